"""The program the TPU would run: the mesh visible wherever model code looks for it while aotcheck
traces, and the lint for activations left unsharded (aotcheck.figures.sharding).

Real compiles through the gate (one v5e-16 worker) of the Llama in tests/adapter_models.py with the
shard helpers of tests/shard_helpers.py; the lint's rule itself as a property over made-up buffers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from hypothesis import given, strategies as st

from aotcheck.figures.attribution import PeakBuffer
from aotcheck.figures.program import Details
from aotcheck.figures.sharding import BatchInput, Unsharded, find_unsharded, global_sizes
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import COST_FIGURES, Measurement
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Merged, Report
from aotcheck.gate.verdict import Verdict
from aotcheck.programs.lowering import lower_config
from aotcheck.render.markdown import markdown
from aotcheck.targets.topology import Target

ROOT = Path(__file__).resolve().parents[1]
HELPERS = "tests/shard_helpers.py"


def _constraints(text: str) -> int:
    return text.count("sdy.sharding_constraint") + text.count("@Sharding")


def test_a_model_that_reads_the_legacy_mesh_gets_its_constraints():
    """Lowering only: the helper that looks for ``with mesh:`` finds it while aotcheck traces; with the
    abstract mesh alone (what aotcheck set before) its constraints vanish."""
    import shard_helpers

    from aotcheck.programs import lowering

    llama_config = shard_helpers.llama_config  # tests/adapter_models.py as already loaded.

    target = Target.of("v5e-16")
    legacy = _constraints(lower_config(llama_config(shard=shard_helpers.by_legacy_mesh), target)["train_step"].as_text())
    direct = _constraints(lower_config(llama_config(shard=shard_helpers.always), target)["train_step"].as_text())
    assert legacy == direct > 0

    config = llama_config(shard=shard_helpers.by_legacy_mesh)
    placement = lowering.place(config, target)
    state, batch = lowering.trainer_state_specs(config, placement)
    with jax.sharding.use_abstract_mesh(placement.mesh.abstract_mesh):  # The abstract mesh alone.
        bare = jax.jit(lowering.make_train_step(config)).lower(state, batch).as_text()
    assert _constraints(bare) == 0


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    """The gate over nnx-llama and its three variants on v5e-16 (goldens in a scratch directory)."""
    tmp = tmp_path_factory.mktemp("llama")
    report = tmp / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "aotcheck", "check", "--configs", "nnx-llama,llama-*", "--topologies", "v5e-16",
         "--slices", "1", f"--module={HELPERS}", f"--golden-dir={tmp / 'golden'}", "--update-golden", "--no-cache",
         f"--report={report}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    cases = {c["config"]: Outcome.from_json(c) for c in json.loads(report.read_text())["cases"]}
    return cases, out.stdout, Report.from_json(json.loads(report.read_text()))


def _program_figures(outcome: Outcome) -> dict:
    return {k: v for k, v in (outcome.figures or {}).items() if k not in COST_FIGURES}


@pytest.mark.heavy
def test_every_way_to_find_the_mesh_compiles_the_same_program(llama_run):
    cases, _, _ = llama_run
    assert sorted(cases) == ["llama-direct", "llama-legacy", "llama-platform", "nnx-llama"]
    direct = _program_figures(cases["llama-direct"])
    assert _program_figures(cases["llama-legacy"]) == direct  # with mesh: / thread_resources
    assert _program_figures(cases["nnx-llama"]) == direct  # jax.sharding.get_abstract_mesh()
    for name in ("llama-direct", "llama-legacy", "nnx-llama"):
        assert cases[name].details.unsharded == [], name


@pytest.mark.heavy
def test_a_platform_check_is_caught_by_the_lint_with_its_buffer_named(llama_run):
    cases, stdout, report = llama_run
    platform = cases["llama-platform"]
    found = platform.details.unsharded
    # The attention scores keep all 16 sequences on each of the 16 devices (8-way fsdp x 2-way tp).
    scores = [u for u in found if "BTHGD,BSHD->BHGTS" in u.name]
    assert scores and scores[0].input == "batch/tokens" and scores[0].batch == 16 and scores[0].ways == 8
    assert scores[0].split < 8 and scores[0].source.startswith("tests/adapter_models.py:")
    assert "16" in scores[0].shape.split("[")[1].split(",")
    # It is the program without its constraints: a higher peak than the constrained one.
    assert platform.figures["peak_bytes"] > 3 * cases["nnx-llama"].figures["peak_bytes"]
    # Said in the session's summary, with the likely causes and the fix...
    note = stdout.split("note: llama-platform/train_step@v5e-16x1: ")[1]
    assert note.startswith(f"{len(found)} activations at the peak keep the whole batch on every device")
    assert "BTHGD,BSHD->BHGTS" in note and "jax.sharding.get_abstract_mesh().empty" in note
    assert re.findall(r"^note: (\S+): \d+ activations? at the peak", stdout, re.M) == [
        "llama-platform/train_step@v5e-16x1"]  # The other three say nothing.
    # ...and in the Markdown job summary.
    md = markdown(Merged(report, problems=[]))
    section = md.split("### Activations left unsharded")[1].split("###")[0]
    assert "<code>llama-platform/train_step@v5e-16x1</code>" in section and "BTHGD,BSHD->BHGTS" in section
    assert "llama-legacy" not in section and "nnx-llama" not in section


# --- The rule, as a property (pure logic: made-up buffers, no compile) -----------------------------------

@given(batch=st.sampled_from([8, 16, 32, 64]), ways=st.sampled_from([2, 4, 8]), split=st.sampled_from([1, 2, 4, 8, 16]),
       rest=st.lists(st.integers(3, 7), min_size=1, max_size=3))
def test_a_buffer_keeping_the_batch_is_flagged_exactly_when_it_is_split_fewer_ways(batch, ways, split, rest):
    shape = f"f32[{','.join(map(str, [batch, *rest]))}]"
    elements = batch * int(__import__("math").prod(rest))
    buffer = PeakBuffer(elements * 4, "temp", "jit(f)/dot_general", shape, "m.py:1")
    before = {(buffer.name, buffer.source): {elements * split}}
    found = find_unsharded([buffer], [BatchInput("batch/x", batch, ways)], before, peak_bytes=elements * 4)
    assert bool(found) == (split < ways)
    if found:
        assert found[0].split == split and found[0].input == "batch/x"
    # Arguments, copies of them and buffers of no known op are never flagged.
    for other in (PeakBuffer(buffer.bytes, "params", "params/w", shape), PeakBuffer(buffer.bytes, "temp", "fusion", shape)):
        assert find_unsharded([other], [BatchInput("batch/x", batch, ways)], before, peak_bytes=elements * 4) == []


def test_small_buffers_and_ones_without_the_whole_batch_are_not_flagged():
    """Pure logic on made-up buffers (no compile)."""
    inputs = [BatchInput("batch/x", 16, 4)]
    # A weight gradient whose first dimension happens to be the batch's: whole on every device by design.
    grad = PeakBuffer(2**20, "temp", "jit(f)/transpose(jvp())/dot_general", "f32[16,16384]", None)
    before = {(grad.name, None): {16 * 16384}}
    assert find_unsharded([grad], inputs, before, peak_bytes=2**20) != []  # Not told it is a weight's shape...
    assert find_unsharded([grad], inputs, before, peak_bytes=2**20, param_shapes=[(16384, 16)]) == []  # ...told.
    small = PeakBuffer(64, "temp", "op", "f32[16]", None)
    assert find_unsharded([small], inputs, {("op", None): {16}}, peak_bytes=64 * 101) == []  # Under 1% of the peak.
    per_device = PeakBuffer(64, "temp", "op", "f32[4,4]", None)  # Its rows are the per-device batch.
    assert find_unsharded([per_device], inputs, {("op", None): {16}}, peak_bytes=64) == []


def test_global_sizes_read_the_lowered_program_with_its_lines():
    import shard_helpers

    lowered = lower_config(shard_helpers.llama_config(), Target.of("v5e-16"))["train_step"]
    sizes = global_sizes(lowered.as_text(dialect="hlo", debug_info=True))
    scores = [v for (name, source), v in sizes.items() if name.endswith("jvp(BTHGD,BSHD->BHGTS)/dot_general")]
    assert scores == [{16 * 2 * 4 * 256 * 256}]  # B, kv heads, groups, T, S: global, before partitioning.
    assert all(source is None or ".py:" in source for _, source in sizes)


def test_findings_round_trip_through_details_and_outcomes():
    found = Unsharded(1024, "jit(f)/op", "f32[16,16]", "m.py:3", "batch/x", 16, 4, 1)
    case = Case.of("c", "p", "v5e-16")
    outcome = Outcome(case, Verdict.PASS, measured=Measurement(case, {}, {}, 1.0, details=Details(unsharded=[found])))
    assert Outcome.from_json(json.loads(json.dumps(outcome.to_json()))).details.unsharded == [found]
    assert "unsharded" not in Details().to_json()  # Clean programs' goldens do not change.


def test_the_lint_over_every_committed_golden_flags_esm2_alone():
    """Every golden's details carry what the lint found when it was made (uncached compiles). Only
    ESM2 (third-party, no activation constraints) keeps its batch whole: its attention weights."""
    flagged = {}
    for path in sorted((ROOT / "golden").glob("*/*.json")):
        details = Details.from_json(json.loads(path.read_text()).get("details"))
        if details.unsharded:
            flagged[path.relative_to(ROOT / "golden").as_posix()] = {u.shape for u in details.unsharded}
    assert flagged == {f"esm2-8m/train_step@{t}.json": {"f32[6,64,5,256,256]"}
                       for t in ("v4-8x2", "v5e-16x1", "v5e-16x2", "h100-8x1", "h100-8x2")}
