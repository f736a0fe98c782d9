r"""Activations left unsharded: a lint over the buffers at the peak.

The compiled program is what the partitioner made of what it was given. When a model skips its
sharding constraints while aotcheck traces it (a helper that returns ``x`` unchanged on a CPU host,
because ``jax.devices()`` says ``cpu``), or the partitioner drops one, an activation can carry the
whole global batch on every device although the batch input is split over mesh axes: the program is
then not the one the accelerator would run, and its peak is too high. The lint names such buffers;
it never changes a figure or a verdict.

It reads how XLA split each op from XLA itself (:mod:`aotcheck.figures.splits`: the module as its
sharding propagation left it, dumped by the same compile), which says which part of each array every
device holds, so the rule compares devices:

A buffer at the peak is flagged when all of these hold:

- it is an activation (``temp`` or ``outputs``) of at least 1% of the peak;
- its per-device shape has a dimension equal to a batch input's whole leading dimension ``B``,
  while that input's leading dimension is split ``k > 1`` ways;
- every op of its name and line whose per-device size is the buffer's puts one piece of it on
  devices that hold different rows of the batch: it is replicated over (some of) the mesh axes
  that split the batch, and each device holds it for more than its own rows. A buffer that keeps
  ``B`` because the partitioner split another dimension over the batch's axes instead (attention
  heads over the data axis) shrinks as much as the batch does and is not flagged, however the way
  counts compare; one split over a part of the data axis only (a sub-axis) is.

An op is found by its JAX name and line, both as in the compiled program (the dump is the same
compile's, after XLA inlined nested ``jax.jit`` calls: ``jit(step)/jit(inner)/...`` on both sides);
failing that, by its line and the last part of its name. Where no op of the buffer's name has its
per-device size (the partitioner laid it out otherwise than propagation said), the rule falls back
to counting ways: its ops' global sizes over its own must say it is split fewer ways than the batch.

Buffers named by an argument (copies, gathers of a parameter) or by no JAX op are never flagged:
nothing says how they were split. Nor is one shaped like a parameter (its dimensions those of a
parameter's, in any order): a gradient or a gathered weight whose dimension happens to equal the
batch is whole on every device by design.

Example (a batch of 16 split 4 ways over ``fsdp``; the scores kept all 16 rows, split over ``tp``):
    >>> from aotcheck.figures.attribution import PeakBuffer
    >>> from aotcheck.figures.splits import read_shardings
    >>> scores = PeakBuffer(2**25, "temp", "jit(step)/BTHGD,BSHD->BHGTS/dot_general", "f32[16,2,512,512,1]",
    ...                     "model.py:88")
    >>> inputs = [BatchInput("batch/tokens", size=16, ways=4, parameter=0)]  # As the compiled program splits it.
    >>> def dump(heads):  # XLA's dump after sharding propagation, shortened by hand.
    ...     mesh = "mesh['fsdp'=4,'tp'=4]"
    ...     return read_shardings("\n".join([
    ...         "ENTRY %main (p.0: s32[16,256]) -> f32[] {",
    ...         "  %p.0 = s32[16,256]{1,0} parameter(0), sharding={" + mesh + ", [{'fsdp'}, {}]}",
    ...         "  %dot.1 = f32[16,8,512,512,1]{4,3,2,1,0} dot(%a, %b), sharding={" + mesh + ", [{}, {'"
    ...         + heads + "'}, {}, {}, {}]}, metadata={op_name=\"jit(step)/BTHGD,BSHD->BHGTS/dot_general\" "
    ...         'source_file="/x/model.py" source_line=88}',
    ...         "}"]))
    >>> found = dump("tp")
    >>> found.parameters[0], found.ops[scores.name, scores.source]
    (Split(dims=(16, 256), axes=(('fsdp',), ()), ways=(4, 1)), [Split(dims=(16, 8, 512, 512, 1), axes=((), ('tp',), (), (), ()), ways=(1, 4, 1, 1, 1))])
    >>> [f.describe() for f in find_unsharded([scores], inputs, found, peak_bytes=2**26)]
    ['f32[16,2,512,512,1] keeps batch/tokens whole (16 rows) on every device, split 4 ways over tp where the batch is split 4 over fsdp: replicated over fsdp, 4 of its 4 shards on each device']
    >>> find_unsharded([scores], inputs, dump("fsdp"), peak_bytes=2**26)  # Its heads split over fsdp instead.
    []
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from aotcheck.records import Record, field, same_line
from aotcheck.figures.attribution import PeakBuffer
from aotcheck.figures.hlo import Computation, parse_arrays
from aotcheck.figures.splits import Shardings, Split, device_coords
from aotcheck.programs.lowering import Argument

# A buffer below this share of the peak is not worth a note, however it is sharded.
MIN_SHARE = 0.01


def held_shards(batch: Split, buffer: Split) -> int | None:
    """On the devices that hold one piece of ``buffer``, how many pieces of ``batch``'s leading
    dimension there are, at most (1: the buffer is split wherever the batch is); None if either's
    layout is not known or they are on different devices."""
    rows, pieces = batch.tiles(), buffer.tiles()
    if batch.layout == ("replicated",):
        return 1
    if buffer.layout == ("replicated",) and rows is not None:
        return len({index[0] for index in rows})
    if rows is None or pieces is None or len(rows) != len(pieces):
        return None
    held: dict[tuple[int, ...], set[int]] = {}
    for row, piece in zip(rows, pieces):
        held.setdefault(piece, set()).add(row[0])
    return max(len(found) for found in held.values())


def replicated_axes(batch: Split, buffer: Split) -> tuple[str, ...]:
    """The mesh axes splitting ``batch``'s leading dimension over which ``buffer`` is (partly)
    replicated: devices that differ on that axis alone hold one piece of it and different rows."""
    mesh = buffer.mesh or batch.mesh
    rows = batch.tiles()
    if not mesh or rows is None or batch.axes is None:
        return ()
    pieces = buffer.tiles() if buffer.layout != ("replicated",) else ((),) * len(rows)
    if pieces is None or len(pieces) != len(rows) or len(rows) != math.prod(size for _, size in mesh):
        return ()
    coords, names = device_coords(mesh), [name for name, _ in mesh]
    out = []
    for name in batch.axes[0]:
        i = names.index(name) if name in names else None
        if i is None:
            continue
        held: dict[tuple[Any, ...], set[int]] = {}
        for device, coord in enumerate(coords):
            held.setdefault((coord[:i] + coord[i + 1:], pieces[device]), set()).add(rows[device][0])
        if any(len(found) > 1 for found in held.values()):
            out.append(name)
    return tuple(out)


class BatchInput(NamedTuple):
    """A batch input whose leading dimension is split over devices."""

    path: str  # "batch/tokens"
    size: int  # Its whole leading dimension (the global batch).
    ways: int  # Over how many devices it is split.
    parameter: int | None = None  # Its entry parameter's number (whose sharding says where its rows are).


@dataclasses.dataclass(frozen=True)
class Unsharded(Record):
    """One buffer at the peak that keeps a sharded batch input's whole leading dimension."""

    bytes: int
    name: str  # The op's JAX name stack (as in the peak's buffer list).
    shape: str  # Per device.
    source: str | None
    input: str  # The batch input whose leading dimension it keeps.
    batch: int  # That dimension.
    ways: int  # How many ways the input is split.
    split: int  # How many ways this buffer is split (its global elements over its per-device ones).
    batch_axes: tuple[str, ...] = ()  # The mesh axes that split the input (empty: not known).
    split_axes: tuple[str, ...] = ()  # The mesh axes that split this buffer.
    replicated: tuple[str, ...] = ()  # The input's axes this buffer is (partly) replicated over.
    shards: int = 0  # How many of the input's shards each device's copy serves (0: not known).
    library: str | None = field(default=None, omit=same_line)  # The model library's own line, when it is not ``source`` (figures.frames).

    def describe(self) -> str:
        """One line, as data: what it keeps and how it is split (render words the rest)."""
        over = f" over {','.join(self.split_axes)}" if self.split_axes else ""
        text = (f"{self.shape} keeps {self.input} whole ({self.batch} rows) on every device, split {self.split} "
                f"way{'s' if self.split != 1 else ''}{over} where the batch is split {self.ways}")
        if self.batch_axes:
            text += f" over {','.join(self.batch_axes)}"
        said = ([f"replicated over {','.join(self.replicated)}"] if self.replicated else []) + \
            ([f"{self.shards} of its {self.ways} shards on each device"] if self.shards else [])
        return text + (": " + ", ".join(said) if said else "")


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
            out.append(BatchInput(arg.path, whole, whole // here, number))
    return out


def find_unsharded(
    buffers: Iterable[PeakBuffer], inputs: Sequence[BatchInput], shardings: Shardings | Callable[[], Shardings], *,
    peak_bytes: int, param_shapes: Iterable[Sequence[int]] = (),
) -> list[Unsharded]:
    """The buffers at the peak that keep a sharded batch input whole (see the module's docstring);
    ``param_shapes``: the parameters' global shapes (a buffer shaped like one is not an activation).
    ``shardings`` may be a function giving them, called only when a buffer keeps a batch's dimension
    (reading XLA's dump of the propagated module costs about what printing the lowered one does)."""
    weights = {tuple(sorted(shape)) for shape in param_shapes}
    read = shardings if not callable(shardings) else None
    found = []
    for buffer in buffers:
        arrays = parse_arrays(buffer.shape)
        if buffer.kind not in ("temp", "outputs") or buffer.bytes < MIN_SHARE * peak_bytes or len(arrays) != 1 \
                or tuple(sorted(arrays[0].dims)) in weights:
            continue
        kept = [batch for batch in inputs if batch.size in arrays[0].dims]
        if not kept:
            continue
        if read is None:
            read = shardings()  # type: ignore[operator]
        splits = read.candidates(buffer.name, buffer.source)
        for batch in kept:
            rows = read.parameters.get(batch.parameter) if batch.parameter is not None else None
            flagged = _flag(buffer, batch, rows, splits, arrays[0].elements)
            if flagged is not None:
                found.append(flagged)
                break
    return found


def _flag(buffer: PeakBuffer, batch: BatchInput, rows: Split | None, splits: Sequence[Split],
          here: int) -> Unsharded | None:
    """The finding for ``buffer`` (``here`` elements per device) against ``batch`` (its entry
    parameter split as ``rows``), or None.

    Its ops of its per-device size say how it is split: the most generous reading of them must
    still put one piece of it on devices holding different rows of the batch. Where none has its
    size, or a layout is not known, its ops' global sizes over its own must say it is split fewer
    ways than the batch.
    """
    axes = rows.axes[0] if rows is not None and rows.axes else ()
    same = [s for s in splits if s.local_elements == here]
    if same and rows is not None:
        held = [(held_shards(rows, s), s) for s in same]
        if all(count is not None for count, _ in held):
            count, best = min(held, key=lambda pair: (pair[0], -pair[1].split))  # type: ignore[arg-type,return-value]
            if count is None or count <= 1:
                return None
            return Unsharded(buffer.bytes, buffer.name, buffer.shape, buffer.source, batch.path, batch.size,
                             batch.ways, best.split, axes, best.over or (), replicated_axes(rows, best), count,
                             library=buffer.library)
    if batch.size // batch.ways in parse_arrays(buffer.shape)[0].dims:
        # No layout to read, and a dimension holds this device's rows of the batch: the whole batch's
        # size elsewhere in the shape is another dimension's (a sequence, a head width), not the batch.
        return None
    if same:
        best = max(same, key=lambda s: s.split)
        ways, over = best.split, best.over or ()
    else:
        counts = [s.elements // here for s in splits if here and s.elements >= here and s.elements % here == 0]
        if not counts:
            return None
        ways, over = max(counts), ()
    if ways >= batch.ways:
        return None
    return Unsharded(buffer.bytes, buffer.name, buffer.shape, buffer.source, batch.path, batch.size, batch.ways,
                     ways, axes, over, library=buffer.library)
