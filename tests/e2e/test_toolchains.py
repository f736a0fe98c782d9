"""aotcheck on every toolchain it supports, each in a fresh virtual environment (marker ``toolchains``:
CI's test command runs them beside the rest; see DEVELOPING.md).

- The oldest supported toolchain (``requirements-oldest.lock``: jax 0.10.2, libtpu 0.0.42.1, Python
  3.11): the lock installed, then ``pip install -e .`` with the package's own ranges resolved against
  it, then the whole gate into a fresh golden directory (figures differ between toolchains, so this
  leg checks behaviour, not the committed numbers): every chip family including 7x's known crashes on
  that libtpu, attribution, the fit search, the three adapters and ESM2, through ``aotcheck check``;
  a second run then passes against what the first wrote.
- The same oldest toolchain against the committed goldens (made with the current lock): the upgrade
  table says which cases moved, by how much, which did not, and the command that accepts them all.
- The current lock on Python 3.13 (CI itself runs 3.12): installs and gates lm-tiny against the
  committed goldens.

An interpreter this machine lacks is skipped with the reason (in CI, where the legs must prove
something, it fails instead); pyenv's versions are found directly, since its shims only answer for
the versions a project selected. The oldest-toolchain tests share one venv, built once for the run by
whichever xdist worker asks first (``venvs.shared_env``); installs into the repository
(``pip install -e .``) take turns all the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from venvs import clean_env, make_env, shared_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.toolchains

FAMILIES = "v4-8,v5p-8,v5e-16,v6e-8,7x-8"


def aotcheck(py: str, *args: str, timeout: int = 1500) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    return subprocess.run([py, "-m", "aotcheck", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.fixture(scope="module")
def oldest(tmp_path_factory) -> str:
    py = shared_env(tmp_path_factory, "oldest", "3.11", "requirements-oldest.lock")  # Once, for every worker.
    versions = subprocess.run([py, "-c", "import sys, jax, importlib.metadata as m; "
                               "print(sys.version_info[:2], jax.__version__, m.version('libtpu'))"],
                              capture_output=True, text=True).stdout
    assert versions.split() == ["(3,", "11)", "0.10.2", "0.0.42.1"], versions
    return py


def verdicts(report: Path) -> dict[str, str]:
    return {c["case"]: c["verdict"] for c in json.loads(report.read_text())["cases"]}


def test_the_oldest_toolchain_runs_the_whole_gate(oldest, tmp_path):
    golden, cache = tmp_path / "golden", tmp_path / "cache"
    # lm-tiny on every family (libtpu's side); the adapters' models on one (the oldest flax and equinox).
    runs = [["--topologies", FAMILIES, "--configs", "lm-tiny"],
            ["--topologies", "v5e-16", "--configs", "linen-tiny,nnx-tiny,eqx-tiny,esm2-8m"]]
    common = ["--slices", "1", f"--golden-dir={golden}", f"--cache-dir={cache}"]
    found, outs = {}, []
    for i, run in enumerate(runs):
        outs.append(aotcheck(oldest, "check", *run, *common, "--update-golden", f"--report={tmp_path / f'first{i}.json'}"))
        found.update(verdicts(tmp_path / f"first{i}.json"))
    first = outs[0]
    # libtpu 0.0.42.1 dies compiling these three (SIGSEGV, a stack overflow), options or not; the rest is written.
    crashes = {"lm-tiny/train_step@7x-8x1", "lm-tiny/eval_step@7x-8x1", "lm-tiny/sample_decode@7x-8x1"}
    assert {c for c, v in found.items() if v == "crashed"} == crashes, first.stdout[-4000:]
    assert {v for c, v in found.items() if c not in crashes} == {"accepted"}, [o.stdout[-4000:] for o in outs]
    # lm-tiny's 4 programs (its eval step too) on 5 families; linen 3, nnx 2, eqx 2, esm2 2.
    assert len(found) == 4 * 5 + 9, sorted(found)
    assert first.returncode == 1 and outs[1].returncode == 0
    assert not any("Traceback" in o.stdout + o.stderr for o in outs)
    # Each crash's C++ stack is in the report, not the terminal (the message quotes the last lines).
    assert "FailureSignalHandler" not in first.stdout + first.stderr, first.stdout[-4000:]
    logs = {c["case"]: "\n".join((c["error"] or {}).get("log", []))
            for c in json.loads((tmp_path / "first0.json").read_text())["cases"]}
    assert all("received by PID" in logs[c] and "FailureSignalHandler" in logs[c] for c in crashes), logs
    tiny = json.loads((golden / "lm-tiny" / "train_step@v4-8x1.json").read_text())
    assert tiny["toolchain"] == {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
    assert sum(v for k, v in tiny["figures"].items() if k.startswith("peak_") and k != "peak_bytes") \
        == tiny["figures"]["peak_bytes"]  # Attribution: the classes add up to XLA's peak.
    assert tiny["figures"]["fit_max_batch"] >= 32 and tiny["figures"]["compile_cpu_seconds"] > 0
    # 0.0.42.1 accepts every preset on every chip: all of them were sent, and recorded.
    v4 = json.loads((golden / "lm-tiny" / "prefill@v4-8x1.json").read_text())
    assert v4["compiler_options"]["xla_tpu_enable_async_collective_fusion"] == "true"

    found = {}
    for i, run in enumerate(runs):
        second = aotcheck(oldest, "check", *run, *common, f"--report={tmp_path / f'second{i}.json'}")
        found.update(verdicts(tmp_path / f"second{i}.json"))
    assert {c for c, v in found.items() if v != "pass"} == crashes, second.stdout[-4000:]
    assert len(found) == 4 * 5 + 9


def test_bisect_searches_two_jax_releases_on_lm_tiny(oldest):
    """aotcheck bisect --toolchains over the oldest lock's venv and this one (jax 0.10.2 / libtpu 0.0.42.1, then
    the current lock): each compiles this checkout's case with its own libtpu (never the parent's, which jax's
    TPU_LIBRARY_PATH would hand down), each visit says its versions and figure. lm-tiny's train step on v5e-16:
    XLA's temporaries move past their tolerance (0 B, then 4.58 MiB)."""
    def bisect(figure: str) -> list[str]:
        out = aotcheck(sys.executable, "bisect", "lm-tiny/train_step@v5e-16x1", "--figure", figure,
                       "--toolchains", f"{oldest},{sys.executable}")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout.splitlines()

    lock = dict(line.split("==") for line in (ROOT / "requirements.lock").read_text().split() if "==" in line)
    current = f"jax {lock['jax']}, jaxlib {lock['jaxlib']}, libtpu {lock['libtpu']}"
    lines = bisect("temp_bytes")  # (peak_bytes holds within its tolerance: 3.12 MiB, then 3.11 MiB, by hand.)
    assert lines[1] == "  jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.42.1: 0 B" and lines[2].startswith(f"  {current}: ")
    assert lines[-1] == f"aotcheck bisect: the first toolchain past the tolerance is {current}, found in 2 compiles"


def test_an_older_toolchain_than_the_goldens_explains_itself(oldest, tmp_path):
    # The committed goldens were made with the current lock; the oldest toolchain is behind them: a
    # downgrade, said as such, with the goldens' toolchain to install and no command that accepts it.
    report = tmp_path / "report.json"
    out = aotcheck(oldest, "check", "--topologies", "v4-8,v5e-16", "--slices", "1", "--configs", "lm-tiny",
                   "--no-cache", f"--report={report}")
    text = out.stdout
    assert "golden file(s) were made with another toolchain" in text, text[-3000:]
    lock = dict(line.split("==") for line in (ROOT / "requirements.lock").read_text().split() if "==" in line)
    goldens = f"jax {lock['jax']}, jaxlib {lock['jaxlib']}, libtpu {lock['libtpu']}"
    assert (f"older toolchain than the goldens': 8 case(s) judged against goldens made with {goldens}; now jax 0.10.2, "
            f"jaxlib 0.10.2, libtpu 0.0.42.1, which is older (a downgrade: the CI lock or this machine is behind the "
            f"goldens)") in text, text[-3000:]
    cases = json.loads(report.read_text())["cases"]
    moved = [c for c in cases if any(r["change"] != "ok" for r in c["changes"])]
    assert f"{len(moved)} moved, {8 - len(moved)} did not." in text
    for c in moved:  # Each moved figure has its row: case, figure, golden, now, change.
        for r in c["changes"]:
            assert any(line.startswith(c["case"]) and r["metric"] in line for line in text.splitlines()), (c, text)
    assert (f"Do not accept these figures: they would take the goldens back to an older toolchain. Install the "
            f"goldens' toolchain ({goldens}) to check against them.") in text
    assert "To accept the new toolchain's figures" not in text
    assert out.returncode == (1 if any(c["failed"] for c in cases) else 0)
    markdown = aotcheck(oldest, "report", str(report), "--format", "markdown").stdout
    assert "### Older toolchain than the goldens'" in markdown and "--update-golden --aot-configs=lm-tiny" not in markdown


def test_the_current_lock_installs_and_gates_on_python_3_13(tmp_path):
    py = make_env("3.13", "requirements.lock", tmp_path)
    report = tmp_path / "report.json"
    out = aotcheck(py, "check", "--configs", "lm-tiny", "--topologies", "v5e-16", "--slices", "1", "--no-cache",
                   f"--report={report}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert set(verdicts(report).values()) == {"pass"} and len(verdicts(report)) == 4


def test_compile_lm_tiny_on_every_family_without_any_option_of_the_users():
    # The presets libtpu refuses are not sent (libtpu 0.0.50.1 refuses async collective fusion off v5e).
    # v4-8, v5e-16 and h100-8 are gated by every default run (tox.ini's matrix), 7x-8 by
    # tests/unit/gate/test_isolation.py and the next libtpu's leg; these are the two families left. The
    # oldest lock's side is test_the_oldest_toolchain_runs_the_whole_gate's: every family.
    for topology in ("v5p-8", "v6e-8"):
        out = aotcheck(sys.executable, "compile", "lm-tiny", "--topology", topology, "--json")
        assert out.returncode == 0, (topology, out.stderr[-2000:])
        programs = json.loads(out.stdout)
        assert sorted(programs) == ["eval_step", "prefill", "sample_decode", "train_step"]
        for method, result in programs.items():
            assert result["figures"]["peak_bytes"] > 0 and result["figures"]["compile_cpu_seconds"] > 0, method
            assert "xla_tpu_enable_async_collective_fusion" not in result["compiler_options"], (topology, method)
        assert "E0000" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


def test_the_oldest_libtpu_carries_state_across_chip_families(oldest, tmp_path):
    # Why aotcheck compiles each chip family in its own process (tests/unit/gate/test_isolation.py has the
    # locked libtpu, where this program no longer shows it).
    from quirks import quirk_counts

    counts = quirk_counts(oldest, tmp_path)
    assert counts["fresh"] != counts["after-v5e"], counts


# libtpu 0.0.51 is published and installs beside jax 0.12.0.1, outside jax's `[tpu]` pin (0.0.50.*):
# users who upgrade it get programs the committed goldens were not made with.
NEXT_LIBTPU = "0.0.51"


@pytest.fixture(scope="module")
def next_libtpu(tmp_path_factory) -> str:
    py = make_env("3.12", "requirements.lock", tmp_path_factory.mktemp("next-libtpu"))
    out = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", f"libtpu=={NEXT_LIBTPU}"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    versions = subprocess.run([py, "-c", "import jax, importlib.metadata as m; print(jax.__version__, m.version('libtpu'))"],
                              capture_output=True, text=True, env=clean_env()).stdout
    assert versions.split() == ["0.12.0.1", NEXT_LIBTPU], versions
    return py


def test_the_next_libtpu_gates_the_reference_configs_and_says_what_moves(next_libtpu, tmp_path):
    """lm-tiny and the reference server against the committed goldens (made with libtpu 0.0.50.1): an
    upgrade, said as such, with what moved; 7x's SparseCore collectives (reached another way by 0.0.51)
    are the same collectives with the same bytes; nothing the ledger has no rule for."""
    report = tmp_path / "report.json"
    out = aotcheck(next_libtpu, "check", "--configs", "lm-tiny,llm", "--topologies", "v4-8,v5e-16,7x-8",
                   "--slices", "1", "--no-cache", f"--report={report}")
    text = out.stdout
    assert "Traceback" not in text + out.stderr, (text[-3000:], out.stderr[-3000:])
    assert "golden file(s) were made with another toolchain" in text, text[-3000:]
    assert f"libtpu {NEXT_LIBTPU}" in text and "To accept the new toolchain's figures" in text, text[-3000:]
    cases = {c["case"]: c for c in json.loads(report.read_text())["cases"]}
    assert not [c for c, r in cases.items() if r["verdict"] in ("crashed", "error", "compile-error")], \
        {c: r["verdict"] for c, r in cases.items()}
    for case, result in cases.items():
        details = (result.get("measured") or {}).get("details") or {}
        assert not [u for u in details.get("uncounted", []) if u["kind"] == "op"], (case, details["uncounted"])
    for case in ("lm-tiny/prefill@7x-8x1", "lm-tiny/train_step@7x-8x1"):
        golden = json.loads((ROOT / "golden" / f"{case}.json").read_text())
        now = cases[case]["measured"]["figures"]
        comm = {k: v for k, v in golden["figures"].items() if k.startswith("comm_")}
        assert comm and {k: now.get(k) for k in comm} == comm, case
        engines = {c.get("engine") for c in cases[case]["measured"]["details"]["collectives"]}
        assert "sparsecore" in engines or case.endswith("prefill@7x-8x1"), (case, engines)
