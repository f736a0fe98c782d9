"""The adapters: models as Flax Linen, Flax NNX and Equinox users write them, with the shardings the
models declare, through to real compiles checked against goldens (tests/adapter_models.py).

Shardings are read on the real v5e-16 mesh (libtpu's devices, no compile); the figures come from
the gate's own compiles of the registered configs, compared with the committed goldens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P

from aotcheck.adapters.base import AdapterError
from aotcheck.programs.lowering import place
from aotcheck.programs.model import trainer_state_specs
from aotcheck.targets.partition import PartitionError, path_to_str

ROOT = Path(__file__).resolve().parents[3]
OPT = optax.adamw(1e-3)


def _adapter_models():
    """tests/adapter_models.py as the ini's aot_config_modules loaded it (importing it again would
    register its configs twice), or imported here when this run's ini does not load it."""
    path = (Path(__file__).resolve().parents[3] / "tests" / "adapter_models.py").resolve()
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
            return module
    import adapter_models

    return adapter_models


am = _adapter_models()


def shardings(adapted, *, topology="v5e-16", mesh=am.MESH):
    """Per parameter path: (its spec, the spec of its first Adam moment), on ``topology``'s devices."""
    config = adapted.trainer(batch_spec={"tokens": am.TOKENS}, optimizer=OPT, mesh=mesh,
                             loss_fn=lambda model, batch: jnp.zeros(()))
    state, _ = trainer_state_specs(config, place(config, topology).mesh)
    mu = state["opt_state"][0].mu
    flat = jax.tree_util.tree_flatten_with_path(state["params"])[0]
    moments = jax.tree_util.tree_leaves(mu)
    return {path_to_str(p): (leaf.sharding.spec, m.sharding.spec) for (p, leaf), m in zip(flat, moments)}


# --- Flax Linen --------------------------------------------------------------------------------------

def test_linen_shardings_come_from_the_model_and_moments_follow():
    found = shardings(am.linen_adapted())
    assert {k: v[0] for k, v in found.items()} == {
        "Embed_0/embedding": P("model", "data"),  # logical (vocab, embed) through LOGICAL
        "up_0/kernel": P("data", "model"), "up_1/kernel": P("data", "model"),  # logical (embed, mlp)
        "down_0/kernel": P("model", None), "down_1/kernel": P("model", None),  # nn.with_partitioning: mesh axes
        "norm_0/scale": P(), "norm_0/bias": P(), "norm_1/scale": P(), "norm_1/bias": P(),  # the override
    }
    assert all(param == moment for param, moment in found.values())


def test_linen_overrides_decide_before_the_model():
    found = shardings(am.linen_adapted(overrides=[(r"up_0/kernel$", P(None, "data")), (r"norm", P())]))
    assert found["up_0/kernel"][0] == P(None, "data") and found["up_1/kernel"][0] == P("data", "model")


def test_linen_unannotated_parameters_are_all_listed_or_replicated_on_request():
    with pytest.raises(PartitionError) as e:
        shardings(am.linen_adapted(overrides=()))
    message = str(e.value)
    assert "decides 4 parameter(s)" in message
    assert all(f"{p} (shape (128,))" in message for p in ("norm_0/scale", "norm_0/bias", "norm_1/scale", "norm_1/bias"))
    found = shardings(am.linen_adapted(overrides=(), unannotated="replicate"))
    assert found["norm_1/bias"][0] == P() and found["up_0/kernel"][0] == P("data", "model")


def test_linen_logical_names_need_rules():
    from aotcheck.adapters import flax_linen

    with pytest.raises(AdapterError, match=r"Embed_0/embedding is annotated with logical axis names .*"
                                           r"logical_axis_rules"):
        flax_linen.adapt(am.LinenLM(), (am.TOKENS,))


def test_linen_other_variable_collections_are_refused_by_name():
    import flax.linen as nn

    from aotcheck.adapters import flax_linen

    class WithBatchNorm(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.BatchNorm(use_running_average=True)(nn.Dense(8)(x))

    with pytest.raises(AdapterError, match=r"WithBatchNorm has variable collections \['batch_stats'\]"):
        flax_linen.adapt(WithBatchNorm(), jax.ShapeDtypeStruct((4, 8), jnp.float32))


def test_a_logical_axis_missing_from_the_mesh_is_named():
    with pytest.raises(PartitionError, match=r"mesh axis 'model' is not in the mesh"):
        shardings(am.linen_adapted(), mesh=am.aotcheck.MeshSpec(("data",), (-1,)))


# --- Flax NNX ----------------------------------------------------------------------------------------

def test_nnx_shardings_come_from_the_model_and_moments_follow():
    found = shardings(am.nnx_adapted())
    assert {k: v[0] for k, v in found.items()} == {
        "embed/embedding": P("model", "data"), "up/kernel": P("data", "model"), "down/kernel": P("model", "data"),
        "norm/scale": P(), "norm/bias": P(),  # unannotated="replicate"
    }
    assert all(param == moment for param, moment in found.values())


def test_nnx_mesh_axis_annotations_without_rules_and_unannotated_errors():
    from flax import nnx

    from aotcheck.adapters import flax_nnx

    class Direct(nnx.Module):
        def __init__(self, rngs):
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
            self.w = nnx.Linear(128, 512, kernel_init=init, rngs=rngs)

    adapted = flax_nnx.adapt(lambda: Direct(nnx.Rngs(0)))
    assert adapted.model_specs == {"w/bias": None, "w/kernel": P(None, "model")}
    with pytest.raises(PartitionError, match=r"(?s)decides 2 parameter\(s\).*norm/bias \(shape \(128,\)\).*"
                                             r"norm/scale \(shape \(128,\)\)"):
        shardings(am.nnx_adapted(unannotated="error"))


# --- Equinox -----------------------------------------------------------------------------------------

def test_equinox_rules_shard_the_array_leaves():
    found = shardings(am.eqx_adapted())
    assert found["embed/weight"][0] == P("model", None)  # the regex, before fsdp
    assert found["mlp/layers/1/weight"][0] == P("data", None) and found["head/weight"][0] == P("data", None)
    assert found["mlp/layers/2/weight"][0] == P(None, "data")  # (128, 512): the larger dimension
    assert all(param == moment for param, moment in found.values())


def test_equinox_without_rules_lists_every_leaf():
    with pytest.raises(PartitionError, match=r"(?s)decides 8 parameter\(s\).*embed/weight.*head/weight"):
        shardings(am.eqx_adapted(rules=()))


def test_a_missing_library_names_the_extra(monkeypatch):
    from aotcheck.adapters import equinox, flax_nnx

    monkeypatch.setitem(sys.modules, "equinox", None)  # What Python does when the import fails.
    with pytest.raises(AdapterError, match=r"needs Equinox, which is not installed .*pip install 'aotcheck\[equinox\]'"):
        equinox.adapt(am.EqxLM)
    monkeypatch.setitem(sys.modules, "flax.nnx", None)
    with pytest.raises(AdapterError, match=r"pip install 'aotcheck\[flax\]'"):
        flax_nnx.adapt(lambda: None)


def test_unannotated_takes_error_replicate_or_rules():
    with pytest.raises(AdapterError, match=r"unannotated='shard': say 'error'"):
        am.nnx_adapted(unannotated="shard")


# --- Real compiles against the goldens ----------------------------------------------------------------

ADAPTED_CASES = ["linen-tiny/train_step", "linen-tiny/eval_step", "linen-tiny/forward", "nnx-tiny/train_step",
                 "nnx-tiny/eval_step", "eqx-tiny/train_step", "eqx-tiny/eval_step", "esm2-8m/train_step",
                 "esm2-8m/eval_step", "nnx-llama/train_step", "nnx-llama/eval_step"]


@pytest.mark.heavy
def test_adapted_models_compile_and_match_their_goldens(tmp_path):
    """The gate's CLI over the repository's ini (which loads tests/adapter_models.py), on v5e-16."""
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "aotcheck", "check", "--configs", "linen-tiny,nnx-tiny,eqx-tiny,esm2-8m,nnx-llama",
         "--topologies", "v5e-16", "--slices", "1", f"--cache-dir={tmp_path / 'cache'}", f"--report={report}"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    cases = {c["case"]: c for c in json.loads(report.read_text())["cases"]}
    assert sorted(cases) == sorted(f"{c}@v5e-16x1" for c in ADAPTED_CASES)
    assert all(c["verdict"] == "pass" and c["golden"] for c in cases.values()), cases
    # ESM2's scan over its 6 layers is counted 6 times (XLA's raw figure counts the body once).
    esm = cases["esm2-8m/train_step@v5e-16x1"]["measured"]["figures"]
    assert esm["flops"] > 3 * esm["flops_xla"]
    # The lint of activations left unsharded: our models constrain theirs and are clean. ESM2 has no
    # constraints: the partitioner follows its FSDP weights and splits its attention weights by head
    # (20 heads: 4 ways), keeping all 64 sequences on each of the 16 devices; a true finding.
    flagged = {k: c["measured"]["details"].get("unsharded") for k, c in cases.items()
               if c["measured"]["details"].get("unsharded")}
    assert sorted(flagged) == ["esm2-8m/eval_step@v5e-16x1", "esm2-8m/train_step@v5e-16x1"], flagged  # Its forward too.
    found = flagged["esm2-8m/train_step@v5e-16x1"][0]
    assert (found["shape"], found["batch"], found["ways"], found["split"]) == ("f32[6,64,5,256,256]", 64, 16, 4)
    assert found["input"] in ("batch/tokens", "batch/targets")  # Both are (64, 256), split 16 ways.


# --- What user code evaluates while it is traced -----------------------------------------------------

def test_constants_computed_while_tracing_work_under_the_abstract_mesh():
    """A model that evaluates a table eagerly while traced (``jax.ensure_compile_time_eval``) lowers
    for a deviceless TPU target: the trace sees the target's mesh only abstractly."""
    import flax.linen as nn

    from aotcheck.adapters import flax_linen
    from aotcheck.programs.lowering import lower_config
    from aotcheck.targets.topology import Target

    class WithTable(nn.Module):
        @nn.compact
        def __call__(self, x):
            with jax.ensure_compile_time_eval():
                table = jnp.sin(jnp.arange(x.shape[-1], dtype=jnp.float32))
            return nn.Dense(8, use_bias=False)(x * table)

    x = jax.ShapeDtypeStruct((32, 16), jnp.float32)
    config = flax_linen.adapt(WithTable(), (x,), unannotated="replicate").trainer(
        batch_spec={"x": x}, optimizer=OPT, loss_fn=lambda model, batch: model(batch["x"]).mean())
    lowered = lower_config(config, Target.of("v5e-16"))["train_step"]
    assert "sine" not in lowered.as_text()  # The table is a constant, computed on the host.


def test_equinox_arrays_cached_while_tracing_do_not_carry_a_mesh_to_the_next_target():
    """Equinox keeps its rotary tables in a process-wide cache; ESM2 lowered for v4-8 and then for
    v4-8 x2 in one process (as a gate worker does) must not see the first target's mesh."""
    from aotcheck.programs.lowering import lower_config
    from aotcheck.targets.topology import Target

    config = am.esm2_config(num_layers=1, embed_size=40, num_heads=2, batch=16, seq=32)
    assert config.trace_in_mesh is False
    for target in (Target.of("v4-8"), Target.of("v4-8", 2)):
        assert "train_step" in lower_config(config, target)


# --- What a second read of the adapters found ---------------------------------------------------------

def test_the_undecided_error_tells_an_adapter_user_what_to_pass():
    """A regex '.*' among the overrides would decide before the model and replicate everything:
    the advice for parameters the model leaves bare names the adapter's own arguments instead."""
    with pytest.raises(PartitionError) as e:
        shardings(am.linen_adapted(overrides=()))
    assert "unannotated='replicate'" in str(e.value) and "('.*', PartitionSpec())" not in str(e.value)


def test_fallback_regexes_may_match_nothing_but_overrides_may_not():
    """A fallback rule has nothing to decide when the model annotates every parameter; an override
    that matches nothing is a typo."""
    from aotcheck import fsdp
    from aotcheck.adapters import flax_linen

    found = shardings(am.linen_adapted(overrides=(), unannotated=[(r"norm_\d/(scale|bias)$", P()), (r"nothing", P())]))
    assert found["norm_0/scale"][0] == P() and found["up_0/kernel"][0] == P("data", "model")
    with pytest.raises(PartitionError, match=r"Partition rule\(s\) \['typo'\] match no parameter"):
        shardings(am.linen_adapted(overrides=[("typo", P())], unannotated="replicate"))
    # One rule alone is a list of one; anything else is refused by name.
    alone = flax_linen.adapt(am.LinenLM(), (am.TOKENS,), logical_axis_rules=am.LOGICAL, unannotated=fsdp("data"))
    assert shardings(alone)["norm_0/scale"][0] == P("data")  # (128,): the 8-way data axis divides it.
    with pytest.raises(AdapterError, match=r"overrides: \('w', 'data'\) is not a rule"):
        am.linen_adapted(overrides=[("w", "data")])


def test_an_import_error_inside_an_installed_library_is_not_called_missing(monkeypatch):
    from aotcheck.adapters.base import require

    def broken(name, *args, **kwargs):
        raise ModuleNotFoundError("No module named 'jax._src.gone'", name="jax._src.gone")

    monkeypatch.setattr("importlib.import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="jax._src.gone"):
        require("flax.nnx", extra="flax", library="Flax")


def test_logical_activation_constraints_shard_as_in_training():
    """``nn.with_logical_constraint`` is a no-op outside ``nn.logical_axis_rules``: the adapter runs the
    loss under the model's rules, so the constraint reaches the program (with the mesh axis)."""
    import flax.linen as nn

    from aotcheck.adapters import flax_linen
    from aotcheck.programs.lowering import lower_config
    from aotcheck.targets.topology import Target

    class Constrained(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(512, use_bias=False,
                         kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")))(x)
            h = nn.with_logical_constraint(h, ("batch", "mlp"))
            return nn.Dropout(0.1, deterministic=False)(h)

    x = jax.ShapeDtypeStruct((32, 128), jnp.float32)
    adapted = flax_linen.adapt(Constrained(), (x,), rng_streams=("dropout",),
                               logical_axis_rules=[("batch", "data"), ("embed", None), ("mlp", "model")])
    def constraints(adapted):
        config = adapted.trainer(batch_spec={"x": x}, optimizer=OPT, mesh=am.MESH,
                                 loss_fn=lambda model, batch: model(batch["x"]).mean())
        text = lower_config(config, Target.of("v5e-16"))["train_step"].as_text()
        return text.count("sdy.sharding_constraint") + text.count("@Sharding")

    # Without the rules around the loss the constraint vanishes (what the adapter used to compile).
    assert constraints(adapted) > constraints(dataclasses.replace(adapted, trace_context=contextlib.nullcontext))


def test_equinox_integer_buffers_and_keys_are_constants_not_parameters():
    import equinox as eqx

    from aotcheck.adapters import equinox as eqx_adapter
    from aotcheck.programs.lowering import lower_config
    from aotcheck.targets.topology import Target

    class WithBuffers(eqx.Module):
        linear: eqx.nn.Linear
        positions: jax.Array
        key: jax.Array

        def __init__(self, key):
            self.linear = eqx.nn.Linear(64, 64, key=key)
            self.positions = jnp.arange(64)
            self.key = jax.random.key(1)

        def __call__(self, x):
            noise = jax.random.normal(self.key, x.shape)
            return self.linear(x + noise + self.positions)

    adapted = eqx_adapter.adapt(WithBuffers, rules=[am.aotcheck.fsdp("data")], unannotated="replicate")
    assert sorted(adapted.model_specs) == ["linear/bias", "linear/weight"]
    x = jax.ShapeDtypeStruct((32, 64), jnp.float32)
    config = adapted.trainer(batch_spec={"x": x}, optimizer=OPT, mesh=am.aotcheck.MeshSpec(("data",), (-1,)),
                             loss_fn=lambda model, batch: jax.vmap(model)(batch["x"]).mean())
    assert "train_step" in lower_config(config, Target.of("v5e-16"))


def test_nnx_logical_names_without_rules_point_at_the_rules():
    """NNX cannot tell logical names from mesh axes, so without rules they reach the mesh as axes:
    the error names the axis and the argument that maps it."""
    from flax import nnx

    from aotcheck.adapters import flax_nnx

    adapted = flax_nnx.adapt(lambda: am.NNXLM(nnx.Rngs(0)), unannotated="replicate")
    with pytest.raises(PartitionError, match=r"mesh axis '(vocab|embed|mlp)' is not in the mesh .* logical_axis_rules"):
        shardings(adapted)


def test_maxtext_adapter_refuses_bad_input_by_name(tmp_path):
    """Pure Python: what the MaxText adapter checks before MaxText is imported (this venv has no MaxText)."""
    from aotcheck.adapters import maxtext

    with pytest.raises(AdapterError, match=r"MaxText config file 'no/such\.yml' not found .*maxtext\.packaged"):
        maxtext.adapt("no/such.yml")
    base = tmp_path / "base.yml"
    base.write_text("per_device_batch_size: 12.0")
    with pytest.raises(AdapterError, match=r"aotcheck sets compile_topology from each target"):
        maxtext.adapt(base, compile_topology="v5e-16")
    adapted = maxtext.adapt(base, per_device_batch_size=2, max_target_length=2048, attention="dot_product")
    with pytest.raises(AdapterError, match=r"knob 'attention' is not an integer override"):
        adapted.trainer(knobs=("attention",))
    with pytest.raises(AdapterError, match=r"fit='max_target_length' is not a knob of this config \(knobs: "
                                           r"per_device_batch_size\)"):
        adapted.trainer(fit="max_target_length")
    config, = adapted.trainer(knobs=("per_device_batch_size", "max_target_length"), fit="max_target_length")
    assert {k: v.size for k, v in config.knobs.items()} == {"per_device_batch_size": 2, "max_target_length": 2048}
    assert config.knobs["max_target_length"].rebuild(4096).knobs["max_target_length"].size == 4096
    assert not maxtext.adapt(base, per_device_batch_size=0.5).trainer()[0].knobs  # A fraction is no knob, silently.
    # The eval step where the job evaluates: eval_interval > 0 given, or in the file or the base_config it names.
    (tmp_path / "evals.yml").write_text("base_config: base.yml\neval_interval: 500\n")
    assert [c.program for c in maxtext.adapt(tmp_path / "evals.yml").trainer()] == ["train_step", "eval_step"]
    assert [c.program for c in maxtext.adapt(tmp_path / "evals.yml", eval_interval=-1).trainer()] == ["train_step"]
    assert [c.program for c in adapted.trainer(eval_step=True)] == ["train_step", "eval_step"]
    moved = adapted.trainer(eval_step=True)[1].knobs["per_device_batch_size"].rebuild(4)
    assert moved.program == "eval_step" and moved.make_program.__self__.overrides[0] == ("per_device_batch_size", 4)
    with pytest.raises(AdapterError, match=r"inference\(\) is not available: MaxText 0\.2\.5's MaxEngine"):
        adapted.inference()
    if importlib.util.find_spec("maxtext") is None:  # Where the extra is not installed, each entry says so.
        for call in (maxtext.packaged, lambda: config.make_program(None, None)):
            with pytest.raises(AdapterError, match=r"pip install 'aotcheck\[maxtext\]'"):
                call()
