"""``aotcheck init``: a starter gate for a project: its pytest settings, one config, the CI workflow.

It writes, in the project's root:

- the ``aot_*`` settings: a ``pytest.ini``, or a ``[tool.pytest.ini_options]`` table
  added at the end of an existing ``pyproject.toml`` (nothing in it is changed);
- ``conftest.py`` registering one model through the adapter of what is installed
  (Flax NNX, Flax Linen, Equinox; plain JAX otherwise), for the user to replace
  with their own model;
- ``.github/workflows/aot-gate.yml``, a few lines over the reusable action.

It writes nothing when any of these already exist (or when pytest settings live in
another file), and says which: nothing a user wrote is overwritten.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> plan = plan_init(root, model="jax")
    >>> sorted(p.relative_to(root).as_posix() for p in plan.files)
    ['.github/workflows/aot-gate.yml', 'conftest.py', 'pytest.ini']
    >>> write_init(plan)
    >>> plan_init(root, model="jax")
    Traceback (most recent call last):
    ...
    aotcheck.scaffold.InitError: aotcheck init writes nothing: conftest.py, .github/workflows/aot-gate.yml already exist, pytest.ini already has pytest settings. Add to them by hand (see docs/getting-started.md, "Your first gate, by hand"), or run it in an empty project.
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from aotcheck.errors import AotcheckError
from aotcheck._files import atomic_write_text
from aotcheck.targets.topology import TopologyError, split_target

# Where the reusable action lives (action.yml at the root of aotcheck's repository).
ACTION = "aotcheck/aotcheck@v1"
MODELS = ("nnx", "linen", "equinox", "jax")
# Files pytest reads settings from, with the section that holds them.
SETTINGS_FILES = (("pytest.ini", "[pytest]"), (".pytest.ini", "[pytest]"), ("tox.ini", "[pytest]"),
                  ("setup.cfg", "[tool:pytest]"), ("pyproject.toml", "[tool.pytest"))


class InitError(AotcheckError, ValueError):
    """``aotcheck init`` cannot write its files (they exist, or the model kind is unknown)."""


class InitPlan(NamedTuple):
    """What ``init`` will write: file -> text, and ``appends``: files that get text added at their end."""

    root: Path
    model: str
    files: Mapping[Path, str]
    appends: Mapping[Path, str]


def detect_model() -> str:
    """The adapter for what is installed: ``nnx`` with Flax, ``equinox``, else ``jax``."""
    if importlib.util.find_spec("flax") is not None:
        return "nnx"
    if importlib.util.find_spec("equinox") is not None:
        return "equinox"
    return "jax"


def plan_init(root: Path, *, model: str = "auto", topologies: str = "v5e-16") -> InitPlan:
    """The files ``init`` writes in ``root``; InitError naming what is already there."""
    model = detect_model() if model == "auto" else model
    if model not in MODELS:
        raise InitError(f"--model {model!r}: choose one of auto, {', '.join(MODELS)}")
    names = [t.strip() for t in topologies.replace(",", " ").split() if t.strip()]
    if not names:
        raise InitError("--topologies is empty: name at least one, e.g. --topologies v5e-16")
    for name in names:  # A name the gate would refuse is never written into a project's settings.
        try:
            split_target(name)
        except TopologyError as e:  # Its words name the closest names and the spelling that works.
            raise InitError(f"aotcheck init writes nothing: --topologies: {name!r} is not a target aotcheck "
                            f"compiles for. {e}") from None
    files = {root / "conftest.py": CONFTESTS[model], root / ".github/workflows/aot-gate.yml": workflow(names)}
    appends: dict[Path, str] = {}
    existing = [p.relative_to(root).as_posix() for p in files if p.exists()]
    # pytest reads pytest.ini first whatever it holds (even empty), so one there is never written over
    # nor bypassed by settings added to pyproject.toml.
    settings = [name for name, section in SETTINGS_FILES
                if (root / name).is_file() and (name in ("pytest.ini", ".pytest.ini")
                                                or section in (root / name).read_text(errors="replace"))]
    if existing or settings:
        said = [f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}"] if existing else []
        said += [f"{', '.join(settings)} already has pytest settings"] if settings else []
        raise InitError(f"aotcheck init writes nothing: {', '.join(said)}. Add to them by hand (see docs/getting-started.md, "
                        "\"Your first gate, by hand\"), or run it in an empty project.")
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        _check_toml(pyproject)
        appends[pyproject] = pyproject_settings(names)
    else:
        files[root / "pytest.ini"] = ini_settings(names)
    _check_writable(root, [*files, *appends])
    return InitPlan(root, model, files, appends)


def _check_toml(path: Path) -> None:
    # pytest refuses a pyproject.toml it cannot parse: adding settings to one would "succeed" into a
    # project whose every pytest run then fails.
    try:
        tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InitError(f"aotcheck init writes nothing: {path.name} is not valid TOML ({e}); pytest could not "
                        "read the settings added to it. Fix it first.") from None


def _check_writable(root: Path, paths: list[Path]) -> None:
    """InitError unless every path can be written: checked before the first write, so init writes all or nothing."""
    for path in paths:
        for parent in reversed(path.relative_to(root).parents):
            where = root / parent
            if where.exists() and not where.is_dir():
                raise InitError(f"aotcheck init writes nothing: {where.relative_to(root).as_posix()} is a file, "
                                f"and {path.relative_to(root).as_posix()} goes under it. Move it aside, or add "
                                "the files by hand (see docs/getting-started.md, \"Your first gate, by hand\").")
            if where.is_dir() and not os.access(where, os.W_OK | os.X_OK):
                raise InitError(f"aotcheck init writes nothing: {where} is not writable.")
        if path.exists() and not os.access(path, os.W_OK):
            raise InitError(f"aotcheck init writes nothing: {path} is not writable.")


def write_init(plan: InitPlan) -> None:
    """Writes the plan, all or nothing: each file whole (atomically; an append rewrites its file
    whole, keeping its mode); a failure part-way removes what this call had written."""
    done: list[tuple[Path, str | None]] = []  # Each path written and what it held before (None: new).
    try:
        for path, text in plan.files.items():
            atomic_write_text(path, text)  # As goldens are written: whole or not at all, with the umask's mode.
            done.append((path, None))
        for path, text in plan.appends.items():
            before = path.read_text()
            atomic_write_text(path, before + ("" if before.endswith("\n") or not before else "\n") + "\n" + text,
                              mode=path.stat().st_mode & 0o777)
            done.append((path, before))
    except BaseException:
        for path, before in reversed(done):
            if before is None:
                path.unlink(missing_ok=True)
            else:
                atomic_write_text(path, before, mode=path.stat().st_mode & 0o777)
        raise


def _extra(name: str) -> str | None:
    """The extra that installs the compiler of target ``name``'s platform (``cuda``), if any."""
    try:
        return split_target(name)[0].platform.extra
    except ValueError:  # A name the gate will refuse with its own message.
        return None


def ini_settings(topologies: list[str]) -> str:
    return (
        "[pytest]\n"
        "# aotcheck: every registered config is compiled for these TPU/GPU targets (on this CPU) and\n"
        "# its memory and FLOP figures are checked against golden/. `pytest --update-golden` accepts them.\n"
        f"aot_topologies = {' '.join(topologies)}\n"
        "aot_slices = 1\n"
        "aot_golden_dir = golden\n"
    )


def pyproject_settings(topologies: list[str]) -> str:
    listed = ", ".join(f'"{t}"' for t in topologies)
    return (
        "[tool.pytest.ini_options]\n"
        "# aotcheck: every registered config is compiled for these TPU/GPU targets (on this CPU) and\n"
        "# its memory and FLOP figures are checked against golden/. `pytest --update-golden` accepts them.\n"
        f"aot_topologies = [{listed}]\n"
        'aot_slices = ["1"]\n'
        'aot_golden_dir = "golden"\n'
    )


def workflow(topologies: list[str]) -> str:
    needed = sorted({e for e in map(_extra, topologies) if e})
    extras = (f"\n          extras: {','.join(needed)}  # JAX's CUDA plugin: XLA's GPU compiler, no GPU needed"
              if needed else "")
    return f"""# The AOT gate: every registered config compiled for its targets on CPU runners, checked against golden/.
name: aot-gate

on:
  pull_request:
  push:
    branches: [main]

jobs:
  compile:
    runs-on: ubuntu-latest
    strategy:
      fail-fast: false
      matrix:
        shard: [1, 2]
    steps:
      - uses: actions/checkout@v5
      - uses: {ACTION}
        with:
          topologies: "{','.join(topologies)}"{extras}
          shards: 2
          shard: ${{{{ matrix.shard }}}}

  summary:
    needs: compile
    if: always()
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v5
      - uses: {ACTION}
        with:
          summarize: true
          shards: 2
"""


_HEADER = '''"""aotcheck's configs for this project: each registered train step is compiled for the TPU
topologies and GPU hosts in the pytest settings and its figures are gated against golden/.

Replace the model below with yours (import it from your package).
"""

import jax
import jax.numpy as jnp
import optax

import aotcheck
'''

_LOSS = '''
TOKENS = jax.ShapeDtypeStruct((64, 256), jnp.int32)  # The global batch: 64 sequences of 256 tokens.
MESH = aotcheck.MeshSpec(("data", "model"), (-1, 2))  # FSDP over "data", tensor parallel over "model".


def loss_fn(model, batch):
    logits = {call}
    labels = batch["tokens"][:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1].astype(jnp.float32), labels).mean()
'''

CONFTESTS = {
    "nnx": _HEADER + '''from flax import nnx

from aotcheck.adapters import flax_nnx


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, vocab: int = 8192, width: int = 256):
        shard = nnx.with_partitioning  # Logical axis names; RULES below map them to the mesh.
        self.embed = nnx.Embed(vocab, width, embedding_init=shard(nnx.initializers.normal(0.02), ("vocab", "embed")),
                               rngs=rngs)
        self.up = nnx.Linear(width, 4 * width, use_bias=False,
                             kernel_init=shard(nnx.initializers.lecun_normal(), ("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(4 * width, width, use_bias=False,
                               kernel_init=shard(nnx.initializers.lecun_normal(), ("mlp", "embed")), rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        return self.embed.attend(x + self.down(nnx.gelu(self.up(x))))


RULES = [("vocab", "model"), ("embed", "data"), ("mlp", "model")]
''' + _LOSS.format(call='model(batch["tokens"])') + '''

@aotcheck.register("my-model")
def my_model():
    adapted = flax_nnx.adapt(lambda: Model(nnx.Rngs(0)), logical_axis_rules=RULES)
    return adapted.trainer(batch_spec={"tokens": TOKENS}, loss_fn=loss_fn, optimizer=optax.adamw(3e-4), mesh=MESH)
''',
    "linen": _HEADER + '''import flax.linen as nn

from aotcheck.adapters import flax_linen


class Model(nn.Module):
    vocab: int = 8192
    width: int = 256

    @nn.compact
    def __call__(self, tokens):
        shard = nn.with_logical_partitioning  # Logical axis names; RULES below map them to the mesh.
        embed = nn.Embed(self.vocab, self.width, embedding_init=shard(nn.initializers.normal(0.02), ("vocab", "embed")))
        x = embed(tokens)
        h = nn.Dense(4 * self.width, use_bias=False, kernel_init=shard(nn.initializers.lecun_normal(), ("embed", "mlp")))(x)
        x = x + nn.Dense(self.width, use_bias=False,
                         kernel_init=shard(nn.initializers.lecun_normal(), ("mlp", "embed")))(nn.gelu(h))
        return embed.attend(x)


RULES = [("vocab", "model"), ("embed", "data"), ("mlp", "model")]
''' + _LOSS.format(call='model(batch["tokens"])') + '''

@aotcheck.register("my-model")
def my_model():
    adapted = flax_linen.adapt(Model(), (TOKENS,), logical_axis_rules=RULES)
    return adapted.trainer(batch_spec={"tokens": TOKENS}, loss_fn=loss_fn, optimizer=optax.adamw(3e-4), mesh=MESH)
''',
    "equinox": _HEADER + '''import equinox as eqx

from aotcheck.adapters import equinox as eqx_adapter


class Model(eqx.Module):
    embed: eqx.nn.Embedding
    mlp: eqx.nn.MLP
    head: eqx.nn.Linear

    def __init__(self, key, vocab: int = 8192, width: int = 256):
        k1, k2, k3 = jax.random.split(key, 3)
        self.embed = eqx.nn.Embedding(vocab, width, key=k1)
        self.mlp = eqx.nn.MLP(width, width, width_size=4 * width, depth=1, key=k2)
        self.head = eqx.nn.Linear(width, vocab, use_bias=False, key=k3)

    def __call__(self, tokens):
        x = jax.vmap(self.embed)(tokens)
        return jax.vmap(self.head)(x + jax.vmap(self.mlp)(x))

''' + _LOSS.format(call='jax.vmap(model)(batch["tokens"])') + '''

@aotcheck.register("my-model")
def my_model():
    # Equinox models carry no shardings: FSDP shards each array's largest dimension over "data".
    adapted = eqx_adapter.adapt(Model, rules=[aotcheck.fsdp("data")])
    return adapted.trainer(batch_spec={"tokens": TOKENS}, loss_fn=loss_fn, optimizer=optax.adamw(3e-4), mesh=MESH)
''',
    "jax": _HEADER + '''from jax.sharding import PartitionSpec as P

VOCAB, WIDTH = 8192, 256


def init(rng):
    k1, k2 = jax.random.split(rng)
    return {"embed": jax.random.normal(k1, (VOCAB, WIDTH)) * 0.02,
            "mlp": jax.random.normal(k2, (WIDTH, 4 * WIDTH)) * 0.02}


class Model:
    def __init__(self, params):
        self.params = params

    def __call__(self, tokens):
        x = self.params["embed"][tokens]
        x = x + jax.nn.gelu(x @ self.params["mlp"]) @ self.params["mlp"].T
        return x @ self.params["embed"].T

''' + _LOSS.format(call='model(batch["tokens"])') + '''

@aotcheck.register("my-model")
def my_model():
    return aotcheck.TrainerConfig(
        init_fn=init, loss_fn=lambda params, batch: loss_fn(Model(params), batch),
        partition_rules=[("embed", P("model", "data")), ("mlp", P("data", "model"))],
        batch_spec={"tokens": TOKENS}, optimizer=optax.adamw(3e-4), mesh=MESH)
''',
}
