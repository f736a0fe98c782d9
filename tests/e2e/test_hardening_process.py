"""Issue 31, hardening round 3: what the processes around a run do to it.

- a presets cache file (which presets libtpu refuses) is checked before it is trusted, named in
  every message it causes, and probed again when libtpu contradicts it;
- an accept command repeats every setting that changed the program (presets off, a CLI module);
- a config registered by a script (``python script.py``) from a helper module's builder is found
  by the compile workers;
- a TPU flag (or one XLA does not know) in ``XLA_FLAGS`` is named, never a crash;
- SIGHUP ends a run as SIGTERM does;
- ``JAX_PLATFORMS=cuda`` on a host without CUDA keeps the plugin's tracebacks off the terminal;
- a builder that returns another program on each call is an error on the case;
- a config module's prints stay off ``compile --json``'s stdout;
- a memory cap (``ulimit -v``) that stops libtpu mapping is the host's limit, not "reinstall libtpu".

REAL: the faults of a process are shown with real processes (``python -m aotcheck``, pytest, a user's
script), each compiling a tiny program on v4-8; the presets file's and the accept command's are shown
in this process (the presets ones compile a tiny program here, as a probe does).
"""

import dataclasses
import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.gate.worker import WorkerRequest, measure_request
from aotcheck.pipeline.cache import CacheSpec
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.targets import presets as options  # The chip's preset policy (targets/presets.py).
from aotcheck.session import GateSession
from aotcheck.settings import GateSettings
from aotcheck.render.accept import accept_case_command
from aotcheck.render.text import outcome_message
from toy import CONFTEST, golden

# --- helpers --------------------------------------------------------------------------------------------

TOY = '''
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

def make_args(mesh, width=128):
    return (jax.ShapeDtypeStruct((mesh.devices.size * 8, width), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)
'''

COMMON = TOY + '''
import aotcheck

def cfg():  # A helper that returns a built config (it registers nothing itself).
    return aotcheck.FunctionConfig(fn=lambda x: jnp.tanh(x), make_args=make_args)
'''

SCRIPT = '''
import sys
import aotcheck
import common

aotcheck.register("toy-helper", common.cfg())

if __name__ == "__main__":
    from aotcheck.cli import main
    sys.exit(main(["check", "--topologies", "v4-8", "--slices", "1", "--no-cache"]))
'''


def make_project(tmp_path, **files):
    """A directory with a pytest.ini (so it is its own rootdir) and the given files."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def child_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTEST_ADDOPTS")}
    env.update(extra)
    return env


def cli(cwd, *args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "aotcheck", *args], cwd=cwd, capture_output=True, text=True,
                          env=env or child_env(), timeout=timeout)


def no_traceback(text):
    assert "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]


@pytest.fixture
def unlisted_libtpu(monkeypatch):
    """The running libtpu as one aotcheck's table does not list: which presets it refuses is probed, and
    the answer remembered in a presets file. This process's books of probes start empty."""
    monkeypatch.setattr(options, "KNOWN_REFUSALS", {})
    monkeypatch.setattr(options, "_probed", {})
    monkeypatch.setattr(options, "_files", {})
    monkeypatch.setattr(options, "_notes", [])


# --- 1. The presets cache: checked before it is trusted, probed again when libtpu contradicts it ---------

def test_a_presets_file_is_checked_before_it_is_trusted_and_named_when_it_is_not(tmp_path, unlisted_libtpu):
    probed = options.refused_presets("v4-8", 1, store=tmp_path)  # A probe, remembered in its file.
    path = options.presets_file(tmp_path, "v4-8", 1)
    assert probed.how == "probe" and path.is_file()
    assert options.read_presets_file(path, "v4-8") == (probed.names, None)
    options._probed.clear()  # A file saves the probe when it refuses nothing; a refusal is probed again.
    assert options.refused_presets("v4-8", 1, store=tmp_path) == (probed.names, "probe" if probed.names else "remembered")

    # Edited to refuse nothing (or to refuse good presets): its check no longer matches; probed again.
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "refused": []}))
    options._probed.clear()
    again = options.refused_presets("v4-8", 1, store=tmp_path)
    assert again.how == "probe" and again.names == probed.names
    assert (f"aotcheck: the presets cache file {path} was not used: it was changed since aotcheck wrote it (its check "
            "does not match). libtpu was probed again and the file rewritten.") in options.probe_notes()
    assert options.read_presets_file(path, "v4-8") == (probed.names, None)  # Rewritten whole.

    # Read and checked field by field: the schema, the types, option names aotcheck knows.
    for document, why in [
        ({"refused": []}, "it holds refused, not the fields aotcheck writes (check, family, libtpu, multi_slice, "
                          "presets, refused)"),
        ({**doc, "refused": "all"}, "its 'refused' is 'all', not a list of option names"),
        ({**doc, "refused": ["xla_no_such_option"]}, "it names xla_no_such_option, which is no preset of aotcheck's for v4"),
        ({**doc, "family": "v5e"}, "its family is 'v5e', not this run's 'v4'"),
    ]:
        path.write_text(json.dumps(document))
        assert options.read_presets_file(path, "v4-8") == (None, why)
    path.write_text("{oops")
    assert options.read_presets_file(path, "v4-8")[1].startswith("it is not JSON (")


REGISTRY = aotcheck.Registry()  # Found by measure_request as the compile workers find a Registry of one's own.
REGISTRY.register("hp-toy", aotcheck.FunctionConfig(
    fn=lambda x: jnp.tanh(x), make_args=lambda mesh: (jax.ShapeDtypeStruct(
        (mesh.devices.size * 8, 128), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)))


def test_a_stale_presets_file_is_probed_again_when_libtpu_refuses_what_it_said_was_accepted(tmp_path, unlisted_libtpu):
    refused = options.probe_refused_presets("v4-8", 1)
    if not refused:
        pytest.skip("this libtpu refuses none of aotcheck's presets on v4: no stale file can fail a compile")
    # A file as aotcheck writes it (its check matches), saying libtpu accepts every preset: stale.
    path = options.presets_file(tmp_path / "cache", "v4-8", 1)
    options._write_presets_file(path, options.parse_topology("v4-8"), 1, ())
    assert options.read_presets_file(path, "v4-8") == (frozenset(), None)
    request = WorkerRequest(case=Case.parse("hp-toy/step@v4-8x1"), registry=(__name__, "REGISTRY"),
                            cache=CacheSpec(tmp_path / "cache"), presets=True)
    measured = measure_request(request)  # Without the re-probe: a compile error naming an option aotcheck sent.
    assert not refused & set(measured.compiler_options)
    assert options.read_presets_file(path, "v4-8") == (refused, None)  # Rewritten with the probe's answer.
    note = next(n for n in options.probe_notes() if "was stale or edited" in n)
    assert note.startswith(f"aotcheck: the presets cache file {path} said libtpu ")
    assert note.endswith("It is rewritten, and the case compiled again without them.")


def test_a_presets_file_that_refuses_presets_is_probed_again_before_it_is_trusted(tmp_path, unlisted_libtpu):
    """U75 (hardening round 5): a presets file edited with its check recomputed, saying libtpu refuses every
    preset, would drop them all from the compile, an answer no compile contradicts. A refusal read from a
    file is confirmed by a probe (a check run and an update run alike), and the file rewritten, named."""
    path = options.presets_file(tmp_path / "cache", "v4-8", 1)
    every = options.preset_options("v4-8", 1)
    options._write_presets_file(path, options.parse_topology("v4-8"), 1, every)  # "libtpu refuses them all"
    request = WorkerRequest(case=Case.parse("hp-toy/step@v4-8x1"), registry=(__name__, "REGISTRY"),
                            cache=CacheSpec(tmp_path / "cache"), presets=True)
    checked = measure_request(request)
    probed = options.probe_refused_presets("v4-8", 1)
    assert set(every) - probed, "this libtpu refuses every preset: nothing tells the file from a probe"
    assert {k for k in every if k not in probed} <= set(checked.compiler_options)  # The probe answered.
    assert options.read_presets_file(path, "v4-8") == (probed, None)  # Rewritten with the probe's answer.
    note = next(n for n in options.probe_notes() if "was stale or edited" in n)
    assert note.startswith(f"aotcheck: the presets cache file {path} said libtpu refuses ")
    options._probed.clear()
    updated = measure_request(dataclasses.replace(request, cache=CacheSpec(tmp_path / "cache", read=False)))
    assert updated.compiler_options == checked.compiler_options


# --- 2. The accept command repeats every setting that changed the program -------------------------------

def fake_measure(case):
    """FAKE: the same figures for any case."""
    return Measurement(case, {"peak_bytes": 2**20, "argument_bytes": 2**10}, {}, 1.0)


def test_the_accept_command_repeats_the_settings_pytest_has_no_option_for(tmp_path):
    case = Case.of("toy", "step", "v4-8")
    cli_settings = GateSettings.parse(rootdir=tmp_path, topologies=["v4-8"], default_options="none",
                                      config_modules=["script.py"], fit="batch", hbm_headroom="0.9",
                                      libtpu_init_args="--xla_x=1", libtpu_init_args_option="--xla_x=1",
                                      front_end="cli")
    gate = GateSession(cli_settings, measure=fake_measure)
    assert accept_case_command(gate.accept(case)) == (
        "pytest --update-golden --aot-case=toy/step@v4-8x1 --aot-libtpu-init-args=--xla_x=1 "
        "--aot-fit=batch -o aot_default_options=none -o aot_hbm_headroom=0.9 -o aot_config_modules=script.py")
    assert "To create it: " + accept_case_command(gate.accept(case)) in outcome_message(gate.check(case))
    # Under pytest the ini's modules are read again by the accept run; presets off is still said.
    pytest_settings = GateSettings.parse(rootdir=tmp_path, topologies=["v4-8"], default_options="none",
                                         config_modules=["script.py"], front_end="pytest")
    assert accept_case_command(GateSession(pytest_settings, measure=fake_measure).accept(case)) == (
        "pytest --update-golden --aot-case=toy/step@v4-8x1 -o aot_default_options=none")


@pytest.mark.heavy
def test_accepting_a_run_without_presets_writes_the_figures_that_run_measured(tmp_path):
    project = make_project(tmp_path, **{"cfg.py": COMMON + '\naotcheck.register("toy", cfg())\n'})
    first = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8", "--default-options", "none")
    assert first.returncode == 1 and "toy/step@v4-8x1: missing-golden" in first.stdout, first.stdout + first.stderr
    command = next(line for line in first.stdout.splitlines() if line.startswith("To create it: "))
    args = shlex.split(command.removeprefix("To create it: "))
    assert args[0] == "pytest" and "aot_default_options=none" in args
    accept = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args[1:]], cwd=project,
                            capture_output=True, text=True, env=child_env(), timeout=300)
    assert accept.returncode == 0, accept.stdout[-3000:] + accept.stderr[-3000:]
    written = json.loads((project / "golden" / "toy" / "step@v4-8x1.json").read_text())
    assert written["compiler_options"] == {}  # Without presets, as the run that printed the command compiled.
    again = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8", "--default-options", "none")
    assert again.returncode == 0 and "toy/step@v4-8x1: pass" in again.stdout, again.stdout[-3000:]


# --- 3. A script registering a config built by a helper module ------------------------------------------

@pytest.mark.heavy
def test_a_config_a_script_registers_from_a_helper_module_is_found_by_the_workers(tmp_path):
    project = make_project(tmp_path, **{"common.py": COMMON, "script.py": SCRIPT})
    for command in ([sys.executable, "script.py"],
                    [sys.executable, "-m", "aotcheck", "check", "--module", "script.py", "--topologies", "v4-8",
                     "--slices", "1", "--no-cache"]):
        out = subprocess.run(command, cwd=project, capture_output=True, text=True, env=child_env(), timeout=300)
        assert "No config named" not in out.stdout, out.stdout[-3000:]
        assert out.returncode == 1 and "toy-helper/step@v4-8x1: missing-golden" in out.stdout, out.stdout[-3000:]
        no_traceback(out.stdout + out.stderr)
    # Registered from code no process can import again: the error says exactly why.
    inline = SCRIPT.replace('if __name__ == "__main__":', "if True:")
    out = subprocess.run([sys.executable, "-c", inline], cwd=project, capture_output=True, text=True,
                         env=child_env(), timeout=300)
    assert ("toy-helper/step@v4-8x1: No config named 'toy-helper'; registered: none. The compile process imported "
            "what registers configs in the session") in out.stdout, out.stdout[-3000:]
    assert ("This session's main program has no file (an interactive session, a notebook or `python -c`), so configs "
            "registered there cannot be registered again in a compile process") in out.stdout


# --- 4. XLA_FLAGS: a TPU flag, or one XLA does not know, is named --------------------------------------

@pytest.mark.heavy
def test_a_tpu_flag_in_xla_flags_is_named_with_where_it_belongs(tmp_path):
    project = make_project(tmp_path, **{"cfg.py": COMMON + '\naotcheck.register("toy", cfg())\n'})
    start = time.monotonic()
    out = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8,h100-8", "--no-cache",
              env=child_env(XLA_FLAGS="--xla_tpu_scoped_vmem_limit_kib=65536"))
    assert time.monotonic() - start < 60  # The first compile process dies of it; no other is started.
    message = ("XLA_FLAGS holds --xla_tpu_scoped_vmem_limit_kib=65536, a TPU compiler flag: XLA reads XLA_FLAGS in "
               "every compile process (jax's CPU backend, the CUDA plugin), does not know it there, and aborted "
               "the process, for TPU and GPU targets alike. libtpu takes TPU flags from LIBTPU_INIT_ARGS: give it "
               "to aotcheck in aot_libtpu_init_args")
    for case in ("toy/step@v4-8x1", "toy/step@h100-8x1"):
        assert f"{case}: error FAILED" in out.stdout and f"{case}: {message}" in out.stdout, out.stdout[-3000:]
    assert "crashed" not in out.stdout and "newer libtpu" not in out.stdout
    unknown = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8", "--no-cache",
                  env=child_env(XLA_FLAGS="--xla_no_such_flag=1"))
    assert ("toy/step@v4-8x1: XLA_FLAGS holds --xla_no_such_flag=1, which XLA does not know: the compile process "
            "aborted on it before compiling anything") in unknown.stdout, unknown.stdout[-3000:]
    assert "crashed" not in unknown.stdout
    # A TPU flag XLA itself knows (a job's NaN check) is no fault: the case compiles.
    known = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8", "--no-cache",
                env=child_env(XLA_FLAGS="--xla_tpu_detect_nan=true"))
    assert "toy/step@v4-8x1: missing-golden" in known.stdout and "XLA_FLAGS holds" not in known.stdout, known.stdout
    no_traceback(out.stdout + out.stderr + unknown.stdout + unknown.stderr)


def test_xla_flags_that_are_no_flags_and_the_environments_libtpu_init_args_are_named(tmp_path):
    """Hardening round 4: XLA_FLAGS="hello world" was told "a newer jax may fix it"; LIBTPU_INIT_ARGS
    reached the compile processes unannounced (junk there crashed every case, "a newer libtpu may fix
    it"), and figures made under it were cached and written into goldens that did not record it."""
    project = make_project(tmp_path, **{"cfg.py": COMMON + '\naotcheck.register("toy", cfg())\n'})
    words = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8", "--no-cache",
                env=child_env(XLA_FLAGS="hello world"))
    assert ("toy/step@v4-8x1: XLA_FLAGS is 'hello world': XLA reads a value that does not start with '--' as the "
            "name of a file of flags") in words.stdout, words.stdout[-3000:]
    assert "crashed" not in words.stdout and "may fix it" not in words.stdout
    junk = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8", "--no-cache",
               env=child_env(LIBTPU_INIT_ARGS="junk --xla_tpu_scoped_vmem_limit_kib=1024"))
    assert junk.returncode == 2 and junk.stderr.startswith(
        "aotcheck: error: LIBTPU_INIT_ARGS (in the environment): 'junk' is not a flag"), junk.stderr
    flags = "--xla_tpu_scoped_vmem_limit_kib=65536"
    used = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8", "--no-cache", "--update-golden",
               env=child_env(LIBTPU_INIT_ARGS=flags))
    assert (f"aotcheck: your launch flags: {flags} (from the environment's LIBTPU_INIT_ARGS: sent as compiler "
            "options, recorded in each golden; no compile process inherits the variable)") in used.stdout, used.stdout
    golden = json.loads((project / "golden" / "toy" / "step@v4-8x1.json").read_text())
    assert golden["compiler_options"]["xla_tpu_scoped_vmem_limit_kib"] == "65536"
    # A scoped VMEM limit of 1 MiB aborts libtpu when it reads the variable; as an option named by the setting
    # over it, it is never read (the compile process does not inherit the variable).
    ignored = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8", "--no-cache", f"--libtpu-init-args={flags}",
                  env=child_env(LIBTPU_INIT_ARGS="--xla_tpu_scoped_vmem_limit_kib=1024"))
    assert ("aotcheck: the environment's LIBTPU_INIT_ARGS (--xla_tpu_scoped_vmem_limit_kib=1024) is not used: "
            "--libtpu-init-args (or aot_libtpu_init_args) gives this run's launch flags") in ignored.stdout
    assert ignored.returncode == 0 and "toy/step@v4-8x1: pass" in ignored.stdout, ignored.stdout[-3000:]


# --- 5. SIGHUP (a closed terminal or ssh session) ends a run as SIGTERM does ------------------------------

SLOW = '''
import time

def slow(x, w):  # Traced in the compile worker: a case that is still running when the signal comes.
    time.sleep(120)
    return x

aotcheck.register("zslow", aotcheck.FunctionConfig(fn=slow, make_args=make_args))
'''


@pytest.fixture
def hangups_not_ignored():
    """SIGHUP at its default in this process, so the runs started here do not inherit it ignored: loading
    libtpu ignores SIGHUP in its process (this one, after an in-process compile), and a run started from
    a process that ignores it (as under nohup) rightly keeps ignoring it."""
    def ignored():
        with open("/proc/self/status") as f:
            mask = next(line.split()[1] for line in f if line.startswith("SigIgn:"))
        return bool(int(mask, 16) & (1 << (signal.SIGHUP - 1)))

    was_ignored = ignored()
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, signal.SIG_IGN if was_ignored else signal.SIG_DFL)


@pytest.mark.heavy
@pytest.mark.parametrize("front,group,status", [("cli", False, 129), ("pytest", True, pytest.ExitCode.INTERRUPTED)])
def test_sighup_ends_a_run_with_its_summary_and_report(project, hangups_not_ignored, front, group, status):
    project.makeconftest(CONFTEST + SLOW)
    report = project.path / "r.json"
    if front == "cli":
        command = [sys.executable, "-m", "aotcheck", "check", "--topologies=v4-8", "--update-golden", f"--report={report}"]
    else:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--aot-topologies=v4-8", "--update-golden",
                   f"--aot-report={report}"]
    proc = subprocess.Popen(command, cwd=project.path, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not golden(project).exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert golden(project).exists(), proc.communicate()[0][-3000:]
    time.sleep(2)  # zslow is tracing now.
    (os.killpg if group else os.kill)(proc.pid, signal.SIGHUP)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == status, out[-3000:]
    assert ("aotcheck: interrupted (SIGHUP) after 1 of 2 cases: the finished ones are reported and their goldens "
            "written; the rest did not run, and no stale golden was removed.") in out, out[-3000:]
    assert "toy/step@v4-8x1" in out and "created" in out  # The summary, with the finished case.
    assert [c["case"] for c in json.loads(report.read_text())["cases"]] == ["toy/step@v4-8x1"]
    no_traceback(out)


# --- 6. JAX_PLATFORMS=cuda on a host without CUDA ---------------------------------------------------------

@pytest.mark.heavy
@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="a host with an NVIDIA GPU has CUDA to start")
def test_a_cuda_jax_platforms_on_a_cpu_host_keeps_the_plugins_tracebacks_off_the_terminal(tmp_path):
    project = make_project(tmp_path, **{"cfg.py": COMMON + '\naotcheck.register("toy", cfg())\n'})
    out = cli(project, "check", "--module", "cfg.py", "--topologies", "v4-8", "--no-cache",
              env=child_env(JAX_PLATFORMS="cuda"))
    assert "toy/step@v4-8x1: missing-golden" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert "cuDNN" not in out.stderr and "Jax plugin configuration error" not in out.stderr, out.stderr[-3000:]
    no_traceback(out.stdout + out.stderr)


# --- 7. A builder that returns another program on each call ---------------------------------------------

COUNTER = TOY + '''
import itertools, tempfile
import aotcheck

CALLS, SCRATCH = itertools.count(1), itertools.count(1)

@aotcheck.register("toy-counter")
def counter():  # Another width on every call: a program the plan never saw.
    width = 128 * next(CALLS)
    return aotcheck.FunctionConfig(fn=lambda x: jnp.tanh(x), make_args=lambda mesh: make_args(mesh, width))

@aotcheck.register("toy-scratch")
def scratch():  # Another scratch path on every call, which the program never reads: the same program.
    where = tempfile.gettempdir() + f"/scratch-{next(SCRATCH)}"
    return aotcheck.FunctionConfig(fn=lambda x: jnp.tanh(x) if where else x, make_args=make_args)
'''


@pytest.mark.heavy
def test_a_builder_that_returns_another_program_on_each_call_is_an_error_on_its_case(tmp_path):
    project = make_project(tmp_path, **{"counter.py": COUNTER})
    out = cli(project, "check", "--module", "counter.py", "--topologies", "v4-8", "--no-cache")
    assert ("toy-counter/step@v4-8x1: Config 'toy-counter' builds a different program on each call: its step for "
            "v4-8x1, lowered from three builds in one compile process, gave 3 different programs") in out.stdout, \
        out.stdout[-3000:]
    assert "and a second build in the session differed at [0].make_args.<width>: 128 vs 256." in out.stdout
    assert "Make the builder return the same config on every call" in out.stdout
    assert "toy-scratch/step@v4-8x1: missing-golden" in out.stdout  # Builds that differ where the program does not.
    no_traceback(out.stdout + out.stderr)


# --- 8. compile --json: stdout is the JSON ---------------------------------------------------------------

NOISY = COMMON + '''
print("noisy: imported")

@aotcheck.register("noisy")
def noisy():
    print("noisy: building")
    return cfg()
'''


@pytest.mark.heavy
def test_compile_json_keeps_a_config_modules_prints_off_stdout(tmp_path):
    project = make_project(tmp_path, **{"noisy.py": NOISY})
    out = cli(project, "compile", "noisy", "--topology", "v4-8", "--json", "--module", "noisy.py")
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout)  # Without the redirect: "noisy: imported" first, and no JSON.
    assert figures["step"]["case"] == "noisy/step@v4-8x1"
    assert "noisy: imported" in out.stderr and "noisy: building" in out.stderr


# --- 9. A memory cap that stops libtpu mapping its library --------------------------------------------

@pytest.mark.heavy
def test_a_memory_cap_that_stops_libtpu_loading_is_said_as_the_hosts_limit(tmp_path):
    project = make_project(tmp_path, **{"cfg.py": COMMON + '\naotcheck.register("toy", cfg())\n'})
    # About 1 GB of address space: enough for the session (jax imported), too little to map libtpu (0.6 GB).
    command = (f"ulimit -v 1000000 && exec {shlex.quote(sys.executable)} -m aotcheck check --module cfg.py "
               "--topologies v4-8 --no-cache")
    out = subprocess.run(["sh", "-c", command], cwd=project, capture_output=True, text=True, env=child_env(),
                         timeout=300)
    assert "toy/step@v4-8x1: " in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    message = out.stdout.split("toy/step@v4-8x1 FAILED:", 1)[-1]
    assert "the host's memory limit, not libtpu's install nor your config: this run's address space is capped at " \
           "0.95 GiB (ulimit -v 1000000, RLIMIT_AS)" in message, message[-3000:]
    assert "raise or lift the limit for this run (ulimit -v unlimited)" in message
    assert "reinstall" not in message and "newer libtpu" not in message
