"""A decoder-only transformer LM in plain JAX + optax: aotcheck's reference model.

Pre-norm blocks (RMSNorm, causal multi-head attention, GELU MLP), layers stacked on a leading axis and run
with ``lax.scan`` (or a Python loop, for comparison) under ``jax.checkpoint``, bf16 compute over fp32
parameters, AdamW. Partition rules shard weights FSDP over ``data`` and tensor-parallel over ``model``.

:func:`trainer_config` and :func:`inference_config` build the configs aotcheck
compiles; the inference config offers ``prefill`` and ``sample_decode`` (prefill
plus a ``lax.fori_loop`` of single-token steps over a KV cache).

Example:
    >>> from aotcheck.models.lm import TINY
    >>> TINY.num_params()
    656000
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from aotcheck.programs.config import InferenceConfig, TrainerConfig
from aotcheck.targets.mesh import MeshSpec
from aotcheck.targets.platform import TPU

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Model and workload sizes.

    Attributes:
        vocab: Vocabulary size.
        d_model: Residual width.
        n_layers: Transformer blocks.
        n_heads: Attention heads (head width is ``d_model // n_heads``).
        d_ff: MLP hidden width.
        seq_len: Training sequence length.
        batch: Global training batch (sequences).
        prompt_len: Inference prompt length.
        decode_len: Tokens ``sample_decode`` generates.
        decode_batch: Global inference batch.
        scan_layers: ``lax.scan`` over layers (else a Python loop, unrolled).
        remat: Recompute each block in the backward pass.
        mesh: Axes ``("data", "model")``: FSDP + data parallel, tensor parallel.
        attention: ``"xla"`` (einsums), or a Pallas TPU kernel from jax itself, run per
            device under ``shard_map`` inside the layer scan as production models run it:
            ``"flash"`` (``flash_attention``, declares its cost) or ``"splash"``
            (``splash_attention``, declares none). TPU targets only.
        experts: Routed experts per MLP (0: a dense MLP). Each token goes to ``top_k``
            experts through ``jax.lax.ragged_dot`` over tokens sorted by expert, per device
            under ``shard_map`` (experts' weights gathered, as FSDP does).
        top_k: Experts per token.
    """

    vocab: int = 32_000
    d_model: int = 2048
    n_layers: int = 16
    n_heads: int = 16
    d_ff: int = 8192
    seq_len: int = 1024
    batch: int = 64
    prompt_len: int = 128
    decode_len: int = 128
    decode_batch: int = 32
    scan_layers: bool = True
    remat: bool = True
    mesh: MeshSpec = MeshSpec(("data", "model"), (-1, 1), adapt=True)
    attention: str = "xla"
    experts: int = 0
    top_k: int = 2

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def num_params(self) -> int:
        """Analytic parameter count (embedding and unembedding untied)."""
        d, f, layers = self.d_model, self.d_ff, self.n_layers
        mlp = 2 * d * f if not self.experts else self.experts * 2 * d * f + d * self.experts  # + the router.
        per_layer = 4 * d * d + mlp + 2 * d  # qkvo, MLP in/out, two norms.
        return 2 * self.vocab * d + layers * per_layer + d

    def train_step_flops(self, *, attention: str = "all") -> float:
        """Analytic FLOPs of one train step (PaLM appendix B): per token, 6 per matmul parameter a
        token meets (of the routed experts, its ``top_k``, not all) plus 12·L·S·d for attention over
        the whole S x S (as the einsums compute it). With ``remat`` every block's forward runs
        twice: 8 per block parameter, 16·L·S·d. ``attention``: ``"all"``; ``"forward"`` (only the
        forward attention, 4·L·S·d, twice with remat: what flash attention's kernels declare, its
        backward kernels declaring none); ``"splash"`` (splash attention's kernels over the causal
        mask's blocks, jax's default 128: a fraction (n+1)/2n of the n x n blocks, each forward pass
        2 block matmuls, its backward 7: ``dq`` 3, ``dkv`` 4); ``"none"``.

        Example:
            >>> import dataclasses
            >>> moe = dataclasses.replace(TINY, experts=4, top_k=2, remat=False)
            >>> extra = moe.train_step_flops() - dataclasses.replace(moe, experts=0).train_step_flops()
            >>> extra == 6 * 2 * 4096 * (2 * 128 * 512 + 128 * 4)  # A second expert's MLP and the router, per token.
            True
        """
        d, f, layers, tokens = self.d_model, self.d_ff, self.n_layers, self.batch * self.seq_len
        per_block = 4 * d * d + 2 * d * f * (self.top_k if self.experts else 1) + d * self.experts
        recompute = 1 if self.remat else 0
        blocks = -(-self.seq_len // 128)  # Splash's default block size.
        visited = (blocks + 1) / (2 * blocks)
        passes = {"all": 3 + recompute, "forward": 1 + recompute, "splash": visited * (1 + recompute + 3.5),
                  "none": 0}[attention]
        flops = 6 * self.vocab * d * tokens + (6 + 2 * recompute) * layers * per_block * tokens
        return float(flops + passes * 4 * layers * self.seq_len * d * tokens)


def init_params(cfg: LMConfig, rng: jax.Array) -> Params:
    """Parameters, fp32, layers stacked on a leading axis of size ``n_layers``."""
    d, f, layers, v = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.vocab
    keys = iter(jax.random.split(rng, 9))

    def normal(shape: tuple[int, ...], fan_in: int) -> jax.Array:
        return jax.random.normal(next(keys), shape, jnp.float32) * fan_in**-0.5

    return {
        "embed": normal((v, d), 1),
        "layers": {
            "attn": {
                "wq": normal((layers, d, d), d),
                "wk": normal((layers, d, d), d),
                "wv": normal((layers, d, d), d),
                "wo": normal((layers, d, d), d),
            },
            "mlp": {"wi": normal((layers, d, f), d), "wo": normal((layers, f, d), f)} if not cfg.experts else {
                "router": normal((layers, d, cfg.experts), d),
                "wi": normal((layers, cfg.experts, d, f), d),
                "wo": normal((layers, cfg.experts, f, d), f),
            },
            "ln1": jnp.ones((layers, d), jnp.float32),
            "ln2": jnp.ones((layers, d), jnp.float32),
        },
        "final_ln": jnp.ones((d,), jnp.float32),
        "unembed": normal((d, v), d),
    }


PARTITION_RULES = (
    # FSDP over "data" on the model dimension, tensor parallel over "model".
    (r"layers/attn/w[qkv]$", P(None, "data", "model")),
    (r"layers/attn/wo$", P(None, "model", "data")),
    (r"layers/mlp/wi$", P(None, "data", "model")),
    (r"layers/mlp/wo$", P(None, "model", "data")),
    (r"^embed$", P("model", "data")),
    (r"^unembed$", P("data", "model")),
    (r".*", P()),  # Norm scales: small, replicated.
)

# Routed experts: FSDP over "data" on each expert's model dimension (gathered where used).
MOE_PARTITION_RULES = (
    (r"layers/mlp/router$", P(None, "data", None)),
    (r"layers/mlp/wi$", P(None, None, "data", None)),
    (r"layers/mlp/wo$", P(None, None, None, "data")),
    *(rule for rule in PARTITION_RULES if not rule[0].startswith("layers/mlp/")),
)


def partition_rules(cfg: LMConfig) -> tuple:
    return MOE_PARTITION_RULES if cfg.experts else PARTITION_RULES


_ACTIVATIONS = P("data", None, None)


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (normed * scale).astype(x.dtype)


def _heads(cfg: LMConfig, x: jax.Array) -> jax.Array:
    return x.reshape(*x.shape[:-1], cfg.n_heads, cfg.head_dim)


def _attend(cfg: LMConfig, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    # q: [B, Sq, H, Dh]; k, v: [B, Sk, H, Dh]; mask: broadcastable to [B, H, Sq, Sk].
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * cfg.head_dim**-0.5
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(q.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    return out.reshape(*out.shape[:-2], cfg.d_model)


def _kernel_attend(cfg: LMConfig, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal attention by a Pallas TPU kernel of jax's, on each device's batch rows and heads
    (XLA does not partition a kernel: ``shard_map`` hands it its shard)."""
    from jax.experimental.pallas.ops.tpu import flash_attention  # noqa: PLC0415  (TPU kernels: imported when used)
    from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415
        splash_attention_kernel as splash, splash_attention_mask as masks,
    )

    scale = cfg.head_dim**-0.5

    def local(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:  # [b, h, S, Dh] on one device
        if cfg.attention == "flash":
            return flash_attention.flash_attention(q, k, v, causal=True, sm_scale=scale)
        causal = masks.MultiHeadMask([masks.CausalMask((q.shape[2], k.shape[2]))] * q.shape[1])
        kernel = splash.make_splash_mha(causal, head_shards=1, q_seq_shards=1)
        return jax.vmap(kernel)(q * scale, k, v)

    spec = P("data", "model", None, None)
    heads_first = [t.transpose(0, 2, 1, 3) for t in (q, k, v)]
    out = jax.shard_map(local, mesh=jax.sharding.get_abstract_mesh(), in_specs=(spec,) * 3, out_specs=spec,
                        check_vma=False)(*heads_first)
    out = out.transpose(0, 2, 1, 3)
    return out.reshape(*out.shape[:-2], cfg.d_model)


def _mlp(layer: Params, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ layer["mlp"]["wi"].astype(x.dtype))
    return h @ layer["mlp"]["wo"].astype(x.dtype)


def _moe(cfg: LMConfig, layer: Params, x: jax.Array) -> jax.Array:
    """Routed experts: each device sorts its own tokens by expert and runs every expert's rows
    with ``jax.lax.ragged_dot`` (the experts' weights gathered whole, as FSDP gathers a layer)."""
    mlp = layer["mlp"]

    def local(x: jax.Array, router: jax.Array, wi: jax.Array, wo: jax.Array) -> jax.Array:
        b, s, d = x.shape
        tokens = x.reshape(b * s, d)
        scores, chosen = jax.lax.top_k((tokens @ router.astype(x.dtype)).astype(jnp.float32), cfg.top_k)
        gates = jax.nn.softmax(scores, axis=-1).astype(x.dtype)  # [T, k]
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat)
        rows = tokens[order // cfg.top_k]  # [T*k, d], grouped by expert
        sizes = jnp.bincount(flat, length=cfg.experts).astype(jnp.int32)
        h = jax.nn.gelu(jax.lax.ragged_dot(rows, wi.astype(x.dtype), sizes))
        out = jax.lax.ragged_dot(h, wo.astype(x.dtype), sizes)  # [T*k, d], grouped by expert
        out = jnp.zeros_like(out).at[order].set(out).reshape(b * s, cfg.top_k, d)
        return jnp.einsum("tkd,tk->td", out, gates).reshape(b, s, d)

    return jax.shard_map(local, mesh=jax.sharding.get_abstract_mesh(),
                         in_specs=(P("data"), P(), P(), P()), out_specs=P("data"),
                         check_vma=False)(x, mlp["router"], mlp["wi"], mlp["wo"])


def _block(cfg: LMConfig, layer: Params, x: jax.Array, mask: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """One block over a full sequence; also returns its keys and values (for a cache)."""
    x = jax.lax.with_sharding_constraint(x, _ACTIVATIONS)
    h = _rms_norm(x, layer["ln1"])
    attn = layer["attn"]
    q, k, v = (_heads(cfg, h @ attn[w].astype(h.dtype)) for w in ("wq", "wk", "wv"))
    attended = _attend(cfg, q, k, v, mask) if cfg.attention == "xla" else _kernel_attend(cfg, q, k, v)
    x = x + attended @ attn["wo"].astype(h.dtype)
    normed = _rms_norm(x, layer["ln2"])
    x = x + (_moe(cfg, layer, normed) if cfg.experts else _mlp(layer, normed))
    return x, (k, v)


def _layer(params: Params, i: int) -> Params:
    return jax.tree_util.tree_map(lambda w: w[i], params["layers"])


def _run_layers(cfg: LMConfig, params: Params, x: jax.Array, mask: jax.Array) -> tuple[jax.Array, Any]:
    def body(x: jax.Array, layer: Params) -> tuple[jax.Array, Any]:
        return _block(cfg, layer, x, mask)

    if cfg.remat:
        body = jax.checkpoint(body, prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
        return jax.lax.scan(body, x, params["layers"])
    kvs = []
    for i in range(cfg.n_layers):
        x, kv = body(x, _layer(params, i))
        kvs.append(kv)
    return x, jax.tree_util.tree_map(lambda *a: jnp.stack(a), *kvs)


def _logits(params: Params, x: jax.Array) -> jax.Array:
    x = _rms_norm(x, params["final_ln"])
    return (x @ params["unembed"].astype(x.dtype)).astype(jnp.float32)


def forward(cfg: LMConfig, params: Params, tokens: jax.Array) -> tuple[jax.Array, Any]:
    """Logits ``[B, S, V]`` (fp32) and per-layer keys/values ``[L, B, S, H, Dh]``."""
    x = params["embed"].astype(jnp.bfloat16)[tokens]
    s = tokens.shape[1]
    mask = jnp.tril(jnp.ones((s, s), bool))[None, None]
    x, kv = _run_layers(cfg, params, x, mask)
    return _logits(params, x), kv


def loss_fn(cfg: LMConfig, params: Params, batch: Mapping[str, jax.Array]) -> jax.Array:
    """Mean next-token cross-entropy."""
    logits, _ = forward(cfg, params, batch["tokens"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()


def prefill(cfg: LMConfig, params: Params, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, Any]:
    """Runs the prompt; returns the last position's logits and a KV cache sized for decoding."""
    logits, (k, v) = forward(cfg, params, batch["prompt"])
    pad = ((0, 0), (0, 0), (0, cfg.decode_len), (0, 0), (0, 0))
    cache = (jnp.pad(k, pad), jnp.pad(v, pad))
    return logits[:, -1], cache


def _decode_step(cfg: LMConfig, params: Params, cache: Any, token: jax.Array, pos: jax.Array) -> tuple[jax.Array, Any]:
    """One token ``[B]`` at position ``pos`` through every layer, updating the cache."""
    x = params["embed"].astype(jnp.bfloat16)[token][:, None]  # [B, 1, D]
    total = cache[0].shape[2]
    mask = (jnp.arange(total) <= pos)[None, None, None]

    def body(x: jax.Array, layer_and_cache: Any) -> tuple[jax.Array, Any]:
        layer, (k_cache, v_cache) = layer_and_cache
        h = _rms_norm(x, layer["ln1"])
        attn = layer["attn"]
        q, k, v = (_heads(cfg, h @ attn[w].astype(h.dtype)) for w in ("wq", "wk", "wv"))
        k_cache = jax.lax.dynamic_update_slice_in_dim(k_cache, k, pos, axis=1)
        v_cache = jax.lax.dynamic_update_slice_in_dim(v_cache, v, pos, axis=1)
        x = x + _attend(cfg, q, k_cache, v_cache, mask) @ attn["wo"].astype(h.dtype)
        normed = _rms_norm(x, layer["ln2"])
        x = x + (_moe(cfg, layer, normed) if cfg.experts else _mlp(layer, normed))
        return x, (k_cache, v_cache)

    x, cache = jax.lax.scan(body, x, (params["layers"], cache))
    return _logits(params, x)[:, 0], cache


def sample_decode(cfg: LMConfig, params: Params, batch: Mapping[str, jax.Array]) -> jax.Array:
    """Greedy decoding: prefill, then ``decode_len`` single-token steps. Returns ``[B, decode_len]``."""
    logits, cache = prefill(cfg, params, batch)
    prompt_len = batch["prompt"].shape[1]
    out = jnp.zeros((logits.shape[0], cfg.decode_len), jnp.int32)

    def step(i: jax.Array, carry: Any) -> Any:
        logits, cache, out = carry
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out = out.at[:, i].set(token)
        logits, cache = _decode_step(cfg, params, cache, token, prompt_len + i)
        return logits, cache, out

    _, _, out = jax.lax.fori_loop(0, cfg.decode_len, step, (logits, cache, out))
    return out


def _abstract_init(cfg: LMConfig):
    return lambda rng: init_params(cfg, rng)


def _platforms(cfg: LMConfig) -> tuple[str, ...]:
    return (TPU.name,) if cfg.attention != "xla" else ()  # jax's Pallas kernels here are TPU kernels.


def trainer_config(cfg: LMConfig, **overrides: Any) -> TrainerConfig:
    """The train step: AdamW with warmup-cosine schedule and global-norm clipping.

    ``overrides`` replace any TrainerConfig field (e.g. ``partition_rules``).
    """
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-4, 2_000, 100_000)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.1))
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq_len), jnp.int32)
    fields = dict(
        init_fn=_abstract_init(cfg),
        loss_fn=lambda params, batch: loss_fn(cfg, params, batch),
        optimizer=optimizer,
        batch_spec={"tokens": tokens, "targets": tokens},
        partition_rules=partition_rules(cfg),
        mesh=cfg.mesh,
        platforms=_platforms(cfg),
    )
    return TrainerConfig(**{**fields, **overrides})


def inference_config(cfg: LMConfig, **overrides: Any) -> InferenceConfig:
    """``prefill`` and ``sample_decode`` over a prompt batch."""
    fields = dict(
        init_fn=_abstract_init(cfg),
        methods={
            "prefill": lambda params, batch: prefill(cfg, params, batch),
            "sample_decode": lambda params, batch: sample_decode(cfg, params, batch),
        },
        input_batch_spec={"prompt": jax.ShapeDtypeStruct((cfg.decode_batch, cfg.prompt_len), jnp.int32)},
        partition_rules=partition_rules(cfg),
        mesh=cfg.mesh,
        platforms=_platforms(cfg),
    )
    return InferenceConfig(**{**fields, **overrides})


# Presets. ``TINY`` compiles in seconds (tests, the default gate); ``ONE_B`` is
# the realistic one for the main job (18 layers, d_model 2048, 1.04B params).
TINY = LMConfig(
    vocab=1024, d_model=128, n_layers=2, n_heads=4, d_ff=512,
    seq_len=128, batch=32, prompt_len=32, decode_len=16, decode_batch=32,
    mesh=MeshSpec(("data", "model"), (-1, 2), adapt=True),  # Adapted: one chip takes (1, 1).
)
ONE_B = LMConfig(
    vocab=32_000, d_model=2048, n_layers=18, n_heads=16, d_ff=8192,
    seq_len=1024, batch=64, prompt_len=128, decode_len=128, decode_batch=32,
    # Pure FSDP by default; tensor parallel on the 16-GiB v5e chips.
    mesh=MeshSpec(("data", "model"), (-1, 1), overrides={"v5e-*": (-1, 2)}, adapt=True),
)


# Production shapes of the field, small: attention by a Pallas kernel inside the layer scan (head
# width 128, as the kernels' blocks want), and routed experts through ragged_dot. Without remat, so
# that train_step_flops is exact: with it, XLA drops the recompute of each block's last matmuls
# (their outputs are dead in the backward pass), 5% below the formula's 8N.
FLASH = LMConfig(
    vocab=1024, d_model=256, n_layers=2, n_heads=2, d_ff=512,
    seq_len=256, batch=16, prompt_len=128, decode_len=16, decode_batch=16,
    mesh=MeshSpec(("data", "model"), (-1, 2), adapt=True), attention="flash", remat=False,
)
SPLASH = dataclasses.replace(FLASH, attention="splash")
MOE = LMConfig(
    vocab=1024, d_model=128, n_layers=2, n_heads=4, d_ff=256,
    seq_len=128, batch=32, prompt_len=32, decode_len=16, decode_batch=32,
    mesh=MeshSpec(("data", "model"), (-1, 1), adapt=True), experts=8, top_k=2, remat=False,
)


def gate_configs(cfg: LMConfig, *, fit_upper: int | None = None) -> list[TrainerConfig | InferenceConfig]:
    """The train step and the inference methods, each with a fit search of its batch, as the
    repository's gate registers them. ``fit_upper``: the search's cap, as a multiple of each
    config's batch (None: the search's default).

    Example:
        >>> [(c.fit, c.fit_upper) for c in gate_configs(TINY, fit_upper=8)]
        [('batch', 256), ('batch', 256)]
    """
    def cap(batch: int) -> int | None:
        return fit_upper * batch if fit_upper else None

    return [trainer_config(cfg, fit="batch", fit_upper=cap(cfg.batch)),
            inference_config(cfg, fit="batch", fit_upper=cap(cfg.decode_batch))]
