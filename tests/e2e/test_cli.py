"""``python -m aotcheck`` as a user runs it: a subprocess from the repository root (aotcheck.cli and
aotcheck.__main__, with the tables of aotcheck.render.explain)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aotcheck.pipeline.measurement import COST_FIGURES

ROOT = Path(__file__).resolve().parents[2]


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "aotcheck", *args], cwd=cwd, capture_output=True, text=True)


def test_topologies_table_and_json():
    out = run("topologies")
    assert out.returncode == 0
    assert "v5e-16" in out.stdout and "v5e:4x4" in out.stdout
    rows = json.loads(run("topologies", "--json").stdout)
    assert {"name": "v4-8", "devices": 4, "platform": "tpu"}.items() <= next(r for r in rows if r["name"] == "v4-8").items()
    assert {"name": "gb200-72", "devices": 72, "platform": "gpu", "libtpu_name": None, "cuda_topology": "1x18x4",
            "device_kind": "NVIDIA GB200"}.items() <= next(r for r in rows if r["name"] == "gb200-72").items()


def test_configs_lists_the_reference_configs():
    out = run("configs")
    assert out.returncode == 0
    assert "lm-tiny" in out.stdout and "sample_decode" in out.stdout and "lm-1b" in out.stdout


def test_configs_without_any_registered(tmp_path):
    out = run("configs", cwd=tmp_path)
    assert out.returncode == 1 and "No configs registered" in out.stdout


def test_compile_json_and_dump_hlo(tmp_path):
    out = run("compile", "lm-tiny", "--topology", "v4-8", "--method", "prefill", "--json",
              "--dump-hlo", str(tmp_path))
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)["prefill"]["figures"]
    assert figures["peak_bytes"] > 0 and figures["flops_xla"] > 0
    hlo = (tmp_path / "lm-tiny.prefill@v4-8x1.hlo.txt").read_text()
    assert hlo.startswith("HloModule")
    assert "TPU_WORKER_HOSTNAMES" not in out.stderr  # libtpu's start-up noise is kept out


@pytest.mark.heavy
def test_compile_table():
    out = run("compile", "lm-tiny", "--topology", "v5e-16", "--slices", "2", "--method", "train_step")
    assert out.returncode == 0, out.stderr
    assert "lm-tiny/train_step@v5e-16x2" in out.stdout and "peak/HBM" in out.stdout


def test_bad_input_is_a_clear_error():
    out = run("compile", "lm-tiny", "--topology", "v5e-17")
    assert out.returncode == 2 and "Closest valid names: v5e-8, v5e-16, v5e-32" in out.stderr
    out = run("compile", "lm-nope", "--topology", "v4-8")
    assert out.returncode == 2 and "No config named 'lm-nope'" in out.stderr
    out = run("compile", "lm-tiny", "--topology", "v4-8", "--slices", "0")
    assert out.returncode == 2 and "slices must be >= 1" in out.stderr
    out = run("compile", "lm-tiny", "--topology", "v4-8", "--method", "nope")
    assert out.returncode == 2 and "no program 'nope'" in out.stderr
    # GPU hosts: a count in the name and another in --slices; a size that is no host or rack.
    out = run("compile", "lm-tiny", "--topology", "h100-16", "--slices", "3")
    assert out.returncode == 2 and "--topology h100-16 names 2 slices (hosts) and --slices says 3" in out.stderr
    out = run("fit", "lm-tiny", "--topology", "h100-12")
    assert out.returncode == 2 and "h100 targets are h100-1, h100-2, h100-4, h100-8" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.heavy
def test_compile_explain_shows_loops_with_trip_counts():
    out = run("compile", "lm-tiny", "--topology", "v4-8", "--method", "train_step", "--explain")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "loop-aware vs" in text and "top matmuls" in text and "all-gather" in text
    # Two scans over lm-tiny's 2 layers (forward, backward), each with its trip count.
    loop_rows = [l for l in text.split("What holds the HBM")[0].splitlines() if l.startswith("while")]
    assert len(loop_rows) == 2 and all(l.split()[1] == "2" for l in loop_rows)
    # What holds the HBM at the peak: the split by class, then the backward scan's activations lead.
    split = text.split("What holds the HBM at the peak (per device):")[1].split("The largest buffers")[0]
    rows = [line.split()[0] for line in split.splitlines()[3:] if line.strip()]
    assert rows == ["params", "opt_state", "batch", "kv_cache", "outputs", "temp", "other", "peak"]
    buffers = text.split("The largest buffers at the peak:")[1].splitlines()
    assert "/transpose(jvp())/while/body/" in buffers[3] and "aotcheck/models/lm.py:" in buffers[3]
    assert "The largest collectives, per step:" in text


@pytest.mark.heavy
def test_compile_json_has_the_goldens_figures_and_details_and_leaves_no_file(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "lm-tiny", "--topology", "v4-8",
                          "--method", "train_step", "--json", "--explain"], cwd=ROOT, capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)["train_step"]
    golden = json.loads((ROOT / "golden/lm-tiny/train_step@v4-8x1.json").read_text())
    assert all(result["figures"].pop(k) > 0 and golden["figures"].pop(k) > 0 for k in COST_FIGURES)  # CPU time.
    assert result["figures"] == golden["figures"]  # The golden: another process, the gate's path.
    assert result["details"] == golden["details"] and result["attribution_problem"] is None
    assert list(tmp_path.iterdir()) == []  # The dump directory is removed.


CANARY = '''
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck

ROW = (8, 2**25)  # float32s: one GiB per row of the batch (the batch axis major: no tile pads it).


def canary(rows):
    def make_program(mesh, target):
        x = jax.ShapeDtypeStruct((rows, *ROW), jnp.float32, sharding=NamedSharding(mesh, P("data")))
        return jax.jit(lambda x: jnp.sum(x, axis=(1, 2))), (x,)

    return aotcheck.FunctionConfig(make_program=make_program, program="train_step", fit="batch",
                                   knobs={"batch": aotcheck.Knob(rows, canary, step=4)})


aotcheck.register("canary", canary(168))  # 42 GiB per chip of a 4-chip slice.
'''


@pytest.mark.heavy  # Two chip families' workers, 8 TPU compiles: about 10 s.
def test_fit_over_every_pool_a_job_may_land_on_names_the_one_that_limits_it(tmp_path):
    """marin #6345's shape: a canary's step needs 42 GiB per chip; it fits v5p-8 (95.74 GiB usable) and
    OOMs on v4-8 (30.75 GiB), where the scheduler fell back. Analytic truth: one GiB per row over 4 chips,
    so 4 x floor(95.74) = 380 rows on v5p-8 and 4 x floor(30.75) = 120 on v4-8."""
    (tmp_path / "canary.py").write_text(CANARY)
    out = run("fit", "canary", "--topology", "v5p-8,v4-8", "--module", "canary.py", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr  # The configured batch does not fit v4-8: a job there OOMs.
    lines = out.stdout.splitlines()
    assert ("canary/train_step: the largest batch that fits every pool (v5p-8x1, v4-8x1) is 120; v4-8x1 limits it"
            in lines), out.stdout
    assert "  each pool's own: v5p-8x1 380, v4-8x1 120" in lines and "  8 compiles (v5p-8x1 4, v4-8x1 4)" in lines
    assert "canary/train_step@v4-8x1: the largest batch that fits is 120, peak 30.00 GiB" in out.stdout
    doc = json.loads(run("fit", "canary", "--topology", "v5p-8,v4-8", "--module", "canary.py", "--json",
                         cwd=tmp_path).stdout)["pools"]
    assert (doc["max_size"], doc["limiting"], doc["pools"]["v5p-8x1"]["max_size"]) == (120, ["v4-8x1"], 380)
    assert all(p["probes"] <= 4 for p in doc["pools"].values())


def test_shards_lays_n_shards_over_at_most_256_jobs():
    out = run("shards", "1000", "--json")
    assert out.returncode == 0, out.stderr
    include = json.loads(out.stdout)["include"]
    assert len(include) == 250 and include[0] == {"shards": "1-4"} and include[-1] == {"shards": "997-1000"}
    text = run("shards", "300").stdout
    assert text.startswith("300 shards over 150 jobs, 2 a job:") and "job 150: shards 299-300" in text
    refused = run("shards", "20000")
    assert refused.returncode == 2 and "aotcheck shards 20000: at most 1,024 shards" in refused.stderr
    # Hardening round 5, V38/V40: 10,000 were laid 40 a job (40 pytest sessions on one runner), 10,001 refused in
    # --aot-shard's words.
    for n in ("10000", "10001", "1025"):
        refused = run("shards", n)
        assert refused.returncode == 2 and refused.stderr.strip() == (
            f"aotcheck: error: aotcheck shards {n}: at most 1,024 shards (GitHub's 256 jobs of a matrix, 4 shards a job "
            "side by side, each a pytest session of its own: more would run a runner out of memory); e.g. aotcheck "
            "shards 1024"), refused.stderr


def test_a_run_leaves_nothing_in_tmpdir(tmp_path):
    """Hardening round 5, V27: libtpu's log directory (aotcheck-dump-<pid>-tpu-logs-*) was left after every run."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("TPU_LOG_DIR", None)
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "lm-tiny", "--topology", "v5e-16", "--method",
                          "prefill"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
