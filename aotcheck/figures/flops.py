"""FLOPs of one HLO instruction, per device: 2 per multiply-add of a ``dot``, ``convolution`` (its
padding and dilation holes not counted) or ``ragged-dot``, and the cost a kernel declares.
"""

from __future__ import annotations

import math
import re

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


# Custom calls that run a kernel compiled from user code: Pallas/Mosaic on TPUs, Triton and
# Mosaic GPU on GPUs. Their work is opaque to XLA; a Pallas kernel may declare it
# (``pl.CostEstimate``), which XLA's TPU backend carries as ``cost_estimate`` in the call's config.
KERNEL_TARGETS = frozenset({"tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "mosaic_gpu_v2"})
# cuBLAS calls XLA's GPU compiler makes of a dot (after autotuning; a deviceless compile keeps dots).
GEMM_TARGETS = frozenset({"__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8"})
_COST_FLOPS = re.compile(r'"cost_estimate"\s*:\s*\{[^{}]*?"flops"\s*:\s*"?(\d+)')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def custom_call_target(inst: Instruction) -> str | None:
    match = _TARGET.search(inst.attrs)
    return match[1] if match else None


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
