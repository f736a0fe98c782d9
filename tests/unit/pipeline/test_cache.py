"""A figures cache that is never stale: an edit that moves source lines but not the program reuses
the compiled figures, and the details name the lines as they are now (aotcheck.figures.sources).

Real runs of ``aotcheck check`` in a project of its own: lm-tiny's train step from a copy of
aotcheck/models/lm.py, edited between runs as a user edits a model.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import aotcheck.models.lm

CONFTEST = '''
import aotcheck
import mylm

aotcheck.register("mylm", lambda: mylm.trainer_config(mylm.TINY, eval_step=None))  # The train step alone.
'''


def _check(project: Path, *args: str) -> dict:
    report = project / "r.json"
    out = subprocess.run([sys.executable, "-m", "aotcheck", "check", "--configs", "mylm", "--topologies", "v4-8",
                          "--slices", "1", f"--report={report}", *args], cwd=project, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (case,) = json.loads(report.read_text())["cases"]
    return case["measured"]  # The Measurement the case was judged from: cached, figures, details.


def _lines(details: dict) -> list[str]:
    found = [b.get("source") for key in ("peak_buffers", "collectives") for b in details[key]]
    return sorted(s for s in found if s)


@pytest.mark.heavy
def test_an_edit_that_moves_lines_reuses_the_figures_and_names_the_lines_as_they_are_now(tmp_path):
    shutil.copy(aotcheck.models.lm.__file__, tmp_path / "mylm.py")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    cache = f"--aot-cache-dir={tmp_path / 'cache'}".replace("--aot-", "--")
    first = _check(tmp_path, cache, "--update-golden")
    assert not first["cached"] and any(s.startswith("mylm.py:") for s in _lines(first["details"]))

    model = tmp_path / "mylm.py"
    model.write_text("# One line more at the top: every line below moves down by one.\n" + model.read_text())
    moved = _check(tmp_path, cache)
    assert moved["cached"]  # The program did not change: nothing compiled...
    shifted = [re.sub(r"^mylm\.py:(\d+)$", lambda m: f"mylm.py:{int(m[1]) + 1}", s) for s in _lines(first["details"])]
    assert _lines(moved["details"]) == shifted  # ...and every line is named as it is now,
    fresh = _check(tmp_path, "--no-cache")
    assert not fresh["cached"] and moved["details"] == fresh["details"]  # exactly as a fresh compile names it.
    # An update run takes nothing from the cache (what it writes into goldens is compiled), and names
    # the same lines.
    updated = _check(tmp_path, cache, "--update-golden")
    golden = json.loads((tmp_path / "golden/mylm/train_step@v4-8x1.json").read_text())
    assert not updated["cached"] and golden["details"] == fresh["details"]

    # An entry whose lines cannot be mapped onto the program as it is (here: anchors pointing at
    # instructions that name no line) is never served: the case is compiled afresh and the entry rewritten.
    (entry,) = (tmp_path / "cache").glob("??/*.json")  # The figures entry (the index is under inputs/).
    data = json.loads(entry.read_text())
    data["anchors"] = {source: [0] for source in data["anchors"]}
    entry.write_text(json.dumps(data))
    again = _check(tmp_path, cache)
    assert not again["cached"] and again["details"] == fresh["details"]
    assert json.loads(entry.read_text())["anchors"] != data["anchors"]


# The shared tier (pipeline.store) behind the local directory: entries validated alike, kept locally.

from aotcheck.pipeline.cache import FiguresCache, REQUIRED_FIGURES, entry_digest  # noqa: E402
from aotcheck.pipeline.store import SharedStore  # noqa: E402

TOOLCHAIN = {"jax": "0.12.0.1"}
ENTRY = {"figures": dict.fromkeys(REQUIRED_FIGURES, 1.0), "compile_seconds": 2.5, "details": {}}


def _runners(tmp_path, *, second_writes=True):
    shared = f"file://{tmp_path}/shared"
    first = FiguresCache(tmp_path / "one", shared=SharedStore(shared))
    second = FiguresCache(tmp_path / "two", shared=SharedStore(shared, write=second_writes))
    return first, second


def test_a_runner_takes_another_runners_entry_from_the_shared_store_and_keeps_it(tmp_path):
    first, second = _runners(tmp_path)
    first.put("ab" * 32, ENTRY, toolchain=TOOLCHAIN)
    found = second.get("ab" * 32, toolchain=TOOLCHAIN)
    assert found is not None and found["figures"] == ENTRY["figures"]
    # A verdict from it names the store (hardening round 5, V12): the entry says where it was read.
    assert found["cached_from"] == f"file://{tmp_path}/shared/ab/{'ab' * 32}.json"
    assert (tmp_path / "two" / "ab" / f"{'ab' * 32}.json").exists()  # Kept locally for the next run.
    assert second.notes == []


def test_a_bad_shared_entry_is_a_miss_named_by_its_url(tmp_path):
    first, second = _runners(tmp_path)
    first.put("cd" * 32, ENTRY, toolchain=TOOLCHAIN)
    shared = tmp_path / "shared" / "cd" / f"{'cd' * 32}.json"
    shared.write_text(shared.read_text()[:40])  # Half an entry (as no writer of aotcheck's leaves one).
    assert second.get("cd" * 32, toolchain=TOOLCHAIN) is None
    (note,) = second.notes
    assert f"file://{tmp_path}/shared/cd/{'cd' * 32}.json is not usable (not whole JSON)" in note
    assert not (tmp_path / "two" / "cd").exists()  # Nothing bad is kept.


def test_a_read_only_runner_reads_the_shared_store_and_writes_only_locally(tmp_path):
    first, second = _runners(tmp_path, second_writes=False)
    first.put("ab" * 32, ENTRY, toolchain=TOOLCHAIN)
    second.put("ef" * 32, ENTRY, toolchain=TOOLCHAIN)
    assert second.get("ab" * 32, toolchain=TOOLCHAIN) is not None
    assert (tmp_path / "two" / "ef").exists() and not (tmp_path / "shared" / "ef").exists()


@pytest.mark.parametrize("where", ["the local cache", "the shared store"])
def test_an_entry_edited_coherently_is_named_where_it_lies_and_compiled_afresh(tmp_path, where):
    """Issue 52, V12: valid JSON, a figure halved (a fake improvement), no compile to back it: its seal
    does not match, the entry is a miss, and the note names the file or the store's URL."""
    first, second = _runners(tmp_path)
    first.put("ab" * 32, ENTRY, toolchain=TOOLCHAIN)
    path = (tmp_path / "one" if where == "the local cache" else tmp_path / "shared") / "ab" / f"{'ab' * 32}.json"
    doc = json.loads(path.read_text())
    doc["figures"]["peak_bytes"] = 0.5
    path.write_text(json.dumps(doc))
    reader = first if where == "the local cache" else second
    found = reader.get("ab" * 32, toolchain=TOOLCHAIN)  # The store's whole copy, where it has one; never the edit.
    assert (found is None) if where == "the shared store" else found["figures"] == ENTRY["figures"]
    named = f"file://{path}" if where == "the shared store" else str(path)
    assert any(named in n and "its seal does not match what it holds" in n for n in reader.notes), reader.notes


def test_the_index_by_inputs_points_at_an_entry_with_its_lines(tmp_path):
    first, second = _runners(tmp_path)
    stored = {"details": {"peak_buffers": []}, "anchors": {"m.py:7": [3]}}
    read = {"environment": {"WIDTH": "digest"}, "files": {}}
    first.remember("12" * 32, "ab" * 32, {"m.py:7": "m.py:8"}, stored, read)
    assert second.key_for("12" * 32) == ("ab" * 32, {"m.py:7": "m.py:8"}, entry_digest(stored), read)
    assert second.key_for("34" * 32) is None
    reader = FiguresCache(tmp_path / "one", read=False)  # An update run takes no answer from a cache.
    assert reader.key_for("12" * 32) is None


def test_an_index_whose_entry_was_rewritten_since_answers_nothing(tmp_path):
    """The index maps the lines of the details it saw; an entry another run rewrote (other lines) is
    not answered through it: the case is lowered, and its lines mapped afresh."""
    from aotcheck.pipeline.case import Case
    from aotcheck.pipeline.measure import by_inputs

    cache = FiguresCache(tmp_path / "c")
    case = Case.of("t", "step", "cpu-2")
    toolchain = case.topology.platform.toolchain()
    seen = {**ENTRY["details"], "peak_buffers": []}
    cache.put("ab" * 32, {**ENTRY, "details": seen}, toolchain=toolchain)
    cache.remember("12" * 32, "ab" * 32, {}, {"details": seen, "anchors": {}}, {"environment": {}, "files": {}})
    answered = by_inputs(cache, "12" * 32, case, {})
    assert answered is not None and answered.cached and not answered.lowered
    cache.put("ab" * 32, {**ENTRY, "details": {**seen, "peak_excess_bytes": 7}}, toolchain=toolchain)
    assert by_inputs(cache, "12" * 32, case, {}) is None


def test_a_bad_local_entry_is_named_and_the_shared_stores_answer_taken_in_its_place(tmp_path):
    first, second = _runners(tmp_path)
    first.put("ab" * 32, ENTRY, toolchain=TOOLCHAIN)
    assert second.get("ab" * 32, toolchain=TOOLCHAIN) is not None  # Now kept locally too.
    local = tmp_path / "two" / "ab" / f"{'ab' * 32}.json"
    local.write_text("{")  # A local copy broken (a hand, a full disk).
    found = second.get("ab" * 32, toolchain=TOOLCHAIN)
    assert found is not None and found["figures"] == ENTRY["figures"]
    assert any(f"{local} is not usable (not whole JSON)" in n for n in second.notes)
    assert json.loads(local.read_text())["key"] == "ab" * 32  # Rewritten whole from the store.
