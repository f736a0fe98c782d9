"""The host's faults (a full TMPDIR, a libtpu that cannot load, the OOM killer): said as the host's,
never cached, never blamed on the config. Real runs, real processes.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults import no_aotcheck_traceback
from toy import CONFTEST, golden, run


def _in_tiny_tmpdir(command, *, cwd, free_kib):
    """Runs ``command`` with TMPDIR on a tmpfs of its own with ``free_kib`` left, in a user and
    mount namespace (no root needed); None where this host allows neither."""
    tmp = cwd / "tiny-tmp"
    tmp.mkdir()
    script = (f'mount -t tmpfs -o size=4m tmpfs {tmp} && head -c $((4096 - {free_kib}))K /dev/zero > {tmp}/fill '
              f'&& TMPDIR={tmp} exec "$@"')
    for prefix in (["unshare", "-rm"], ["unshare", "-m"]):
        probe = subprocess.run([*prefix, "true"], capture_output=True)
        if probe.returncode == 0:
            return subprocess.run([*prefix, "sh", "-c", script, "sh", *command], cwd=cwd, capture_output=True,
                                  text=True, timeout=600)
    return None


def test_a_full_tmpdir_is_said_as_such_and_nothing_is_cached_or_written(project):
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--aot-topologies=v4-8", "--aot-configs=toy",
               "--update-golden", "--aot-cache-dir=cache"]
    out = _in_tiny_tmpdir(command, cwd=project.path, free_kib=8)
    if out is None:
        pytest.skip("this host can make no tmpfs (no mount namespace): a full TMPDIR cannot be staged")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "toy/step@v4-8x1: the temporary directory" in out.stdout and "(TMPDIR) is out of space" in out.stdout
    assert "nothing was cached or written for this case" in out.stdout and "while building or lowering" not in out.stdout
    no_aotcheck_traceback(out.stdout + out.stderr)
    assert not golden(project).exists() and not list((project.path / "cache").rglob("*.json"))
    result = run(project, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden", "--aot-cache-dir=cache")
    result.assert_outcomes(passed=2)  # With room again: compiled afresh, the peak split.
    assert "cached" not in result.stdout.str().split("aotcheck summary")[1]
    assert json.loads(golden(project).read_text())["figures"]["peak_temp_bytes"] >= 0


def test_a_libtpu_that_cannot_load_is_the_hosts_error_not_the_configs(project, monkeypatch):
    fake = project.path / "broken-libtpu.so"  # Not libtpu.so: Python would import that as a module "libtpu".
    fake.write_text("not a shared library\n")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(fake))
    result = run(project, "--aot-topologies=v4-8", "--aot-configs=toy", "--aot-no-cache")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert (f"toy/step@v4-8x1: libtpu could not be loaded (INTERNAL: Failed to open {fake}: {fake}: file too short); "
            f"this host's libtpu, not the config: TPU_LIBRARY_PATH={fake} points at it") in out, out[-3000:]
    assert "while building or lowering" not in out
    no_aotcheck_traceback(out)


HOG = '''
import numpy as np

def hog(x, w):  # Traced in the compile worker: more host memory than the run's memory limit allows.
    block = np.ones(4 * 2**30 // 8)
    return x * float(block[-1])

aotcheck.register("hog", aotcheck.FunctionConfig(fn=hog, make_args=make_args))
'''


def _memory_cgroup(limit_bytes):
    """A cgroup (v1 or v2) limiting memory to ``limit_bytes``, as a directory to add pids to; None where
    this host allows none (not root, no memory controller)."""
    for root, limit, swap in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
                              ("/sys/fs/cgroup", "memory.max", "memory.swap.max")):
        group = Path(root) / f"aotcheck-test-{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            (group / limit).write_text(str(limit_bytes))
            if (group / swap).exists():
                (group / swap).write_text(str(limit_bytes) if swap.startswith("memory.memsw") else "0")
            return group
        except OSError:
            if group.is_dir():
                group.rmdir()
    return None


@pytest.mark.heavy  # A real run of 15 s or more.
def test_a_worker_the_hosts_oom_killer_ends_is_a_crashed_case_said_as_such(project):
    # A real memory limit on the run (a cgroup, as a CI runner's container has): the kernel's OOM
    # killer picks the largest process, the compile worker, and the session lives to say so.
    project.makeconftest(CONFTEST + HOG)
    group = _memory_cgroup(3 * 2**30)
    if group is None:
        pytest.skip("this host gives no memory cgroup (needs root and a memory controller)")
    try:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--aot-topologies=v4-8", "--aot-no-cache",
                   "--update-golden"]
        # The shell joins the group, then becomes the run (no preexec_fn: a fork of this process, which
        # has JAX's threads, is what JAX warns about).
        out = subprocess.run(["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh", *command],
                             cwd=project.path, capture_output=True, text=True, timeout=300)
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert ("hog/step@v4-8x1 crashed: the v4 compile process died with SIGKILL (signal 9) while compiling "
            "hog/step@v4-8x1 (SIGKILL: most likely the host's OOM killer or a memory limit") in out.stdout, out.stdout[-3000:]
    assert "toy/step@v4-8x1" in out.stdout and golden(project).exists()  # The next case got a fresh worker.
    no_aotcheck_traceback(out.stdout + out.stderr)
