"""plan.py: the plan is a value (the matrix, skips, knobs, shards, completeness) made without a session.

The configs here are real FunctionConfigs on host targets; nothing compiles (a plan only builds configs).
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

from aotcheck import FunctionConfig, Registry
from aotcheck.gate.golden import GoldenStore
from aotcheck.pipeline.case import Case
from aotcheck.plan import check_knob_globs, make_plan, stale_goldens
from aotcheck.programs.knob import Knob
from aotcheck.settings import GateSettings, SettingsError


def _args(mesh, rows=8):
    return (jax.ShapeDtypeStruct((rows, 128), jnp.float32),)


def _registry() -> Registry:
    registry = Registry()
    registry.register("small", FunctionConfig(fn=lambda x: 2 * x, make_args=_args))
    big = FunctionConfig(fn=lambda x: 2 * x, make_args=_args, min_devices=4, fit="rows",
                         knobs={"rows": Knob(8, lambda n: FunctionConfig(fn=lambda x: 2 * x,
                                                                         make_args=lambda mesh: _args(mesh, n)))})
    registry.register("big", big)
    return registry


def _broken():
    raise RuntimeError("no such checkpoint")


def test_the_plan_holds_skips_and_knobs_and_is_frozen(tmp_path):
    settings = GateSettings.parse(rootdir=tmp_path, topologies="cpu-2,cpu-4")
    plan = make_plan(settings, _registry(), GoldenStore(settings.golden_dir))
    by_id = {p.case.id: p for p in plan.matrix}
    assert sorted(by_id) == ["big/step@cpu-2x1", "big/step@cpu-4x1", "small/step@cpu-2x1", "small/step@cpu-4x1"]
    assert "needs at least 4 devices" in by_id["big/step@cpu-2x1"].skip and by_id["big/step@cpu-4x1"].skip is None
    assert plan.knob(Case.parse("big/step@cpu-4x1")) == "rows" and plan.knob(Case.parse("small/step@cpu-4x1")) is None
    assert plan.cases == plan.matrix and plan.complete and plan.shard_seconds() is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.cases = ()  # type: ignore[misc]


def test_a_config_deployed_on_some_targets_skips_the_others_saying_which_it_is_deployed_on(tmp_path):
    registry = _registry()
    registry.register("sized", FunctionConfig(fn=lambda x: 2 * x, make_args=_args, targets="cpu-4x*"))
    settings = GateSettings.parse(rootdir=tmp_path, topologies="cpu-2,cpu-4", slices="1,2")
    by_id = {p.case.id: p for p in make_plan(settings, registry, GoldenStore(settings.golden_dir)).matrix}
    assert by_id["sized/step@cpu-4x1"].skip is None and by_id["sized/step@cpu-4x2"].skip is None
    assert by_id["sized/step@cpu-2x1"].skip == ("sized is deployed on cpu-4x* only (its targets); cpu-2x1 is not one")


def test_a_config_that_names_its_targets_is_planned_on_them_whatever_the_run_lists(tmp_path):
    """Issue 54: the main job is one command. A config that names its targets (a server sized for one
    slice) is compiled there under any run's topologies; one that globs them is only filtered by them, and
    a run with no targets plans nothing."""
    registry = _registry()
    registry.register("sized", FunctionConfig(fn=lambda x: 2 * x, make_args=_args, targets=("cpu-4x1", "cpu-2x2")))
    registry.register("globbed", FunctionConfig(fn=lambda x: 2 * x, make_args=_args, targets="cpu-4x*"))
    settings = GateSettings.parse(rootdir=tmp_path, topologies="cpu-2")
    plan = make_plan(settings, registry, GoldenStore(settings.golden_dir))
    by_id = {p.case.id: p for p in plan.matrix}
    assert by_id["sized/step@cpu-4x1"].skip is None and by_id["sized/step@cpu-2x2"].skip is None
    assert "deployed on cpu-4x1, cpu-2x2 only" in by_id["sized/step@cpu-2x1"].skip
    assert not any(i.startswith("globbed/") and "cpu-4" in i for i in by_id)  # A glob names no target of its own.
    assert {c: [t.name for t in ts] for c, ts in plan.declared.items()} == {"sized": ["cpu-4x1", "cpu-2x2"]}
    assert list(dict.fromkeys(p.case.target.name for p in plan.matrix)) == ["cpu-2x1", "cpu-4x1", "cpu-2x2"]
    none = GateSettings.parse(rootdir=tmp_path, topologies="")
    assert make_plan(none, registry, GoldenStore(none.golden_dir)).matrix == ()
    listed = GateSettings.parse(rootdir=tmp_path, topologies="cpu-4,cpu-2x2")  # Listed by the run: nothing declared beyond.
    assert make_plan(listed, registry, GoldenStore(listed.golden_dir)).declared == {}


@pytest.mark.parametrize("fields, words", [
    ({"targets": ()}, r"targets=\(\): give globs over target names, e.g. targets=\('v5e-1x1',\)"),
    ({"targets": ("v5e-1x1", "")}, r"targets=\('v5e-1x1', ''\): give globs"),
    ({"memory_fraction": 0}, r"memory_fraction=0: give the share of a GPU's memory the process runs with, a number "
                             r"in \(0, 1\]"),
    ({"memory_fraction": 1.5}, r"memory_fraction=1.5: give the share"),
    ({"memory_fraction": True}, r"memory_fraction=True: give the share"),
    ({"memory_fraction": "0.9"}, r"memory_fraction='0.9': give the share"),
])
def test_a_deployment_field_that_is_not_one_is_refused_when_built(fields, words):
    from aotcheck.errors import ConfigError
    with pytest.raises(ConfigError, match=words):
        FunctionConfig(fn=abs, make_args=_args, **fields)


def test_shards_split_the_matrix_and_a_broken_config_fails_in_the_first_only(tmp_path):
    registry = _registry()
    registry.register("broken", _broken)
    plans = [make_plan(GateSettings.parse(rootdir=tmp_path, topologies="cpu-2,cpu-4", shard=f"{k}/2"), registry,
                       GoldenStore(tmp_path / "golden")) for k in (1, 2)]
    assert sorted(p.case.id for plan in plans for p in plan.cases) == sorted(p.case.id for p in plans[0].matrix)
    assert "no such checkpoint" in plans[0].broken["broken"] and not plans[1].broken
    assert not plans[0].complete  # A config that did not build: its goldens' fate is not this run's to judge.
    mine, every = plans[0].shard_seconds()
    assert 0 < mine < every == sum(plans[0].seconds.values())


def test_the_whole_matrix_ran_only_when_every_selected_case_did(tmp_path):
    settings = GateSettings.parse(rootdir=tmp_path, topologies="cpu-2")
    plan = make_plan(settings, _registry(), GoldenStore(settings.golden_dir))
    ids = [p.case.id for p in plan.matrix]
    assert plan.whole_matrix_ran(ids) and not plan.whole_matrix_ran(ids[1:])
    part = make_plan(GateSettings.parse(rootdir=tmp_path, topologies="cpu-2", configs="small"), _registry(),
                     GoldenStore(settings.golden_dir))
    assert not part.whole_matrix_ran([p.case.id for p in part.matrix])  # Another config was left out.


def test_an_empty_selection_says_why(tmp_path):
    settings = GateSettings.parse(rootdir=tmp_path, topologies="cpu-2", configs="nothing*")
    plan = make_plan(settings, _registry(), GoldenStore(settings.golden_dir))
    assert plan.empty_reason == "no registered config matches --aot-configs=nothing* (registered: big, small)"


def test_stale_goldens_are_judged_on_the_whole_registry(tmp_path):
    store = GoldenStore(tmp_path / "golden")
    for rel in ("small/step@cpu-2x1.json", "gone/step@cpu-2x1.json", "small/other@cpu-2x1.json"):
        (store.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (store.root / rel).write_text(json.dumps({"format": 1, "case": rel.removesuffix(".json"), "figures": {}}))
    assert sorted(stale_goldens(_registry(), store)) == ["gone/step@cpu-2x1.json", "small/other@cpu-2x1.json"]


def test_a_tolerance_over_a_knob_no_config_offers_is_refused_once_configs_are_known(tmp_path):
    ok = GateSettings.parse(rootdir=tmp_path, topologies="cpu-2", tolerances=["fit_max_rows = 5%"])
    check_knob_globs(ok, _registry())  # `big` offers rows.
    typo = GateSettings.parse(rootdir=tmp_path, topologies="cpu-2", tolerances=["fit_max_rowz = 5%"])
    with pytest.raises(SettingsError, match="aot_tolerances: 'fit_max_rowz' in 'fit_max_rowz = 5%' matches no figure"):
        check_knob_globs(typo, _registry())


def test_the_plan_keeps_each_selected_servers_facts_made_once(tmp_path):
    """The plan holds each server (its programs' order, its pool, its memory fraction) when it is made, so
    the session never asks the registry for them again; a config that is no server has none."""
    from aotcheck.models import serve
    from aotcheck.programs.serving import Server

    registry = _registry()
    registry.register("llm", lambda: serve.serving_config(serve.TINY, memory_fraction=0.8))
    settings = GateSettings.parse(rootdir=tmp_path, topologies="cpu-2")
    plan = make_plan(settings, registry, GoldenStore(settings.golden_dir))
    assert dict(plan.servers) == {"llm": Server("llm", ("step", "sample"), "pages", serve.TINY.pages, 0.8)}
    with pytest.raises(TypeError):
        plan.servers["lm"] = plan.servers["llm"]  # type: ignore[index]  # Read-only, as the rest of the plan.
