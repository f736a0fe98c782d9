"""Peak attribution (aotcheck.figures.attribution) on programs built for the purpose, compiled for real.

What each test shows: the classes sum to the peak; the parameters' class is the
parameters' analytic bytes per device; a dominating temporary is named with the
line that made it; a replicated copy of a parameter is a new buffer with its path;
dropping remat moves bytes into temporaries and the gate's message names them; the
dump changes nothing and leaves nothing behind; a missing dump is a note, not a failure.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P
from toy import run

import aotcheck
from aotcheck._runtime import toolchain
from aotcheck.figures.attribution import CLASSES, PEAK_FIGURES, attribute, read_dump
from aotcheck.figures.dump import AttributionError
from aotcheck.figures.hlo import parse_module
from aotcheck.figures.program import Details, program_figures
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measure import measure
from aotcheck.pipeline.measurement import COST_FIGURES, Measurement
from aotcheck.gate.golden import Golden
from aotcheck.gate.why import grown
from aotcheck.models import lm
from aotcheck.programs.lowering import lower_config, place
from aotcheck.programs.model import trainer_state_specs
from aotcheck.targets.topology import Target

GOLDEN = Path(__file__).resolve().parents[3] / "golden"
HERE = "tests/unit/figures/test_attribution.py"


def analytic_param_bytes(config: aotcheck.TrainerConfig, target: Target) -> int:
    """The parameters' bytes on one device, from their shapes and shardings alone (no compile)."""
    state, _ = trainer_state_specs(config, place(config, target).mesh)
    return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
               for leaf in jax.tree_util.tree_leaves(state["params"]))


def _line(marker: str) -> int:
    """The line of this file that carries ``marker`` (so the test does not hard-code line numbers)."""
    lines = Path(__file__).read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if marker in line and "_line(" not in line)


# A train step whose peak is un-rematted f32 logits [B, S, V]: B=16, S=128, V=16384, 4 devices.
VOCAB, SEQ, BATCH, WIDTH = 16384, 128, 16, 64


def logits_init(key):
    k1, k2 = jax.random.split(key)
    return {"embed": jax.random.normal(k1, (VOCAB, WIDTH)), "unembed": jax.random.normal(k2, (WIDTH, VOCAB))}


def logits_loss(params, batch):
    x = params["embed"][batch["tokens"]]
    logits = (x @ params["unembed"]).astype(jnp.float32)  # marker: logits
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])


def logits_config():
    return aotcheck.TrainerConfig(
        init_fn=logits_init,
        loss_fn=logits_loss,
        optimizer=optax.sgd(0.1),
        partition_rules=((r"^embed$", P("data", None)), (r"^unembed$", P(None, "data"))),
        batch_spec={"tokens": jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32)},
        mesh=aotcheck.MeshSpec(("data",), (-1,)),
    )


@pytest.fixture(scope="module")
def logits_case():
    return measure(Case.of("logits", "train_step", "v4-8"), config=logits_config())


def test_classes_sum_to_the_peak_and_name_the_dominating_temporary(logits_case):
    figures = logits_case.figures
    assert sum(figures[name] for name in PEAK_FIGURES) == figures["peak_bytes"]
    assert all(figures[name] >= 0 for name in PEAK_FIGURES)
    top = logits_case.details.peak_buffers[0]
    per_device = BATCH * SEQ * VOCAB * 4 // 4  # f32 logits, a quarter per device (XLA picks which axis)
    assert top.kind == "temp" and top.bytes >= per_device
    dims = [int(d) for d in top.shape.removeprefix("f32[").rstrip("]").split(",")]
    assert top.shape.startswith("f32[") and math.prod(dims) * 4 == per_device and SEQ in dims, top
    assert top.source in {f"{HERE}:{_line('marker: logits')}", f"{HERE}:{_line('jax.nn.log_softmax(logits)')}"}
    assert top.name.startswith("jit(train_step)/")
    assert figures["peak_temp_bytes"] >= per_device
    assert figures["peak_params_bytes"] == analytic_param_bytes(logits_config(), Target.of("v4-8"))


def copy_config(*, replicate: bool) -> aotcheck.InferenceConfig:
    """A 64 MiB weight sharded over 4 devices, served; ``replicate`` asks for a whole copy of it on each."""

    def apply(params, batch):
        w = params["w"]
        if replicate:
            w = jax.lax.with_sharding_constraint(w, P())  # marker: replicated copy
        return jnp.tanh(batch["x"] @ w)

    return aotcheck.InferenceConfig(
        init_fn=lambda key: {"w": jax.random.normal(key, (4096, 4096))}, methods={"apply": apply},
        partition_rules=((r"^w$", P(None, "data")),),  # Sharded on its output: no gather needed.
        input_batch_spec={"x": jax.ShapeDtypeStruct((16, 4096), jnp.float32)},
        mesh=aotcheck.MeshSpec(("data",), (-1,)))


def test_a_replicated_copy_of_a_parameter_is_a_new_buffer_with_its_path():
    case = Case.of("copy", "apply", "v4-8")
    plain, copied = (measure(case, config=copy_config(replicate=r)) for r in (False, True))
    new = [g.now for g in grown(plain.details.peak_buffers, copied.details.peak_buffers, limit=10)]
    # jax 0.10's XLA kept the constraint's name and line on the all-gather; jax 0.12's names the all-gather
    # by the argument it gathers (op_name="params['w']") and carries no source line: nothing to name it by.
    line = f"{HERE}:{_line('marker: replicated copy')}" if toolchain()["jax"].startswith("0.10.") else None
    assert any(b.name == "all-gather of params/w" and b.kind == "temp" and b.shape.endswith("[4096,4096]")
               and b.source == line for b in new), new
    gathers = grown(plain.details.collectives, copied.details.collectives, limit=10)
    assert any(g.now.kind == "all-gather" and g.now.source == line for g in gathers), gathers


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_the_dump_changes_nothing_and_leaves_nothing_behind(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    config = lm.trainer_config(lm.TINY)
    lowered = lower_config(config, Target.of("v4-8"))["train_step"]
    from aotcheck.programs.options import resolve_compiler_options

    options = resolve_compiler_options(Target.of("v4-8").topology, 1, config.options, None)
    plain = program_figures(lowered.compile(compiler_options=options), num_devices=4)
    measured = measure(Case.of("lm-tiny", "train_step", "v4-8"), config=config)
    # The pipeline's own figures (the peak's split, compile costs, the partitioner's fallbacks) aside.
    extra = (*PEAK_FIGURES, *COST_FIGURES, "sharding_fallbacks")
    assert measured.figures["sharding_fallbacks"] == 0
    assert {k: v for k, v in measured.figures.items() if k not in extra} == plain
    assert all(measured.figures[k] > 0 for k in COST_FIGURES)
    assert measured.compiler_options == options  # The dump options never reach the cache key or golden.
    assert list(tmp_path.iterdir()) == []


def test_every_committed_golden_splits_its_peak_exactly():
    files = sorted(GOLDEN.rglob("*.json"))
    assert len(files) >= 24
    for path in files:
        figures = json.loads(path.read_text())["figures"]
        assert sum(figures[name] for name in PEAK_FIGURES) == figures["peak_bytes"], path
        buffers = json.loads(path.read_text())["details"]["peak_buffers"]
        assert buffers and all(b["kind"] in CLASSES for b in buffers), path


@pytest.mark.parametrize("name, cfg", [("lm-tiny", lm.TINY), ("lm-1b", lm.ONE_B)])
def test_params_class_is_the_analytic_parameter_bytes_per_device(name, cfg):
    """Against the committed goldens (real compiles: lm-1b's are the main job's), for every target."""
    files = sorted((GOLDEN / name).glob("train_step@*.json"))
    assert files
    for path in files:
        target = Target.parse(path.stem.split("@")[1])
        measured = json.loads(path.read_text())["figures"]["peak_params_bytes"]
        analytic = analytic_param_bytes(lm.trainer_config(cfg), target)
        assert measured == analytic, (path.name, measured, analytic)  # docs/figures.md: "equals".


@pytest.mark.heavy  # A real run of 15 s or more.
def test_dropping_remat_fails_with_the_temporaries_named(toy, edit_toy):
    run(toy, "--aot-topologies=v4-8", "-k", "lm and train_step", "--update-golden").assert_outcomes(passed=1)
    edit_toy(lm="noremat")
    result = run(toy, "--aot-topologies=v4-8", "-k", "lm and train_step", "--aot-no-cache")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "peak_temp_bytes" in out
    result.stdout.fnmatch_lines(["*The peak grew in: temp +*", "*Buffers at the peak that are new or grew:*",
                                 "*temp +*'jit(train_step)/*' at aotcheck/models/lm.py:*"])
    assert "'broadcast." not in out  # Every buffer named by its JAX op, none by a bare HLO name.
    assert "/while/body/" in out.split("Buffers at the peak")[1]  # The layers' ops (the scan over layers).


def test_a_missing_dump_is_an_error_that_names_the_file(tmp_path):
    """FAKE: dump files written by hand (none, then ones of an unknown format), not by XLA."""
    with pytest.raises(AttributionError, match=r"no \*after_optimizations-buffer-assignment.txt"):
        read_dump(tmp_path, hlo_text="", arguments=[], peak_bytes=1)
    (tmp_path / "m.after_optimizations-buffer-assignment.txt").write_text("allocation 0: size 4, maybe-live-out:\n")
    (tmp_path / "m.after_optimizations-live-range.txt").write_text("HloLiveRange (max 1):\n  (a new format)\n")
    with pytest.raises(AttributionError, match="no 'BufferLiveRange:' section"):
        read_dump(tmp_path, hlo_text="", arguments=[], peak_bytes=1)


def test_a_dump_that_adds_up_past_the_peak_nets_temporaries_or_is_refused():
    """FAKE: a buffer assignment and live ranges written by hand, so the peak figure can be set
    below what they list (as lm-1b's prefill on v4-8 showed for real, by 4%)."""
    assignment = ("allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:\n"
                  " value: <1 p @0> (size=64,offset=0): f32[16]{0}\n"
                  "allocation 1: size 64, preallocated-temp:\n value: <2 f.1 @0> (size=64,offset=0): f32[16]{0}\n")
    live = "  BufferLiveRange:\n    p{}:0-2\n    f.1{}:1-2\n"
    found = attribute(assignment, live, parse_module(""), arguments=[], peak_bytes=100)
    assert found.classes["temp"] == 36 and found.excess == 28 and sum(found.classes.values()) == 100
    with pytest.raises(AttributionError, match="more than its peak of 50 beyond its temporaries"):
        attribute(assignment, live, parse_module(""), arguments=[], peak_bytes=50)


def test_out_of_memory_shows_the_largest_buffers_from_the_dump(tmp_path):
    from jax.sharding import NamedSharding

    from aotcheck.gate.check import check_case
    from aotcheck.gate.golden import GoldenStore
    from aotcheck.render.text import outcome_message

    def make_args(mesh):  # 20 GiB of f32 per device, then an f32 copy of it: more than a v4 device has.
        return (jax.ShapeDtypeStruct((mesh.devices.size * 5 * 2**30,), jnp.float32,
                                     sharding=NamedSharding(mesh, P("data"))),)

    config = aotcheck.FunctionConfig(fn=lambda x: jnp.exp(x) * 2, make_args=make_args)
    case = Case.of("oom", "step", "v4-8")
    outcome = check_case(case, measure=lambda c: measure(c, config=config), store=GoldenStore(tmp_path))
    assert outcome.verdict.value == "out-of-memory"
    assert outcome.details is not None and outcome.details.peak_buffers
    assert {b.name for b in outcome.details.peak_buffers} >= {"args[0]"}
    message = outcome_message(dataclasses.replace(outcome, golden_file="g.json"))
    assert "The largest buffers at XLA's peak" in message and "args[0]" in message and "20.00 GiB" in message


def test_the_job_summary_and_chart_show_the_split(tmp_path):
    """FAKE outcomes (plain data, as a report holds them) rendered: the Markdown block and the stacked bars."""
    from aotcheck.figures.attribution import PeakBuffer
    from aotcheck.gate.compare import DEFAULT_TOLERANCES, compare
    from aotcheck.gate.outcome import Outcome
    from aotcheck.gate.report import Merged, Report
    from aotcheck.gate.verdict import Verdict
    from aotcheck.render.chart import svg_chart, text_bars
    from aotcheck.render.markdown import markdown

    golden_doc = json.loads((GOLDEN / "lm-tiny" / "train_step@v4-8x1.json").read_text())
    before = golden_doc["figures"]
    now = {**before, "peak_temp_bytes": before["peak_temp_bytes"] + 2**30, "peak_bytes": before["peak_bytes"] + 2**30,
           "comm_all_gather_bytes": before["comm_all_gather_bytes"] + 2**20}
    logits = PeakBuffer(2**30, "temp", "jit(train_step)/log_softmax", "f32[16,2048,8192]", "model.py:88")
    details = Details.from_json(golden_doc["details"])
    from aotcheck.figures.loops import CollectiveOp

    gather = CollectiveOp("all-gather", "jit(train_step)/sharding_constraint", "model.py:90", 2, 2**20)
    case = Case.of("lm-tiny", "train_step", "v4-8")
    outcome = Outcome(case, Verdict.REGRESSION, failed=True,
                      measured=Measurement(case, now, {}, 1.0, details=Details([logits, *details.peak_buffers],
                                                                               [gather, *details.collectives])),
                      golden=Golden(before, toolchain(), {}, Path("g.json"), golden_doc["details"]),
                      changes=[r for r in compare(before, now, DEFAULT_TOLERANCES) if r.change.value != "ok"])
    from aotcheck.render.text import outcome_message

    outcome = dataclasses.replace(outcome, golden_file="g.json")
    assert "temp +1.00 GiB: f32[16,2048,8192] 'jit(train_step)/log_softmax' at model.py:88 (new at peak)" in outcome_message(outcome)
    assert "all-gather +1.00 MiB (2 per step): 'jit(train_step)/sharding_constraint' at model.py:90 (new)" in outcome_message(outcome)
    text = markdown(Merged(Report(outcomes=[outcome], golden_dir="golden"), []))
    block = text.split("### What holds the HBM at the peak")[1]
    assert "<details>" in block and "| temp |" in block and "`jit(train_step)/log_softmax`" in block
    assert "T temp" in text_bars([outcome]) and 'fill="#e36209"><title>temp</title>' in svg_chart([outcome])


def test_arguments_skip_what_jit_leaves_out_of_the_program():
    """jit drops unused arguments (keep_unused=False), so the entry's parameters, and the names the
    peak's buffers get from them, skip those: read from the lowered module's public text (the names
    and shapes jax gives the parameters), no private attribute. Lowered for host devices, compiled."""
    from jax.sharding import NamedSharding

    from aotcheck.programs.lowering import arguments, lower_config
    from aotcheck.targets.topology import Target

    def make_args(mesh):
        rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
        return (jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=rows),
                jax.ShapeDtypeStruct((256,), jnp.float32, sharding=whole),  # Unused, shaped like params["b"].
                {"b": jax.ShapeDtypeStruct((256,), jnp.float32, sharding=whole),  # Unused too.
                 "w": jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=whole)})

    config = aotcheck.FunctionConfig(fn=lambda x, unused, params: jnp.tanh(x @ params["w"]), make_args=make_args)
    lowered = lower_config(config, Target.of("cpu-4"))["step"]
    assert [a.path for a in arguments(lowered, config)] == ["args[0]", "args[2]/w"]
    entry = next(c for c in parse_module(lowered.compile().as_text()).values() if c.is_entry)
    assert sum(inst.opcode == "parameter" for inst in entry.instructions.values()) == 2
