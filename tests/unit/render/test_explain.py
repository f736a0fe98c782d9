"""aotcheck.render.explain: ``aotcheck compile``'s table and ``--explain``, from a real compile of a
scan of matmuls on host devices (quick: XLA's CPU compiler, the same stages as every target's)."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.stages import lower
from aotcheck.render.explain import compile_table, explain, peak_table

TRIPS, N = 5, 64


def scan_step(w, x):
    def body(h, _):
        return jnp.tanh(h @ w), None
    return jax.lax.scan(body, x, None, length=TRIPS)[0]


def make_args(mesh):
    return (jax.ShapeDtypeStruct((N, N), jnp.float32, sharding=NamedSharding(mesh, P())),
            jax.ShapeDtypeStruct((8 * mesh.devices.size, N), jnp.float32, sharding=NamedSharding(mesh, P("data"))))


@pytest.fixture(scope="module")
def compiled():
    case = Case.of("scan", "step", "cpu-2")
    with lower(case, aotcheck.FunctionConfig(fn=scan_step, make_args=make_args)).compile() as done:
        yield done.measure(), done.compiled.as_text(), case


def test_explain_counts_the_loop_times_its_trips_and_splits_the_peak(compiled):
    measured, text, _ = compiled
    out = explain(text, measured.figures, details=measured.details)
    rows = [line.split() for line in out.splitlines() if line.startswith("while")]
    assert len(rows) == 1 and rows[0][1] == str(TRIPS), out  # The scan, with its trip count.
    per_trip = 2 * 8 * N * N  # One device's rows (8 of 16) times the weight: a matmul's FLOPs.
    assert measured.figures["flops"] == TRIPS * per_trip  # Loop-aware: the body times its trips,
    # against XLA's raw figure, which counts the body once (and a stray op or two beside it).
    assert out.startswith("FLOPs per device: 327.68 K loop-aware vs 65.54 K XLA raw"), out
    assert "dot_general  327.68 K      5" in out  # The top matmul, run once per trip.
    assert "What holds the HBM at the peak (per device):" in out
    split = out.split("What holds the HBM at the peak (per device):")[1]
    assert [line.split()[0] for line in split.splitlines()[3:11]] == [
        "params", "opt_state", "batch", "kv_cache", "outputs", "temp", "other", "peak"]


def test_the_compile_table_shows_the_peaks_share_of_the_chip_and_the_figures(compiled):
    measured, _, case = compiled
    out = compile_table([measured], case.topology)
    header, _, row = out.splitlines()[:3]
    assert header.split()[:3] == ["case", "compile", "argument"] and row.startswith("scan/step@cpu-2x1")
    assert "'step >=' is a roofline lower bound" in out


def test_the_peak_table_is_absent_without_a_split():
    assert peak_table({"peak_bytes": 0}) is None and peak_table({}) is None
