"""Every reference config on one chip: meshes adapt to one device (MeshSpec.adapt), so lm-tiny, llm and
lm-1b's prefill compile for v5e-1 and h100-1, and lm-1b's train step says it does not fit one v5e chip."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compile_json(config: str, topology: str, *method: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", config, "--topology", topology, "--json",
                          *(("--method", method[0]) if method else ())], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.heavy
@pytest.mark.parametrize("topology", ["v5e-1", "h100-1"])
def test_lm_tiny_and_the_reference_server_compile_on_one_chip(topology):
    tiny = compile_json("lm-tiny", topology)
    assert set(tiny) == {"train_step", "prefill", "sample_decode"}
    server = compile_json("llm", topology)
    assert len(server) == 9 and all(r["hbm_verdict"] is None for r in [*tiny.values(), *server.values()])
    # One device holds everything: the weights whole (18.9M parameters as fp32, the reference LM's).
    assert server["step[tokens=64]"]["figures"]["peak_params_bytes"] >= 18_000_000 * 4


@pytest.mark.main_job
def test_lm_1b_prefills_on_one_v5e_chip_and_its_train_step_says_it_does_not_fit():
    prefill = compile_json("lm-1b", "v5e-1", "prefill")["prefill"]
    assert prefill["hbm_verdict"] is None and prefill["figures"]["peak_bytes"] < 15.75 * 2**30
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "lm-1b", "--topology", "v5e-1", "--method",
                          "train_step"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "exceeds available HBM" in out.stdout + out.stderr  # 16.87G of 15.75G on the chip.
