"""Ship what you gated (issue 53): a case that passes its gate writes its executable and a manifest; a fresh
process loads it instead of compiling, and equals a fresh JIT bit for bit; a manifest that does not match
the process is refused, naming the field. Real CLI runs, real compiles, real loads in fresh processes
(aotcheck.shipping's commands, aotcheck.gate.ship's rule: only a passing case ships)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aotcheck import _runtime


ROOT = Path(__file__).resolve().parents[2]


def aotcheck(*args, **kw):
    return subprocess.run([sys.executable, "-m", "aotcheck", *args], cwd=ROOT, capture_output=True, text=True, **kw)


@pytest.mark.heavy  # A real export and a load in a fresh process (25 to 65 s).
def test_an_exported_train_step_loads_in_a_fresh_process_equals_jit_and_a_changed_manifest_is_refused(tmp_path):
    out, golden = tmp_path / "export", tmp_path / "golden"
    made = aotcheck("export", "lm-tiny", "--topology", "cpu-8", "--program", "train_step", f"--out={out}",
                    f"--golden-dir={golden}", "--update-golden")
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    manifest_path = out / "lm-tiny" / "train_step@cpu-8x1.manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["toolchain"]["jax"] == _runtime.toolchain()["jax"] and manifest["devices"] == list(range(8))
    assert manifest["mesh"] == {"data": 4, "model": 2} and any(a["donated"] for a in manifest["inputs"])
    assert manifest["golden_digest"] and manifest["figures"]["peak_bytes"] > 0
    assert manifest["payload_bytes"] == (out / "lm-tiny" / "train_step@cpu-8x1.executable").stat().st_size

    loaded = aotcheck("load", str(out), "--check", f"--report={tmp_path / 'load.json'}")  # A fresh process.
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr[-2000:]
    [check] = json.loads((tmp_path / "load.json").read_text())["checks"]
    assert check["equal"] and 0 < check["load_seconds"] < check["compile_seconds"], check
    assert "lm-tiny/train_step@cpu-8x1: loaded in " in loaded.stdout
    assert "its outputs equal a fresh JIT's bit for bit" in loaded.stdout and "W1207" not in loaded.stderr

    manifest_path.write_text(json.dumps({**manifest, "toolchain": {**manifest["toolchain"], "jax": "0.0.1"}}))
    refused = aotcheck("load", str(out), "--check")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (f"lm-tiny/train_step@cpu-8x1: refused, not loaded: jax: exported with '0.0.1', this process has "
            f"'{_runtime.toolchain()['jax']}'") in refused.stdout

    # A case that fails its gate (here: no golden) exports nothing.
    failed = aotcheck("export", "lm-tiny", "--topology", "cpu-8", "--program", "prefill", f"--out={out}",
                      f"--golden-dir={golden}")
    assert failed.returncode == 1 and "missing-golden" in failed.stdout
    assert not list((out / "lm-tiny").glob("prefill*"))


LOAD_IN_ORDER = """
import json, sys, time
import jax
jax.config.update("jax_num_cpu_devices", 8)
import jax.monitoring
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)
import aotcheck
from aotcheck.gate.boot import load_order
from aotcheck.programs.names import program_id
dest, ids = sys.argv[1], json.loads(sys.argv[2])
seconds = {}
cases = [aotcheck.Case.parse(i) for i in ids]
for case in (program_id(*key) for key in load_order([(c.program, c.bucket) for c in cases], ["step", "sample"])):
    start = time.perf_counter()
    aotcheck.load(dest, f"llm/{case}@cpu-8x1")
    seconds[case] = time.perf_counter() - start
print(json.dumps({"compiles": len(compiles), "seconds": seconds}))
"""


@pytest.mark.heavy  # A real export and a load in a fresh process (25 to 65 s).
def test_a_servers_buckets_export_and_load_in_its_load_order_with_no_compile(tmp_path):
    out = tmp_path / "export"
    made = aotcheck("export", "llm", "--topology", "cpu-8", f"--out={out}", f"--golden-dir={tmp_path / 'golden'}",
                    "--update-golden")
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    ids = sorted(m["case"] for m in (json.loads(p.read_text()) for p in out.rglob("*.manifest.json")))
    assert len(ids) == 9
    ran = subprocess.run([sys.executable, "-c", LOAD_IN_ORDER, str(out), json.dumps(ids)], cwd=ROOT,
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found["compiles"] == 0 and len(found["seconds"]) == 9, found
    assert list(found["seconds"])[:3] == ["step[tokens=16]", "step[tokens=32]", "step[tokens=64]"]


@pytest.mark.heavy  # A real export and a load in a fresh process (25 to 65 s).
def test_a_tpu_export_names_libtpu_and_the_chip_and_is_refused_on_a_host_without_one(tmp_path):
    out = tmp_path / "export"
    made = aotcheck("export", "lm-tiny", "--topology", "v5e-1", "--program", "prefill", f"--out={out}",
                    f"--golden-dir={tmp_path / 'golden'}", "--update-golden")
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    manifest = json.loads((out / "lm-tiny" / "prefill@v5e-1x1.manifest.json").read_text())
    assert manifest["toolchain"]["libtpu"] == _runtime.toolchain()["libtpu"]
    assert (manifest["platform"], manifest["topology"], manifest["device_kind"]) == ("tpu", "v5e-1", "TPU v5 lite")
    refused = aotcheck("load", str(out), "--check")
    assert refused.returncode == 2 and "platform: exported with 'tpu', this process has 'cpu'" in refused.stdout


def test_pytest_exports_what_passed_and_not_what_failed(project):
    """The plugin's --aot-export: the same session as the CLI's; a case that passes ships, naming its
    golden's sha256; after an edit that fails the gate, nothing more ships."""
    import hashlib

    from toy import golden, run

    result = run(project, "--aot-topologies=cpu-4", "--update-golden", "--aot-export=out", "--aot-report=r.json")
    result.assert_outcomes(passed=2)  # The toy's own test and its one case.
    manifest = json.loads((project.path / "out" / "toy" / "step@cpu-4x1.manifest.json").read_text())
    made = golden(project, "toy/step@cpu-4x1.json")
    assert manifest["golden_digest"] == hashlib.sha256(made.read_bytes()).hexdigest()
    assert manifest["topology"] == "cpu-4" and manifest["inputs"][0]["shape"] == [32, 256]
    result.stdout.fnmatch_lines(["aotcheck: exported 1 passing case(s), * of executables, each beside its manifest "
                                 f"(first: {project.path / 'out' / 'toy' / 'step@cpu-4x1.manifest.json'}); *"])
    [case] = [c for c in json.loads((project.path / "r.json").read_text())["cases"]]
    assert case["shipped"]["payload_bytes"] == json.loads(
        (project.path / "out" / "toy" / "step@cpu-4x1.manifest.json").read_text())["payload_bytes"]
    doc = json.loads(made.read_text())
    made.write_text(json.dumps({**doc, "figures": {**doc["figures"], "peak_bytes": 1}}))  # Now it regresses.
    (project.path / "out" / "toy" / "step@cpu-4x1.manifest.json").unlink()
    failed = run(project, "--aot-topologies=cpu-4", "--aot-export=out")
    failed.assert_outcomes(passed=1, failed=1)
    assert not (project.path / "out" / "toy" / "step@cpu-4x1.manifest.json").exists()
