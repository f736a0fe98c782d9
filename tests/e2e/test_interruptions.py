"""Interruptions (aotcheck.interruption): Ctrl-C and SIGTERM (CI's cancel and timeout) end a run cleanly, keep what it finished
and stop its compile workers; a worker whose run was killed outright stops at once. Real processes.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from toy import CONFTEST, golden


SLOW = '''
import time

def slow(x, w):  # Traced in the compile worker: a case that is still running when the signal comes.
    time.sleep(120)
    return x

aotcheck.register("zslow", aotcheck.FunctionConfig(fn=slow, make_args=make_args))
'''

HELD = '''
def held(x, w):  # Holds the GIL for seconds at a time, as a long C call in a trace or a compile can.
    for _ in range(100):
        sum(range(10**8))
    return x

aotcheck.register("zheld", aotcheck.FunctionConfig(fn=held, make_args=make_args))
'''


def _processes_with(marker):
    """Pids of live processes whose environment holds the variable ``AOTCHECK_TEST_RUN=<marker>`` exactly (a
    run's compile workers among them): a whole entry, so that the marker of one run is never a prefix
    matching another's running beside it (``...-pytest`` and ``...-pytest -n 2``)."""
    found = []
    entry_bytes = b"\0AOTCHECK_TEST_RUN=" + marker.encode() + b"\0"
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry_bytes in b"\0" + (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _state(pid):
    """A process's command line, state, kernel wait channel (what a stuck run waits on), and its signal
    masks (blocked, ignored, pending: a SIGINT that never arrives shows there)."""
    try:
        proc = Path(f"/proc/{pid}")
        stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        masks = [line for line in (proc / "status").read_text().splitlines() if line.startswith(("SigBlk", "SigIgn", "SigPnd", "ShdPnd"))]
        return ((proc / "cmdline").read_bytes().replace(b"\0", b" ")[-120:].decode(), stat, (proc / "wchan").read_text(), masks)
    except OSError as e:
        return str(e)



INTERRUPTIONS = [
    # (front end, signal, to the whole process group?, exit status)
    ("pytest", signal.SIGTERM, True, pytest.ExitCode.INTERRUPTED),
    ("pytest -n 2", signal.SIGINT, True, pytest.ExitCode.INTERRUPTED),
    ("pytest -n 2", signal.SIGTERM, True, pytest.ExitCode.INTERRUPTED),  # A CI runner's cancel.
    ("cli", signal.SIGINT, True, 130),
    ("cli", signal.SIGTERM, False, 143),
]
# In the heavy leg (real runs of 5-14 s each; the default run keeps one per front end). The CLI's SIGINT to
# the group did not end within 60 s in the full default run three times of three on 2026-12-06 (early), and
# passed in two full runs after the tests were split: if it stops again, the failure shows each process's
# state and Python stacks.
HEAVY_INTERRUPTIONS = {("pytest -n 2", signal.SIGINT), ("pytest -n 2", signal.SIGTERM), ("cli", signal.SIGINT)}


@pytest.mark.parametrize("front,sig,group,status", [
    pytest.param(*row, id=f"{row[0]}-{row[1].name}-{'group' if row[2] else 'process'}",
                 marks=[pytest.mark.heavy] if row[:2] in HEAVY_INTERRUPTIONS else [])
    for row in INTERRUPTIONS])
def test_an_interrupted_run_keeps_what_it_finished_and_stops_its_workers(project, front, sig, group, status):
    project.makeconftest(CONFTEST + SLOW)
    tmp = project.path / "tmp"
    tmp.mkdir()
    leftover = tmp / "aotcheck-dump-999999999-left"  # A kill -9 trial's leftover: no such process.
    leftover.mkdir()
    marker = f"{project.path}-{front}"  # The full path: xdist's workers give their tests the same names.
    env = dict(os.environ, TMPDIR=str(tmp), AOTCHECK_TEST_RUN=marker, PYTHONFAULTHANDLER="1")
    report = project.path / "r.json"
    store = project.path / "store"  # Runners' shared store (hardening round 5: kills and signals lose nothing there).
    if front == "cli":
        command = [sys.executable, "-m", "aotcheck", "check", "--topologies=v4-8", "--update-golden", f"--report={report}",
                   f"--cache-url=file://{store}"]
    else:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--aot-topologies=v4-8", "--update-golden",
                   f"--aot-report={report}", f"--aot-cache-url=file://{store}", *front.split()[1:]]
    # A session of its own, as a terminal or a CI runner starts a job: SIGINT is not ignored there. A suite
    # started in the background (`pytest ... &` in a script) has SIGINT ignored, every child inherits that
    # and Python keeps it: the run would never see this Ctrl-C. The child restores it, then becomes the run.
    command = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
               "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])", *command[1:]]
    proc = subprocess.Popen(command, cwd=project.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not golden(project).exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert golden(project).exists(), proc.communicate()[0][-3000:]
    time.sleep(2)  # zslow is tracing now.
    (os.killpg if group else os.kill)(proc.pid, sig)
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # Where each process of the run is stuck (PYTHONFAULTHANDLER: stacks).
        states = {pid: _state(pid) for pid in _processes_with(marker)}
        os.killpg(proc.pid, signal.SIGABRT)
        pytest.fail(f"the run did not end within 60 s of {sig.name}: {states}\n{proc.communicate()[0][-8000:]}")
    took = time.monotonic() - start
    assert took < 15, (took, out[-3000:])
    assert proc.returncode == status, out[-3000:]
    assert f"aotcheck: interrupted ({sig.name}) after 1 of 2 cases: the finished ones are reported and their goldens " \
           "written; the rest did not run, and no stale golden was removed." in out, out[-3000:]
    assert "toy/step@v4-8x1" in out and "created" in out  # The summary, with the finished case.
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    cases = json.loads(report.read_text())["cases"]
    assert [c["case"] for c in cases] == ["toy/step@v4-8x1"] and golden(project).exists()
    time.sleep(1)
    assert _processes_with(marker) == [], "a compile worker outlived its run"
    assert not list(tmp.glob("aotcheck-dump-*")), list(tmp.iterdir())  # Its own dumps and the leftover removed.
    # The store holds whole, sealed entries only: the finished case's, none half-written.
    from aotcheck.pipeline.cache import seal_problem

    entries = [p for p in store.rglob("*") if p.is_file()]
    assert entries and all(p.suffix == ".json" and seal_problem(json.loads(p.read_text())) is None for p in entries), entries
    # The matrix's finished part re-run against the store from another runner's empty cache: answered by it.
    again = subprocess.run([sys.executable, "-m", "aotcheck", "check", "--topologies=v4-8", "--configs=toy",
                            f"--cache-dir={project.path / 'other-runner'}", f"--cache-url=file://{store}",
                            f"--report={project.path / 'again.json'}"], cwd=project.path, capture_output=True, text=True,
                           env=dict(env, AOTCHECK_TEST_RUN=marker + "-again"))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    [case] = json.loads((project.path / "again.json").read_text())["cases"]
    assert case["verdict"] == "pass" and case["measured"]["cached"], case


def test_a_worker_whose_run_was_killed_stops_at_once(project):
    # kill -9 of the session process alone: nothing can stop its workers but themselves.
    project.makeconftest(CONFTEST + HELD)
    tmp = project.path / "tmp"
    tmp.mkdir()
    marker = f"{project.path}-orphan"
    env = dict(os.environ, TMPDIR=str(tmp), AOTCHECK_TEST_RUN=marker)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--aot-topologies=v4-8",
                             "--aot-configs=zheld"], cwd=project.path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(_processes_with(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(5)  # The worker is tracing zheld, the GIL held by one long C call after another.
    workers = [p for p in _processes_with(marker) if p != proc.pid]
    assert workers, "no compile worker started"
    proc.kill()
    killed = time.monotonic()
    proc.wait()
    # docs/troubleshooting.md: "stops at once". The watchdog thread alone took 1.6 to 8 s (a trace holds the GIL); the kernel's
    # parent-death signal ends it as the session ends.
    while _processes_with(marker) and time.monotonic() < killed + 5:
        time.sleep(0.05)
    assert _processes_with(marker) == [], "the orphaned worker kept running"
    assert time.monotonic() - killed < 1.0, f"the orphaned worker ran {time.monotonic() - killed:.1f} s more"
    # Its dump directories (if it had made any) go with the next run.
    subprocess.run([sys.executable, "-c", "from aotcheck import _runtime; _runtime.remove_dumps()"],
                   env=dict(os.environ, TMPDIR=str(tmp)), check=True, capture_output=True)
    assert not list(tmp.glob("aotcheck-dump-*"))
