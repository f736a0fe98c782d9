"""The toy project the plugin and gate tests run pytest in, for real (pytester, subprocesses).

The toy is a jitted ``tanh(x @ w)`` whose width comes from TOY_WIDTH, so a test
can grow its memory between two runs the way an edited config would.
"""

import json

CONFTEST = '''
import os

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck

WIDTH = int(os.environ.get("TOY_WIDTH", "256"))


def make_args(mesh):
    rows = NamedSharding(mesh, P("data"))
    return (
        jax.ShapeDtypeStruct((mesh.devices.size * 8, WIDTH), jnp.float32, sharding=rows),
        jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32, sharding=NamedSharding(mesh, P())),
    )


aotcheck.register("toy", aotcheck.FunctionConfig(fn=lambda x, w: jnp.tanh(x @ w), make_args=make_args))

if os.environ.get("TOY_EXTRAS"):
    aotcheck.register("big", aotcheck.FunctionConfig(fn=lambda x, w: jnp.tanh(x @ w), make_args=make_args,
                                                     min_devices=8))

    @aotcheck.register("broken")
    def broken():
        raise RuntimeError("the builder fell over")

    def huge(mesh):  # 24 GiB per device: more than any v5e has.
        return (jax.ShapeDtypeStruct((mesh.devices.size * 6 * 2**30,), jnp.float32,
                                     sharding=NamedSharding(mesh, P("data"))),)

    aotcheck.register("oom", aotcheck.FunctionConfig(fn=lambda x: x * 2, make_args=huge))

if os.environ.get("TOY_FIT"):
    import toy_fit  # noqa: F401  (a config that asks for a fit search)

if os.environ.get("TOY_LM"):
    from aotcheck.models import lm

    import dataclasses

    rules = ((".*", P()),) if os.environ["TOY_LM"] == "replicated" else lm.PARTITION_RULES
    model = dataclasses.replace(lm.TINY, remat=os.environ["TOY_LM"] != "noremat")  # noremat: a regressed edit
    aotcheck.register("lm", lambda: lm.trainer_config(model, partition_rules=rules))
'''

FIT = '''
import os

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

import aotcheck

VOCAB, WIDTH = 16384, 64
HEAVY = os.environ.get("TOY_FIT") == "heavy"  # An edit that doubles the activations.


def init(key):
    k1, k2 = jax.random.split(key)
    return {"embed": jax.random.normal(k1, (VOCAB, WIDTH)), "unembed": jax.random.normal(k2, (WIDTH, VOCAB))}


def loss(params, batch):
    logits = (params["embed"][batch["tokens"]] @ params["unembed"]).astype(jnp.float32)
    if HEAVY:
        logits = jnp.concatenate([logits, jnp.tanh(logits)], axis=-1)
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])


aotcheck.register("fit", aotcheck.TrainerConfig(
    init_fn=init, loss_fn=loss, optimizer=optax.sgd(0.1),
    partition_rules=((r"^embed$", P("data", None)), (r"^unembed$", P(None, "data"))),
    batch_spec={"tokens": jax.ShapeDtypeStruct((16, 128), jnp.int32)},
    mesh=aotcheck.MeshSpec(("data",), (-1,)),
    fit=None if os.environ.get("TOY_FIT_FIELD") == "none" else "batch",  # none: the gate's --aot-fit asks
    fit_targets=tuple(os.environ.get("TOY_FIT_TARGETS", "*").split())))
'''

INI = """
[pytest]
aot_golden_dir = golden
"""


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def golden(pytester, case="toy/step@v4-8x1.json"):
    return pytester.path / "golden" / case


def plant_stale(pytester, rel="gone/step@v4-8x1.json"):
    """A golden aotcheck wrote for a case no config has any more: toy/step's, written for ``rel``."""
    doc = json.loads(golden(pytester).read_text())
    path = golden(pytester, rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**doc, "case": rel.removesuffix(".json")}, indent=2, sort_keys=True) + "\n")
    return path


def without_noisy(text: str | bytes) -> str:
    """A golden's JSON with its noisy figures (compile and lower seconds) dropped: an update run compiles
    afresh (it reads no figures cache), so two of them agree on every figure but these."""
    import fnmatch

    from aotcheck.gate.compare import NOISY

    doc = json.loads(text)
    doc["figures"] = {k: v for k, v in doc["figures"].items() if not any(fnmatch.fnmatchcase(k, g) for g in NOISY)}
    return json.dumps(doc, indent=2, sort_keys=True)
