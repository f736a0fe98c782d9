"""Loop-aware FLOPs and collectives from a compiled program's optimized HLO text.

XLA's ``cost_analysis()`` counts a while loop's body once, so a model whose
layers run under ``lax.scan`` (or whose matmuls the SPMD partitioner turned
into windowed-einsum loops) reports a fraction of its real work. Here every
computation is weighed by how often it runs: a while body by its trip count
(read from the loop condition, the loop's initial tuple and the body's counter
update), a fusion or call by its caller's count.

What is counted:
- FLOPs of ``dot`` and ``convolution`` exactly (2 per multiply-add; a
  convolution's padding and dilation holes are not counted), wherever they sit
  (fusions, loop bodies, async computations). Elementwise work is not counted:
  the figure is the matrix-unit work, which dominates any model worth gating.
- Collectives by kind, each once (an async ``*-start`` counts, its ``*-done``
  does not), with the bytes of its larger side (all-gather: the gathered
  result; reduce-scatter: the input), per device.

Example (a loop of 4 matmuls, compiled for host CPU devices):
    >>> import jax, jax.numpy as jnp
    >>> from aotcheck import compile_function
    >>> x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    >>> compiled = compile_function(lambda x, w: jax.lax.fori_loop(0, 4, lambda i, y: y @ w, x), x, x,
    ...                             topology="cpu-1")
    >>> analysis = analyze_hlo(compiled.as_text())
    >>> [(loop.trip_count, loop.flops_per_trip) for loop in iter_loops(analysis)]
    [(4, 1024.0)]
    >>> analysis.flops  # 4 trips x 2 x 8^3
    4096.0
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterator

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
    "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "token": 0,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%(\S+)\s+\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%(\S+)\s*=\s*")


@dataclasses.dataclass(frozen=True)
class Array:
    dtype: str
    dims: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def bytes(self) -> float:
        return self.elements * _DTYPE_BYTES.get(self.dtype, 1 if self.dtype.startswith("f8") else 4)


def parse_arrays(type_text: str) -> list[Array]:
    """All array types in a (possibly tuple) HLO type string, in order."""
    out = []
    for dtype, dims in _ARRAY.findall(type_text):
        if dtype in _DTYPE_BYTES or dtype.startswith("f8"):
            out.append(Array(dtype, tuple(int(d) for d in dims.split(",") if d)))
    return out


@dataclasses.dataclass
class Instruction:
    name: str
    type_text: str
    opcode: str
    operands: list[str]
    args: str  # Raw text inside the parentheses: a parameter's index, a constant's value.
    attrs: str
    is_root: bool

    @property
    def int_arg(self) -> int | None:
        match = re.fullmatch(r"\s*(-?\d+)\s*", self.args)
        return int(match[1]) if match else None

    @property
    def arrays(self) -> list[Array]:
        return parse_arrays(self.type_text)

    def attr(self, key: str) -> str | None:
        match = re.search(rf"\b{re.escape(key)}=(\{{[^}}]*\}}|[^,\s]+)", self.attrs)
        return match[1] if match else None

    def called(self, key: str) -> list[str]:
        value = self.attr(key)
        if not value:
            return []
        return [v.strip().lstrip("%") for v in value.strip("{}").split(",") if v.strip()]


@dataclasses.dataclass
class Computation:
    name: str
    instructions: dict[str, Instruction]
    root: Instruction | None
    is_entry: bool


def _matching(text: str, start: int, open_char: str, close_char: str) -> int:
    """Index just past the bracket that closes the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def parse_instruction(line: str) -> Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    pos = match.end()
    if line.startswith("(", pos):
        end = _matching(line, pos, "(", ")")
    else:
        end = line.find(" ", pos)
    type_text = line[pos:end]
    rest = line[end:].lstrip()
    op = re.match(r"([\w\-\.]+)\(", rest)
    if not op:
        return None
    close = _matching(rest, op.end() - 1, "(", ")")
    args = rest[op.end():close - 1]
    operands = re.findall(r"%([\w\.\-]+)", args)
    return Instruction(match[2], type_text, op[1], operands, args, rest[close:], bool(match[1]))


_UNPREFIXED = re.compile(r"^(\s*(?:ROOT\s+)?)(?!%)([\w.\-]+\s*=)")


def lowered_instructions(text: str) -> Iterator[Instruction]:
    r"""Every instruction of a module's text in order, names printed with ``%`` (a compiled
    program's) or without (``lowered.as_text(dialect="hlo")``).

    Example:
        >>> [i.opcode for i in lowered_instructions("ENTRY m {\n  p.1 = f32[4]{0} parameter(0)\n}")]
        ['parameter']
    """
    for line in text.splitlines():
        inst = parse_instruction(_UNPREFIXED.sub(r"\1%\2", line, count=1))
        if inst is not None:
            yield inst


def parse_module(text: str) -> dict[str, Computation]:
    """Computations of an HLO module's text, by name."""
    computations: dict[str, Computation] = {}
    current: Computation | None = None
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header:
                current = Computation(header[2], {}, None, bool(header[1]))
            continue
        if line.startswith("}"):
            computations[current.name] = current
            current = None
            continue
        inst = parse_instruction(line)
        if inst:
            current.instructions[inst.name] = inst
            if inst.is_root:
                current.root = inst
    return computations


def short_source(path: str, line: str | int) -> str:
    """``file:line``, the file as a reader finds it: relative to the working directory, else from its
    top-level package (``aotcheck/models/lm.py``) or its site-packages, else its base name.

    Example:
        >>> short_source(os.path.join(os.getcwd(), "models", "lm.py"), 88)
        'models/lm.py:88'
        >>> import tempfile
        >>> package = os.path.join(tempfile.mkdtemp(), "pkg", "models")
        >>> os.makedirs(package)
        >>> for d in (package, os.path.dirname(package)):
        ...     open(os.path.join(d, "__init__.py"), "w").close()
        >>> short_source(os.path.join(package, "lm.py"), 12)
        'pkg/models/lm.py:12'
        >>> short_source("/venv/lib/python3.11/site-packages/flax/linen/linear.py", 12)
        'flax/linen/linear.py:12'
        >>> short_source("/elsewhere/model.py", 7)
        'model.py:7'
    """
    here = os.getcwd() + os.sep
    if path.startswith(here):
        return f"{path[len(here):]}:{line}"
    if "site-packages" + os.sep in path:
        return f"{path.split('site-packages' + os.sep, 1)[1]}:{line}"
    top = os.path.dirname(path)
    while os.path.exists(os.path.join(top, "__init__.py")):
        top = os.path.dirname(top)
    if top != os.path.dirname(path):
        return f"{os.path.relpath(path, top)}:{line}"
    return f"{os.path.basename(path)}:{line}"


_TABLE_ROW = re.compile(r"^(\d+) (.*)$")


def stack_frames(text: str) -> dict[int, str]:
    """Stack frame id -> ``file:line`` of the Python line it names, from an HLO module's frame tables.

    An instruction's ``metadata={... stack_frame_id=N}`` points into these tables
    (``FileNames``, ``FileLocations``, ``StackFrames``), printed before the first
    computation. The line chosen for a frame is its innermost one outside installed
    packages (the user's model or step, not optax's internals); the innermost if all are.

    Example:
        >>> stack_frames('''HloModule m
        ... FileNames
        ... 1 "/venv/lib/python3.11/site-packages/optax/_src/base.py"
        ... 2 "/elsewhere/model.py"
        ...
        ... FunctionNames
        ... 1 "loss"
        ...
        ... FileLocations
        ... 1 {file_name_id=2 function_name_id=1 line=88 end_line=88 column=4 end_column=4}
        ... 2 {file_name_id=1 function_name_id=1 line=12 end_line=12 column=4 end_column=4}
        ...
        ... StackFrames
        ... 1 {file_location_id=1 parent_frame_id=1}
        ... 2 {file_location_id=2 parent_frame_id=2}
        ... ''')
        {1: 'model.py:88', 2: 'model.py:88'}
    """
    tables: dict[str, dict[int, str]] = {}
    table = None
    for line in text.splitlines():
        if line.startswith(("ENTRY", "%")):
            break
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table = tables.setdefault(line, {})
            continue
        row = _TABLE_ROW.match(line)
        if table is not None and row:
            table[int(row[1])] = row[2]
    files = {k: v.strip('"') for k, v in tables.get("FileNames", {}).items()}
    locations = {}
    for k, v in tables.get("FileLocations", {}).items():
        found = re.search(r"file_name_id=(\d+).*?\bline=(\d+)", v)
        if found and int(found[1]) in files:
            locations[k] = (files[int(found[1])], int(found[2]))
    frames = {}
    for k, v in tables.get("StackFrames", {}).items():
        found = re.search(r"file_location_id=(\d+) parent_frame_id=(\d+)", v)
        if found:
            frames[k] = (int(found[1]), int(found[2]) - 1)  # Printed parent ids are one past (0: no parent).
    out = {}
    for frame in frames:
        chain, seen, current = [], set(), frame
        while current in frames and current not in seen:
            seen.add(current)
            location = locations.get(frames[current][0])
            if location:
                chain.append(location)
            current = frames[current][1]
        pick = next((loc for loc in chain if "site-packages" not in loc[0]), chain[0] if chain else None)
        if pick:
            out[frame] = short_source(*pick)
    return out


def metadata(inst: Instruction, key: str) -> str | None:
    """One field of an instruction's ``metadata={...}`` (``op_name``, ``source_line``, ...), or None."""
    match = re.search(rf'\b{key}=("([^"]*)"|\d+)', inst.attrs)
    return None if not match else (match[2] if match[2] is not None else match[1])


def instruction_source(inst: Instruction, frames: dict[int, str]) -> str | None:
    """The Python line that made ``inst``: its ``source_file``/``source_line``, or its stack frame's."""
    file, line = metadata(inst, "source_file"), metadata(inst, "source_line")
    if file and line:
        return short_source(file, line)
    frame = metadata(inst, "stack_frame_id")
    return frames.get(int(frame)) if frame else None


# --- FLOPs of one instruction ------------------------------------------------------


def _dims(text: str | None) -> list[int]:
    return [int(d) for d in (text or "").strip("{}").split(",") if d.strip()]


def dot_flops(inst: Instruction, comp: Computation) -> float:
    lhs = comp.instructions.get(inst.operands[0]) if inst.operands else None
    if lhs is None or not lhs.arrays or not inst.arrays:
        return 0.0
    lhs_dims = lhs.arrays[0].dims
    contracting = math.prod(lhs_dims[d] for d in _dims(inst.attr("lhs_contracting_dims")))
    return 2.0 * inst.arrays[0].elements * contracting


def _window_field(window: str, key: str, n: int, default: int) -> list[int]:
    match = re.search(rf"\b{key}=([0-9x_\-]+)", window)
    if not match:
        return [default] * n
    return [int(v) for v in match[1].split("x")]


def _valid_pairs(out: int, kernel: int, size_in: int, stride: int, pad_low: int, lhs_dil: int, rhs_dil: int) -> int:
    """(output position, kernel position) pairs that read a real input element."""
    dilated_in = (size_in - 1) * lhs_dil + 1
    count = 0
    for k in range(kernel):
        offset = k * rhs_dil - pad_low
        for o in range(out):
            i = o * stride + offset
            if 0 <= i < dilated_in and i % lhs_dil == 0:
                count += 1
    return count


def convolution_flops(inst: Instruction, comp: Computation) -> float:
    if len(inst.operands) < 2 or not inst.arrays:
        return 0.0
    lhs, rhs = (comp.instructions.get(o) for o in inst.operands[:2])
    labels = inst.attr("dim_labels")
    if lhs is None or rhs is None or not labels or not lhs.arrays or not rhs.arrays:
        return 0.0
    lhs_labels, rest = labels.split("_", 1)
    rhs_labels, out_labels = rest.split("->")
    lhs_shape, rhs_shape, out_shape = lhs.arrays[0].dims, rhs.arrays[0].dims, inst.arrays[0].dims
    spatial = sorted(c for c in lhs_labels if c.isdigit())
    window = inst.attr("window") or ""
    n = len(spatial)
    strides = _window_field(window, "stride", n, 1)
    lhs_dil = _window_field(window, "lhs_dilate", n, 1)
    rhs_dil = _window_field(window, "rhs_dilate", n, 1)
    pads = re.search(r"\bpad=([0-9_x\-]+)", window)
    pad_low = [int(p.split("_")[0]) for p in pads[1].split("x")] if pads else [0] * n
    pairs = 1
    for j, s in enumerate(spatial):
        pairs *= _valid_pairs(
            out_shape[out_labels.index(s)], rhs_shape[rhs_labels.index(s)], lhs_shape[lhs_labels.index(s)],
            strides[j], pad_low[j], lhs_dil[j], rhs_dil[j],
        )
    feature_groups = int(inst.attr("feature_group_count") or 1)
    batch_groups = int(inst.attr("batch_group_count") or 1)
    in_features = lhs_shape[lhs_labels.index("f")] // feature_groups
    out_features = rhs_shape[rhs_labels.index("o")]
    batch = lhs_shape[lhs_labels.index("b")] // batch_groups
    return 2.0 * batch * out_features * in_features * pairs


# --- Trip counts ---------------------------------------------------------------------

_PASS_THROUGH = {"copy", "bitcast", "convert", "reshape"}


def _resolve(comp: Computation, name: str, module: dict[str, Computation], depth: int = 0) -> tuple[str, int] | None:
    """What a scalar value is: ("gte", tuple index of the parameter), ("const", n), or None."""
    inst = comp.instructions.get(name)
    if inst is None or depth > 8:
        return None
    if inst.opcode == "constant":
        return ("const", inst.int_arg) if inst.int_arg is not None else None
    if inst.opcode == "get-tuple-element" and inst.operands:
        source = comp.instructions.get(inst.operands[0])
        if source is not None and source.opcode == "parameter":
            return ("gte", int(inst.attr("index") or 0))
        return None
    if inst.opcode in _PASS_THROUGH and inst.operands:
        return _resolve(comp, inst.operands[0], module, depth + 1)
    return None


def _compare_in(comp: Computation, module: dict[str, Computation]) -> tuple[Computation, Instruction, list] | None:
    """The loop condition's compare, following a fused root into its computation.

    Returns (computation holding it, compare, operand bindings): for a fused
    compare, each fused parameter is bound to the outer operand's resolution.
    """
    root = comp.root
    if root is None:
        return None
    if root.opcode == "compare":
        return comp, root, [_resolve(comp, o, module) for o in root.operands]
    if root.opcode == "fusion":
        inner = module.get((root.called("calls") or [""])[0])
        if inner is None or inner.root is None or inner.root.opcode != "compare":
            return None
        outer = [_resolve(comp, o, module) for o in root.operands]
        bindings = []
        for operand in inner.root.operands:
            inst = inner.instructions.get(operand)
            if inst is not None and inst.opcode == "parameter":
                index = inst.int_arg
                bindings.append(outer[index] if index is not None and index < len(outer) else None)
            else:
                bindings.append(_resolve(inner, operand, module))
        return inner, inner.root, bindings
    return None


def trip_count(loop: Instruction, caller: Computation, module: dict[str, Computation]) -> int | None:
    """A while loop's trip count, or None when it cannot be read off the HLO."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attrs)
    if known:
        return int(known[1])
    cond = module.get((loop.called("condition") or [""])[0])
    body = module.get((loop.called("body") or [""])[0])
    if cond is None or body is None:
        return None
    found = _compare_in(cond, module)
    if found is None:
        return None
    _, compare, bindings = found
    direction = compare.attr("direction")
    if len(bindings) != 2 or None in bindings:
        return None
    (kind_a, a), (kind_b, b) = bindings
    if kind_a == "gte" and kind_b == "const":
        index, limit = a, b
    elif kind_a == "const" and kind_b == "gte":
        index, limit = b, a
        direction = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, direction)
    else:
        return None
    start = _initial_value(loop, caller, index, module)
    step = _step(body, index, module)
    if start is None or step is None or step == 0:
        return None
    if direction == "LT" and step > 0:
        return max(0, -(-(limit - start) // step))
    if direction == "LE" and step > 0:
        return max(0, (limit - start) // step + 1)
    if direction == "GT" and step < 0:
        return max(0, -(-(start - limit) // -step))
    if direction == "GE" and step < 0:
        return max(0, (start - limit) // -step + 1)
    return None


def _initial_value(loop: Instruction, caller: Computation, index: int, module: dict[str, Computation]) -> int | None:
    init = caller.instructions.get(loop.operands[0]) if loop.operands else None
    if init is None or init.opcode != "tuple" or index >= len(init.operands):
        return None
    value = _resolve(caller, init.operands[index], module)
    return value[1] if value and value[0] == "const" else None


def _step(body: Computation, index: int, module: dict[str, Computation]) -> int | None:
    root = body.root
    if root is None or root.opcode != "tuple" or index >= len(root.operands):
        return None
    update = body.instructions.get(root.operands[index])
    if update is None or update.opcode not in ("add", "subtract") or len(update.operands) != 2:
        return None
    a, b = (_resolve(body, o, module) for o in update.operands)
    if a == ("gte", index) and b and b[0] == "const":
        return b[1] if update.opcode == "add" else -b[1]
    if b == ("gte", index) and a and a[0] == "const" and update.opcode == "add":
        return a[1]
    return None


# --- The walk ------------------------------------------------------------------------


@dataclasses.dataclass
class CollectiveStats:
    count: int = 0
    bytes: float = 0.0


@dataclasses.dataclass
class Loop:
    """A while loop and what one trip of it costs."""

    name: str
    op_name: str
    trip_count: int | None
    multiplier: int  # How often the loop itself runs.
    flops_per_trip: float = 0.0


@dataclasses.dataclass
class HloAnalysis:
    """Loop-aware totals of one program, per device."""

    flops: float = 0.0
    collectives: dict[str, CollectiveStats] = dataclasses.field(
        default_factory=lambda: {k: CollectiveStats() for k in COLLECTIVES}
    )
    loops: list[Loop] = dataclasses.field(default_factory=list)
    unknown_trip_counts: int = 0
    top_ops: list[tuple[float, str, int]] = dataclasses.field(default_factory=list)  # (flops, op, multiplier)
    # (kind, op_name, source line) -> count and bytes, loop-aware.
    collective_ops: dict[tuple[str, str, str | None], CollectiveStats] = dataclasses.field(default_factory=dict)


def _collective_kind(opcode: str) -> str | None:
    base = opcode.removesuffix("-start")
    return base if base in COLLECTIVES and not opcode.endswith(("-done", "-update")) else None


def _collective_bytes(inst: Instruction, comp: Computation) -> float:
    """The larger side of a collective: its largest result array or its operands' total."""
    result = max((a.bytes for a in inst.arrays), default=0.0)
    operands = sum(
        src.arrays[0].bytes for o in inst.operands if (src := comp.instructions.get(o)) is not None and src.arrays
    )
    return max(result, operands)


def _op_name(inst: Instruction) -> str:
    return metadata(inst, "op_name") or inst.name


@dataclasses.dataclass(frozen=True)
class CollectiveOp:
    """The collectives one JAX op became, loop-aware: how many run per step and their bytes per device."""

    kind: str
    name: str  # JAX's name stack (``op_name``) of the op, or the HLO instruction's name.
    source: str | None
    count: int
    bytes: int

    @property
    def key(self) -> tuple[str, str, str | None]:
        """What identifies a collective across two compiles of one case (one op can make several)."""
        return self.kind, self.name, self.source

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "CollectiveOp":
        return cls(str(data["kind"]), str(data["name"]), data.get("source"), int(data["count"]), int(data["bytes"]))


def top_collectives(analysis: "HloAnalysis", limit: int = 10) -> list[CollectiveOp]:
    """The ``limit`` collectives that move the most bytes per step."""
    ops = [CollectiveOp(kind, name, source, stats.count, int(stats.bytes))
           for (kind, name, source), stats in analysis.collective_ops.items()]
    return sorted(ops, key=lambda op: (-op.bytes, -op.count, op.kind, op.name))[:limit]


def analyze_hlo(text: str, *, module: dict[str, Computation] | None = None) -> HloAnalysis:
    """Walks the module from its entry, weighing each computation by how often it runs.

    ``module``: the text's parse, when the caller has one already.
    """
    module = module if module is not None else parse_module(text)
    frames = stack_frames(text)
    entry = next((c for c in module.values() if c.is_entry), None)
    result = HloAnalysis()
    if entry is None:
        return result
    ops: dict[str, list] = defaultdict(lambda: [0.0, 0])

    def walk(comp: Computation, multiplier: int, depth: int = 0) -> float:
        if depth > 64:
            return 0.0
        total = 0.0
        for inst in comp.instructions.values():
            flops = 0.0
            if inst.opcode == "dot":
                flops = dot_flops(inst, comp)
            elif inst.opcode == "convolution":
                flops = convolution_flops(inst, comp)
            if flops:
                total += flops
                key = _op_name(inst)
                ops[key][0] += flops * multiplier
                ops[key][1] = max(ops[key][1], multiplier)
            kind = _collective_kind(inst.opcode)
            if kind:
                size = multiplier * _collective_bytes(inst, comp)
                origin = (kind, _op_name(inst), instruction_source(inst, frames))
                for stats in (result.collectives[kind], result.collective_ops.setdefault(origin, CollectiveStats())):
                    stats.count += multiplier
                    stats.bytes += size
            if inst.opcode == "while":
                count = trip_count(inst, comp, module)
                if count is None:
                    result.unknown_trip_counts += 1
                inner = Loop(inst.name, _op_name(inst), count, multiplier)
                result.loops.append(inner)
                body = module.get((inst.called("body") or [""])[0])
                if body is not None:
                    per_trip = walk(body, multiplier * (count if count is not None else 1), depth + 1)
                    inner.flops_per_trip = per_trip
                    total += per_trip * (count if count is not None else 1)
            elif inst.opcode == "conditional":
                branches = inst.called("branch_computations") or (
                    inst.called("true_computation") + inst.called("false_computation")
                )
                # One branch runs: FLOPs of the costliest (an upper bound); collectives of all.
                costs = [walk(module[b], multiplier, depth + 1) for b in branches if b in module]
                total += max(costs, default=0.0)
            elif not inst.opcode.endswith(("-done", "-update")):
                # Every called computation runs as often as its caller: fusions, calls, async
                # starts (7x runs collectives in call-start(..., async_execution_thread=
                # "sparsecore")), custom calls. A `*-done` names its start's computation again.
                # A reducer's to_apply is scalar arithmetic; only a call's is a real body.
                is_call = inst.opcode in ("call", "call-start")
                for name in inst.called("calls") + (inst.called("to_apply") if is_call else []):
                    if name in module:
                        total += walk(module[name], multiplier, depth + 1)
        return total

    result.flops = walk(entry, 1)
    result.top_ops = sorted(((f, name, m) for name, (f, m) in ops.items()), reverse=True)[:10]
    return result


def iter_loops(analysis: HloAnalysis) -> Iterator[Loop]:
    return iter(sorted(analysis.loops, key=lambda l: -(l.flops_per_trip * (l.trip_count or 1) * l.multiplier)))
