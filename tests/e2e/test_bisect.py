"""``aotcheck bisect`` over a real git history (issue 56): 64 commits of a project, one of which adds a
buffer to its step; the command finds that commit against the golden, compiling only the commits it visits
(ceil(log2(63)) = 6, each in a worktree of its own), and says each visited commit's figure."""

import re
import subprocess
import sys

import pytest


CONFTEST = '''
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import aotcheck
import model


@aotcheck.register("bis")
def bis():
    def make_args(mesh):
        return (jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)
    return aotcheck.FunctionConfig(fn=model.step, make_args=make_args, program="step")
'''
MODEL = '''
import jax.numpy as jnp


def step(x):
    return jnp.tanh(x @ x)
'''
GROWN = '''
import jax.numpy as jnp


def step(x):
    wide = jnp.concatenate([x] * 16, axis=1)  # The buffers the bisection must find: temp_bytes 256 KiB -> 9 MiB.
    return jnp.tanh(x @ x) + jnp.sum(jnp.sin(wide) @ wide.T)
'''


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.heavy
def test_bisect_finds_the_commit_that_added_a_buffer_in_six_compiles(tmp_path):
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    (repo / "pytest.ini").write_text("[pytest]\naot_topologies = cpu-4\n")
    (repo / "conftest.py").write_text(CONFTEST)
    (repo / "model.py").write_text(MODEL)
    made = subprocess.run([sys.executable, "-m", "aotcheck", "check", "--case", "bis/step@cpu-4x1", "--update-golden"],
                          cwd=repo, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    (repo / ".gitignore").write_text(".aotcheck-cache/\n__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the model and its golden")
    good = git(repo, "rev-parse", "HEAD").strip()
    culprit = None
    for k in range(1, 64):  # 63 commits after --good; the 41st grows the step's buffers.
        if k == 41:
            (repo / "model.py").write_text(GROWN)
        (repo / "notes.txt").write_text(f"note {k}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"change {k}")
        if k == 41:
            culprit = git(repo, "rev-parse", "HEAD").strip()
    out = subprocess.run([sys.executable, "-m", "aotcheck", "bisect", "bis/step@cpu-4x1", "--figure", "temp_bytes",
                          "--good", good], cwd=repo, capture_output=True, text=True)
    print(out.stdout)  # Each visited commit's figure (pytest -rP shows it).
    assert out.returncode == 0, out.stdout + out.stderr
    visited = re.findall(r"^  ([0-9a-f]{12}) change (\d+): (.*): (good|bad)$", out.stdout, re.M)
    assert f"the first bad commit is {culprit} (change 41), found in 6 compiles" in out.stdout, out.stdout
    assert len(visited) == 6 and all((int(k) >= 41) == (verdict == "bad") for _, k, _, verdict in visited)
    assert "63 commits, at most 6 to compile" in out.stdout
    assert git(repo, "worktree", "list").count("\n") == 1  # Every worktree it made is gone.
    assert git(repo, "status", "--porcelain") == ""  # The checkout in use is untouched.


@pytest.mark.parametrize("args, said", [
    (["--figure", "peak_bytes", "--good", "nosuch"], "--good nosuch: not a commit of the git repository"),
    (["--figure", "peak_bites", "--good", "HEAD"], "--figure peak_bites: not a figure aotcheck measures"),
    (["--figure", "peak_bytes", "--good", "HEAD"], "no commit after --good HEAD up to --bad HEAD"),
    (["--figure", "peak_bytes"], "--good: give a revision where the figure was within its tolerance (or --toolchains)"),
    (["--figure", "peak_bytes", "--toolchains", "no/such/venv"], "--toolchains no/such/venv: no such python"),
    (["--figure", "peak_bytes", "--toolchains", sys.executable], "give two toolchains or more, oldest first"),
])
def test_bisect_refuses_bad_input_in_one_line_before_compiling(tmp_path, args, said):
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "-c", "user.email=ci@example.com", "-c", "user.name=ci", "commit", "-q", "--allow-empty", "-m", "one")
    out = subprocess.run([sys.executable, "-m", "aotcheck", "bisect", "bis/step@cpu-4x1", *args], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
