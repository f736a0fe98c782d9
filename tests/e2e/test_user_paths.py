"""User-visible paths that had no test of their own: docs/library.md's pytest-free script with real
workers, ``aotcheck check --shard``, ``aot_tolerances`` deciding a verdict, and a non-editable
install (``pip install .``, as the action installs aotcheck). Real processes throughout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from toy import run

ROOT = Path(__file__).resolve().parents[2]


def _readme_script() -> str:
    readme = (ROOT / "docs" / "library.md").read_text()
    after = readme.split("The gate itself, without pytest, in a script")[1]
    return re.search(r"```python\n(.*?)```", after, re.S)[1]


def test_readmes_stages_run_as_printed(tmp_path):
    """docs/library.md's library section, as printed: one case lowered, compiled and measured by the stages, in
    this process; the argument paths it prints, the peak and its largest buffer are real."""
    readme = (ROOT / "docs" / "library.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme.split("One case through the pipeline's stages")[1], re.S)[1]
    (tmp_path / "stages.py").write_text(block)
    out = subprocess.run([sys.executable, "stages.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    paths, measured = out.stdout.strip().splitlines()[-2:]
    assert eval(paths) == ["batch/targets", "batch/tokens"], paths  # noqa: S307  (its own print)
    peak, buffer = measured.split(" ", 1)
    assert int(peak) > 2**20 and buffer.startswith("PeakBuffer(bytes="), measured


@pytest.mark.heavy
def test_readmes_pytest_free_script_runs_the_gate_with_real_workers(tmp_path):
    """docs/library.md's script, as printed: its workers import it for the registration; each case has a
    verdict (no goldens here: missing), and nothing but the script's own output is printed."""
    (tmp_path / "gate.py").write_text(_readme_script())
    out = subprocess.run([sys.executable, "gate.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = eval(out.stdout.strip().splitlines()[-1])  # The script prints a list of (id, verdict, failed).
    ids = {f"lm-tiny/{p}@{t}x{n}" for p in ("train_step", "eval_step", "prefill", "sample_decode") for t in ("v4-8", "v5e-16")
           for n in (1, 2)}
    assert {case for case, _, _ in found} == ids
    assert {(verdict, failed) for _, verdict, failed in found} == {("missing-golden", True)}


@pytest.mark.heavy  # A real run of 12 s or more (2 cores, -n 2).
def test_check_shards_on_the_command_line_split_the_matrix(project):
    """``aotcheck check --shard K/N`` (the CLI's spelling): the shards' cases are disjoint and make
    up the matrix."""
    project.makeini("[pytest]\naot_golden_dir = golden\naot_topologies = v4-8 v5e-16\naot_slices = 1 2\n")
    # The goldens first, as a checkout has them: shards are weighed by the seconds they record.
    check = [sys.executable, "-m", "aotcheck", "check", "--configs", "toy"]
    assert subprocess.run([*check, "--update-golden"], cwd=project.path, capture_output=True, timeout=600).returncode == 0
    seen = {}
    for k in (1, 2):
        report = project.path / f"r{k}.json"
        out = subprocess.run([*check, "--shard", f"{k}/2", f"--report={report}"], cwd=project.path,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        seen[k] = {c["case"] for c in json.loads(report.read_text())["cases"]}
        assert f"shard {k}/2 (expected " in out.stdout
    assert seen[1] and seen[2] and seen[1].isdisjoint(seen[2])
    assert seen[1] | seen[2] == {f"toy/step@{t}x{n}" for t in ("v4-8", "v5e-16") for n in (1, 2)}


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_aot_tolerances_decide_the_verdict(project, edit_toy):
    """A change the default tolerances fail passes under a wider ``aot_tolerances`` line, and the
    table shows the tolerance that judged it."""
    run(project, "--aot-topologies=v4-8", "--update-golden").assert_outcomes(passed=2)
    edit_toy(width=264)  # Wider: every figure grows (by half, with the tiles' padding).
    strict = run(project, "--aot-topologies=v4-8")
    strict.assert_outcomes(passed=1, failed=1)
    assert "regressed against" in strict.stdout.str()
    loose = run(project, "--aot-topologies=v4-8", "-o", "aot_tolerances=* = 100% + 1MiB")
    loose.assert_outcomes(passed=2)


@pytest.mark.heavy
def test_a_non_editable_install_has_every_module_and_runs(tmp_path):
    """``pip install .`` as the action does (a wheel, not the source tree): every module of the
    package is in it, and the installed command works from elsewhere."""
    target = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          f"--target={target}", str(ROOT)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    installed = {p.relative_to(target).as_posix() for p in (target / "aotcheck").rglob("*.py")}
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "aotcheck").rglob("*.py")}
    assert installed == source
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-m", "aotcheck", "topologies"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "v5e-16" in out.stdout, out.stderr[-2000:]
    where = subprocess.run([sys.executable, "-c", "import aotcheck; print(aotcheck.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert where.stdout.strip().startswith(str(target))


KNOB_CONFTEST = '''
import jax, jax.numpy as jnp, optax
from jax.sharding import PartitionSpec as P

import aotcheck

VOCAB, WIDTH = 16384, 64


def config(seq):
    def loss(params, batch):
        logits = (params["embed"][batch["tokens"]] @ params["unembed"]).astype(jnp.float32)
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    return aotcheck.TrainerConfig(
        init_fn=lambda key: {"embed": jax.random.normal(key, (VOCAB, WIDTH)),
                             "unembed": jax.random.normal(key, (WIDTH, VOCAB))},
        loss_fn=loss, optimizer=optax.sgd(0.1),
        partition_rules=((r"^embed$", P("data", None)), (r"^unembed$", P(None, "data"))),
        # 512 sequences: 8 MiB of f32 logits per position on each of 4 devices, so about 1,900 fit.
        batch_spec={"tokens": jax.ShapeDtypeStruct((512, seq), jnp.int32)}, mesh=aotcheck.MeshSpec(("data",), (-1,)),
        knobs={"seq": aotcheck.Knob(128, config, step=128)}, fit="seq", eval_step=None)


aotcheck.register("seqfit", lambda: config(128))
'''


@pytest.mark.heavy  # A real run of 12 s or more (2 cores, -n 2).
def test_a_configs_own_knob_is_searched_and_gated(pytester):
    """A config's own ``Knob`` (its sequence length, in steps of 128) named by ``fit=``: the gate
    searches it and gates ``fit_max_seq``, and ``aotcheck fit`` reports it."""
    pytester.makeconftest(KNOB_CONFTEST)
    pytester.makeini("[pytest]\naot_golden_dir = golden\n")
    out = subprocess.run([sys.executable, "-m", "aotcheck", "check", "--topologies", "v5e-4", "--update-golden",
                          "--report=r.json"], cwd=pytester.path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (case,) = json.loads((pytester.path / "r.json").read_text())["cases"]
    found = case["measured"]["figures"]["fit_max_seq"]
    assert found > 128 and found % 128 == 0 and case["measured"]["details"]["fit"]["knob"] == "seq"
    fit = subprocess.run([sys.executable, "-m", "aotcheck", "fit", "seqfit", "--topology", "v5e-4", "--knob", "seq"],
                         cwd=pytester.path, capture_output=True, text=True, timeout=600)
    # ``aotcheck fit``'s happy path in the default run: the max, the configured size's peak, what fills the memory.
    assert fit.returncode == 0 and f"seqfit/train_step@v5e-4x1: the largest seq that fits is {found}," in fit.stdout, \
        fit.stdout
    assert "configured seq 128: peak " in fit.stdout and "What fills the memory at the max:" in fit.stdout, fit.stdout
    assert "log_softmax" in fit.stdout, fit.stdout
