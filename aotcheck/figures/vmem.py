"""Each Pallas TPU kernel's scoped VMEM: what the compiler records that it uses, against its limit.

libtpu writes a kernel's scoped allocations into its custom call's ``backend_config`` as it compiles
(``"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"364544"}]``, memory space 1
being VMEM): the kernel's scratch, Mosaic's own scratch and any vector registers it spilled, the
figure the compiler holds against the limit (jax's ragged paged attention on v5e: 364,544 bytes = its
declared scratch 311,296 + Mosaic's 36,864 + 4 spilled registers of 4,096, by libtpu's LLO allocation
list; block arithmetic alone is 0.78-1.17x of it). A kernel's own ``vmem_limit_bytes`` is there too
(``scoped_memory_configs``); else the compile's ``xla_tpu_scoped_vmem_limit_kib``, else the chip's
default. SMEM has no such record in the compiled program (a kernel's scalar operands and SMEM scratch
appear only in libtpu's LLO dumps): an SMEM overflow is refused with its numbers
(:mod:`aotcheck.programs.compile`), its headroom is not measured.

Example:
    >>> from aotcheck.figures.hlo import parse_module
    >>> text = ('HloModule m\\n\\nENTRY %main (p: f32[8]) -> f32[8] {\\n  %p = f32[8]{0} parameter(0)\\n'
    ...         '  ROOT %k.2 = f32[8]{0} custom-call(%p), custom_call_target="tpu_custom_call", '
    ...         'metadata={op_name="jit(f)/my_kernel/pallas_call"}, backend_config={"scoped_memory_configs":[],'
    ...         '"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"16252928"}]}\\n}\\n')
    >>> (use,) = scoped_vmem(parse_module(text), default=Limit(16 * 2**20, "v5e's default"))
    >>> use.kernel, use.bytes, use.limit.bytes, round(use.share, 3)
    ('my_kernel', 16252928, 16777216, 0.969)
    >>> vmem_figures([use])
    {'vmem_scoped_bytes': 16252928, 'vmem_limit_bytes': 16777216}
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from aotcheck.figures.flops import kernel_name
from aotcheck.figures.frames import metadata
from aotcheck.figures.hlo import Computation
from aotcheck.figures.ledger import custom_call_target
from aotcheck.targets.tpu import CHIPS

USED, LIMIT = "vmem_scoped_bytes", "vmem_limit_bytes"
VMEM_SPACE = "1"  # XLA's TPU memory space of VMEM (S(1) in a layout).
NEAR = 0.95  # Within 5% of its limit, a kernel is said to be near it.
FLAG = "xla_tpu_scoped_vmem_limit_kib"


@dataclasses.dataclass(frozen=True)
class Limit:
    """A scoped VMEM limit and where it comes from (``"the kernel's vmem_limit_bytes"``, the flag, a chip's default)."""

    bytes: int
    source: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Limit":
        return cls(int(data["bytes"]), str(data["source"]))


@dataclasses.dataclass(frozen=True)
class ScopedUse:
    """One kernel's scoped VMEM as the compiler recorded it (the largest of its calls), against its limit."""

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
        mib = 2**20
        return (f"{self.kernel} ({self.op}) uses {self.bytes / mib:.2f} MiB of its {self.limit.bytes / mib:.2f} MiB of "
                f"scoped VMEM ({self.share:.1%}; the limit: {self.limit.source}), within 5% of it: a larger block or "
                f"another toolchain's spills may not compile; --{FLAG} raises the limit (in aot_libtpu_init_args to "
                "check it here, and in your job's LIBTPU_INIT_ARGS), as does the kernel's vmem_limit_bytes")

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "op": self.op, "bytes": self.bytes, "limit": self.limit.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ScopedUse":
        return cls(str(data["kernel"]), str(data["op"]), int(data["bytes"]), Limit.from_json(data["limit"]))


_CONFIGS = re.compile(r'"(used_scoped_memory_configs|scoped_memory_configs)"\s*:\s*(\[[^\]]*\])')


def _vmem(configs: str) -> int:
    return sum(int(c["size"]) for c in json.loads(configs) if str(c.get("memory_space")) == VMEM_SPACE)


def default_limit(options: Mapping[str, str], family: str) -> Limit:
    """The scoped VMEM limit of a kernel that sets none: the compile's ``xla_tpu_scoped_vmem_limit_kib``
    (a preset's, the config's or the launch's), else the chip's default.

    Example:
        >>> default_limit({}, "v5e"), default_limit({"xla_tpu_scoped_vmem_limit_kib": "98304"}, "v6e").bytes
        (Limit(bytes=16777216, source="v5e's default"), 100663296)
    """
    kib = options.get(FLAG)
    if kib:
        return Limit(int(kib) * 1024, f"--{FLAG}={kib}")
    chip = CHIPS.get(family)
    return Limit(chip.scoped_vmem_bytes if chip is not None else 0, f"{family}'s default")


def scoped_vmem(module: Mapping[str, Computation], *, default: Limit) -> list[ScopedUse]:
    """Each Pallas TPU kernel's scoped VMEM in ``module`` (the compiled program, parsed), the nearest its
    limit first; ``default``: the limit of a kernel that sets none of its own."""
    found: dict[str, ScopedUse] = {}
    for comp in module.values():
        for inst in comp.instructions.values():
            if inst.opcode != "custom-call" or custom_call_target(inst) != "tpu_custom_call":
                continue
            configs = dict(m.groups() for m in _CONFIGS.finditer(inst.attrs))
            if "used_scoped_memory_configs" not in configs:
                continue
            own = _vmem(configs.get("scoped_memory_configs", "[]"))
            use = ScopedUse(re.sub(r"\.\d+$", "", kernel_name(metadata(inst, "op_name") or inst.name)), inst.name,
                            _vmem(configs["used_scoped_memory_configs"]),
                            Limit(own, "the kernel's vmem_limit_bytes") if own else default)
            if use.kernel not in found or use.share > found[use.kernel].share:
                found[use.kernel] = use
    return sorted(found.values(), key=lambda u: (-u.share, u.kernel))


def vmem_figures(uses: Sequence[ScopedUse]) -> dict[str, int]:
    """The figures of the kernel nearest its limit: its scoped VMEM and the limit (none without kernels)."""
    if not uses:
        return {}
    nearest = max(uses, key=lambda u: u.share)
    return {USED: nearest.bytes, LIMIT: nearest.limit.bytes}
