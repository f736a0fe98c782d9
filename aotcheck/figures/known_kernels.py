"""The costs of the Pallas kernels jax ships that declare none, registered by name
(:mod:`aotcheck.figures.kernels`), counted from what each does.

- Splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``): its kernels run a grid of
  (query block, key block) pairs per head and skip every pair its mask's ``block_mask`` holds 0 for
  (``_next_nonzero``). Each visited pair does the block matmuls of its kernel, ``2·bq·bkv·d`` FLOPs
  each: the forward 2 (QKᵀ, PV), ``dq`` 3 (QKᵀ, dP = dO·Vᵀ, dQ = dS·K), ``dkv`` 4 (QKᵀ, dV, dP, dK;
  5 with ``use_fused_bwd_kernel``, which adds dQ). The block sizes come from the call's metadata
  (``xprof_metadata``), the visited pairs from the mask the program holds as a constant (built when
  tracing; read from XLA's dump, which prints constants whole). A mask the program computes cannot
  be read: the kernel is then named as uncounted. Segment ids (packing) can skip more at run time:
  the count is the mask's, an upper bound for packed sequences.
- Ragged paged attention (``jax.experimental.pallas.ops.tpu.ragged_paged_attention``): how many keys
  each query token attends is known only at run time. Counted as its upper bound: every query token
  against the longest sequence the page table holds, ``4·T·Hq·D·L`` (``L`` = pages per sequence ×
  page size), exactly what XLA's dense attention over the same pages does. Marked as a bound.
- Megablox's grouped matmuls (``gmm``, ``tgmm``: jax's ``megablox``, MaxText's copy and qwix's) declare
  their cost over every row of their left operand, the static buffer routing fills. Without expert
  parallelism that buffer is the tokens times top-k, exactly what runs; under dropless expert
  parallelism of E it is sized for the worst case, E times the rows a device receives on average
  (measured on a Mixtral-style MaxText step: 4.000x at E = 4). Kept as declared, marked as a bound.

Example (a causal 4 x 4 block mask visits 10 of 16 pairs; one head, blocks of 128, d 64):
    >>> import numpy as np
    >>> from aotcheck.figures.hlo import Array
    >>> from aotcheck.figures.kernels import KernelCall, lookup
    >>> mask = np.tril(np.ones((1, 4, 4), dtype=np.int8))
    >>> meta = 'xprof_metadata":"{\\\\"block_q\\\\": 128, \\\\"block_kv\\\\": 128, \\\\"q_layout\\\\": 1}"'
    >>> call = KernelCall("splash_mha_fwd_no_residuals", [Array("s8", (1, 4, 4)), Array("s8", (1, 4, 4)),
    ...                   Array("bf16", (1, 512, 64)), Array("bf16", (1, 512, 64))], [], meta, (None, mask, None, None))
    >>> lookup("splash_mha_fwd_no_residuals")(call) == 10 * 2 * (2 * 128 * 128 * 64)
    True
"""

from __future__ import annotations

import math
import re

from aotcheck.figures.kernels import KernelCall, declared_bound, kernel_cost

# Block matmuls per visited (query block, key block) pair, by kernel (jax's splash_attention_kernel.py).
_SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
# The block sizes each kernel runs with, by the metadata's keys.
_SPLASH_BLOCKS = {"fwd": ("block_q", "block_kv"), "dq": ("block_q_dq", "block_kv_dq"),
                  "dkv": ("block_q_dkv", "block_kv_dkv")}
_HEAD_DIM_MINOR = 1  # splash's QKVLayout.HEAD_DIM_MINOR: q is [..., heads, seq, head_dim].


def _metadata(attrs: str, key: str) -> int | bool | None:
    """One field of the kernel's ``xprof_metadata`` (JSON inside its frontend attributes, its quotes
    escaped)."""
    match = re.search(rf'\\*"{re.escape(key)}\\*"\s*:\s*(\d+|true|false)', attrs)
    if match is None:
        return None
    return int(match[1]) if match[1].isdigit() else match[1] == "true"


def _splash(kind: str):
    def cost(call: KernelCall) -> float | None:
        bq, bkv = (_metadata(call.attrs, key) for key in _SPLASH_BLOCKS[kind])
        floats = [a for a in call.operands if a.dtype in ("bf16", "f16", "f32") and len(a.dims) >= 3]
        if not bq or not bkv or len(floats) < 2:
            return None
        q, k = floats[0], floats[1]
        layout = _metadata(call.attrs, "q_layout") or _HEAD_DIM_MINOR
        *batch, heads, seq, d = q.dims if layout == _HEAD_DIM_MINOR else (*q.dims[:-2], q.dims[-1], q.dims[-2])
        kv_seq = k.dims[-2] if (_metadata(call.attrs, "k_layout") or _HEAD_DIM_MINOR) == _HEAD_DIM_MINOR else k.dims[-1]
        mask_operand = call.operands[1] if len(call.operands) > 1 else None
        if mask_operand is not None and mask_operand.dtype[0] in "su" and len(mask_operand.dims) == 3:
            mask = call.values[1] if len(call.values) > 1 else None
            if mask is None or heads % mask.shape[0]:
                return None  # The program computes its mask (or shards it): what it visits cannot be read.
            visits = int((mask != 0).sum()) * (heads // mask.shape[0]) * math.prod(batch)
        else:  # No block mask: every pair runs.
            visits = heads * math.prod(batch) * -(-seq // bq) * -(-kv_seq // bkv)
        matmuls = _SPLASH_MATMULS[kind] + (kind == "dkv" and bool(_metadata(call.attrs, "use_fused_bwd_kernel")))
        return float(visits * matmuls * 2 * bq * bkv * d)

    return cost


for _kind in _SPLASH_MATMULS:
    kernel_cost(f"splash_mha_{_kind}*")(_splash(_kind))


@kernel_cost("ragged_paged_attention_kernel", bound=True)
def ragged_paged_attention(call: KernelCall) -> float | None:
    """``4·T·Hq·D·L``: queries [T, Hq, D] against the keys of the longest sequence the page table
    allows (``L`` = pages per sequence [max_seqs, pages_per_seq] × page size of the KV pool
    [pages, page_size, 2·Hkv, D]), QKᵀ and PV. Found by shape, not position (jax's versions order
    them differently)."""
    queries = [a for a in call.operands if a.dtype[0] in "bf" and len(a.dims) == 3]
    pools = [a for a in call.operands if a.dtype[0] in "bf" and len(a.dims) == 4]
    tables = [a for a in call.operands if a.dtype[0] in "su" and len(a.dims) == 2]
    if len(queries) != 1 or len(pools) != 1 or len(tables) != 1:
        return None
    (tokens, heads, d), pool, table = queries[0].dims, pools[0].dims, tables[0].dims
    return 4.0 * tokens * heads * d * table[1] * pool[1]


for _name in ("gmm", "tgmm"):
    declared_bound(_name)
