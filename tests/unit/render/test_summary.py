"""The session in the terminal (aotcheck.render.summary): the table, notes, an interruption.

FAKE: outcomes made by hand (no compile); the real runs are tests/e2e/test_plugin.py's and test_cli.py's.
"""

from pathlib import Path

import pytest

from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.gate.run import Interrupted
from aotcheck.pipeline.cache import CacheSpec
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.summary import case_line, session_summary

CASE = Case.of("lm", "prefill", "v5e-16")


def test_the_table_shows_each_case_and_its_share_of_the_chips_hbm():
    o = Outcome(CASE, Verdict.PASS, measured=Measurement(CASE, {"peak_bytes": 8 * 2**30}, {}, 2.0))
    lines = session_summary(Report([o]), update=False)
    row = next(line for line in lines[0].splitlines() if line.startswith("lm/prefill@v5e-16x1"))
    assert "8.00 GiB" in row and "50.0%" in row and row.rstrip().endswith("pass")
    assert case_line(o) == "lm/prefill@v5e-16x1: pass"


def test_an_update_says_what_it_wrote_and_an_interruption_what_it_kept():
    o = Outcome(CASE, Verdict.ACCEPTED, measured=Measurement(CASE, {"peak_bytes": 2**30}, {}, 1.0),
                golden_action=GoldenAction.CREATED)
    text = "\n".join(session_summary(Report([o], interrupted=Interrupted("SIGHUP", 1, 3, True)), update=True))
    assert "1 created, 0 changed, 0 unchanged" in text
    assert "interrupted (SIGHUP) after 1 of 3 cases" in text
    assert "interrupted" not in "\n".join(session_summary(Report([o]), update=True))


def test_a_compiler_that_is_not_installed_is_said_so_in_the_header():
    """Hardening round 5, T14: with no CUDA plugin the header said `jax-cuda12-pjrt None`."""
    from aotcheck.gate.run import RunHeader
    from aotcheck.render.summary import header_lines

    header = RunHeader(targets=("h100-8x1",), golden_dir="golden", update=False,
                       toolchain={"jax": "0.10.2", "jax-cuda12-pjrt": None})
    assert header_lines(header)[0].endswith("no figures cache; jax 0.10.2, jax-cuda12-pjrt not installed")


def test_goldens_of_a_platform_whose_compiler_is_not_installed_promise_no_upgrade_table(tmp_path, monkeypatch):
    """T14's other half: the header promised an upgrade table for GPU goldens no case could judge. A FAKE
    platform toolchain (the CUDA plugin reported absent) over a real golden file and a real session."""
    import json

    from aotcheck.session import GateSession
    from aotcheck.settings import GateSettings
    from aotcheck.targets import platform as platforms

    golden = tmp_path / "golden" / "lm" / "prefill@h100-8x1.json"
    golden.parent.mkdir(parents=True)
    golden.write_text(json.dumps({"format": 1, "case": "lm/prefill@h100-8x1", "figures": {}, "details": {},
                                  "toolchain": {"jax": "0.1", "jax-cuda12-pjrt": "0.1"}, "compiler_options": {}}))
    session = GateSession(GateSettings.parse(rootdir=tmp_path, topologies="h100-8", cache_dir=None))
    assert session.foreign_toolchain_goldens() != []  # Installed here, and another version: said.
    monkeypatch.setattr(platforms.Platform, "toolchain", lambda self: {"jax": "0.1", "jax-cuda12-pjrt": None})
    assert session.foreign_toolchain_goldens() == []


@pytest.mark.parametrize("shares, update, said", [
    (True, False, "figures cache c, shared through s3://b/aot;"),
    (False, False, "figures cache c, shared through s3://b/aot (read only);"),
    (True, True, "figures cache c, shared through s3://b/aot (written: not read, goldens take figures from compiles only);"),
    (False, True, "figures cache c, shared through s3://b/aot (neither read nor written by an update);"),
])
def test_the_header_says_once_what_a_run_does_with_its_shared_store(shares, update, said):
    """Hardening round 5, V23: an update in read mode was headed "(read only) (written, not read)"."""
    from aotcheck.gate.run import RunHeader
    from aotcheck.render.summary import header_lines

    header = RunHeader(targets=("v4-8x1",), golden_dir="golden", update=update,
                       cache=CacheSpec(Path("c"), not update, "s3://b/aot", shares))
    assert said in header_lines(header)[0] and header_lines(header)[0].count("(") <= 2


@pytest.mark.parametrize("front_end, given, said", [
    ("cli", {"cache_mode": "read"}, "aotcheck: --cache-mode read changes nothing: it is the shared cache's mode, and "
                                    "no shared cache is set (--cache-url)"),
    ("pytest", {"cache_url": "file:///s", "no_cache": True}, "aotcheck: --aot-cache-url file:///s is not used: "
                                                             "--aot-no-cache turns every figures cache off, the shared one too"),
    ("pytest", {"cache_url": "file:///s", "cache_mode": "read"}, None),  # Both used: nothing to say.
    ("pytest", {"cache_mode": "readwrite"}, None),  # The default mode with no store: nothing was asked.
])
def test_a_cache_setting_that_changes_nothing_is_said(tmp_path, front_end, given, said):
    """Hardening round 5, V19/V20: a cache URL beside --no-cache, and a read mode with no shared cache, were
    silent. Real settings parsed, the real session's header."""
    from aotcheck.render.summary import header_lines
    from aotcheck.session import GateSession
    from aotcheck.settings import GateSettings

    settings = GateSettings.parse(rootdir=tmp_path, topologies="v4-8", front_end=front_end, **given)
    lines = [line for line in header_lines(GateSession(settings).header()) if "changes nothing" in line
             or "is not used" in line]
    assert lines == ([said] if said else [])


@pytest.mark.parametrize("state, said", [("a file", "is a file, not a directory: no golden can be read or written there"),
                                         ("a dangling link", "is a symbolic link whose target does not exist: no golden")])
def test_a_golden_dir_that_is_no_directory_is_said_as_what_it_is(state, said):
    from aotcheck.gate.run import RunHeader
    from aotcheck.render.summary import header_lines

    header = RunHeader(targets=("v4-8x1",), golden_dir="golden", update=False, golden_dir_missing=True,
                       golden_dir_state=state)
    warning = [line for line in header_lines(header) if "WARNING" in line]
    assert len(warning) == 1 and said in warning[0] and "does not exist, so every case" not in warning[0]
