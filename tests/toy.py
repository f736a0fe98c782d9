"""The toy project the plugin and gate tests run pytest in, for real (pytester, subprocesses).

The toy is a jitted ``tanh(x @ w)``; a :class:`Toy` says which variant its conftest holds (the width,
the extra configs, a tiny LM, a fit search), and the ``edit_toy`` fixture rewrites the conftest between
two runs exactly as a user edits a config: a test that grows the memory writes a wider toy.

Example:
    >>> "WIDTH = 512" in render(Toy(width=512)) and "if False:" in render(Toy())
    True
"""

from __future__ import annotations

import dataclasses
import json
import string

# The conftest's lines are the same for every variant (only values change), so source lines in the
# details (conftest.py:LINE) do not move when a test edits the toy.
_CONFTEST = string.Template('''
import os

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck

WIDTH = $width


def make_args(mesh):
    rows = NamedSharding(mesh, P("data"))
    return (
        jax.ShapeDtypeStruct((mesh.devices.size * 8, WIDTH), jnp.float32, sharding=rows),
        jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32, sharding=NamedSharding(mesh, P())),
    )


aotcheck.register("toy", aotcheck.FunctionConfig(fn=lambda x, w: jnp.tanh(x @ w), make_args=make_args))

if $extras:
    aotcheck.register("big", aotcheck.FunctionConfig(fn=lambda x, w: jnp.tanh(x @ w), make_args=make_args,
                                                     min_devices=8))

    @aotcheck.register("broken")
    def broken():
        raise RuntimeError("the builder fell over")

    def huge(mesh):  # 24 GiB per device: more than any v5e has.
        return (jax.ShapeDtypeStruct((mesh.devices.size * 6 * 2**30,), jnp.float32,
                                     sharding=NamedSharding(mesh, P("data"))),)

    aotcheck.register("oom", aotcheck.FunctionConfig(fn=lambda x: x * 2, make_args=huge))

if $fit:
    import toy_fit  # noqa: F401  (a config that asks for a fit search)

if $lm:
    from aotcheck.models import lm

    import dataclasses

    rules = ((".*", P()),) if $lm == "replicated" else lm.PARTITION_RULES
    model = dataclasses.replace(lm.TINY, remat=$lm != "noremat")  # noremat: a regressed edit
    aotcheck.register("lm", lambda: lm.trainer_config(model, partition_rules=rules, eval_step=None))  # The train step.
''')

_FIT = string.Template('''
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

import aotcheck

VOCAB, WIDTH = 16384, 64
HEAVY = $heavy  # An edit that doubles the activations.


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
    mesh=aotcheck.MeshSpec(("data",), (-1,)), eval_step=None,  # Its train step alone.
    fit=$fit_field,  # None: the gate's --aot-fit asks
    fit_targets=$fit_targets))
''')


@dataclasses.dataclass(frozen=True)
class Toy:
    """Which toy the conftest holds.

    Attributes:
        width: The matmul's width (wider: every figure grows).
        extras: Also ``big`` (8 devices at least), ``broken`` (its builder raises) and ``oom`` (24 GiB).
        lm: Also a tiny LM ``lm``: ``"fsdp"``, ``"replicated"`` (its parameters unsharded) or ``"noremat"``.
        fit: Also ``fit``, a trainer that asks for a fit search: ``"light"``, or ``"heavy"`` (twice the
            activations, as an edit that regressed).
        fit_field: The knob ``fit`` offers the search (None: the gate's ``--aot-fit`` asks).
        fit_targets: Where ``fit`` is searched.
    """

    width: int = 256
    extras: bool = False
    lm: str | None = None
    fit: str | None = None
    fit_field: str | None = "batch"
    fit_targets: tuple[str, ...] = ("*",)


def render(toy: Toy) -> str:
    """The conftest of ``toy``."""
    return _CONFTEST.safe_substitute(width=toy.width, extras=toy.extras, fit=bool(toy.fit), lm=repr(toy.lm))


def render_fit(toy: Toy) -> str:
    """The fit config's module (``toy_fit.py``) of ``toy``."""
    return _FIT.safe_substitute(heavy=toy.fit == "heavy", fit_field=repr(toy.fit_field),
                           fit_targets=repr(tuple(toy.fit_targets)))


CONFTEST = render(Toy())  # The plain toy, for tests that add configs of their own to it.
FIT = render_fit(Toy())


class ToyEditor:
    """Rewrites a project's toy, one edit on top of the last (``edit_toy(width=512)``)."""

    def __init__(self, pytester, toy: Toy = Toy()) -> None:
        self.pytester = pytester
        self.toy = toy

    def __call__(self, **changes) -> Toy:
        self.toy = dataclasses.replace(self.toy, **changes)
        self.pytester.makeconftest(render(self.toy))
        self.pytester.makepyfile(toy_fit=render_fit(self.toy))
        return self.toy


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
