"""Activations left unsharded: a lint over the buffers at the peak.

The compiled program is what the partitioner made of what it was given. When a model skips its
sharding constraints while aotcheck traces it (a helper that returns ``x`` unchanged on a CPU host,
because ``jax.devices()`` says ``cpu``), or the partitioner drops one, an activation can carry the
whole global batch on every device although the batch input is split over k > 1 devices: the
program is then not the one the accelerator would run, and its peak is too high. The lint names such
buffers; it never changes a figure or a verdict.

A buffer at the peak is flagged when all of these hold:

- it is an activation (``temp`` or ``outputs``) of at least 1% of the peak;
- its per-device shape has a dimension equal to a batch input's whole leading dimension ``B``,
  while that input's leading dimension is split ``k > 1`` ways on the devices;
- the op that made it had (before partitioning, in the lowered program) ``g`` elements, and every
  such op of its name and line is split fewer than ``k`` ways: ``g / per-device elements < k``.
  A buffer that keeps ``B`` because the partitioner split another dimension instead (attention
  heads over the data axis) shrinks as much as the batch does and is not flagged.

Buffers named by an argument (copies, gathers of a parameter) or by no JAX op are never flagged:
nothing says how large they were before partitioning. Nor is one shaped like a parameter (its
dimensions those of a parameter's, in any order): a gradient or a gathered weight whose dimension
happens to equal the batch is whole on every device by design.

Example (a 4-way sharded batch of 16; the scores kept all 16 rows):
    >>> from aotcheck.figures.attribution import PeakBuffer
    >>> scores = PeakBuffer(2**25, "temp", "jit(step)/BTHGD,BSHD->BHGTS/dot_general", "f32[16,2,512,512,4]",
    ...                     "model.py:88")
    >>> inputs = [BatchInput("batch/tokens", size=16, ways=4)]
    >>> before = {(scores.name, scores.source): {16 * 2 * 4 * 512 * 512}}
    >>> [f.describe() for f in find_unsharded([scores], inputs, before, peak_bytes=2**26)]
    ['f32[16,2,512,512,4] keeps batch/tokens whole (16 rows) on every device, split 1 way where the batch is split 4']
    >>> half = {(scores.name, scores.source): {16 * 2 * 4 * 512 * 512 * 4}}  # Split 4 ways on its heads.
    >>> find_unsharded([scores], inputs, half, peak_bytes=2**26)
    []
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from aotcheck.figures.attribution import PeakBuffer
from aotcheck.figures.hlo import Computation, instruction_source, lowered_instructions, metadata, parse_arrays, stack_frames
from aotcheck.programs.lowering import Argument

# A buffer below this share of the peak is not worth a note, however it is sharded.
MIN_SHARE = 0.01

GlobalSizes = Mapping[tuple[str, "str | None"], Collection[int]]
"""(JAX op name, source line) -> the element counts its ops had before partitioning."""


class BatchInput(NamedTuple):
    """A batch input whose leading dimension is split over devices."""

    path: str  # "batch/tokens"
    size: int  # Its whole leading dimension (the global batch).
    ways: int  # Over how many devices it is split.


@dataclasses.dataclass(frozen=True)
class Unsharded:
    """One buffer at the peak that keeps a sharded batch input's whole leading dimension."""

    bytes: int
    name: str  # The op's JAX name stack (as in the peak's buffer list).
    shape: str  # Per device.
    source: str | None
    input: str  # The batch input whose leading dimension it keeps.
    batch: int  # That dimension.
    ways: int  # How many ways the input is split.
    split: int  # How many ways this buffer is split (elements before partitioning / per device).

    def describe(self) -> str:
        """One line, as data: what it keeps and how it is split (render words the rest)."""
        return (f"{self.shape} keeps {self.input} whole ({self.batch} rows) on every device, split {self.split} "
                f"way{'s' if self.split != 1 else ''} where the batch is split {self.ways}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Unsharded":
        return cls(int(data["bytes"]), str(data["name"]), str(data["shape"]), data.get("source"), str(data["input"]),
                   int(data["batch"]), int(data["ways"]), int(data["split"]))


def batch_inputs(args: Sequence[Argument], module: Mapping[str, Computation]) -> list[BatchInput]:
    """The batch inputs whose leading dimension the compiled program splits over devices: each
    argument's global shape (as traced) against its entry parameter's per-device shape."""
    entry = next((c for c in module.values() if c.is_entry), None)
    if entry is None:
        return []
    local = {inst.int_arg: inst.arrays for inst in entry.instructions.values()
             if inst.opcode == "parameter" and inst.int_arg is not None}
    out = []
    for number, arg in enumerate(args):
        arrays = local.get(number) or []
        if arg.kind != "batch" or not arg.shape or len(arrays) != 1 or not arrays[0].dims:
            continue
        whole, here = arg.shape[0], arrays[0].dims[0]
        if here and whole % here == 0 and whole // here > 1:
            out.append(BatchInput(arg.path, whole, whole // here))
    return out


def global_sizes(lowered_hlo: str) -> dict[tuple[str, str | None], set[int]]:
    """Element counts by (op name, source line), from the lowered program before partitioning
    (``lowered.as_text(dialect="hlo", debug_info=True)``: global shapes, JAX's names and lines).

    Example:
        >>> global_sizes('''ENTRY main.3 {
        ...   dot.1 = f32[64,32]{1,0} dot(a, b), metadata={op_name="jit(f)/dot_general" source_file="/m.py" source_line=9}
        ... }''')
        {('jit(f)/dot_general', 'm.py:9'): {2048}}
    """
    frames = stack_frames(lowered_hlo)
    out: dict[tuple[str, str | None], set[int]] = {}
    for inst in lowered_instructions(lowered_hlo):
        arrays, name = inst.arrays, metadata(inst, "op_name")
        if not name or len(arrays) != 1:
            continue
        out.setdefault((name, instruction_source(inst, frames)), set()).add(arrays[0].elements)
    return out


def find_unsharded(
    buffers: Iterable[PeakBuffer], inputs: Sequence[BatchInput], before: GlobalSizes | Callable[[], GlobalSizes], *,
    peak_bytes: int, param_shapes: Iterable[Sequence[int]] = (),
) -> list[Unsharded]:
    """The buffers at the peak that keep a sharded batch input whole (see the module's docstring);
    ``param_shapes``: the parameters' global shapes (a buffer shaped like one is not an activation).
    ``before`` may be a function giving the sizes, called only when a buffer keeps a batch's dimension
    (printing the lowered program with its locations costs as much as a tenth of a small compile)."""
    weights = {tuple(sorted(shape)) for shape in param_shapes}
    sizes = before if not callable(before) else None
    found = []
    for buffer in buffers:
        arrays = parse_arrays(buffer.shape)
        if buffer.kind not in ("temp", "outputs") or buffer.bytes < MIN_SHARE * peak_bytes or len(arrays) != 1 \
                or tuple(sorted(arrays[0].dims)) in weights:
            continue
        kept = [batch for batch in inputs if batch.size in arrays[0].dims]
        if not kept:
            continue
        if sizes is None:
            sizes = before()  # type: ignore[operator]
        here = arrays[0].elements
        splits = [g // here for g in sizes.get((buffer.name, buffer.source), ()) if here and g >= here and g % here == 0]
        for batch in kept:
            # The most generous reading of its name must still split it fewer ways than the batch.
            if splits and max(splits) < batch.ways:
                found.append(Unsharded(buffer.bytes, buffer.name, buffer.shape, buffer.source, batch.path, batch.size,
                                       batch.ways, max(splits)))
                break
    return found
