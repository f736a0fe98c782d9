"""FLOPs of one HLO instruction, per device: 2 per multiply-add of a ``dot``, ``convolution`` (its
padding and dilation holes not counted) or ``ragged-dot``, the textbook counts of XLA's other matrix
ops, a dot XLA rewrote as multiply + reduce, and a custom kernel's count (a cost registered for its
name, :mod:`aotcheck.figures.kernels`, else the one it declares).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import NamedTuple

from aotcheck.figures import hlo, kernels, ledger
from aotcheck.figures.hlo import Computation, Instruction


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


def ragged_dot_flops(inst: Instruction, comp: Computation) -> float:
    """A ``ragged-dot``: 2 per multiply-add each row really does. Ragged in a non-contracting
    dimension (MoE's routed experts: ``[M,K] x [G,K,N] -> [M,N]``) or a batch dimension, each
    output element sums over the contracting dimensions once, as in a dot; ragged in a contracting
    dimension (the weights' gradient: ``[K,M] x [M,N] -> [G,K,N]``), each of the ``M`` rows
    contributes to one group's output only, so the output's group dimension does not multiply.

    Example:
        >>> from aotcheck.figures.hlo import parse_module
        >>> module = parse_module('''ENTRY %m (x: bf16[64,16], w: bf16[4,16,32], g: s32[4]) -> bf16[64,32] {
        ...   %x = bf16[64,16]{1,0} parameter(0)
        ...   %w = bf16[4,16,32]{2,1,0} parameter(1)
        ...   %g = s32[4]{0} parameter(2)
        ...   ROOT %r = bf16[64,32]{1,0} ragged-dot(%x, %w, %g), lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}
        ... }''')
        >>> ragged_dot_flops(module["m"].root, module["m"])  # 2 * 64 * 16 * 32
        65536.0
    """
    flops = dot_flops(inst, comp)
    ragged = _dims(inst.attr("lhs_ragged_dims"))
    contracting = _dims(inst.attr("lhs_contracting_dims"))
    if ragged and ragged[0] in contracting and inst.arrays and inst.arrays[0].dims:
        flops /= inst.arrays[0].dims[0]  # The output's leading group dimension.
    return flops


_COST_FLOPS = re.compile(r'"cost_estimate"\s*:\s*\{[^{}]*?"flops"\s*:\s*"?(\d+)')


def declared_flops(inst: Instruction) -> float | None:
    """The FLOPs a kernel's custom call declares (a Pallas ``CostEstimate``), or None if it declares none.

    Example:
        >>> from aotcheck.figures.hlo import parse_instruction
        >>> declared_flops(parse_instruction('%k = f32[8]{0} custom-call(%a), custom_call_target="tpu_custom_call", '
        ...                                  'backend_config={"custom_call_config":{"cost_estimate":{"flops":"4096"}}}'))
        4096.0
    """
    match = _COST_FLOPS.search(inst.attrs)
    return float(match[1]) if match else None


def gemm_flops(inst: Instruction, comp: Computation) -> float:
    """A cuBLAS gemm custom call: 2 x the output's elements x the contracting size (its config's
    ``dot_dimension_numbers``; the first result is the output, a second the workspace)."""
    lhs = comp.instructions.get(inst.operands[0]) if inst.operands else None
    found = re.search(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]', inst.attrs)
    if lhs is None or not lhs.arrays or not inst.arrays or not found:
        return 0.0
    dims = [int(d) for d in re.findall(r"\d+", found[1])]
    return 2.0 * inst.arrays[0].elements * math.prod(lhs.arrays[0].dims[d] for d in dims)


def does_arithmetic(inst: Instruction) -> bool:
    """Whether a kernel touches floating-point data (an integer-only one, such as XLA's own ragged-dot
    metadata kernel, does no FLOPs worth counting)."""
    return any(a.dtype.startswith(("f", "bf", "c")) for a in inst.arrays)


def kernel_name(op_name: str) -> str:
    """A kernel's name from its op's JAX name stack: the last name before ``pallas_call``.

    Example:
        >>> kernel_name("jit(f)/while/body/vmap(splash)/splash_mha_fwd_no_residuals/pallas_call")
        'splash_mha_fwd_no_residuals'
        >>> kernel_name("jit(f)/while/body/eval_jaxpr/jit(flash_attention)/pallas_call")
        'flash_attention'
    """
    parts = [p for p in op_name.split("/") if p and p != "pallas_call"]
    name = parts[-1] if parts else op_name
    match = re.fullmatch(r"(?:jit|pjit|vmap|remat|checkpoint)\((.*)\)", name)
    return match[1] if match else name


# --- One instruction ---------------------------------------------------------------------

# Ops that carry a value through unchanged in what it holds (its type or layout aside).
_THROUGH = frozenset({"convert", "bitcast", "copy", "reshape", "copy-done"})

Outer = tuple[tuple[Computation, Instruction], ...]
"""The instructions (each with the computation that holds it) a computation was entered through,
innermost first: a fusion or call (its parameters are their operands) or a while loop (its parameter
is the loop's tuple): where a parameter's value comes from."""


def _carried_from(body: Computation, position: int) -> frozenset[int] | None:
    """The elements of a loop body's parameter whose value element ``position`` can hold on any trip:
    the body's result gives it back as it came, through copies (the TPU compiler moves a loop-invariant
    value between memory spaces with a ``copy-start``/``copy-done`` pair) and possibly from another
    element (one it keeps in the other memory space). None where the body computes it."""
    root = body.root
    if root is None or root.opcode != "tuple":
        return None
    seen, todo = {position}, [position]
    while todo:
        at = todo.pop()
        if at >= len(root.operands):
            return None
        inst = body.instructions.get(root.operands[at])
        while inst is not None and inst.opcode in (*_THROUGH, "copy-start") and inst.operands:
            inst = body.instructions.get(inst.operands[0])
        source = body.instructions.get(inst.operands[0]) if inst is not None and inst.operands else None
        if inst is None or inst.opcode != "get-tuple-element" or source is None or source.opcode != "parameter":
            return None
        element = int(inst.attr("index") or 0)
        if element not in seen:
            seen.add(element)
            todo.append(element)
    return frozenset(seen)


def _loop_invariant(loop: Instruction, caller: Computation, body: Computation, index: list[int], outer: Outer,
                    module: Mapping[str, Computation]) -> tuple[Instruction, Computation, Outer] | None:
    """What element ``index[-1]`` of a loop's tuple holds on every trip (the loop in ``caller``, its
    body ``body``), where the body never changes it: the one instruction every element it may come
    from starts with. None if the body computes it or the elements start from different values."""
    positions = _carried_from(body, index[-1]) if index and loop.operands else None
    if positions is None:
        return None
    found = {p: _defining(loop.operands[0], caller, outer, module, index=[*index[:-1], p]) for p in sorted(positions)}
    first = found[min(positions)]
    if first is None or any(f is None or f[0] is not first[0] for f in found.values()):
        return None
    return first


def _defining(name: str, comp: Computation, outer: Outer, module: Mapping[str, Computation], *,
              index: list[int] | None = None) -> tuple[Instruction, Computation, Outer] | None:
    """The instruction that really makes value ``name`` (element ``index`` of it, innermost last):
    through ops that carry it unchanged, out of a fusion's or call's parameter to its operand, into a
    fusion's root, through a tuple's element and a loop's carried value (one its body passes on
    unchanged) to where the loop got it."""
    index = list(index or ())  # Tuple elements still to take, innermost last.
    for _ in range(64):
        inst = comp.instructions.get(name)
        if inst is None:
            return None
        if inst.opcode in _THROUGH and inst.operands:
            name = inst.operands[0]
        elif inst.opcode == "copy-start" and inst.operands:
            if index:  # (the copy, the operand, its context): any of the first two is the operand's value.
                index.pop()
            name = inst.operands[0]
        elif inst.opcode == "get-tuple-element" and inst.operands:
            index.append(int(inst.attr("index") or 0))
            name = inst.operands[0]
        elif inst.opcode == "tuple" and index:
            position = index.pop()
            if position >= len(inst.operands):
                return None
            name = inst.operands[position]
        elif inst.opcode == "while" and index and inst.operands:
            # An element of a loop's result that its body passes on unchanged: what the loop started with.
            body = module.get((inst.called("body") or [""])[0])
            return None if body is None else _loop_invariant(inst, comp, body, index, outer, module)
        elif inst.opcode == "parameter" and outer:
            (caller, through), outer = outer[0], outer[1:]
            if through.opcode == "while":
                if comp.name not in through.called("body"):
                    return None  # The condition's parameter: not a value the loop carries into a kernel.
                # None where the loop changes it each trip: not one value.
                return _loop_invariant(through, caller, comp, index, outer, module)
            else:
                number = inst.int_arg
                if number is None or number >= len(through.operands):
                    return None
                comp, name = caller, through.operands[number]
        elif inst.opcode == "fusion" and not index and \
                (called := module.get((inst.called("calls") or [""])[0])) is not None and called.root is not None:
            outer = ((comp, inst), *outer)
            comp, name = called, called.root.name
        else:
            return (inst, comp, outer) if not index else None
    return None


def _reshaped_dims(dims: tuple[int, ...], chosen: set[int], onto: tuple[int, ...]) -> set[int]:
    """The dimensions of shape ``onto`` that dimensions ``chosen`` of ``dims`` (the same elements,
    reshaped row-major) overlap.

    Example (a [8, 8192, 128] product seen as [8, 64, 128, 128]; dimension 2 is part of the 8192):
        >>> _reshaped_dims((8, 64, 128, 128), {2}, (8, 8192, 128)), _reshaped_dims((4, 6), {1}, (4, 6))
        ({1}, {1})
    """
    def spans(shape: tuple[int, ...]) -> list[tuple[int, int]]:
        out, inner = [], 1
        for size in reversed(shape):
            out.append((inner, inner * size))
            inner *= size
        return out[::-1]

    theirs, ours = spans(dims), spans(onto)
    return {j for j, (low, high) in enumerate(ours) if high > low
            and any(max(low, lo) < min(high, hi) for i, (lo, hi) in enumerate(theirs) if i in chosen and hi > lo)}


_OP_NAME = re.compile(r'\bop_name="([^"]*)"')


def rewritten_dot_flops(inst: Instruction, comp: Computation, module: Mapping[str, Computation],
                        outer: Outer = ()) -> float:
    """A ``reduce`` that sums a product over a dimension both factors have, where one factor is a
    broadcast that lacks a dimension the other has, and which JAX's name for it calls a
    ``dot_general`` (where the program names it): a dot XLA's algebraic simplifier rewrote as
    multiply + reduce (it does so for a dot one of whose sides has no free dimension: decode
    attention's one query token). Counted as that dot, 2 per multiply-add: 2 x the product's elements.
    Any other reduce (a sum, a norm's sum of squares or its gradient against its scale, a product
    with a scalar) counts 0.

    Example (q [B,D] against k [B,S,D]: the scores of one query token, B=2, S=4, D=8):
        >>> from aotcheck.figures.hlo import parse_module
        >>> m = parse_module('''HloModule m
        ... %add (a: f32[], b: f32[]) -> f32[] {
        ...   %a = f32[] parameter(0)
        ...   %b = f32[] parameter(1)
        ...   ROOT %s = f32[] add(%a, %b)
        ... }
        ... ENTRY %e (q: f32[2,8], k: f32[2,4,8]) -> f32[2,4] {
        ...   %q = f32[2,8]{1,0} parameter(0)
        ...   %k = f32[2,4,8]{2,1,0} parameter(1)
        ...   %bq = f32[2,4,8]{2,1,0} broadcast(%q), dimensions={0,2}
        ...   %p = f32[2,4,8]{2,1,0} multiply(%bq, %k)
        ...   %z = f32[] constant(0)
        ...   ROOT %r = f32[2,4]{1,0} reduce(%p, %z), dimensions={2}, to_apply=%add
        ... }''')
        >>> rewritten_dot_flops(m["e"].root, m["e"], m)  # 2 * B * S * D
        128.0
    """
    reducer = module.get((inst.called("to_apply") or [""])[0])
    if reducer is None or reducer.root is None or reducer.root.opcode != "add" or len(inst.operands) != 2:
        return 0.0
    name = _OP_NAME.search(inst.attrs)
    if name is not None and "dot_general" not in name[1].rsplit("/", 1)[-1]:
        return 0.0  # JAX wrote a sum (a norm's gradient against its scale): vector work, not a dot.
    found = _defining(inst.operands[0], comp, outer, module)
    if found is None or found[0].opcode != "multiply" or len(found[0].operands) != 2:
        return 0.0
    product, where, around = found
    shape = product.arrays[0].dims if product.arrays else ()
    reduce_in = comp.instructions.get(inst.operands[0])
    if not shape or reduce_in is None or not reduce_in.arrays or reduce_in.arrays[0].elements != math.prod(shape):
        return 0.0
    # The product's dimensions the reduce sums (a reshape between them splits or merges dimensions: XLA's
    # GPU compiler sums a long dimension in two reduces, the first over a split part of it).
    reduced = _reshaped_dims(reduce_in.arrays[0].dims, set(_dims(inst.attr("dimensions"))), shape)
    if not reduced:
        return 0.0
    kept = []
    for operand in product.operands:
        factor = _defining(operand, where, around, module)
        if factor is not None and factor[0].opcode == "broadcast":
            kept.append(set(_dims(factor[0].attr("dimensions"))))
        else:
            kept.append(set(range(len(shape))))  # A whole operand: it has every dimension.
    contracts = all(reduced <= k for k in kept)  # Both factors have the summed dimensions...
    degenerate = any(len(k) < len(shape) and not (set(range(len(shape))) - k) <= reduced for k in kept)
    # ...and one factor lacks a dimension that is not summed (the other side's free dimension).
    return 2.0 * product.arrays[0].elements if contracts and degenerate else 0.0


class KernelCount(NamedTuple):
    """How one run of a custom kernel was counted: its FLOPs and their basis: ``declared`` (its
    ``pl.CostEstimate``), ``registered`` (a cost registered by name, :mod:`aotcheck.figures.kernels`)
    or ``none`` (it declares none and none is registered: it counts 0 and is named as uncounted)."""

    name: str
    flops: float
    basis: str


def kernel_count(inst: Instruction, comp: Computation, op_name: str, *, module: Mapping[str, Computation] | None = None,
                 outer: Outer = (), constants: Mapping[str, Instruction] | None = None) -> KernelCount:
    """One run of a custom kernel (a Pallas/Mosaic or Triton call), counted: a registered cost first
    (it is the user's, or aotcheck's for a kernel jax ships), else what it declares; a kernel that
    touches no floating-point data (XLA's own integer metadata kernels) does no FLOPs to count.
    A registered cost that returns None (it cannot tell from this call) leaves the kernel uncounted.

    ``constants``: the program's constants printed whole (XLA's dump), by name: an operand that is
    one (through copies, tuples and loop carries: ``outer`` says how the walk got here) is given to
    the cost by value (a splash kernel's block mask)."""
    name = re.sub(r"\.\d+$", "", kernel_name(op_name))
    cost = kernels.lookup(name)
    if cost is not None:
        operands, values = [], []
        for o in inst.operands:
            src = comp.instructions.get(o)
            operands.append(src.arrays[0] if src is not None and src.arrays else hlo.Array("token", ()))
            found = _defining(o, comp, outer, module or {})
            value = None
            if found is not None and found[0].opcode == "constant":
                value = hlo.constant_value(found[0])
                if value is None and constants and found[0].name in constants:
                    value = hlo.constant_value(constants[found[0].name])
            values.append(value)
        call = kernels.KernelCall(name, operands, inst.arrays, inst.attrs, tuple(values))
        try:
            flops = cost(call)
            if flops is None:
                return KernelCount(name, 0.0, "none")
            flops = float(flops)
        except Exception as e:  # The user's function: named with the kernel, never a silent zero.
            raise kernels.KernelCostError(f"the cost registered for kernel {name!r} raised {type(e).__name__}: {e} "
                                          f"(on operands {[f'{a.dtype}{list(a.dims)}' for a in operands]}); fix "
                                          f"the function given to aotcheck.kernel_cost({name!r})") from e
        return KernelCount(name, flops, "registered")
    declared = declared_flops(inst)
    if declared is not None:
        return KernelCount(name, declared, "declared")
    return KernelCount(name, 0.0, "none" if does_arithmetic(inst) else "integer")


def instruction_flops(inst: Instruction, comp: Computation, module: Mapping[str, Computation],
                      outer: Outer = ()) -> float:
    """FLOPs of one run of an instruction the ledger counts as matrix work (a custom kernel's come
    from :func:`kernel_count`); 0 for anything else."""
    opcode = ledger.base_opcode(inst.opcode)
    if opcode == "dot":
        return dot_flops(inst, comp)
    if opcode == "convolution":
        return convolution_flops(inst, comp)
    if opcode == "ragged-dot":
        return ragged_dot_flops(inst, comp)
    if opcode == "reduce":
        return rewritten_dot_flops(inst, comp, module, outer)
    if opcode == "custom-call" and ledger.custom_call_target(inst) in ledger.GEMM_TARGETS:
        return gemm_flops(inst, comp)
    if opcode in ("cholesky", "triangular-solve", "fft", "scaled-dot"):
        return linalg_flops(inst, comp)
    return 0.0


def linalg_flops(inst: Instruction, comp: Computation) -> float:
    """The textbook counts of XLA's other matrix ops, per run: ``cholesky`` n^3/3 per matrix,
    ``triangular-solve`` m^2 n per system (m the triangular side), ``fft`` 5 N log2 N per transform,
    ``scaled-dot`` as the dot it scales.

    Example:
        >>> from aotcheck.figures.hlo import parse_module
        >>> m = parse_module('''ENTRY %e (a: f32[2,6,6]) -> f32[2,6,6] {
        ...   %a = f32[2,6,6]{2,1,0} parameter(0)
        ...   ROOT %c = f32[2,6,6]{2,1,0} cholesky(%a), lower=true
        ... }''')
        >>> linalg_flops(m["e"].root, m["e"])  # 2 matrices x 6^3 / 3
        144.0
    """
    if not inst.arrays:
        return 0.0
    out = inst.arrays[0]
    opcode = ledger.base_opcode(inst.opcode)
    if opcode == "cholesky" and len(out.dims) >= 2:
        n = out.dims[-1]
        return out.elements / (n * n) * n ** 3 / 3
    if opcode == "triangular-solve":
        a = comp.instructions.get(inst.operands[0]) if inst.operands else None
        if a is None or not a.arrays or len(a.arrays[0].dims) < 2:
            return 0.0
        m = a.arrays[0].dims[-1]
        return out.elements * m  # m^2 n per system = (m n elements of the solution) x m.
    if opcode == "fft":
        lengths = _dims(inst.attr("fft_length"))
        size = math.prod(lengths) if lengths else 1
        return 5.0 * out.elements * math.log2(size) if size > 1 else 0.0
    if opcode == "scaled-dot":
        return dot_flops(inst, comp)
    return 0.0
