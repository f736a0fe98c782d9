r"""How XLA split each array, read from XLA itself: the module as its sharding propagation left it.

Before the partitioner, the module XLA dumps after its sharding propagation (asked of the same
compile by :func:`dump_options`, found by :func:`sharding_dump`) gives every op its global shape and
its sharding, the entry parameters' too. jax 0.12's libtpu writes a sharding by mesh axis
(``{mesh['fsdp'=4,'tp'=4], [{}, {'tp'}, {}]}``, a sub-axis as ``{'data':(1)4}``), older ones as a
tile assignment of device ids (``{devices=[1,4,4]<=[4,4]T(1,0) last_tile_dim_replicate}``, named here
against the mesh: HLO's device ids are positions in the mesh's devices, row-major). Either way it
says which part of the array each device holds (:meth:`Split.tiles`), so two arrays can be compared
device by device: what the lint of :mod:`aotcheck.figures.sharding` rests on.

Example (a batch of 16 rows split 4 ways over ``data``; an op that keeps it whole on every device):
    >>> found = read_shardings("\n".join([
    ...     "ENTRY %main (p.0: s32[16,256]) -> f32[16,256] {",
    ...     "  %p.0 = s32[16,256]{1,0} parameter(0), sharding={mesh['data'=4], [{'data'}, {}]}",
    ...     "  %exp.1 = f32[16,256]{1,0} exponential(%p.0), sharding={mesh['data'=4], [{}, {}]}, "
    ...     'metadata={op_name="jit(step)/exp" source_file="/x/model.py" source_line=9}',
    ...     "}"]))
    >>> rows, [exp] = found.parameters[0], found.candidates("jit(step)/exp", "model.py:9")
    >>> rows
    Split(dims=(16, 256), axes=(('data',), ()), ways=(4, 1))
    >>> rows.tiles(), exp.tiles()  # Per device, the piece it holds: the op's one piece holds every row.
    (((0, 0), (1, 0), (2, 0), (3, 0)), ((0, 0), (0, 0), (0, 0), (0, 0)))
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aotcheck.figures.frames import instruction_source, metadata, stack_frames
from aotcheck.figures.hlo import logical_lines, parse_instruction

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
def device_coords(mesh: _Mesh) -> tuple[tuple[int, ...], ...]:
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
        for coord in device_coords(mesh):
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
    for device, coord in enumerate(device_coords(mesh)):
        for i, size in enumerate(sizes):
            if coord[i] + 1 < size:
                neighbour = held[device + strides[i]]
                found = [axes | {i} if held[device][d] != neighbour[d] else axes for d, axes in enumerate(found)]
    return tuple(tuple(names[i] for i in sorted(axes)) for axes in found)


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
