"""Figures users can trust: loop-aware FLOPs, collectives, HBM fit, roofline (real compiles)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

import aotcheck
from aotcheck.figures.program import roofline
from aotcheck.figures.hlo import parse_module
from aotcheck.figures.loops import analyze_hlo, trip_count
from aotcheck.figures.hbm import HbmVerdict, hbm_verdict
from aotcheck.render.memory import oom_words
from aotcheck.models import lm
from aotcheck.targets.tpu import CHIPS

# Four layers, no remat: the PaLM appendix formula (6N per token + attention) is exact.
NO_REMAT = dataclasses.replace(lm.TINY, n_layers=4, remat=False)


def train_figures(cfg, topology, **overrides):
    compiled = aotcheck.compile_trainer_programs(lm.trainer_config(cfg, eval_step=None, **overrides), topology=topology)
    return aotcheck.program_figures(compiled["train_step"])


@pytest.mark.parametrize("topology", ["v4-8", "v5e-16"])
def test_loop_aware_flops_match_the_analytic_count(topology):
    figures = train_figures(NO_REMAT, topology)
    analytic = NO_REMAT.train_step_flops()
    assert figures["flops_program"] == analytic  # docs/figures.md: "exactly".
    # XLA's raw figure counts the scanned layers once: far below.
    assert figures["flops_xla"] * figures["flops_program"] / figures["flops"] < 0.5 * analytic


@pytest.mark.heavy
def test_windowed_einsum_loops_are_counted():
    # Unscanned and FSDP-only on v5e-16: the SPMD partitioner turns weight matmuls into
    # while loops (windowed einsum) that XLA's raw figure counts once. (~30 s compile.)
    cfg = dataclasses.replace(lm.ONE_B, n_layers=2, remat=False, scan_layers=False,
                              mesh=aotcheck.MeshSpec(("data", "model"), (-1, 1)))
    compiled = aotcheck.compile_trainer_programs(lm.trainer_config(cfg, eval_step=None), topology="v5e-16")["train_step"]
    analysis = analyze_hlo(compiled.as_text())
    assert len(analysis.loops) > 10 and analysis.unknown_trip_counts == 0
    figures = aotcheck.program_figures(compiled)
    assert figures["flops_program"] == cfg.train_step_flops()  # Exactly, as without the loops.
    assert figures["flops_xla"] * 16 < 0.8 * cfg.train_step_flops()


@pytest.mark.heavy  # A real run of 12 s or more (2 cores, -n 2).
def test_scanned_and_unrolled_agree():
    scanned = train_figures(dataclasses.replace(NO_REMAT, remat=True), "v4-8")
    unrolled = train_figures(dataclasses.replace(NO_REMAT, remat=True, scan_layers=False), "v4-8")
    assert scanned["flops"] == pytest.approx(unrolled["flops"], rel=0.01)


def test_sample_decode_flops_scale_with_decode_length():
    flops = {}
    for n in (8, 16, 32):
        cfg = dataclasses.replace(lm.TINY, decode_len=n)
        out = aotcheck.compile_inference_programs(lm.inference_config(cfg), input_batch_spec=None, topology="v4-8")
        flops[n] = aotcheck.program_figures(out["sample_decode"])["flops"]
    per_token_a = (flops[16] - flops[8]) / 8
    per_token_b = (flops[32] - flops[16]) / 16
    assert per_token_a > 0
    # Linear in the decode length (attention over a longer cache adds a little).
    assert per_token_b == pytest.approx(per_token_a, rel=0.05)


@pytest.mark.heavy  # A real run of 12 s or more (2 cores, -n 2).
def test_replicating_instead_of_fsdp_changes_the_collectives():
    fsdp = train_figures(lm.TINY, "v4-8")
    replicated = train_figures(lm.TINY, "v4-8", partition_rules=((".*", P()),))
    assert fsdp["comm_all_gather_count"] > replicated["comm_all_gather_count"]
    assert fsdp["argument_bytes"] < replicated["argument_bytes"]


def test_roofline_uses_the_chip_figures():
    figures = {"flops": 197e12, "bytes_accessed_xla": 819e9 / 2}
    bounds = roofline(figures, "v5e-16")
    assert bounds == {"compute_seconds": 1.0, "memory_seconds": 0.5, "bound_seconds": 1.0}
    assert roofline(figures, "cpu-4") is None


def test_hbm_verdict_is_a_record_in_plain_words():
    from aotcheck.render.text import hbm_words

    over = hbm_verdict(int(17.3 * 2**30), "v5e-16")
    assert (over.peak_bytes, over.capacity_bytes, over.limit_bytes, over.headroom, over.topology) == (
        int(17.3 * 2**30), 16 * 2**30, 16 * 2**30, 1.0, "v5e-16")
    assert HbmVerdict.from_json(json.loads(json.dumps(over.to_json()))) == over
    assert hbm_words(over) == "needs 17.30 GiB of 16.00 GiB HBM per device on v5e-16: 108%"
    assert hbm_verdict(int(15.3 * 2**30), "v5e-16") is None
    tight = hbm_verdict(int(15.3 * 2**30), "v5e-16", headroom=0.95)
    assert tight.limit_bytes == int(16 * 2**30 * 0.95) and "headroom 95% allows 15.20 GiB" in hbm_words(tight)
    # The boundary: exactly the capacity fits, one byte more does not.
    assert hbm_verdict(CHIPS["v4"].hbm_bytes, "v4-8") is None
    assert hbm_words(hbm_verdict(CHIPS["v4"].hbm_bytes + 1, "v4-8")).endswith("on v4-8: 100%")
    assert hbm_verdict(2**40, "cpu-4") is None  # No HBM known: nothing to check against.


def test_xla_out_of_memory_is_one_record_read_where_the_compile_raises():
    """A real HBM refusal on a deviceless v5e-1: typed and read once, its record worded without XLA's text."""
    cfg = dataclasses.replace(lm.ONE_B, n_layers=4, batch=64, mesh=aotcheck.MeshSpec(("data", "model"), (-1, 1)))
    with pytest.raises(aotcheck.OutOfMemory) as e:  # Typed where XLA says so: nothing downstream reads the text.
        aotcheck.compile_trainer_programs(lm.trainer_config(cfg), topology="v5e-1")
    o = e.value.overflow
    assert type(e.value) is aotcheck.OutOfMemory and o.hbm and o.limit_bytes == round(15.75 * 2**30)
    assert o.size_bytes > o.limit_bytes and sum(o.breakdown.values()) >= o.size_bytes
    text = oom_words(o, "v5e-1")
    assert text.startswith("does not fit: XLA needs ") and "of the 15.75 GiB HBM a device can use on v5e-1" in text


# Trip counts from HLO shapes the compiler emits: a fused compare, a non-zero start, a step of 2.
# (Pure parsing: hand-written HLO text, no compiler.)
_LOOP = """
%fused_cond (p0: s32[], p1: s32[]) -> pred[] {
  %p0 = s32[] parameter(0)
  %p1 = s32[] parameter(1)
  ROOT %lt = pred[] compare(%p0, %p1), direction=LT
}

%cond (param: (s32[], f32[8,8])) -> pred[] {
  %param = (s32[], f32[8,8]) parameter(0)
  %gte = s32[] get-tuple-element(%param), index=0
  %limit = s32[] constant(11)
  ROOT %fusion = pred[] fusion(%gte, %limit), kind=kLoop, calls=%fused_cond
}

%body (param.1: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %param.1 = (s32[], f32[8,8]) parameter(0)
  %i = s32[] get-tuple-element(%param.1), index=0
  %two = s32[] constant(2)
  %next = s32[] add(%i, %two)
  %x = f32[8,8] get-tuple-element(%param.1), index=1
  %y = f32[8,8] dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[8,8]) tuple(%next, %y)
}

ENTRY %main (a: f32[8,8]) -> f32[8,8] {
  %a = f32[8,8] parameter(0)
  %start = s32[] constant(1)
  %init = (s32[], f32[8,8]) tuple(%start, %a)
  %w = (s32[], f32[8,8]) while(%init), condition=%cond, body=%body
  %ag = f32[32,8] all-gather(%a), dimensions={0}
  ROOT %out = f32[8,8] get-tuple-element(%w), index=1
}
"""


def test_trip_count_from_fused_condition_start_and_step():
    module = parse_module(_LOOP)
    entry = module["main"]
    assert trip_count(entry.instructions["w"], entry, module) == 5  # 1, 3, 5, 7, 9
    analysis = analyze_hlo(_LOOP)
    assert analysis.flops == 5 * 2 * 8 * 8 * 8
    assert analysis.collectives["all-gather"].count == 1
    assert analysis.collectives["all-gather"].bytes == 32 * 8 * 4


@pytest.mark.heavy  # 14 s of 7x compiles: in the heavy leg.
def test_collectives_inside_sparsecore_calls_are_counted_on_7x(tmp_path):
    # On 7x the collectives run in call-start(..., async_execution_thread="sparsecore")
    # computations; a walk that does not enter them counts none. Compiled in a worker process
    # (the CLI's), since this libtpu can crash on 7x depending on what the process compiled before.
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "lm-tiny", "--topology", "7x-8",
                          "--method", "prefill", "--json", "--dump-hlo", str(tmp_path)],
                         cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout)["prefill"]["figures"]
    hlo = (tmp_path / "lm-tiny.prefill@7x-8x1.hlo.txt").read_text()
    assert 'async_execution_thread="sparsecore"' in hlo and "call-start" in hlo
    assert figures["comm_all_gather_count"] > 0 and figures["comm_all_reduce_count"] > 0
    assert figures["comm_all_gather_bytes"] > 0
