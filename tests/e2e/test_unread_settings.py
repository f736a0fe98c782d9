"""A knob that changed nothing (issue 56, item 2; Hunyuan3's MaxText notes: two remat knobs and 18 tile
sizes, tuned by hand for a day, left the compiled program identical because the code never read them).

Real ``aotcheck check`` runs in a project of its own, on a host target: a FunctionConfig whose ``tile``
knob and ``remat_policy`` setting its function never reads, and whose ``width`` it does. The golden
records the knobs, the settings and the lowered module's digest; a run with ``tile`` and
``remat_policy`` changed carries the note "changed, and the program did not", naming both; a run with
``width`` changed carries none (its figures moved instead).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = '''
import jax, jax.numpy as jnp
import aotcheck
from aotcheck import FunctionConfig, Knob

def make(tile={tile}, width={width}, policy={policy!r}):
    return FunctionConfig(
        fn=lambda x: jnp.tanh(x) * 2, make_args=lambda mesh: (jax.ShapeDtypeStruct(
            (width, 128), jnp.float32, sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())),),
        knobs={{"tile": Knob(tile, lambda n: make(tile=n, width=width, policy=policy))}},
        settings={{"remat_policy": policy}})

aotcheck.register("tiles", make)
'''


def _check(project: Path, *args: str, **knobs) -> dict:
    (project / "conftest.py").write_text(CONFTEST.format(**{"tile": 128, "width": 64, "policy": "full", **knobs}))
    report = project / "r.json"
    out = subprocess.run([sys.executable, "-m", "aotcheck", "check", "--configs", "tiles", "--topologies", "cpu-1",
                          "--no-cache", f"--report={report}", *args], cwd=project, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode in (0, 1), out.stdout[-3000:] + out.stderr[-3000:]
    (case,) = json.loads(report.read_text())["cases"]
    return {**case, "stdout": out.stdout}


@pytest.mark.heavy
def test_a_knob_and_a_setting_the_code_never_reads_are_named_and_one_it_reads_is_not(tmp_path):
    first = _check(tmp_path, "--update-golden")
    golden = json.loads((tmp_path / "golden/tiles/step@cpu-1x1.json").read_text())
    assert golden["settings"] == {"tile": 128, "remat_policy": "full"} and len(golden["program"]) == 16
    assert first["verdict"] == "accepted"

    unread = _check(tmp_path, tile=256, policy="minimal")
    assert unread["verdict"] == "pass"  # The program is the golden's: its figures too.
    note = ("tiles/step@cpu-1x1: remat_policy ('full' -> 'minimal'), tile (128 -> 256) changed, and the program "
            "did not: the lowered module is the golden's, so the code never read them")
    assert note in unread["notes"] and note in unread["stdout"]

    read = _check(tmp_path, width=4096)
    assert read["verdict"] != "pass" and not [n for n in read["notes"] if "the program did not" in n]
