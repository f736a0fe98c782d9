r"""Activations left unsharded: a lint over the buffers at the peak.

The compiled program is what the partitioner made of what it was given. When a model skips its
sharding constraints while aotcheck traces it (a helper that returns ``x`` unchanged on a CPU host,
because ``jax.devices()`` says ``cpu``), or the partitioner drops one, an activation can carry the
whole global batch on every device although the batch input is split over mesh axes: the program is
then not the one the accelerator would run, and its peak is too high. The lint names such buffers;
it never changes a figure or a verdict.

It reads how XLA split each op from XLA itself: the module as its sharding propagation left it,
before the partitioner (dumped by the same compile, see :func:`dump_options`), gives every op its
global shape and its sharding, the entry parameters' too. jax 0.12's libtpu writes a sharding by
mesh axis (``{mesh['fsdp'=4,'tp'=4], [{}, {'tp'}, {}]}``, a sub-axis as ``{'data':(1)4}``), older
ones as a tile assignment of device ids (``{devices=[1,4,4]<=[4,4]T(1,0) last_tile_dim_replicate}``,
named here against the mesh: HLO's device ids are positions in the mesh's devices, row-major).
Either way it says which part of the array each device holds, so the rule compares devices:

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
import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from aotcheck.figures.attribution import PeakBuffer
from aotcheck.figures.frames import instruction_source, metadata, stack_frames
from aotcheck.figures.hlo import Computation, logical_lines, parse_arrays, parse_instruction
from aotcheck.programs.lowering import Argument

# A buffer below this share of the peak is not worth a note, however it is sharded.
MIN_SHARE = 0.01

# The passes after which XLA's dump holds every op's sharding, before the partitioner: Shardy's
# (jax's default) and GSPMD's (``jax_use_shardy_partitioner=False``).
PROPAGATION_PASSES = ("shardy-xla", "sharding-propagation")


def dump_options() -> dict[str, Any]:
    """Compiler options that make XLA also dump the module after its sharding propagation (with
    ``xla_dump_to``). Measured on a 71M-parameter train step for v5e-16: 2.6 MiB more dump (10.5 ->
    13.2 MiB: the module before and after the pass, 0.7 MiB, and Shardy's own files, 2 MiB), the
    compile's CPU time within its noise (81-102 s with it, 90-102 s without), and reading it back
    0.13 s, as much as printing the lowered program with its locations."""
    return {"xla_dump_hlo_pass_re": "^(" + "|".join(re.escape(p) for p in PROPAGATION_PASSES) + ")$"}


def sharding_dump(directory: str | Path) -> str | None:
    """The text of the module as the last sharding propagation left it, from XLA's dump in
    ``directory`` (None if XLA wrote none: another toolchain, a pass of another name)."""
    after = re.compile(r"\.(\d+)\.[^/]*\.after_(" + "|".join(map(re.escape, PROPAGATION_PASSES)) + r")\.")
    found = [(int(m[1]), path) for path in Path(directory).glob("*.txt") if (m := after.search(path.name))]
    if not found:
        return None
    try:
        return max(found)[1].read_text(errors="replace")
    except OSError:
        return None


MeshAxes = Mapping[str, int]
"""A mesh's axes in order, each with its size (``dict(mesh.shape)``)."""

_Mesh = tuple[tuple[str, int], ...]  # The same, hashable.


@dataclasses.dataclass(frozen=True)
class Split:
    """One array as sharding propagation left it: its global dimensions, per dimension the mesh axes
    that split it (None: a tile assignment read without the mesh) and into how many parts; and,
    for the rule, which part each device holds (``layout``) and the mesh its device ids are read on."""

    dims: tuple[int, ...]
    axes: tuple[tuple[str, ...], ...] | None
    ways: tuple[int, ...]
    layout: tuple[Any, ...] | None = dataclasses.field(default=None, repr=False, compare=False)
    mesh: _Mesh | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def over(self) -> tuple[str, ...] | None:
        """Every mesh axis that splits it, in dimension order (None where they are not known)."""
        if self.axes is None:
            return None
        return tuple(dict.fromkeys(a for axes in self.axes for a in axes))

    @property
    def split(self) -> int:
        """Into how many parts it is split (its per-device copies are this many times smaller)."""
        return math.prod(self.ways)

    @property
    def elements(self) -> int:
        """Elements in all (its global shape's)."""
        return math.prod(self.dims)

    @property
    def local_elements(self) -> int:
        """Elements per device (a dimension that does not divide is padded, as XLA pads it)."""
        return math.prod(-(-d // w) for d, w in zip(self.dims, self.ways))

    def tiles(self) -> tuple[tuple[int, ...], ...] | None:
        """Per device id, the index of the piece it holds (one per dimension); None if not known."""
        return _device_tiles(self.layout) if self.layout is not None else None


def _top_level(text: str, open_char: str = "{", close_char: str = "}") -> list[str]:
    """The bracketed groups at the top level of ``text``, without their brackets."""
    groups, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == open_char:
            if depth == 0:
                start = i + 1
            depth += 1
        elif char == close_char:
            depth -= 1
            if depth == 0:
                groups.append(text[start:i])
    return groups


_AXIS = re.compile(r"^\s*'([^']+)'\s*=\s*(\d+)\s*$")
_DIM_AXIS = re.compile(r"'([^']+)'(?::\((\d+)\)(\d+))?")
_V2 = re.compile(r"^\{devices=\[([\d,]+)\](.*?)(\s+last_tile_dim_replicate)?(?:\s+last_tile_dims=\{([^}]*)\})?\}$", re.S)


def parse_sharding(text: str, dims: Sequence[int], mesh: MeshAxes | None = None) -> Split | None:
    """An array's ``sharding={...}`` (the braces included) as a :class:`Split`; ``dims`` its global
    shape, ``mesh`` the axes a tile assignment's device ids are read against. None for what does not
    say how one array is split (a tuple's, a single device's, a shard_map's, a form not read here).

    Example:
        >>> parse_sharding("{mesh['data'=2,'model'=4], [{'data'}, {'model':(1)2}]}", (8, 8))
        Split(dims=(8, 8), axes=(('data',), ('model',)), ways=(2, 2))
        >>> parse_sharding("{devices=[1,4,4]<=[4,4]T(1,0) last_tile_dim_replicate}", (16, 8), {"fsdp": 4, "tp": 4})
        Split(dims=(16, 8), axes=((), ('tp',)), ways=(1, 4))
        >>> parse_sharding("{replicated}", (16, 8)), parse_sharding("{maximal device=0}", (16, 8))
        (Split(dims=(16, 8), axes=((), ()), ways=(1, 1)), None)
    """
    text, dims = text.strip(), tuple(dims)
    if text.startswith("{{") or "manual" in text:
        return None  # A tuple's; or inside a shard_map, where shapes are already per device.
    if text.startswith("{mesh["):
        return _named(text, dims)
    if text == "{replicated}":
        return Split(dims, ((),) * len(dims), (1,) * len(dims), ("replicated",),
                     tuple(mesh.items()) if mesh else None)
    v2 = _V2.match(text)
    if not v2:
        return None
    tiles = tuple(int(t) for t in v2[1].split(","))
    extra = (1 if v2[3] else 0) + (len([s for s in v2[4].split(",") if s.strip()]) if v2[4] else 0)
    if len(tiles) != len(dims) + extra:
        return None
    layout = ("tiled", v2[2].strip(), tiles, len(dims))
    if _device_tiles(layout) is None:
        return None
    known = tuple(mesh.items()) if mesh and math.prod(mesh.values()) == math.prod(tiles) else None
    axes = _tiled_axes(layout, known) if known else None
    return Split(dims, axes, tiles[:len(dims)], layout, known)


def _named(text: str, dims: tuple[int, ...]) -> Split | None:
    """``{mesh['x'=2,...], [{'x'}, {}, ...]}`` or ``{mesh[...], replicated}`` (a sub-axis ``'x':(pre)size``)."""
    header = _top_level(text[len("{mesh"):], "[", "]")
    if not header:
        return None
    items = [_AXIS.match(item) for item in header[0].split(",")] if header[0].strip() else []
    if not all(items):  # A mesh given otherwise (its device order listed, say): not read here.
        return None
    mesh: _Mesh = tuple((m[1], int(m[2])) for m in items if m)
    sizes = dict(mesh)
    rest = text[len("{mesh") + len(header[0]) + 2:].lstrip(", ")
    if rest.startswith("replicated"):
        return Split(dims, ((),) * len(dims), (1,) * len(dims), ("replicated",), mesh)
    groups = _top_level((_top_level(rest, "[", "]") or [""])[0]) if rest.startswith("[") else []
    if len(groups) != len(dims):
        return None
    axes, ways, parts = [], [], []
    for group in groups:
        names, count, dim_parts = [], 1, []
        for name, pre, size in _DIM_AXIS.findall(group):
            if name not in sizes:
                return None
            pre_size, part = (int(pre), int(size)) if size else (1, sizes[name])
            if sizes[name] % (pre_size * part):
                return None
            names.append(name)
            count *= part
            dim_parts.append((name, pre_size, part))
        axes.append(tuple(dict.fromkeys(names)))
        ways.append(count)
        parts.append(tuple(dim_parts))
    return Split(dims, tuple(axes), tuple(ways), ("named", mesh, tuple(parts)), mesh)


@functools.lru_cache(maxsize=256)
def _coords(mesh: _Mesh) -> tuple[tuple[int, ...], ...]:
    """Per device id, its coordinate on each mesh axis (ids are row-major positions in the mesh)."""
    sizes = [size for _, size in mesh]
    out = []
    for device in range(math.prod(sizes)):
        coord = []
        for size in reversed(sizes):
            coord.append(device % size)
            device //= size
        out.append(tuple(reversed(coord)))
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _device_tiles(layout: tuple[Any, ...]) -> tuple[tuple[int, ...], ...] | None:
    """Per device id, the index of the piece it holds along each dimension (a program has few
    distinct layouts, each worked out once); None if the layout cannot be read."""
    if layout[0] == "replicated":
        return None
    if layout[0] == "named":
        _, mesh, parts = layout
        sizes = dict(mesh)
        names = [name for name, _ in mesh]
        out = []
        for coord in _coords(mesh):
            index = []
            for dim_parts in parts:
                tile = 0
                for name, pre, size in dim_parts:
                    digit = (coord[names.index(name)] // (sizes[name] // (pre * size))) % size
                    tile = tile * size + digit
                index.append(tile)
            out.append(tuple(index))
        return tuple(out)
    _, assignment, tiles, rank = layout
    ids = _tile_ids(assignment, tiles)
    if ids is None or sorted(ids) != list(range(len(ids))):
        return None
    strides = [math.prod(tiles[i + 1:]) for i in range(len(tiles))]
    held: list[tuple[int, ...]] = [()] * len(ids)
    for flat, device in enumerate(ids):
        held[device] = tuple((flat // strides[d]) % tiles[d] for d in range(rank))
    return tuple(held)


def _tile_ids(text: str, tiles: Sequence[int]) -> list[int] | None:
    """The device ids of a tile assignment, in row-major tile order: ``<=[dims]T(perm)`` (an iota
    reshaped and transposed) or a list."""
    count = math.prod(tiles)
    iota = re.fullmatch(r"<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if iota:
        shape = [int(d) for d in iota[1].split(",")]
        perm = [int(p) for p in iota[2].split(",")] if iota[2] else list(range(len(shape)))
        if math.prod(shape) != count or sorted(perm) != list(range(len(shape))):
            return None
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        out_shape = [shape[p] for p in perm]
        ids = []
        for flat in range(count):
            index, rest = [], flat
            for size in reversed(out_shape):
                index.append(rest % size)
                rest //= size
            index.reverse()
            ids.append(sum(index[k] * strides[perm[k]] for k in range(len(perm))))
        return ids
    listed = [int(i) for i in re.findall(r"\d+", text)]
    return listed if len(listed) == count else None


@functools.lru_cache(maxsize=1024)
def _tiled_axes(layout: tuple[Any, ...], mesh: _Mesh) -> tuple[tuple[str, ...], ...] | None:
    """Per dimension of a tile assignment, the mesh axes that split it: those along which two
    devices, alike on every other axis, hold different pieces of that dimension."""
    held = _device_tiles(layout)
    if held is None:
        return None
    sizes, names = [size for _, size in mesh], [name for name, _ in mesh]
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    found: list[set[int]] = [set() for _ in range(layout[3])]
    for device, coord in enumerate(_coords(mesh)):
        for i, size in enumerate(sizes):
            if coord[i] + 1 < size:
                neighbour = held[device + strides[i]]
                found = [axes | {i} if held[device][d] != neighbour[d] else axes for d, axes in enumerate(found)]
    return tuple(tuple(names[i] for i in sorted(axes)) for axes in found)


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
    coords, names = _coords(mesh), [name for name, _ in mesh]
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


@dataclasses.dataclass
class Shardings:
    """The program as sharding propagation left it: each op's :class:`Split` by (JAX op name,
    source line), and the entry parameters' by number."""

    ops: dict[tuple[str, str | None], list[Split]] = dataclasses.field(default_factory=dict)
    parameters: dict[int, Split] = dataclasses.field(default_factory=dict)

    def candidates(self, name: str, source: str | None) -> list[Split]:
        """The ops of this name and line; failing that, of this line and the last part of the name
        (a name stack another caller prefixed)."""
        exact = self.ops.get((name, source))
        if exact or source is None:
            return exact or []
        last = name.rsplit("/", 1)[-1]
        return [s for (other, line), splits in self.ops.items() if line == source and other.rsplit("/", 1)[-1] == last
                for s in splits]


def read_shardings(text: str, mesh: MeshAxes | Callable[[], MeshAxes | None] | None = None) -> Shardings:
    """:class:`Shardings` from a module's text as XLA dumped it after sharding propagation (see
    :func:`sharding_dump`); ``mesh`` (or a function giving it, called only for a tile assignment)
    names the axes of a tile assignment."""
    frames = stack_frames(text)
    out = Shardings()
    axes: list[MeshAxes | None] = []

    def mesh_axes() -> MeshAxes | None:
        if not axes:
            axes.append(mesh() if callable(mesh) else mesh)
        return axes[0]

    entry = False
    for depth, _, line in logical_lines(text):  # Statements whole: a kernel's config may hold newlines.
        if depth == 0:
            entry = line.startswith("ENTRY")
            continue
        if line.strip() == "}":
            entry = False
            continue
        start = line.find(", sharding={")
        if start < 0:
            continue
        inst = parse_instruction(line)
        if inst is None or len(inst.arrays) != 1:
            continue
        shard_text = line[start + len(", sharding="):]
        shard_text = shard_text[:_closing(shard_text)]
        split = parse_sharding(shard_text, inst.arrays[0].dims, None if "mesh[" in shard_text else mesh_axes())
        if split is None:
            continue
        if inst.opcode == "parameter" and entry and inst.int_arg is not None:
            out.parameters[inst.int_arg] = split
            continue
        name = metadata(inst, "op_name")
        if name:
            out.ops.setdefault((name, instruction_source(inst, frames)), []).append(split)
    return out


def _closing(text: str) -> int:
    """Index just past the brace that closes the one ``text`` starts with."""
    depth = 0
    for i, char in enumerate(text):
        depth += char == "{"
        depth -= char == "}"
        if depth == 0:
            return i + 1
    return len(text)


class BatchInput(NamedTuple):
    """A batch input whose leading dimension is split over devices."""

    path: str  # "batch/tokens"
    size: int  # Its whole leading dimension (the global batch).
    ways: int  # Over how many devices it is split.
    parameter: int | None = None  # Its entry parameter's number (whose sharding says where its rows are).


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
    split: int  # How many ways this buffer is split (its global elements over its per-device ones).
    batch_axes: tuple[str, ...] = ()  # The mesh axes that split the input (empty: not known).
    split_axes: tuple[str, ...] = ()  # The mesh axes that split this buffer.
    replicated: tuple[str, ...] = ()  # The input's axes this buffer is (partly) replicated over.
    shards: int = 0  # How many of the input's shards each device's copy serves (0: not known).
    library: str | None = None  # The model library's own line, when it is not ``source`` (figures.frames).

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

    def to_json(self) -> dict[str, Any]:
        out = {**dataclasses.asdict(self), "batch_axes": list(self.batch_axes), "split_axes": list(self.split_axes),
               "replicated": list(self.replicated)}
        if self.library is None or self.library == self.source:
            del out["library"]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Unsharded":
        return cls(int(data["bytes"]), str(data["name"]), str(data["shape"]), data.get("source"), str(data["input"]),
                   int(data["batch"]), int(data["ways"]), int(data["split"]),
                   *(tuple(str(a) for a in data.get(key) or ()) for key in ("batch_axes", "split_axes", "replicated")),
                   int(data.get("shards", 0)), data.get("library"))


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
