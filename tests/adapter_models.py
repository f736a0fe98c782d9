"""Models as their users write them, registered through aotcheck's adapters (ini: aot_config_modules).

- ``linen-tiny``: a Flax Linen LM annotated both ways Linen offers (logical axis names
  through ``logical_axis_rules``, and mesh axes), its LayerNorms left unannotated and
  decided by a regex override; a train step and a ``forward`` method.
- ``nnx-tiny``: a Flax NNX LM with ``nnx.with_partitioning`` (logical names), a Dropout
  (RNG state besides its parameters) and an unannotated LayerNorm, replicated on request.
- ``eqx-tiny``: an Equinox model (no annotations: Equinox has none), sharded by a regex
  and :func:`aotcheck.fsdp`.
- ``nnx-llama``: a Flax NNX Llama (grouped-query attention, RMSNorm, SwiGLU) written the way
  model libraries write theirs: parameters annotated with mesh axes (``fsdp``, ``tp``) and
  activations constrained by a shard helper that looks for the mesh in context (see docs/configs.md, "How a
  model finds its mesh"). ``llama_config(shard=...)`` builds it with another helper.
- ``esm2-8m``: third-party code: ESM2 (the protein language model, 6 layers, 7.8M
  parameters) as the ``esm2quinox`` package publishes it, an Equinox port by Equinox's
  author; it has no shardings of its own, so FSDP decides every parameter.

Their goldens are under golden/; the default run checks them on v5e-16 (tests/unit/adapters/test_base.py),
the main job on every topology.
"""

from __future__ import annotations

import equinox as eqx
import esm2quinox
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

import aotcheck
from aotcheck.adapters import equinox as eqx_adapter
from aotcheck.adapters import flax_linen, flax_nnx

VOCAB, D, FF, BATCH, SEQ = 1024, 128, 512, 32, 128
TOKENS = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32)
MESH = aotcheck.MeshSpec(("data", "model"), (-1, 2))
LOGICAL = [("batch", "data"), ("vocab", "model"), ("embed", "data"), ("mlp", "model")]
BATCH_ONLY, LOGITS = ("batch", None, None), ("batch", None, "vocab")  # Activations: the batch on the data axis.
lecun = nn.initializers.lecun_normal()


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1].astype(jnp.float32), tokens[:, 1:]).mean()


# --- Flax Linen ------------------------------------------------------------------------------------

class LinenLM(nn.Module):
    layers: int = 2

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        embed = nn.Embed(VOCAB, D, embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02),
                                                                                ("vocab", "embed")))
        x = nn.with_logical_constraint(embed(tokens), BATCH_ONLY)
        for i in range(self.layers):
            h = nn.LayerNorm(name=f"norm_{i}")(x)  # Unannotated: scale and bias.
            h = nn.Dense(FF, use_bias=False, name=f"up_{i}",
                         kernel_init=nn.with_logical_partitioning(lecun, ("embed", "mlp")))(h)
            x = x + nn.Dense(D, use_bias=False, name=f"down_{i}",
                             kernel_init=nn.with_partitioning(lecun, ("model", None)))(nn.gelu(h))  # Mesh axes.
            x = nn.with_logical_constraint(x, BATCH_ONLY)
        # Without these constraints the partitioner follows the FSDP-sharded weights and keeps the whole
        # batch on every device (the lint of aotcheck.figures.sharding says so).
        return nn.with_logical_constraint(embed.attend(x), LOGITS)


def linen_adapted(**options) -> aotcheck.adapters.base.Adapted:
    options.setdefault("overrides", [(r"norm_\d+/(scale|bias)$", P())])
    return flax_linen.adapt(LinenLM(), (TOKENS,), logical_axis_rules=LOGICAL, **options)


@aotcheck.register("linen-tiny", description="Flax Linen LM through aotcheck.adapters.flax_linen")
def linen_tiny():
    adapted = linen_adapted()
    return [
        adapted.trainer(batch_spec={"tokens": TOKENS}, optimizer=optax.adamw(1e-3), mesh=MESH,
                        loss_fn=lambda model, batch: next_token_loss(model(batch["tokens"]), batch["tokens"])),
        adapted.inference(methods={"forward": lambda model, batch: model(batch["tokens"])},
                          input_batch_spec={"tokens": TOKENS}, mesh=MESH),
    ]


# --- Flax NNX --------------------------------------------------------------------------------------

class NNXLM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        part = nnx.with_partitioning
        self.embed = nnx.Embed(VOCAB, D, embedding_init=part(nnx.initializers.normal(0.02), ("vocab", "embed")),
                               rngs=rngs)
        self.norm = nnx.LayerNorm(D, rngs=rngs)  # Unannotated: replicated on request.
        self.up = nnx.Linear(D, FF, use_bias=False, kernel_init=part(lecun, ("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(FF, D, use_bias=False, kernel_init=part(lecun, ("mlp", "embed")), rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)  # RNG state the train step carries besides the params.

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.with_logical_constraint(self.embed(tokens), BATCH_ONLY)  # Logical names, as in Linen.
        x = nn.with_logical_constraint(x + self.down(self.drop(nnx.gelu(self.up(self.norm(x))))), BATCH_ONLY)
        return nn.with_logical_constraint(self.embed.attend(x), LOGITS)


def nnx_adapted(**options) -> aotcheck.adapters.base.Adapted:
    options.setdefault("unannotated", "replicate")
    # Dropout draws from an RBG key, as TPU trainers usually do: with the default threefry key the
    # mask's bits alone made this tiny step take 18 s to compile on v5e-16 (2.8 s with RBG).
    return flax_nnx.adapt(lambda: NNXLM(nnx.Rngs(params=0, dropout=jax.random.key(0, impl="rbg"))),
                          logical_axis_rules=LOGICAL, **options)


@aotcheck.register("nnx-tiny", description="Flax NNX LM through aotcheck.adapters.flax_nnx")
def nnx_tiny():
    return nnx_adapted().trainer(
        batch_spec={"tokens": TOKENS}, optimizer=optax.adamw(1e-3), mesh=MESH,
        loss_fn=lambda model, batch: next_token_loss(model(batch["tokens"]), batch["tokens"]))


# --- Flax NNX, written as model libraries write theirs ----------------------------------------------

def shard_by_context_mesh(x: jax.Array, *spec) -> jax.Array:
    """The shard helper as a model should write it: decided by the mesh in context, which aotcheck
    sets while it traces for a TPU target (and which is empty on a laptop, where this is a no-op)."""
    if jax.sharding.get_abstract_mesh().empty:
        return x
    return jax.lax.with_sharding_constraint(x, P(*spec))


LLAMA = dict(vocab=2048, dim=256, heads=8, kv_heads=2, head_dim=32, ffn=512, layers=2)
LLAMA_BATCH, LLAMA_SEQ = 16, 256
LLAMA_MESH = aotcheck.MeshSpec(("fsdp", "tp"), (-1, 2))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int):
        self.scale = nnx.Param(jnp.ones((dim,)), out_sharding=(None,))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)).astype(x.dtype) * self.scale


class LlamaBlock(nnx.Module):
    def __init__(self, c: dict, shard, rngs: nnx.Rngs):
        part, init = nnx.with_partitioning, nnx.initializers.lecun_normal()
        self.c, self.shard = c, shard
        self.attn_norm, self.mlp_norm = RMSNorm(c["dim"]), RMSNorm(c["dim"])
        self.wq = nnx.Param(part(init, ("fsdp", "tp", None))(rngs.params(), (c["dim"], c["heads"], c["head_dim"])))
        self.wk = nnx.Param(part(init, ("fsdp", "tp", None))(rngs.params(), (c["dim"], c["kv_heads"], c["head_dim"])))
        self.wv = nnx.Param(part(init, ("fsdp", "tp", None))(rngs.params(), (c["dim"], c["kv_heads"], c["head_dim"])))
        self.wo = nnx.Param(part(init, ("tp", None, "fsdp"))(rngs.params(), (c["heads"], c["head_dim"], c["dim"])))
        self.w1 = nnx.Param(part(init, ("fsdp", "tp"))(rngs.params(), (c["dim"], c["ffn"])))
        self.w3 = nnx.Param(part(init, ("fsdp", "tp"))(rngs.params(), (c["dim"], c["ffn"])))
        self.w2 = nnx.Param(part(init, ("tp", "fsdp"))(rngs.params(), (c["ffn"], c["dim"])))

    def __call__(self, x: jax.Array) -> jax.Array:
        c, shard = self.c, self.shard
        groups = c["heads"] // c["kv_heads"]
        h = self.attn_norm(x)
        q = jnp.einsum("BTD,DNH->BTNH", h, self.wq.astype(h.dtype))
        q = q.reshape(*q.shape[:2], c["kv_heads"], groups, c["head_dim"])  # BTHGD
        k = shard(jnp.einsum("BSD,DHK->BSHK", h, self.wk.astype(h.dtype)), "fsdp", None, "tp", None)
        v = shard(jnp.einsum("BSD,DHK->BSHK", h, self.wv.astype(h.dtype)), "fsdp", None, "tp", None)
        scores = jnp.einsum("BTHGD,BSHD->BHGTS", q, k).astype(jnp.float32) / c["head_dim"] ** 0.5
        scores = shard(scores, "fsdp", "tp", None, None, None)
        causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
        probs = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1).astype(x.dtype)
        out = jnp.einsum("BHGTS,BSHD->BTHGD", probs, v).reshape(*x.shape[:2], c["heads"], c["head_dim"])
        x = x + shard(jnp.einsum("BTNH,NHD->BTD", out, self.wo.astype(x.dtype)), "fsdp", None, None)
        h = self.mlp_norm(x)
        gate = jax.nn.silu(h @ self.w1.astype(h.dtype)) * (h @ self.w3.astype(h.dtype))
        return x + shard(shard(gate, "fsdp", None, "tp") @ self.w2.astype(h.dtype), "fsdp", None, None)


class Llama(nnx.Module):
    def __init__(self, c: dict, *, shard=shard_by_context_mesh, rngs: nnx.Rngs):
        part = nnx.with_partitioning
        self.shard = shard
        self.embed = nnx.Embed(c["vocab"], c["dim"], embedding_init=part(nnx.initializers.normal(0.02), ("tp", "fsdp")),
                               rngs=rngs)
        self.blocks = nnx.List([LlamaBlock(c, shard, rngs) for _ in range(c["layers"])])
        self.norm = RMSNorm(c["dim"])

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.shard(self.embed(tokens).astype(jnp.bfloat16), "fsdp", None, None)
        for block in self.blocks:
            x = block(x)
        return self.shard(self.embed.attend(self.norm(x)), "fsdp", None, "tp")


def llama_config(*, shard=shard_by_context_mesh, batch: int = LLAMA_BATCH, seq: int = LLAMA_SEQ
                 ) -> aotcheck.TrainerConfig:
    """The Llama train step, registered exactly as docs/getting-started.md shows (``flax_nnx.adapt``, mesh-axis names)."""
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    adapted = flax_nnx.adapt(lambda: Llama(LLAMA, shard=shard, rngs=nnx.Rngs(0)))
    return adapted.trainer(batch_spec={"tokens": tokens}, optimizer=optax.adamw(3e-4), mesh=LLAMA_MESH,
                           loss_fn=lambda model, batch: next_token_loss(model(batch["tokens"]), batch["tokens"]))


aotcheck.register("nnx-llama", llama_config,
                  description="Flax NNX Llama (GQA), mesh-axis annotations and a shard helper, through flax_nnx")


# --- Equinox ---------------------------------------------------------------------------------------

class EqxLM(eqx.Module):
    embed: eqx.nn.Embedding
    mlp: eqx.nn.MLP
    head: eqx.nn.Linear

    def __init__(self, key: jax.Array):
        k1, k2, k3 = jax.random.split(key, 3)
        self.embed = eqx.nn.Embedding(VOCAB, D, key=k1)
        self.mlp = eqx.nn.MLP(D, D, width_size=FF, depth=2, key=k2)
        self.head = eqx.nn.Linear(D, VOCAB, use_bias=False, key=k3)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = jax.vmap(self.embed)(tokens)
        return jax.vmap(self.head)(x + jax.vmap(self.mlp)(x))


def eqx_adapted(**options) -> aotcheck.adapters.base.Adapted:
    options.setdefault("rules", [(r"^embed/weight$", P("model", None)), aotcheck.fsdp("data")])
    return eqx_adapter.adapt(EqxLM, **options)


@aotcheck.register("eqx-tiny", description="Equinox LM through aotcheck.adapters.equinox")
def eqx_tiny():
    return eqx_adapted().trainer(
        batch_spec={"tokens": TOKENS}, optimizer=optax.adamw(1e-3), mesh=MESH,
        loss_fn=lambda model, batch: next_token_loss(jax.vmap(model)(batch["tokens"]), batch["tokens"]))


# --- Third-party: ESM2 from esm2quinox -------------------------------------------------------------

ESM2_8M = dict(num_layers=6, embed_size=320, num_heads=20)  # esm2_t6_8M_UR50D's shape.
ESM2_BATCH, ESM2_SEQ = 64, 256


def esm2_config(*, num_layers: int, embed_size: int, num_heads: int, batch: int = ESM2_BATCH,
                seq: int = ESM2_SEQ) -> aotcheck.TrainerConfig:
    """ESM2's masked-LM train step: tokens in, the original tokens as targets at every position."""
    adapted = eqx_adapter.adapt(
        lambda key: esm2quinox.ESM2(num_layers=num_layers, embed_size=embed_size, num_heads=num_heads,
                                    token_dropout=False, key=key),
        rules=[aotcheck.fsdp("data")])

    def loss(model, batch):
        logits = jax.vmap(model)(batch["tokens"]).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"]).mean()

    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return adapted.trainer(batch_spec={"tokens": tokens, "targets": tokens}, optimizer=optax.adamw(1e-4),
                           loss_fn=loss, mesh=aotcheck.MeshSpec(("data",), (-1,)))


aotcheck.register("esm2-8m", lambda: esm2_config(**ESM2_8M),
                  description="ESM2 8M (esm2quinox, third-party Equinox) through aotcheck.adapters.equinox")
