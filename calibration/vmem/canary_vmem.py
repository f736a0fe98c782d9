"""The canary's scoped VMEM on a real v5e chip and deviceless, one script for both (no aotcheck import).

The model of ``aotcheck.models.canary`` on one device, written out in plain JAX so that it runs on the
chip's bare toolchain: experts through jax's megablox ``gmm``, tiles (2048, 512, 512), the train step
(bf16, gradients, SGD) and the eval step (f32 forward). Each program is compiled at the default scoped
VMEM limit and the eval step at 22, 23 and 24 MiB; what the compiler says is kept. On the chip the
train step and the eval step at 24 MiB are also run once. Usage::

    python canary_vmem.py chip OUT.json          # on the chip
    python canary_vmem.py deviceless OUT.json    # on a CPU host: deviceless v5e-1, the same libtpu
"""

import json
import re
import sys
import time

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.megablox import gmm

VOCAB, D, F, LAYERS, EXPERTS, TOP_K, SEQ, BATCH = 1024, 1024, 2048, 2, 8, 2, 512, 4
TILING = (2048, 512, 512)


def experts(layer, x):
    b, s, d = x.shape
    tokens = x.reshape(b * s, d)
    scores, chosen = jax.lax.top_k((tokens @ layer["router"].astype(x.dtype)).astype(jnp.float32), TOP_K)
    gates = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat)
    rows = tokens[order // TOP_K]
    sizes = jnp.bincount(flat, length=EXPERTS).astype(jnp.int32)
    h = jax.nn.gelu(gmm(rows, layer["wi"].astype(x.dtype), sizes, preferred_element_type=x.dtype, tiling=TILING))
    out = gmm(h, layer["wo"].astype(x.dtype), sizes, preferred_element_type=x.dtype, tiling=TILING)
    out = jnp.zeros_like(out).at[order].set(out).reshape(b * s, TOP_K, d)
    return jnp.einsum("tkd,tk->td", out, gates).reshape(b, s, d)


def norm(x, scale):
    variance = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return (x * jax.lax.rsqrt(variance + 1e-6).astype(x.dtype)) * scale.astype(x.dtype)


def loss(params, batch, dtype):
    x = params["embed"].astype(dtype)[batch["tokens"]]
    x, _ = jax.lax.scan(lambda x, layer: (x + experts(layer, norm(x, layer["ln"])), None), x, params["layers"])
    logits = (norm(x, params["final_ln"]) @ params["unembed"].astype(dtype)).astype(jnp.float32)
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], axis=-1)
    return -picked.mean()


def train_step(params, batch):
    value, grads = jax.value_and_grad(loss)(params, batch, jnp.bfloat16)
    return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads), value


def eval_step(params, batch):
    return loss(params, batch, jnp.float32)


def shapes(sharding):
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)  # noqa: E731
    params = {"embed": f32(VOCAB, D), "unembed": f32(D, VOCAB), "final_ln": f32(D),
              "layers": {"ln": f32(LAYERS, D), "router": f32(LAYERS, D, EXPERTS),
                         "wi": f32(LAYERS, EXPERTS, D, F), "wo": f32(LAYERS, EXPERTS, F, D)}}
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32, sharding=sharding)
    return params, {"tokens": tokens, "targets": tokens}


def attempt(fn, args, kib):
    options = {} if kib is None else {"xla_tpu_scoped_vmem_limit_kib": str(kib)}
    start = time.perf_counter()
    try:
        compiled = jax.jit(fn).lower(*args).compile(compiler_options=options)
        return compiled, {"compiled": True, "seconds": round(time.perf_counter() - start, 1)}
    except Exception as e:  # The compiler's refusal, kept as it said it.
        said = re.search(r"Scoped allocation with size ([0-9.]+[KMG]) and limit ([0-9.]+[KMG])", str(e))
        return None, {"compiled": False, "size": said and said[1], "limit": said and said[2],
                      "error": str(e).splitlines()[0][:300]}


def main(mode, out):
    if mode == "chip":
        device = jax.devices()[0]
    else:
        from jax.experimental import topologies
        device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
                                              chips_per_host_bounds=(1, 1, 1), num_slices=1).devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    args = shapes(sharding)
    found = {"mode": mode, "jax": jax.__version__, "device_kind": device.device_kind, "tiling": TILING}
    import importlib.metadata as metadata
    found["libtpu"] = metadata.version("libtpu")
    runs = {}
    for name, fn, kib in [("train_step", train_step, None), ("eval_step", eval_step, None),
                          ("eval_step@22528", eval_step, 22528), ("eval_step@23552", eval_step, 23552),
                          ("eval_step@24576", eval_step, 24576)]:
        compiled, found[name] = attempt(fn, args, kib)
        if compiled is not None:
            found[name]["temp_bytes"] = compiled.memory_analysis().temp_size_in_bytes
            if mode == "chip" and name in ("train_step", "eval_step@24576"):
                real = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype, device=device) + 0.01
                                              if s.dtype == jnp.float32 else jnp.zeros(s.shape, s.dtype, device=device), args)
                start = time.perf_counter()
                result = jax.block_until_ready(compiled(*real))
                runs[name] = {"ran": True, "seconds": round(time.perf_counter() - start, 3),
                              "loss": float(jax.tree_util.tree_leaves(result)[-1])}
        print(name, found[name], flush=True)
    found["runs"] = runs
    with open(out, "w") as f:
        json.dump(found, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
