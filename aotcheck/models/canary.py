"""marin's MoE canary, small: routed experts through jax's megablox grouped matmul, its eval in f32.

marin #6378 / #6363: a MoE canary trained to its first eval (step 240), then failed with a
deterministic compile OOM: the eval step runs the grouped-matmul Pallas kernel in f32, needing
more scoped VMEM than the chip's default limit, while the train step (bf16) fits. This model is
that shape: each layer's experts run :func:`jax.experimental.pallas.ops.tpu.megablox.gmm` per device
under ``shard_map`` (tokens sorted by expert), with the train step in bf16 and its own eval step
(:attr:`~aotcheck.programs.config.TrainerConfig.eval_step`) in f32. Its tiles are sized so that the
kernel's blocks fit the 16 MiB default in bf16 and do not in f32: aotcheck refuses the eval step
before launch, naming the kernel and the flag that raises the limit (``tests/e2e/test_eval_step.py``).

Example (the two programs; nothing is traced here):
    >>> config = trainer_config(CANARY)
    >>> config.programs, config.platforms
    (('train_step', 'eval_step'), ('tpu',))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from aotcheck.models.lm import _rms_norm  # The reference LM's norm, as its layers use it.
from aotcheck.programs.config import TrainerConfig
from aotcheck.targets.mesh import MeshSpec
from aotcheck.targets.platform import TPU


@dataclasses.dataclass(frozen=True)
class CanaryConfig:
    """Sizes, the kernel's tiles ``(tm, tk, tn)``, and the dtypes the train and eval steps compute in."""

    vocab: int = 1024
    d_model: int = 1024
    d_ff: int = 2048
    n_layers: int = 2
    experts: int = 8
    top_k: int = 2
    seq_len: int = 512
    batch: int = 4
    tiling: tuple[int, int, int] = (2048, 512, 512)
    train_dtype: Any = jnp.bfloat16
    eval_dtype: Any = jnp.float32


CANARY = CanaryConfig()


def init_params(cfg: CanaryConfig, rng: jax.Array) -> dict[str, Any]:
    """Parameters in f32 (cast to the step's dtype where used); only ever traced."""
    keys = iter(jax.random.split(rng, 6))
    d, f, e, layers = cfg.d_model, cfg.d_ff, cfg.experts, cfg.n_layers

    def normal(shape: tuple[int, ...]) -> jax.Array:
        return jax.random.normal(next(keys), shape, jnp.float32) * shape[-2] ** -0.5

    return {"embed": normal((cfg.vocab, d)), "unembed": normal((d, cfg.vocab)), "final_ln": jnp.ones((d,)),
            "layers": {"ln": jnp.ones((layers, d)), "router": normal((layers, d, e)),
                       "wi": normal((layers, e, d, f)), "wo": normal((layers, e, f, d))}}


def _experts(cfg: CanaryConfig, layer: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    """Each device sorts its tokens by expert and runs megablox's gmm over them, in ``x``'s dtype."""
    from jax.experimental.pallas.ops.tpu.megablox import gmm  # noqa: PLC0415 (TPU kernels: imported when traced)

    def local(x: jax.Array, router: jax.Array, wi: jax.Array, wo: jax.Array) -> jax.Array:
        b, s, d = x.shape
        tokens = x.reshape(b * s, d)
        scores, chosen = jax.lax.top_k((tokens @ router.astype(x.dtype)).astype(jnp.float32), cfg.top_k)
        gates = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat)
        rows = tokens[order // cfg.top_k]
        sizes = jnp.bincount(flat, length=cfg.experts).astype(jnp.int32)
        h = jax.nn.gelu(gmm(rows, wi.astype(x.dtype), sizes, preferred_element_type=x.dtype, tiling=cfg.tiling))
        out = gmm(h, wo.astype(x.dtype), sizes, preferred_element_type=x.dtype, tiling=cfg.tiling)
        out = jnp.zeros_like(out).at[order].set(out).reshape(b * s, cfg.top_k, d)
        return jnp.einsum("tkd,tk->td", out, gates).reshape(b, s, d)

    return jax.shard_map(local, mesh=jax.sharding.get_abstract_mesh(), in_specs=(P("data"), P(), P(), P()),
                         out_specs=P("data"), check_vma=False)(x, layer["router"], layer["wi"], layer["wo"])


def loss_fn(cfg: CanaryConfig, params: Mapping[str, Any], batch: Mapping[str, jax.Array], *, dtype: Any) -> jax.Array:
    """Mean next-token cross-entropy, the layers computed in ``dtype``."""
    x = params["embed"].astype(dtype)[batch["tokens"]]

    def body(x: jax.Array, layer: Mapping[str, jax.Array]) -> tuple[jax.Array, None]:
        return x + _experts(cfg, layer, _rms_norm(x, layer["ln"])), None

    x, _ = jax.lax.scan(body, x, params["layers"])
    logits = (_rms_norm(x, params["final_ln"]) @ params["unembed"].astype(dtype)).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()


def trainer_config(cfg: CanaryConfig, **overrides: Any) -> TrainerConfig:
    """The train step in ``cfg.train_dtype``, and the canary's own eval step in ``cfg.eval_dtype``;
    data parallel, parameters replicated (``overrides`` replace any field)."""
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq_len), jnp.int32)
    fields = dict(
        init_fn=lambda rng: init_params(cfg, rng),
        loss_fn=lambda params, batch: loss_fn(cfg, params, batch, dtype=cfg.train_dtype),
        eval_step=lambda params, batch: {"loss": loss_fn(cfg, params, batch, dtype=cfg.eval_dtype)},
        optimizer=optax.adamw(3e-4),
        batch_spec={"tokens": tokens, "targets": tokens},
        partition_rules=((".*", P()),),
        mesh=MeshSpec(("data",), (-1,), adapt=True),
        platforms=(TPU.name,),
    )
    return TrainerConfig(**{**fields, **overrides})


__all__ = ["CANARY", "CanaryConfig", "init_params", "loss_fn", "trainer_config"]
