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
