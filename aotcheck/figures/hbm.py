"""Whether a program fits its chip's memory, as records that :mod:`aotcheck.render.memory` words.

Two ways to not fit HBM: the compiled peak exceeds the device's HBM (or the
headroom a project allows: :func:`hbm_verdict`'s :class:`HbmVerdict`), or XLA itself
refuses, out of memory in some space (HBM, a GPU's memory, a Pallas kernel's VMEM or
SMEM): that refusal is read once where the compile raises it, into an
:class:`aotcheck.errors.Overflow`; :func:`locate` finds the Python line of the op it names
in the lowered program.
"""

from __future__ import annotations

import dataclasses
import math
import re

from aotcheck.records import Record
from aotcheck.errors import Overflow
from aotcheck.figures.frames import instruction_source, metadata, short_source, stack_frames
from aotcheck.figures.hlo import lowered_instructions
from aotcheck.targets.topology import Topology, parse_topology

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


