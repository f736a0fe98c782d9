"""The eval step, compiled by default: marin #6378's failure caught before launch.

A MoE canary (``aotcheck.models.canary``: jax's megablox grouped matmul in its experts) whose train
step runs the kernel in bf16 and fits, and whose own eval step runs it in f32 and needs 22 MiB of
scoped VMEM against v5e's 16 MiB default. ``aotcheck check`` for real, in a project of its own: the
train step is written, the eval step refused with the kernel, the size, the limit and the flag that
raises it (rounded up to 4 MiB: at a limit of exactly XLA's figure the kernel places more); with that
flag, the eval step compiles.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = '''
import aotcheck
from aotcheck.models import canary, lm

aotcheck.register("canary", lambda: canary.trainer_config(canary.CANARY))
aotcheck.register("no-eval", lambda: lm.trainer_config(lm.TINY, eval_step=None))
'''


def _check(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aotcheck", "check", "--topologies", "v5e-1", "--no-cache",
                           f"--report={project / 'r.json'}", *args], cwd=project, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.heavy
def test_the_canarys_eval_step_is_refused_for_vmem_while_its_train_step_fits(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    out = _check(tmp_path, "--configs", "canary,no-eval", "--update-golden")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    verdicts = {c["case"]: c["verdict"] for c in json.loads((tmp_path / "r.json").read_text())["cases"]}
    assert verdicts == {"canary/train_step@v5e-1x1": "accepted", "canary/eval_step@v5e-1x1": "out-of-memory",
                        "no-eval/train_step@v5e-1x1": "accepted"}
    assert (tmp_path / "golden/canary/train_step@v5e-1x1.json").is_file()
    assert not (tmp_path / "golden/canary/eval_step@v5e-1x1.json").exists()
    text = out.stdout
    # The refusal in words: the program, the space, the kernel (megablox's gmm), its size and the limit,
    # and the cure (22 MiB as a launch flag, or on the kernel).
    refusal = text[text.index("canary/eval_step@v5e-1x1"):]
    assert "does not fit in VMEM on v5e-1" in refusal and "the Pallas kernel" in refusal and "gmm" in refusal
    assert "needs a scoped VMEM allocation of 22.00 MiB; the scoped VMEM limit is 16.00 MiB" in refusal
    # XLA's 22 MiB is what it had placed when it stopped: at a 22 MiB limit the kernel places 22.82 MiB
    # (libtpu 0.0.50.1), so the limit advised is rounded up to 4 MiB, and that one compiles.
    assert "megablox/gmm.py" in refusal and "vmem_limit_bytes=25165824" in refusal
    assert "To raise the limit to 24.00 MiB (XLA's figure rounded up to 4 MiB" in refusal
    assert "--xla_tpu_scoped_vmem_limit_kib=24576" in refusal
    # A trainer without an eval step says so once, in the header, not per case.
    assert text.count("no-eval has a train step and no eval step") == 1 and "canary has a train step" not in text
    assert "no-eval/eval_step" not in text

    # The cure named works: the eval step compiles with the limit raised.
    cured = _check(tmp_path, "--case", "canary/eval_step@v5e-1x1", "--update-golden",
                   "--libtpu-init-args=--xla_tpu_scoped_vmem_limit_kib=24576")
    assert cured.returncode == 0, cured.stdout[-3000:] + cured.stderr[-3000:]
    assert (tmp_path / "golden/canary/eval_step@v5e-1x1.json").is_file()
