"""Each Pallas TPU kernel's memory spaces: its scoped VMEM and its SMEM, against their limits.

**VMEM**: libtpu writes a kernel's scoped allocations into its custom call's ``backend_config`` as it
compiles (``"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"364544"}]``, memory
space 1 being VMEM): the kernel's scratch, Mosaic's own scratch and any vector registers it spilled,
the figure the compiler holds against the limit (jax's ragged paged attention on v5e: 364,544 bytes =
its declared scratch 311,296 + Mosaic's 36,864 + 4 spilled registers of 4,096, by libtpu's LLO
allocation list; block arithmetic alone is 0.78-1.17x of it). A kernel's own ``vmem_limit_bytes`` is
there too (``scoped_memory_configs``); else the compile's ``xla_tpu_scoped_vmem_limit_kib``, else the
chip's default.

**SMEM** has no such record in the compiled program (libtpu's LLO dumps alone list it). The kernel
says it itself: its Mosaic body, carried in the same ``backend_config``, declares every operand and
scratch buffer with its memory space, so a kernel's SMEM is the sum of its ``#tpu.memory_space<smem>``
buffers as SMEM lays them out (a row of 128 words per 512 bytes, 2-D and up in tiles of 8 rows): for
the reference server's step, 10,240 bytes, what the LLO lists (its 120 bytes of spilled scalar
registers aside). Against the core's SMEM (jax's table of TPU cores: 1 MiB).

Example:
    >>> from aotcheck.figures.hlo import parse_module
    >>> text = ('HloModule m\\n\\nENTRY %main (p: f32[8]) -> f32[8] {\\n  %p = f32[8]{0} parameter(0)\\n'
    ...         '  ROOT %k.2 = f32[8]{0} custom-call(%p), custom_call_target="tpu_custom_call", '
    ...         'metadata={op_name="jit(f)/my_kernel/pallas_call"}, backend_config={"scoped_memory_configs":[],'
    ...         '"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"16252928"}]}\\n}\\n')
    >>> (use,) = kernel_memory(parse_module(text), vmem=Limit(16 * 2**20, "v5e's default"))
    >>> use.space, use.kernel, use.bytes, use.limit.bytes, round(use.share, 3)
    ('vmem', 'my_kernel', 16252928, 16777216, 0.969)
    >>> space_figures([use])
    {'vmem_scoped_bytes': 16252928, 'vmem_limit_bytes': 16777216}
    >>> smem_layout_bytes((16, 16), 4), smem_layout_bytes((17,), 4), smem_layout_bytes((), 4)
    (8192, 512, 512)
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence

from aotcheck.records import Record
from aotcheck.errors import ConfigError
from aotcheck.figures.flops import kernel_name
from aotcheck.figures.frames import metadata
from aotcheck.figures.hlo import Computation, Instruction
from aotcheck.figures.ledger import custom_call_target
from aotcheck.targets.topology import Topology, parse_topology

FIGURES = {"vmem": ("vmem_scoped_bytes", "vmem_limit_bytes"), "smem": ("smem_bytes", "smem_limit_bytes")}
VMEM_SPACE = "1"  # XLA's TPU memory space of VMEM (S(1) in a layout).
NEAR = 0.95  # Within 5% of its limit, a kernel is said to be near it.
FLAG = "xla_tpu_scoped_vmem_limit_kib"
_CURE = {
    "vmem": f"a larger block, or another toolchain's spills, may not compile; --{FLAG} raises the limit (in aot_libtpu_init_args to check it here, and in your job's "
            "LIBTPU_INIT_ARGS), as does the kernel's vmem_limit_bytes",
    "smem": "a larger scalar operand may not compile, and nothing raises SMEM: shrink the kernel's scalar operands (a page table is max_num_seqs x "
            "pages per sequence words) or its SMEM scratch",
}


@dataclasses.dataclass(frozen=True)
class Limit(Record):
    """A memory space's limit for a kernel and where it comes from (``"the kernel's vmem_limit_bytes"``,
    the flag, a chip's default, its SMEM)."""

    bytes: int
    source: str


@dataclasses.dataclass(frozen=True)
class ScopedUse(Record):
    """One kernel's use of one memory space (the largest of its calls), against its limit."""

    space: str  # "vmem" or "smem".
    kernel: str
    op: str  # The HLO instruction (``ragged_paged_attention_kernel.2``).
    bytes: int
    limit: Limit

    @property
    def share(self) -> float:
        return self.bytes / self.limit.bytes if self.limit.bytes else 0.0

    @property
    def near(self) -> bool:
        return self.share >= NEAR

    def describe(self) -> str | None:
        """A line for a kernel within 5% of its limit (None otherwise)."""
        if not self.near:
            return None
        size = (lambda n: f"{n / 2**20:.2f} MiB") if self.limit.bytes >= 2**20 else (lambda n: f"{n / 2**10:.2f} KiB")
        what = "scoped VMEM" if self.space == "vmem" else "SMEM"
        return (f"{self.kernel} ({self.op}) uses {size(self.bytes)} of its {size(self.limit.bytes)} of {what} "
                f"({self.share:.1%}; the limit: {self.limit.source}), within 5% of it: {_CURE[self.space]}")


def default_limit(options: Mapping[str, str], topology: str | Topology) -> Limit:
    """The scoped VMEM limit of a kernel that sets none: the compile's ``xla_tpu_scoped_vmem_limit_kib``
    (a preset's, the config's or the launch's), else the chip's default.

    Example:
        >>> default_limit({}, "v5e-1"), default_limit({"xla_tpu_scoped_vmem_limit_kib": "98304"}, "v6e-8").bytes
        (Limit(bytes=16777216, source="v5e's default"), 100663296)
    """
    kib = options.get(FLAG)
    if kib:
        if not (str(kib).isascii() and str(kib).isdigit()):  # A config's compiler_options: launch flags are checked.
            raise ConfigError(f"compiler option {FLAG}={kib!r} is not a count of KiB; give the scoped VMEM limit in "
                              f"decimal KiB, e.g. {FLAG}='98304' (96 MiB)")
        return Limit(int(kib) * 1024, f"--{FLAG}={kib}")
    topo = parse_topology(topology)
    return Limit(topo.device.scoped_vmem_bytes or 0, f"{topo.family}'s default")


def smem_limit(topology: str | Topology) -> Limit | None:
    """A core's SMEM, from jax's table (None where this jax has none, and off TPUs)."""
    topo = parse_topology(topology)
    found = topo.smem_bytes
    return Limit(found, f"{topo.family}'s SMEM") if found else None


_CONFIGS = re.compile(r'"(used_scoped_memory_configs|scoped_memory_configs)"\s*:\s*(\[[^\]]*\])')
_BODY = re.compile(r'"body"\s*:\s*"([A-Za-z0-9+/=]+)"')
_SMEM_REF = re.compile(r"memref<((?:\d+x)*)(\w+), #tpu\.memory_space<smem>>")
_BITS = re.compile(r"[a-z]+(\d+)")


def _vmem(configs: str) -> int:
    return sum(int(c["size"]) for c in json.loads(configs) if str(c.get("memory_space")) == VMEM_SPACE)


def smem_layout_bytes(shape: Sequence[int], itemsize: int) -> int:
    """An SMEM buffer's bytes as SMEM lays it out: 128 words a row (512 bytes), a 2-D or larger
    buffer's last two dimensions in tiles of 8 x 128 words."""
    words = max(1, itemsize // 4)  # Scalars narrower than a word take a word each.
    if len(shape) < 2:
        return math.ceil(max(1, math.prod(shape)) * words / 128) * 512
    rows, cols = shape[-2], shape[-1] * words
    return math.prod(shape[:-2]) * math.ceil(rows / 8) * 8 * math.ceil(cols / 128) * 128 * 4


def kernel_smem(inst: Instruction) -> int | None:
    """The SMEM a kernel's Mosaic body declares (its scalar operands and SMEM scratch); None where its
    body cannot be read here (a toolchain without Mosaic's Python bindings, a body of another format)."""
    found = _BODY.search(inst.attrs)
    if not found:
        return None
    try:
        from jax.extend.mlir import ir, passmanager  # noqa: PLC0415  (only for a program with TPU kernels)
        from jaxlib.mosaic.python import tpu  # noqa: PLC0415

        context = ir.Context()
        tpu.register_dialect(context)
        with context, ir.Location.unknown():
            context.allow_unregistered_dialects = True
            module = ir.Module.parse(base64.b64decode(found[1]))
            passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
            text = str(module)
    except Exception:  # Mosaic's bindings differ between toolchains: no figure, never a guess.
        return None
    entry = re.search(r"\^bb0\((.*?)\):", text) or re.search(r"func\.func @\w+\((.*?)\)", text)
    if entry is None:
        return None
    total = 0
    for dims, dtype in _SMEM_REF.findall(entry[1]):
        bits = _BITS.fullmatch(dtype)
        total += smem_layout_bytes(tuple(int(d) for d in dims.split("x") if d), int(bits[1]) // 8 if bits else 4)
    return total


def _kernels(module: Mapping[str, Computation]) -> Iterator[tuple[Instruction, dict[str, str]]]:
    for comp in module.values():
        for inst in comp.instructions.values():
            if inst.opcode == "custom-call" and custom_call_target(inst) == "tpu_custom_call":
                configs = dict(m.groups() for m in _CONFIGS.finditer(inst.attrs))
                if "used_scoped_memory_configs" in configs:
                    yield inst, configs


def kernel_memory(module: Mapping[str, Computation], *, vmem: Limit, smem: Limit | None = None) -> list[ScopedUse]:
    """Each Pallas TPU kernel's VMEM (and SMEM, given its limit) in ``module`` (the compiled program,
    parsed), the nearest its limit first; ``vmem``: the limit of a kernel that sets none of its own."""
    found: dict[tuple[str, str], ScopedUse] = {}
    bodies: dict[str, int | None] = {}  # A kernel's calls share its body: read once.
    for inst, configs in _kernels(module):
        kernel = re.sub(r"\.\d+$", "", kernel_name(metadata(inst, "op_name") or inst.name))
        own = _vmem(configs.get("scoped_memory_configs", "[]"))
        uses = [ScopedUse("vmem", kernel, inst.name, _vmem(configs["used_scoped_memory_configs"]),
                          Limit(own, "the kernel's vmem_limit_bytes") if own else vmem)]
        if smem is not None:
            body = _BODY.search(inst.attrs)
            key = body[1] if body else inst.name
            if key not in bodies:
                bodies[key] = kernel_smem(inst)
            if bodies[key] is not None:
                uses.append(ScopedUse("smem", kernel, inst.name, int(bodies[key] or 0), smem))
        for use in uses:
            held = found.get((use.space, kernel))
            if held is None or use.share > held.share:
                found[(use.space, kernel)] = use
    return sorted(found.values(), key=lambda u: (-u.share, u.space, u.kernel))


def space_figures(uses: Sequence[ScopedUse]) -> dict[str, int]:
    """Per memory space, the figures of the kernel nearest its limit: its use and the limit (none without kernels)."""
    out: dict[str, int] = {}
    for space, (used, limit) in FIGURES.items():
        mine = [u for u in uses if u.space == space]
        if mine:
            nearest = max(mine, key=lambda u: u.share)
            out.update({used: nearest.bytes, limit: nearest.limit.bytes})
    return out
