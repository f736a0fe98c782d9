"""aotcheck.render.calibration: the calibration table, and docs/calibration.md held to it."""

from pathlib import Path

from aotcheck.gate.calibration import read_records
from aotcheck.render.calibration import HEADERS, calibration_markdown, calibration_rows

ROOT = Path(__file__).resolve().parents[3]


def test_docs_calibration_holds_the_table_of_the_committed_records():
    table = calibration_markdown(read_records(ROOT / "calibration"))
    assert table in (ROOT / "docs" / "calibration.md").read_text(), \
        "docs/calibration.md's table is stale: paste calibration_markdown(read_records('calibration')) over it"


def test_the_table_has_the_rows_the_issue_asks_for():
    rows = calibration_rows(read_records(ROOT / "calibration"))
    assert all(len(row) == len(HEADERS) for row in rows)
    figures = {(row[0], row[2]): row for row in rows}
    assert figures[("lm-tiny/train_step", "temporaries at train_step[batch=32]")][5] == "0.510"
    assert figures[("lm-tiny/train_step", "code at train_step[batch=32]")][3:] == ["6,694,400 B", "6,694,400 B", "1.000"]
    assert figures[("lm-1b/prefill", "fit_max_batch")][3:] == ["224", "224 ran, 225 refused at compile", "1.000"]
    assert figures[("llm-256k/*", "largest pool that starts")][3:] == ["4,434 pages", "4,434 pages", "1.000"]
    assert figures[("llm-256k/*", "start-up at 4,435 pages")][4] == "failed: E0101 at structured_decode[seqs=512]"
    assert figures[("llm-256k/*", "start-up at 4,479 pages")][3:] == [
        "will not start", "failed: E0101 at structured_decode[seqs=512]", "agrees"]
