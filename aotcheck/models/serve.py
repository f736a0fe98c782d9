"""aotcheck's reference server: the reference LM served from a paged KV cache, as vLLM on TPU serves.

Two programs, compiled over the buckets a server compiles at start-up (:mod:`aotcheck.programs.serving`):

- ``step[tokens=T]``: one scheduler step of ``T`` tokens from up to ``max_num_seqs`` sequences,
  prefill and decode mixed: each layer writes its keys and values into the pages of the pool
  (donated, updated in place) and attends over them by **jax's own ragged paged attention kernel**
  (``jax.experimental.pallas.ops.tpu.ragged_paged_attention``) on a TPU, by XLA over the gathered
  pages elsewhere. Which is decided as production code decides it, by ``jax.default_backend()``,
  and the kernel picks its own block sizes from ``jax.devices()[0].device_kind``: both answer as the
  target while aotcheck traces (``trace_as_target``).
- ``sample[tokens=T,seqs=S]``: the logits of ``S`` sequences' last tokens from a step's hidden
  states, and the greedy next tokens.

Tensor parallel over ``model`` (attention heads, MLP columns, the pool's KV heads), replicated
over ``data`` (each replica a server of its own).

Example:
    >>> config = serving_config(TINY)
    >>> [c.programs[0] for c in config.expand()][:3], TINY.pages_per_seq
    (['step[tokens=16]', 'step[tokens=32]', 'step[tokens=64]'], 16)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from aotcheck.models.lm import LMConfig, Params, init_params
from aotcheck.programs.serving import Bucketed, Limits, ServingConfig, doubling, pages_for
from aotcheck.targets.mesh import MeshSpec
from aotcheck.targets.platform import TPU


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """The model and how it is served.

    Attributes:
        model: The weights' shapes (an :class:`~aotcheck.models.lm.LMConfig`; its head width a
            multiple of 128, as the kernel's blocks want).
        page_size: Tokens per KV page.
        pages: The KV pool's configured size, in pages (per replica).
        limits: The scheduler's limits (tpu-inference's names).
        min_tokens: The smallest token bucket (tpu-inference starts at 16).
        min_seqs: The smallest request bucket.
        mesh: ``("data", "model")``: replicas, tensor parallel.
        num_kv_pages_per_block: The kernel's block sizes, or None for its own tuned table (read from
        num_queries_per_block:   the device kind: a deviceless trace needs ``trace_as_target``).
        vmem_limit_bytes: The kernel's VMEM limit (None: the compiler's).
        weights_dtype: The parameters' dtype as served (the reference LM's are fp32; a server loads
            bf16 checkpoints).
        sampler: ``"greedy"`` (the argmax of the logits) or ``"top_p"``: tpu-inference's sampler, each
            request's temperature and nucleus (top-p) over fp32 logits, its threshold found by a 31-step
            binary search (no sort: TPUs sort slowly), the token drawn by the Gumbel-max trick.
        structured_decoding: Also compile ``structured_decode[seqs=S]`` per request bucket, as
            tpu-inference precompiles it for every deployment (its ``_precompile_structured_decoding``).
    """

    model: LMConfig
    page_size: int = 16
    pages: int = 256
    limits: Limits = Limits(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=256)
    min_tokens: int = 16
    min_seqs: int = 8
    mesh: MeshSpec = MeshSpec(("data", "model"), (-1, 8), overrides={"v4-8": (-1, 4)}, adapt=True)
    num_kv_pages_per_block: int | None = None
    num_queries_per_block: int | None = None
    vmem_limit_bytes: int | None = None
    weights_dtype: Any = jnp.float32
    sampler: str = "greedy"
    structured_decoding: bool = False

    def __post_init__(self) -> None:
        if self.sampler not in ("greedy", "top_p"):
            raise ValueError(f"ServeConfig.sampler={self.sampler!r}: give 'greedy' or 'top_p'")

    @property
    def pages_per_seq(self) -> int:
        """A sequence's page table: enough pages for ``max_model_len`` tokens."""
        return pages_for(self.limits.max_model_len, self.page_size)

    def kv_pool(self, pages: int) -> list[jax.ShapeDtypeStruct]:
        """Per layer ``[pages, page_size, 2 x heads, head_dim]`` bf16, keys and values interleaved by head."""
        m = self.model
        return [jax.ShapeDtypeStruct((pages, self.page_size, 2 * m.n_heads, m.head_dim), jnp.bfloat16)
                for _ in range(m.n_layers)]


RULES = (
    # Tensor parallel over "model"; nothing over "data" (replicas hold the whole model each).
    (r"layers/attn/w[qkv]$", P(None, None, "model")),
    (r"layers/attn/wo$", P(None, "model", None)),
    (r"layers/mlp/wi$", P(None, None, "model")),
    (r"layers/mlp/wo$", P(None, "model", None)),
    (r"^unembed$", P(None, "model")),
    (r".*", P()),
)

_HEADS = P(None, "model", None)        # [tokens, heads, head_dim]
_POOL = P(None, None, "model", None)   # [pages, page_size, 2 x heads, head_dim]


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6) * scale).astype(x.dtype)


def _xla_paged_attention(q: jax.Array, pool: jax.Array, page_indices: jax.Array, cu_q_lens: jax.Array,
                         positions: jax.Array, scale: float) -> jax.Array:
    """Attention over each token's own sequence's pages, by XLA: gather the pages, mask the future."""
    tokens, heads, _ = q.shape
    seq = jnp.minimum(jnp.searchsorted(cu_q_lens[1:], jnp.arange(tokens), side="right"), page_indices.shape[0] - 1)
    kv = pool[page_indices[seq]]  # [T, pages_per_seq, page_size, 2h, D]
    kv = kv.reshape(tokens, -1, 2 * heads, kv.shape[-1])
    k, v = kv[:, :, 0::2], kv[:, :, 1::2]
    logits = jnp.einsum("thd,tlhd->thl", q, k).astype(jnp.float32) * scale
    seen = jnp.arange(kv.shape[1])[None, None] <= positions[:, None, None]
    probs = jax.nn.softmax(jnp.where(seen, logits, jnp.finfo(jnp.float32).min), axis=-1).astype(q.dtype)
    return jnp.einsum("thl,tlhd->thd", probs, v)


def _paged_attention(cfg: ServeConfig, q: jax.Array, k: jax.Array, v: jax.Array, pool: jax.Array,
                     batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Writes this step's keys and values into their slots of the pool, then attends: per device, on
    its own heads (XLA does not partition a kernel: ``shard_map`` hands it its shard)."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention  # noqa: PLC0415

    scale = cfg.model.head_dim**-0.5

    def local(q, k, v, pool, slots, kv_lens, page_indices, cu_q_lens, num_seqs, positions):  # noqa: ANN001, ANN202
        tokens, heads, dim = q.shape
        new = jnp.stack([k, v], axis=2).reshape(tokens, 2 * heads, dim)
        pool = pool.reshape(-1, 2 * heads, dim).at[slots].set(new).reshape(pool.shape)
        if jax.default_backend() == TPU.name:  # As the target answers it while aotcheck traces.
            out = ragged_paged_attention(q, pool, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale=scale,
                                         num_kv_pages_per_block=cfg.num_kv_pages_per_block,
                                         num_queries_per_block=cfg.num_queries_per_block,
                                         vmem_limit_bytes=cfg.vmem_limit_bytes)
        else:
            out = _xla_paged_attention(q, pool, page_indices, cu_q_lens, positions, scale)
        return out, pool

    names = ("slots", "kv_lens", "page_indices", "cu_q_lens", "num_seqs", "positions")
    return jax.shard_map(local, mesh=jax.sharding.get_abstract_mesh(),
                         in_specs=(_HEADS, _HEADS, _HEADS, _POOL, *(P(),) * len(names)),
                         out_specs=(_HEADS, _POOL), check_vma=False)(q, k, v, pool, *(batch[n] for n in names))


def step(cfg: ServeConfig, params: Params, kv: list[jax.Array], batch: Mapping[str, jax.Array]) -> tuple[jax.Array, Any]:
    """One scheduler step: the hidden states of every token ``[T, d_model]`` and the pool, updated."""
    m = cfg.model
    x = params["embed"].astype(jnp.bfloat16)[batch["tokens"]]
    pool = []
    for i in range(m.n_layers):
        layer = jax.tree_util.tree_map(lambda w: w[i], params["layers"])  # noqa: B023
        h = _rms_norm(x, layer["ln1"])
        q, k, v = ((h @ layer["attn"][w].astype(h.dtype)).reshape(-1, m.n_heads, m.head_dim) for w in ("wq", "wk", "wv"))
        attended, kv_i = _paged_attention(cfg, q, k, v, kv[i], batch)
        x = x + attended.reshape(-1, m.d_model) @ layer["attn"]["wo"].astype(h.dtype)
        h = _rms_norm(x, layer["ln2"])
        x = x + jax.nn.gelu(h @ layer["mlp"]["wi"].astype(h.dtype)) @ layer["mlp"]["wo"].astype(h.dtype)
        pool.append(kv_i)
    return x, pool


def sample(params: Params, batch: Mapping[str, jax.Array]) -> jax.Array:
    """Greedy next tokens ``[S]`` from the hidden states at each sequence's last token."""
    h = _rms_norm(batch["hidden"][batch["logits_indices"]], params["final_ln"])
    return jnp.argmax((h @ params["unembed"].astype(h.dtype)).astype(jnp.float32), axis=-1).astype(jnp.int32)


def sample_top_p(params: Params, batch: Mapping[str, jax.Array]) -> jax.Array:
    """Next tokens ``[S]`` drawn from each request's nucleus at its temperature, as tpu-inference samples:
    fp32 logits, the smallest probability still kept found by a 31-step binary search per request (the
    kept tokens' mass is the first at or above ``top_p``), then Gumbel-max over the kept logits."""
    h = _rms_norm(batch["hidden"][batch["logits_indices"]], params["final_ln"])
    logits = (h @ params["unembed"].astype(h.dtype)).astype(jnp.float32) / batch["temperature"][:, None]
    probs = jax.nn.softmax(logits, axis=-1)
    top_p = batch["top_p"][:, None]

    def halve(_: int, bounds: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        low, high = bounds
        mid = (low + high) / 2
        enough = jnp.sum(jnp.where(probs >= mid, probs, 0.0), axis=-1, keepdims=True) >= top_p
        return jnp.where(enough, mid, low), jnp.where(enough, high, mid)

    low, _ = jax.lax.fori_loop(0, 31, halve, (jnp.zeros_like(top_p), jnp.max(probs, axis=-1, keepdims=True)))
    gumbel = jax.random.gumbel(jax.random.wrap_key_data(batch["key"]), logits.shape, jnp.float32)
    return jnp.argmax(jnp.where(probs >= low, logits + gumbel, -jnp.inf), axis=-1).astype(jnp.int32)


def structured_decode(params: Params, batch: Mapping[str, jax.Array]) -> jax.Array:
    """The logits ``[S, vocab]`` with the tokens each request's grammar forbids masked to -inf, where any
    request asks for structured output: tpu-inference's ``structured_decode_fn``, whose bitmask packs 32
    tokens per int32."""
    del params  # A program of the server's like the others, its weights unused (and pruned by jit).
    logits, bitmask, require = batch["logits"], batch["grammar_bitmask"], batch["require_structured"]

    def masked() -> jax.Array:
        forbidden = (jnp.right_shift(bitmask[:, :, None], batch["arange"][None, None, :]) & 1) == 0
        forbidden = forbidden.reshape(logits.shape[0], -1)[:, :logits.shape[1]]
        return jnp.where(require, jnp.where(forbidden, -jnp.inf, logits), logits)

    return jax.lax.cond(jnp.any(require), masked, lambda: logits)


def _step_inputs(cfg: ServeConfig, point: Mapping[str, int]) -> dict[str, jax.ShapeDtypeStruct]:
    tokens, seqs = point["tokens"], cfg.limits.max_num_seqs
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    return {"tokens": i32(tokens), "positions": i32(tokens), "slots": i32(tokens), "kv_lens": i32(seqs),
            "page_indices": i32(seqs, cfg.pages_per_seq), "cu_q_lens": i32(seqs + 1), "num_seqs": i32(1)}


def _step_run_inputs(cfg: ServeConfig, point: Mapping[str, int]) -> dict[str, np.ndarray]:
    """One sequence of the bucket's tokens, its keys in its own pages: metadata the paged attention kernel
    can run on (on zeros, no sequence, it leaves a DMA semaphore set and halts the chip: E0200)."""
    tokens, seqs, per_seq = point["tokens"], cfg.limits.max_num_seqs, cfg.pages_per_seq
    at = np.arange(tokens, dtype=np.int32)
    page_indices = np.zeros((seqs, per_seq), np.int32)
    page_indices[0] = np.arange(per_seq, dtype=np.int32)
    cu_q_lens = np.full((seqs + 1,), tokens, np.int32)
    cu_q_lens[0] = 0
    kv_lens = np.zeros((seqs,), np.int32)
    kv_lens[0] = tokens
    return {"positions": at, "slots": at, "kv_lens": kv_lens, "page_indices": page_indices, "cu_q_lens": cu_q_lens,
            "num_seqs": np.ones((1,), np.int32)}


def _sample_inputs(cfg: ServeConfig, point: Mapping[str, int]) -> dict[str, jax.ShapeDtypeStruct]:
    seqs = point["seqs"]
    inputs = {"hidden": jax.ShapeDtypeStruct((point["tokens"], cfg.model.d_model), jnp.bfloat16),
              "logits_indices": jax.ShapeDtypeStruct((seqs,), jnp.int32)}
    if cfg.sampler == "top_p":
        inputs.update(temperature=jax.ShapeDtypeStruct((seqs,), jnp.float32),
                      top_p=jax.ShapeDtypeStruct((seqs,), jnp.float32), key=jax.ShapeDtypeStruct((2,), jnp.uint32))
    return inputs


def _structured_inputs(cfg: ServeConfig, point: Mapping[str, int]) -> dict[str, jax.ShapeDtypeStruct]:
    seqs, vocab = point["seqs"], cfg.model.vocab
    return {"logits": jax.ShapeDtypeStruct((seqs, vocab), jnp.bfloat16),
            "grammar_bitmask": jax.ShapeDtypeStruct((seqs, -(-vocab // 32)), jnp.int32),
            "require_structured": jax.ShapeDtypeStruct((seqs, 1), jnp.bool_),
            "arange": jax.ShapeDtypeStruct((32,), jnp.int32)}


def serving_config(cfg: ServeConfig, **overrides: Any) -> ServingConfig:
    """The server's :class:`ServingConfig`: ``step`` over token buckets doubling from ``min_tokens`` to the
    token budget, ``sample`` over their product with request buckets up to ``max_num_seqs`` (no more
    requests than tokens); ``overrides`` replace any of its fields."""
    limits = cfg.limits
    tokens = doubling(cfg.min_tokens, limits.max_num_batched_tokens)
    fields: dict[str, Any] = dict(
        init_fn=lambda rng: jax.tree_util.tree_map(lambda w: w.astype(cfg.weights_dtype), init_params(cfg.model, rng)),
        partition_rules=RULES,
        mesh=cfg.mesh,
        bucketed={
            "step": Bucketed(fn=lambda params, kv, batch: step(cfg, params, kv, batch),
                             inputs=lambda point: _step_inputs(cfg, point), axes={"tokens": tokens},
                             covers={"tokens": "max_num_batched_tokens"},
                             run_inputs=lambda point: _step_run_inputs(cfg, point)),
            "sample": Bucketed(fn=sample if cfg.sampler == "greedy" else sample_top_p, inputs=lambda point: _sample_inputs(cfg, point), uses_kv=False,
                               axes={"tokens": tokens, "seqs": doubling(cfg.min_seqs, limits.max_num_seqs)},
                               covers={"tokens": "max_num_batched_tokens", "seqs": "max_num_seqs"},
                               when=lambda point: point["seqs"] <= point["tokens"]),
            **({"structured_decode": Bucketed(fn=structured_decode, inputs=lambda point: _structured_inputs(cfg, point),
                                              uses_kv=False, axes={"seqs": doubling(cfg.min_seqs, limits.max_num_seqs)},
                                              covers={"seqs": "max_num_seqs"})}
               if cfg.structured_decoding else {}),
        },
        kv=cfg.kv_pool,
        kv_partition=_POOL,
        pages=cfg.pages,
        limits=limits,
        fit_upper=2**23,  # Pages of a few KiB each: the largest HBM holds millions.
    )
    return ServingConfig(**{**fields, **overrides})


# A small model with production's head width (128, as the kernel's blocks want) and 8 heads to
# split over 8 devices; 18.9M parameters, compiled in seconds per bucket.
TINY = ServeConfig(model=LMConfig(vocab=1024, d_model=1024, n_layers=2, n_heads=8, d_ff=2048))


def engine_pages(*, weights_bytes: int, page_bytes: int, limit_bytes: int, utilization: float) -> int:
    """The pages an engine allocates per device at ``utilization`` (its ``gpu_memory_utilization``):
    utilization x the device's limit, less the weights, over a page's bytes (tpu-inference's
    ``determine_available_memory``; it also takes off what programs it loaded before its pool, which the
    boot budget counts as the programs' instead).

    Example:
        >>> engine_pages(weights_bytes=2**30, page_bytes=2**20, limit_bytes=16 * 2**30, utilization=0.5)
        7168
    """
    return int((utilization * limit_bytes - weights_bytes) // page_bytes)


# tpu-inference #3360's server: a 256K vocabulary and 2B-class dims (gemma-2b's 18 layers of 2048, its
# 2.56B parameters as bf16) on one v5e chip at --max-num-seqs 512 --max-num-batched-tokens 1024, sampling
# with temperature and top-p, structured decoding precompiled as tpu-inference always does. Its pool is
# what an engine allocates at vLLM's long-standing default utilization, 0.90: (0.9 x 15.75 GiB - 4.77 GiB
# of weights) over 2.25 MiB a page (18 layers x 16 tokens x 32 heads' keys and values x 128 x 2 bytes):
# 4,282 pages (on the runtime's bytes_limit, 16,909,336,064, it is 4,281; the config keeps the pool a
# v5e chip was held at). Under the chip's start-up rules it starts: #3360's failure is not reproduced.
# The kernel's blocks are set: its own table's for v5e (32 queries) need 16.38M of the chip's 16M of scoped
# VMEM at 16 heads of 128 (CompileTimeScopedVmemOom, as tpu-inference #3194's kernel did).
LLM_256K = ServeConfig(
    model=LMConfig(vocab=256000, d_model=2048, n_layers=18, n_heads=16, d_ff=16384),
    page_size=16, pages=engine_pages(weights_bytes=2 * 2_558_601_216, page_bytes=18 * 16 * 32 * 128 * 2,
                                     limit_bytes=16_911_433_728, utilization=0.90),
    limits=Limits(max_num_seqs=512, max_num_batched_tokens=1024, max_model_len=2048),
    min_tokens=512, min_seqs=256, mesh=MeshSpec(("data", "model"), (1, 1)),
    num_kv_pages_per_block=8, num_queries_per_block=16,
    weights_dtype=jnp.bfloat16, sampler="top_p", structured_decoding=True)

# tpu-inference #3408's shape: a 30B dense model (64 layers of 4096, MLP 45056, a 262K vocabulary: 30.07B
# parameters as bf16) tensor parallel over a tpu7x-8's 8 devices, its pool at gpu_memory_utilization=0.98:
# (0.98 x 94.75 GiB - 8.75 GiB of weights per device) over 8 MiB a page per device (64 layers x 64 tokens
# x 8 heads' keys and values x 128 x 2 bytes). Pages of 64 tokens: with 16, a step's page table for
# 1024 requests of 8192 tokens is 2 MiB, over the core's 1 MiB of SMEM (its kernel is refused so). Its
# kernel's blocks are set (4 pages): the kernel's own choice for 64-token pages needs 32.19 MiB of 7x's
# 32 MiB of scoped VMEM (refused, over by 192 KiB). The weights: the layers' 27.9B parameters and the
# unembedding split 8 ways, the 1.07B of the embedding table on every device. Its buckets: steps of 1024
# and 2048 tokens, sampling and structured decoding for 128 to 1024 requests (10 programs; each step
# compiles in 4-6 minutes on 2 cores, the rest in seconds).
LLM_31B = ServeConfig(
    model=LMConfig(vocab=262144, d_model=4096, n_layers=64, n_heads=32, d_ff=45056),
    page_size=64, pages=engine_pages(weights_bytes=9_396_297_728, page_bytes=64 * 64 * 8 * 128 * 2,
                                     limit_bytes=101_737_037_824, utilization=0.98),
    limits=Limits(max_num_seqs=1024, max_num_batched_tokens=2048, max_model_len=8192),
    min_tokens=1024, min_seqs=128, mesh=MeshSpec(("data", "model"), (1, 8)), num_kv_pages_per_block=4,
    num_queries_per_block=16,
    weights_dtype=jnp.bfloat16, sampler="top_p", structured_decoding=True)
