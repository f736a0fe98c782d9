"""Whether a program fits its chip's memory, said in plain words and numbers.

Two ways to not fit HBM: the compiled peak exceeds the device's HBM (or the
headroom a project allows: :func:`hbm_verdict`'s :class:`HbmVerdict`, a record that
:mod:`aotcheck.render` words), or XLA itself refuses with RESOURCE_EXHAUSTED.
A third is not HBM's at all: an op (a Pallas kernel) overflows another memory
space, VMEM or SMEM (:class:`aotcheck.errors.OutOfMemorySpace`): :func:`explain_overflow`
says which, how much of what limit, the op and its line, and how the limit is raised
where it can be; :func:`locate` finds the line in the lowered program.
"""

from __future__ import annotations

import dataclasses
import math
import re

from aotcheck.records import Record
from aotcheck.errors import Overflow
from aotcheck.figures.fit import Fit
from aotcheck.figures.frames import instruction_source, metadata, short_source, stack_frames
from aotcheck.figures.hlo import lowered_instructions
from aotcheck.units import fmt_bytes
from aotcheck.targets.topology import Topology, parse_topology

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclasses.dataclass(frozen=True)
class HbmVerdict(Record):
    """A compiled peak over the HBM a device may use, in bytes per device (worded by
    :func:`aotcheck.render.text.hbm_words`).

    Attributes:
        peak_bytes: The program's peak.
        capacity_bytes: The device's HBM.
        limit_bytes: What the project allows: ``headroom`` x the capacity (rounded down).
        headroom: The share of the capacity the project allows (1.0: all of it).
        topology: The topology's name (``v5e-16``).
    """

    peak_bytes: int
    capacity_bytes: int
    limit_bytes: int
    headroom: float
    topology: str

    @property
    def share(self) -> float:
        """The peak's share of the capacity."""
        return self.peak_bytes / self.capacity_bytes


def hbm_verdict(peak_bytes: int, topology: str | Topology, *, headroom: float = 1.0) -> HbmVerdict | None:
    """None if ``peak_bytes`` fits ``headroom`` x the device's HBM (or the device's HBM is not known),
    else the peak against the limit.

    Example:
        >>> over = hbm_verdict(17 * 2**30, "v5e-16")
        >>> over
        HbmVerdict(peak_bytes=18253611008, capacity_bytes=17179869184, limit_bytes=17179869184, headroom=1.0, topology='v5e-16')
        >>> f"{over.share:.0%}", hbm_verdict(15 * 2**30, "v5e-16"), hbm_verdict(15 * 2**30, "v5e-16", headroom=0.9).limit_bytes
        ('106%', None, 15461882265)
    """
    topo = parse_topology(topology)
    if topo.device.memory_bytes is None:
        return None
    limit = topo.device.memory_bytes * headroom
    if peak_bytes <= limit:
        return None
    return HbmVerdict(int(peak_bytes), int(topo.device.memory_bytes), math.floor(limit), float(headroom), topo.name)


def _size(number: str, unit: str) -> float:
    return float(number) * _UNITS.get(unit.upper().rstrip("IB") if unit else "", 1)


def oom_bytes(error: str) -> int | None:
    """What XLA said a program that ran out of HBM needs per device (its ``Used X of Y hbm`` or
    ``required for ... (X) exceeds``), to 2 decimals of its unit; None where it does not say.

    Example:
        >>> oom_bytes("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 33.27G of 30.75G hbm.")
        35723390484
        >>> oom_bytes("INVALID_ARGUMENT: bad sharding") is None
        True
    """
    need = re.search(r"required for .+? \(([\d.]+)([KMGT]?)i?B?\) exceeds available HBM", error)
    used = re.search(r"Used ([\d.]+)([KMGT]?)i?B? of [\d.]+[KMGT]?i?B? hbm", error)
    found = need or used
    return int(_size(found[1], found[2])) if found else None


def explain_oom(error: str, topology: str | Topology) -> str:
    """A plain summary of XLA's out-of-memory error (an :class:`aotcheck.errors.OutOfMemory`'s message)."""
    name = parse_topology(topology).name
    lines = []
    need = re.search(r"required for (.+?) \(([\d.]+)([KMGT]?)i?B?\) exceeds available HBM \(([\d.]+)([KMGT]?)i?B?\)", error)
    used = re.search(r"Used ([\d.]+)([KMGT]?)i?B? of ([\d.]+)([KMGT]?)i?B? hbm", error)
    if need:
        required, available = _size(need[2], need[3]), _size(need[4], need[5])
        lines.append(
            f"does not fit: XLA needs {fmt_bytes(required)} for {need[1]} of the {fmt_bytes(available)} HBM "
            f"a device can use on {name}: {required / available:.0%}"
        )
    elif used:
        required, available = _size(used[1], used[2]), _size(used[3], used[4])
        lines.append(
            f"does not fit: XLA needs {fmt_bytes(required)} of the {fmt_bytes(available)} HBM a device can "
            f"use on {name}: {required / available:.0%}"
        )
    else:
        lines.append(f"does not fit in HBM on {name}")
    parts = re.findall(r"^\s+(reserved|program|arguments|HLO temp)\s+([\d.]+[KMGT]?)", error, re.M)
    if parts:
        lines.append("XLA's figures per device: " + ", ".join(f"{k} {v}" for k, v in parts))
    allocations = re.findall(r"Size: ([\d.]+[KMGT]?i?B?)\s*\n\s*(?:Operator: ([^\n]*)\n\s*)?(?:Shape: ([^\n]*))?", error)
    if allocations:
        lines.append("Largest allocations XLA names:")
        for size, operator, shape in allocations[:5]:
            lines.append(f"  {size}  {shape.strip()}  {operator.strip()[:120]}".rstrip())
    return "\n".join(lines)


# How the spaces read, and which scoped limits a launch flag raises (libtpu's flag, in KiB).
_SPACE_NAMES = {"vmem": "VMEM", "smem": "SMEM", "cmem": "CMEM", "sflag": "sync flags"}
_SCOPED_FLAG = {"vmem": "xla_tpu_scoped_vmem_limit_kib"}


def space_name(space: str) -> str:
    """``vmem`` -> ``VMEM``: a memory space as TPU documentation writes it."""
    return _SPACE_NAMES.get(space.lower(), space.upper())


def _dims(type_text: str) -> str:
    return re.sub(r"\{[^}]*\}", "", type_text).strip()


def locate(overflow: Overflow, lowered_hlo: str) -> str | None:
    """The Python line that made the op ``overflow`` names, from the lowered program
    (``lowered.as_text(dialect="hlo", debug_info=True)``): the instructions that fit what XLA said
    (a Pallas kernel, JAX's op name, the op's shape); several lines joined by ``or`` where the words
    fit several ops; XLA's own ``source_file``/``source_line`` where the program names none; else None.

    Example:
        >>> program = \'\'\'ENTRY main.3 {
        ...   x.1 = f32[8,128]{1,0} parameter(0)
        ...   k.1 = f32[8,128]{1,0} custom-call(x.1), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/pallas_call" source_file="/m.py" source_line=9}
        ...   ROOT k.2 = f32[4,128]{1,0} custom-call(k.1), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/pallas_call" source_file="/m.py" source_line=12}
        ... }\'\'\'
        >>> locate(Overflow("vmem", 2**27, 2**24, "scoped", op_name="jit(f)/pallas_call", op_shape="f32[4,128]",
        ...                 kernel=True), program)
        'm.py:12'
        >>> locate(Overflow("smem", 2**20, 2**20, op_name="jit(f)/pallas_call", kernel=True), program)
        'm.py:9 or m.py:12'
    """
    frames = stack_frames(lowered_hlo)
    pool = list(lowered_instructions(lowered_hlo))
    if overflow.kernel:
        pool = [i for i in pool if i.opcode == "custom-call" and 'custom_call_target="tpu_custom_call"' in i.attrs]
    elif not overflow.op_name:
        pool = []  # Nothing to tell one op from another.
    if overflow.op_name:
        named = [i for i in pool if metadata(i, "op_name") == overflow.op_name]
        # A nested jit prefixes the compiled program's names: the last part of the name still fits.
        tail = overflow.op_name.rsplit("/", 1)[-1]
        pool = named or [i for i in pool if (metadata(i, "op_name") or "").rsplit("/", 1)[-1] == tail]
    if overflow.op_shape:
        pool = [i for i in pool if _dims(i.type_text) == overflow.op_shape] or pool
    lines = sorted({s for s in (instruction_source(i, frames) for i in pool) if s},
                   key=lambda s: (s.rpartition(":")[0], int(s.rpartition(":")[2] or 0)))
    if lines:
        return " or ".join(lines[:3]) + (f" (and {len(lines) - 3} more)" if len(lines) > 3 else "")
    if overflow.source and ":" in overflow.source:  # XLA's metadata named the file: as a reader finds it.
        path, line = overflow.source.rsplit(":", 1)
        return short_source(path, line)
    return None


def _op(overflow: Overflow) -> str:
    """``the Pallas kernel jit(f)/pallas_call at model.py:12 (XLA's %f.1)``."""
    who = "the Pallas kernel" if overflow.kernel else "the op"
    name = overflow.op_name or (f"XLA calls %{overflow.instruction}" if overflow.instruction else "XLA does not name")
    where = f" at {overflow.source}" if overflow.source else " (XLA names no source line)"
    xla = f" (XLA's %{overflow.instruction})" if overflow.op_name and overflow.instruction else ""
    return f"{who} {name}{where}{xla}"


def overflow_phrase(overflow: Overflow) -> str:
    """What overflowed, in a few words, for a line that is about something else (a fit search's).

    Example:
        >>> overflow_phrase(Overflow("vmem", 2**27, 2**24, "scoped", op_name="jit(f)/pallas_call", kernel=True))
        'the Pallas kernel jit(f)/pallas_call (XLA names no source line) needs 128.00 MiB of VMEM, over its scoped limit of 16.00 MiB'
    """
    space = space_name(overflow.space)
    limit = "its scoped limit" if overflow.limit == "scoped" else f"the {space} there is"
    return (f"{_op(overflow)} needs {fmt_bytes(overflow.size_bytes)} of {space}, "
            f"over {limit} of {fmt_bytes(overflow.limit_bytes)}")


def explain_overflow(overflow: Overflow, topology: str | Topology, *, fit: Fit | None = None) -> str:
    """XLA's refusal of an op for a memory space other than HBM, in words: the space, the size, the
    limit, the op and its line, and how the limit is raised where it can be (never an HBM table: HBM
    is not what overflowed). With ``fit`` (a fit search that ran after it), whether it depends on the size.

    Example (the refusal the E1001 example of :func:`aotcheck.programs.compile.overflow_of` reads):
        >>> vmem = Overflow("vmem", 2**27, 2**24, "scoped", 2**27 - 2**24, instruction="f.1",
        ...                 op_name="jit(f)/pallas_call", op_shape="f32[4096,4096]", kernel=True, source="kernels.py:30")
        >>> print(explain_overflow(vmem, "v5e-1"))  # doctest: +NORMALIZE_WHITESPACE
        does not fit in VMEM on v5e-1: the Pallas kernel jit(f)/pallas_call at kernels.py:30 (XLA's %f.1)
        needs a scoped VMEM allocation of 128.00 MiB; the scoped VMEM limit is 16.00 MiB (over by 112.00 MiB).
        This is the kernel's on-chip memory, not HBM.
        To raise the limit to 128.00 MiB: for this kernel alone, pl.pallas_call(...,
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=134217728)); for every kernel that sets no limit of
        its own, --xla_tpu_scoped_vmem_limit_kib=131072 in the job's launch flags (LIBTPU_INIT_ARGS; aotcheck reads them
        from aot_libtpu_init_args, --aot-libtpu-init-args or a config's libtpu_init_args). A core of v5e-1 has
        128.00 MiB of VMEM: no limit goes past that. Or give the kernel smaller blocks or scratch.
    """
    topo = parse_topology(topology)
    space = space_name(overflow.space)
    size = fmt_bytes(overflow.size_bytes) if overflow.size_bytes is not None else "?"
    limit = fmt_bytes(overflow.limit_bytes) if overflow.limit_bytes is not None else "?"
    over = f" (over by {fmt_bytes(overflow.excess_bytes)})" if overflow.excess_bytes else ""
    if overflow.size_bytes is None or overflow.limit_bytes is None:  # XLA's words were not read in full.
        what = "does not fit (aotcheck could not read the sizes from XLA's message)"
    elif overflow.limit == "scoped":
        what = f"needs a scoped {space} allocation of {size}; the scoped {space} limit is {limit}{over}"
    else:
        allocation = " ".join(x for x in (overflow.tag, overflow.allocation_shape) if x)
        what = (f"needs {size} of {space}" + (f" (its {allocation})" if allocation else "")
                + f"; the chip's {space} holds {limit}{over}")
    owner = "the kernel's" if overflow.kernel else "the op's"
    lines = [f"does not fit in {space} on {topo.name}: {_op(overflow)} {what}.",
             f"This is {owner} on-chip memory, not HBM."]
    flag = _SCOPED_FLAG.get(overflow.space.lower())
    noun = "kernel" if overflow.kernel else "op"
    smaller = (f"Give the {noun} less SMEM (smaller SMEM scratch, fewer scalar-prefetch operands)."
               if overflow.space.lower() == "smem" else
               f"Give the {noun} " + ("smaller blocks or scratch." if overflow.kernel else f"less {space}."))
    if overflow.limit == "scoped" and flag and overflow.size_bytes:
        kib = math.ceil(overflow.size_bytes / 1024)
        capacity = topo.vmem_bytes if overflow.space.lower() == "vmem" else None
        chip = f"A core of {topo.name} has {fmt_bytes(capacity)} of {space}" if capacity else ""
        if capacity and overflow.size_bytes > capacity:
            lines.append(f"{chip}: no limit holds {size}. {smaller}")
        else:
            kernel = "" if not overflow.kernel else (
                f"for this kernel alone, pl.pallas_call(..., compiler_params=pltpu.CompilerParams("
                f"vmem_limit_bytes={kib * 1024})); for every kernel that sets no limit of its own, ")
            lines.append(
                f"To raise the limit to {fmt_bytes(kib * 1024)}: {kernel}--{flag}={kib} in the job's launch flags "
                "(LIBTPU_INIT_ARGS; aotcheck reads them from aot_libtpu_init_args, --aot-libtpu-init-args or a "
                "config's libtpu_init_args)." + (f" {chip}: no limit goes past that." if chip else "")
                + f" Or g{smaller[1:]}")
    elif overflow.limit == "scoped":
        lines.append(f"aotcheck knows no launch flag that raises the scoped {space} limit. {smaller}")
    else:
        lines.append(f"No flag raises it: the chip has no more {space}. {smaller}")
    if fit is not None and fit.max_size == 0 and fit.refused is not None and fit.refused.space == overflow.space:
        lines.append(f"It does not depend on the {fit.knob}: the smallest {fit.knob} ({fit.step}) is refused for "
                     f"{space} too ({fit.probes} compiles).")
    return "\n".join(lines)
