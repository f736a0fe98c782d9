"""The program the TPU would run: the mesh visible wherever model code looks for it while aotcheck
traces, and the lint for activations left unsharded (aotcheck.figures.sharding).

Real compiles of the Llama in tests/adapter_models.py with the shard helpers of tests/shard_helpers.py:
through the gate (one v5e-16 worker, heavy), and a one-layer one on 2-D meshes in this process (the
rule in mesh axes, a nested jax.jit, both forms of XLA's shardings); the lint's rule itself as
properties over made-up buffers and shardings.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import pytest
from hypothesis import given, strategies as st

from aotcheck.figures.attribution import PeakBuffer
from aotcheck.figures.program import Details
from aotcheck.figures.dump import dump_options
from aotcheck.figures.hlo import parse_arrays
from aotcheck.figures.sharding import BatchInput, Unsharded, find_unsharded
from aotcheck.figures.splits import Shardings, Split, parse_sharding, read_shardings, sharding_dump
from aotcheck.figures.splits import dump_options as sharding_dump_options
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import COST_FIGURES, Measurement
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Merged, Report
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.stages import lower
from aotcheck.programs.compile import compile_lowered
from aotcheck.programs.lowering import lower_config, place
from aotcheck.programs.model import make_train_step, trainer_state_specs
from aotcheck.render.markdown import markdown
from aotcheck.targets.topology import Target

ROOT = Path(__file__).resolve().parents[3]
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
    state, batch = trainer_state_specs(config, placement.mesh)
    with jax.sharding.use_abstract_mesh(placement.mesh.abstract_mesh):  # The abstract mesh alone.
        bare = jax.jit(make_train_step(config)).lower(state, batch).as_text()
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
    cases = {c["config"]: Outcome.from_json(c) for c in json.loads(report.read_text())["cases"]
             if c["case"].split("/")[1].startswith("train_step")}  # nnx-llama's eval step is not the subject.
    return cases, out.stdout, Report.from_json(json.loads(report.read_text()))


def _program_figures(outcome: Outcome) -> dict:
    return {k: v for k, v in (outcome.figures or {}).items() if k not in COST_FIGURES}


@pytest.mark.heavy
def test_every_way_to_find_the_mesh_compiles_the_same_program(llama_run):
    cases, _, _ = llama_run
    assert sorted(cases) == ["llama-as-target", "llama-direct", "llama-legacy", "llama-platform", "nnx-llama"]
    direct = _program_figures(cases["llama-direct"])
    assert _program_figures(cases["llama-legacy"]) == direct  # with mesh: / thread_resources
    assert _program_figures(cases["nnx-llama"]) == direct  # jax.sharding.get_abstract_mesh()
    # A helper that asks jax.devices(), traced as the target (the default): the constraints are there.
    assert _program_figures(cases["llama-as-target"]) == direct
    for name in ("llama-direct", "llama-legacy", "nnx-llama", "llama-as-target"):
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
    assert scores[0].batch_axes == ("fsdp",) and scores[0].replicated == ("fsdp",)  # Its rows not split over fsdp.
    assert "16" in scores[0].shape.split("[")[1].split(",")
    # It is the program without its constraints: a higher peak than the constrained one.
    assert platform.figures["peak_bytes"] > 3 * cases["nnx-llama"].figures["peak_bytes"]
    # Said in the session's summary, with the likely causes and the fix...
    note = stdout.split("note: llama-platform/train_step@v5e-16x1: ")[1]
    assert note.startswith(f"{len(found)} activations at the peak keep the whole batch on every device")
    assert "BTHGD,BSHD->BHGTS" in note and "jax.sharding.get_abstract_mesh().empty" in note
    assert re.findall(r"^note: (\S+): \d+ activations? at the peak", stdout, re.M) == [
        "llama-platform/train_step@v5e-16x1"]  # The other four say nothing.
    # ...and in the Markdown job summary.
    md = markdown(Merged(report, problems=[]))
    section = md.split("### Activations left unsharded")[1].split("###")[0]
    assert "<code>llama-platform/train_step@v5e-16x1</code>" in section and "BTHGD,BSHD->BHGTS" in section
    assert "llama-legacy" not in section and "nnx-llama" not in section


# --- The rule in mesh axes, on real compiles (a one-layer Llama on v5e-16, in this process) -----------

AXES_TARGET = "v5e-16"
SCORES = "BTHGD,BSHD->BHGTS"  # The attention scores' einsum: (B, kv heads, groups, T, S).


@pytest.fixture(scope="module")
def small_llama():
    """Measures shard_helpers.small_llama_config through the stages (a compile of 2-4 s), once per variant."""
    import shard_helpers

    done = {}

    def measure(helper: str, mesh: tuple[int, int] = (4, 4), *, nested: bool = False):
        key = (helper, mesh, nested)
        if key not in done:
            config = shard_helpers.small_llama_config(getattr(shard_helpers, helper), mesh=mesh, nested=nested)
            lowered = lower(Case.of("small-llama", "train_step", AXES_TARGET), config)
            with lowered.compile() as compiled:
                done[key] = compiled.measure(), sharding_dump(compiled.dump_dir), lowered
        return done[key]

    return measure


@pytest.mark.heavy
@pytest.mark.parametrize("mesh", [(4, 4), (2, 8)], ids=["fsdp4-tp4", "fsdp2-tp8"])
def test_activations_replicated_over_the_batch_axes_are_flagged_however_many_ways_they_are_split(small_llama, mesh):
    """The shard helper skips its constraints on a CPU host: the activations keep all 16 rows, split
    over ``tp`` as many ways as the batch is over ``fsdp`` (4, 4), or more (2, 8). Counting ways saw
    nothing there; the axes say they are replicated over ``fsdp``. Constrained, nothing is flagged."""
    measured, _, _ = small_llama("by_platform", mesh)
    found = measured.details.unsharded
    assert found and all(u.input == "batch/tokens" and u.batch == 16 and u.ways == mesh[0] and u.batch_axes == ("fsdp",)
                         for u in found)
    by_axes = [u for u in found if u.replicated]
    assert all(u.replicated == ("fsdp",) and u.split_axes == ("tp",) and u.split == mesh[1] and u.shards == mesh[0]
               for u in by_axes)  # Each device's copy serves every shard of the batch.
    scores = [u for u in by_axes if SCORES in u.name]
    assert scores and scores[0].split >= scores[0].ways  # What a rule in counts of ways let through.
    assert scores[0].source.startswith("tests/adapter_models.py:")
    assert scores[0].describe().endswith(f"split {mesh[1]} ways over tp where the batch is split {mesh[0]} over fsdp: "
                                         f"replicated over fsdp, {mesh[0]} of its {mesh[0]} shards on each device")
    constrained, _, _ = small_llama("always", mesh)
    assert constrained.details.unsharded == []
    assert constrained.figures["peak_bytes"] < measured.figures["peak_bytes"]


@pytest.mark.heavy
def test_a_buffer_split_over_the_batch_axis_on_another_dimension_is_not_flagged(small_llama):
    """The scores constrained to keep the whole batch with their kv heads split over ``fsdp`` (the
    batch's axis): as small per device as with the batch split, so not an unsharded activation."""
    measured, _, _ = small_llama("heads_over_data")
    peak = measured.figures["peak_bytes"]
    whole = [b for b in measured.details.peak_buffers if b.kind == "temp" and b.bytes >= 0.01 * peak
             and 16 in parse_arrays(b.shape)[0].dims and b.source and b.source.startswith("tests/adapter_models.py:")]
    assert whole  # A large activation keeps all 16 rows on every device...
    assert measured.details.unsharded == []  # ...and is split over fsdp on another dimension.


@pytest.mark.heavy
def test_a_nested_jit_is_seen_through(small_llama):
    """The model called inside a nested ``jax.jit``: the compiled program names its ops
    ``jit(train_step)/jvp(jit(forward))/...``; the propagated module, dumped by the same compile, names
    them so too, and the findings are those of the model called directly."""
    nested = small_llama("by_platform", nested=True)[0].details.unsharded
    direct = small_llama("by_platform")[0].details.unsharded
    assert nested and all("jit(forward)" in u.name for u in nested if "jvp" in u.name)
    scores = [u for u in nested if SCORES in u.name]
    assert scores and scores[0].replicated == ("fsdp",) and scores[0].split_axes == ("tp",)
    assert {(u.shape, u.source) for u in direct} <= {(u.shape, u.source) for u in nested}


@pytest.mark.heavy
def test_a_tile_assignment_names_the_same_mesh_axes_as_the_named_form(small_llama):
    """jax 0.12's libtpu dumps shardings by mesh axis name; an older one (0.0.42.1) as a tile assignment
    of device ids (``xla_enable_hlo_sharding_v3`` switches between them, on both). Read against the
    mesh, the ids name the same axes for every op of the program."""
    _, named_text, lowered = small_llama("by_platform", (2, 8))
    with tempfile.TemporaryDirectory() as dump:  # The same compile, its shardings written the other way.
        compile_lowered(lowered.lowered, {**lowered.options, **dump_options(dump), **sharding_dump_options(),
                                          "xla_enable_hlo_sharding_v3": False}, what="v2", topology=AXES_TARGET)
        tiled_text = sharding_dump(dump)
    assert "sharding={mesh['fsdp'=2,'tp'=8]" in named_text and "sharding={devices=[" in tiled_text
    mesh = dict(place(lowered.config, Target.of(AXES_TARGET)).mesh.shape)
    named, tiled = read_shardings(named_text), read_shardings(tiled_text, mesh)

    def axes(found):
        return {key: sorted((s.dims, s.ways, tuple(frozenset(a) for a in s.axes)) for s in splits)
                for key, splits in found.ops.items()}

    assert axes(named) == axes(tiled) and len(named.ops) > 100
    assert named.parameters == tiled.parameters
    assert any(SCORES in name and source.startswith("tests/adapter_models.py:") for name, source in named.ops)
    assert read_shardings(tiled_text).ops  # Without the mesh, the ways alone (the rule counts them).
    assert all(s.axes is None for splits in read_shardings(tiled_text).ops.values() for s in splits if s.split > 1)


# --- The rule, as a property (pure logic: made-up buffers, no compile) -----------------------------------

MESH_AXES = ("data", "fsdp", "tp")


def _named(axes_per_dim, size: int) -> str:
    """A sharding as jax 0.12's libtpu writes it, on a mesh of MESH_AXES, each of ``size`` devices."""
    mesh = ",".join(f"'{a}'={size}" for a in MESH_AXES)
    return "{mesh[" + mesh + "], [" + ", ".join("{" + ", ".join(f"'{a}'" for a in axes) + "}" for axes in axes_per_dim) + "]}"


def _lint(buffer: PeakBuffer, op: Split, rows: Split, ways: int, *, of: PeakBuffer | None = None,
          **kwargs) -> list[Unsharded]:
    """The lint on one buffer, its op's split (the op of ``of``'s name and line, by default its own) and
    the batch's (its entry parameter 0, split ``ways`` ways)."""
    batch, of = rows.dims[0], of or buffer
    shardings = Shardings({(of.name, of.source): [op]}, {0: rows})
    return find_unsharded([buffer], [BatchInput("batch/x", batch, ways, 0)], shardings, peak_bytes=buffer.bytes,
                          **kwargs)


def _buffer(*dims: int, name: str = "jit(f)/dot_general", source: str | None = "m.py:1") -> PeakBuffer:
    return PeakBuffer(math.prod(dims) * 4, "temp", name, f"f32[{','.join(map(str, dims))}]", source)


@given(batch=st.sampled_from([8, 16, 32, 64]), size=st.sampled_from([2, 4]),
       batch_axes=st.lists(st.sampled_from(MESH_AXES), min_size=1, max_size=2, unique=True),
       buffer_axes=st.lists(st.sampled_from(MESH_AXES), max_size=3, unique=True),
       rest=st.lists(st.integers(3, 7), min_size=1, max_size=3))
def test_a_buffer_keeping_the_batch_is_flagged_exactly_when_replicated_over_one_of_its_axes(
        batch, size, batch_axes, buffer_axes, rest):
    buffer, split = _buffer(batch, *rest), size ** len(buffer_axes)
    op = parse_sharding(_named([[]] * len(rest) + [buffer_axes], size), (batch, *rest[:-1], rest[-1] * split))
    rows = parse_sharding(_named([batch_axes, []], size), (batch, 7))
    found = _lint(buffer, op, rows, size ** len(batch_axes))
    missing = tuple(a for a in batch_axes if a not in buffer_axes)
    assert bool(found) == bool(missing)  # However the way counts compare.
    if found:
        assert found[0].replicated == missing and found[0].batch_axes == tuple(batch_axes)
        assert found[0].shards == size ** len(missing)  # The batch's shards one device's copy serves.
        assert found[0].split == split and found[0].split_axes == tuple(buffer_axes)
    # Arguments, copies of them and buffers of no known op are never flagged.
    for other in (PeakBuffer(buffer.bytes, "params", "params/w", buffer.shape),
                  PeakBuffer(buffer.bytes, "temp", "fusion", buffer.shape)):
        assert _lint(other, op, rows, size ** len(batch_axes), of=buffer) == []


def test_a_part_of_the_batch_axis_is_not_the_whole_of_it():
    """ESM2's attention weights on v5e-16: the batch split 16 ways over ``data``, the heads 4 ways over
    a part of it (a sub-axis): each device's copy serves 4 of the batch's 16 shards."""
    mesh = "mesh['data'=16]"
    rows = parse_sharding("{" + mesh + ", [{'data'}, {}]}", (64, 256))
    for part, heads, expected in (("'data':(1)4", 20, [(("data",), 4, ("data",))]),
                                  ("'data':(4)4", 20, [(("data",), 4, ("data",))]),
                                  ("'data'", 80, [])):
        op = parse_sharding("{" + mesh + ", [{}, {" + part + "}, {}]}", (64, heads, 256))
        found = _lint(_buffer(64, 5, 256), op, rows, 16)
        assert [(u.replicated, u.shards, u.split_axes) for u in found] == expected, part


def test_a_tile_assignment_read_without_the_mesh_is_judged_by_device_all_the_same():
    """An older libtpu's form, read without the mesh: no axis named, the rule exact (by device id)."""
    rows = parse_sharding("{devices=[4,1,4]<=[16] last_tile_dim_replicate}", (16, 7))  # Row block: id // 4.
    for pieces, expected in (("{devices=[1,4,4]<=[4,4]T(1,0) last_tile_dim_replicate}", [(4, 4, (), ())]),  # id % 4
                             ("{devices=[1,4,4]<=[16] last_tile_dim_replicate}", [])):  # id // 4, as the rows.
        found = _lint(_buffer(16, 8), parse_sharding(pieces, (16, 32)), rows, 4)
        assert [(u.shards, u.split, u.batch_axes, u.replicated) for u in found] == expected, pieces


@given(batch=st.sampled_from([8, 16, 32, 64]), ways=st.sampled_from([2, 4, 8]), split=st.sampled_from([1, 2, 4, 8, 16]),
       rest=st.lists(st.integers(3, 7), min_size=1, max_size=3), matches=st.booleans())
def test_without_a_layout_a_buffer_is_flagged_when_split_fewer_ways(batch, ways, split, rest, matches):
    """No op of the buffer's per-device size (the partitioner laid it out otherwise), or its layout not
    known: the ways counted."""
    dims = (batch, *rest[:-1], rest[-1] * split)
    if matches:
        op = Split(dims, None, (1,) * len(rest) + (split,))
    else:  # Split 3 ways on the batch, as the partitioner did not: no per-device size matches.
        op = parse_sharding("{mesh['tp'=3], [{'tp'}" + ", {}" * len(rest) + "]}", dims)
    rows = parse_sharding("{mesh['fsdp'=" + str(ways) + "], [{'fsdp'}, {}]}", (batch, 7))
    found = _lint(_buffer(batch, *rest), op, rows, ways)
    # A dimension holding this device's rows says the batch is split, whatever else equals its size.
    assert bool(found) == (split < ways and batch // ways not in (batch, *rest))
    if found:
        assert found[0].split == split and found[0].shards == 0 and found[0].batch_axes == ("fsdp",)


def test_without_a_layout_a_dimension_that_only_equals_the_batch_is_not_the_batch():
    """Pure logic (no compile): lm-moe's decode cache [layers, 8 rows, 32 positions, heads, 32] on 4
    devices, a batch of 32 split 4 ways: its 32s are the prompt and the head width, its 8 the rows."""
    rows = parse_sharding("{mesh['data'=4], [{'data'}, {}]}", (32, 32))
    unknown = parse_sharding("{mesh['tp'=3], [{'tp'}, {}, {}, {}, {}]}", (2, 32, 32, 4, 32))  # No size matches.
    assert _lint(_buffer(2, 8, 32, 4, 32), unknown, rows, 4) == []
    assert _lint(_buffer(2, 32, 32, 4, 32), unknown, rows, 4) != []  # Every row here: flagged by the count.


def test_small_buffers_and_ones_without_the_whole_batch_are_not_flagged():
    """Pure logic on made-up buffers (no compile)."""
    rows = parse_sharding("{mesh['data'=4], [{'data'}, {}]}", (16, 7))
    whole = parse_sharding("{mesh['data'=4], [{}, {}]}", (16, 16384))
    # A weight gradient whose first dimension happens to be the batch's: whole on every device by design.
    grad = _buffer(16, 16384, name="jit(f)/transpose(jvp())/dot_general", source=None)
    assert _lint(grad, whole, rows, 4) != []  # Not told it is a weight's shape...
    assert _lint(grad, whole, rows, 4, param_shapes=[(16384, 16)]) == []  # ...told.
    small = _buffer(16, 16384)
    assert find_unsharded([small], [BatchInput("batch/x", 16, 4, 0)], Shardings({(small.name, small.source): [whole]},
                          {0: rows}), peak_bytes=small.bytes * 101) == []  # Under 1% of the peak.
    assert _lint(_buffer(4, 4), parse_sharding("{mesh['data'=4], [{}, {}]}", (4, 4)), rows, 4) == []  # 4 rows: not 16.
    # Named by another caller's name stack: found by its line and the last part of its name.
    inner = _buffer(16, 16384, name="jit(step)/jit(inner)/dot_general", source="m.py:9")
    lowered_name = Shardings({("jit(inner)/dot_general", "m.py:9"): [whole]}, {0: rows})
    found = find_unsharded([inner], [BatchInput("batch/x", 16, 4, 0)], lowered_name, peak_bytes=inner.bytes)
    assert [(u.replicated, u.shards) for u in found] == [(("data",), 4)]


def test_shardings_read_in_both_forms():
    named = parse_sharding("{mesh['data'=2,'fsdp'=2,'tp'=4], [{'data', 'fsdp'}, {}, {'tp':(1)2}], replicated={'tp':(2)2}}",
                           (16, 3, 8))
    assert named == Split((16, 3, 8), (("data", "fsdp"), (), ("tp",)), (4, 1, 2)) and named.local_elements == 4 * 3 * 4
    mesh = {"data": 2, "fsdp": 2, "tp": 4}
    # The same split as tile assignments: an iota and a list of the device ids (row-major over the mesh).
    iota = parse_sharding("{devices=[4,1,2,2]<=[4,2,2]T(0,2,1) last_tile_dim_replicate}", (16, 3, 8), mesh)
    listed = parse_sharding("{devices=[4,1,2,2]0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 last_tile_dim_replicate}",
                            (16, 3, 8), mesh)
    assert iota.axes == ((("data", "fsdp"), (), ("tp",))) and iota.ways == (4, 1, 2)
    assert listed.axes == ((("data", "fsdp"), (), ("tp",))) and listed.ways == (4, 1, 2)
    assert parse_sharding("{devices=[4,1,2,2]<=[16] last_tile_dim_replicate}", (16, 3, 8)).axes is None  # No mesh.
    for unknown in ("{maximal device=0}", "{{replicated}, {replicated}}", "{devices=[4,1,4]<=[16] last_tile_dims={manual}}",
                    "{mesh['x'=4], [{'x'}]}"):
        assert parse_sharding(unknown, (16, 3)) is None, unknown


def test_findings_round_trip_through_details_and_outcomes():
    found = Unsharded(1024, "jit(f)/op", "f32[16,16]", "m.py:3", "batch/x", 16, 4, 4, ("fsdp",), ("tp",), ("fsdp",))
    case = Case.of("c", "p", "v5e-16")
    outcome = Outcome(case, Verdict.PASS, measured=Measurement(case, {}, {}, 1.0, details=Details(unsharded=[found])))
    assert Outcome.from_json(json.loads(json.dumps(outcome.to_json()))).details.unsharded == [found]
    # A finding written before the lint read mesh axes (a golden's, a cache entry's) reads with none.
    old = {k: v for k, v in found.to_json().items() if k not in ("batch_axes", "split_axes", "replicated")}
    assert Unsharded.from_json(old) == Unsharded(1024, "jit(f)/op", "f32[16,16]", "m.py:3", "batch/x", 16, 4, 4)
    assert Unsharded.from_json(old).describe() == ("f32[16,16] keeps batch/x whole (16 rows) on every device, "
                                                   "split 4 ways where the batch is split 4")
    assert "unsharded" not in Details().to_json()  # Clean programs' goldens do not change.


def test_the_lint_over_every_committed_golden_flags_esm2_alone():
    """Every golden's details carry what the lint found when it was made (uncached compiles). Only
    ESM2 (third-party, no activation constraints) keeps its batch whole: its attention weights."""
    flagged = {}
    for path in sorted((ROOT / "golden").glob("*/*.json")):
        details = Details.from_json(json.loads(path.read_text()).get("details"))
        if details.unsharded:
            flagged[path.relative_to(ROOT / "golden").as_posix()] = {u.shape for u in details.unsharded}
    # In mesh axes (since figures version 12), its attention's temporaries too: split over heads on a
    # part of the data axis, replicated over the rest of it.
    gpu = {"f32[6,64,5,256,256]", "f32[64,5,256,256]"}
    assert flagged == {
        "esm2-8m/train_step@h100-8x1.json": gpu, "esm2-8m/train_step@h100-8x2.json": gpu,
        "esm2-8m/train_step@v4-8x2.json": {"bf16[6,64,5,256,256]", "f32[6,64,5,256,256]", "f32[64,256,320]",
                                           "f32[64,5,256,256]"},
        "esm2-8m/train_step@v5e-16x1.json": {"bf16[320,64,256]", "f32[6,64,5,256,256]", "f32[64,5,256,16]",
                                             "f32[64,5,256,256]"},
        "esm2-8m/train_step@v5e-16x2.json": {"bf16[6,64,5,256,256]", "f32[6,64,5,256,256]", "f32[64,256,320]",
                                             "f32[64,5,256,256]"},
        # Its eval step (the forward alone) keeps the same attention weights whole, and no other model's does.
        "esm2-8m/eval_step@h100-8x1.json": {"f32[64,5,256,16]", "f32[64,5,256,256]"},
        "esm2-8m/eval_step@h100-8x2.json": {"f32[64,5,256,16]", "f32[64,5,256,256]"},
        "esm2-8m/eval_step@v4-8x1.json": {"bf16[64,256,320]"},
        "esm2-8m/eval_step@v4-8x2.json": {"f32[64,5,256,256]", "f32[64,5,256,8]"},
        "esm2-8m/eval_step@v5e-16x1.json": {"f32[64,256,80]", "f32[64,5,256,256]", "f32[64,5,256,8]"},
        "esm2-8m/eval_step@v5e-16x2.json": {"f32[64,5,256,256]", "f32[64,5,256,8]"},
    }
