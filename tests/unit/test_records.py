"""The one JSON codec (aotcheck.records): its rules on small records, and every stored form read and
written back byte for byte: each file under golden/, stored reports and figures-cache entries
(tests/fixtures/records/, written by real runs)."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from aotcheck.figures.program import Details
from aotcheck.gate.golden import dumps, golden_document, parse_document
from aotcheck.gate.report import Report, dumps_report, load_report
from aotcheck.pipeline.cache import sealed
from aotcheck.pipeline.case import Case
from aotcheck.records import Record, field, from_json, same_line, to_json
from aotcheck.targets.usable import Usable

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = sorted((ROOT / "golden").rglob("*.json"))
FIXTURES = ROOT / "tests" / "fixtures" / "records"


class Kind(enum.Enum):
    TEMP = "temp"
    ARG = "argument"


@dataclasses.dataclass(frozen=True)
class Line(Record):
    source: str | None
    library: str | None = field(default=None, omit=same_line)


@dataclasses.dataclass(frozen=True)
class Thing(Record):
    bytes: int
    kind: Kind
    case: Case
    shape: tuple[int, ...] = ()
    lines: list[Line] = field(default_factory=list, omit="empty")
    ratio: float = 0.0
    note: str | None = field(default=None, omit="none")
    where: Path = field(default=Path("."), skip=True)
    renamed: dict[str, int] = field(default_factory=dict, key="other")

    __json_extra__ = {"id": lambda t: t.case.id}


def test_a_record_is_written_by_its_fields_and_read_back():
    thing = Thing(8, Kind.ARG, Case.of("lm-tiny", "step[tokens=16]", "v5e-8", 2), (2, 4),
                  [Line("a.py:1", "lib.py:2"), Line("a.py:3", "a.py:3")], 1, renamed={"x": 1})
    data = thing.to_json()
    assert data == {"bytes": 8, "kind": "argument", "case": "lm-tiny/step[tokens=16]@v5e-8x2", "shape": [2, 4],
                    "lines": [{"source": "a.py:1", "library": "lib.py:2"}, {"source": "a.py:3"}], "ratio": 1.0,
                    "other": {"x": 1}, "id": "lm-tiny/step[tokens=16]@v5e-8x2"}
    back = Thing.from_json(json.loads(json.dumps(data)))
    assert back == dataclasses.replace(thing, lines=[Line("a.py:1", "lib.py:2"), Line("a.py:3", None)], ratio=1.0)
    assert back.case.bucket == thing.case.bucket and isinstance(back.shape, tuple)


def test_a_missing_field_without_a_default_is_named_and_null_takes_the_default():
    with pytest.raises(KeyError, match="kind"):
        Thing.from_json({"bytes": 1, "case": "c/p@v4-8x1"})
    assert Thing.from_json({"bytes": 1, "kind": "temp", "case": "c/p@v4-8x1", "lines": None}).lines == []
    with pytest.raises(ValueError):
        Thing.from_json({"bytes": 1, "kind": "hot", "case": "c/p@v4-8x1"})
    with pytest.raises(TypeError):
        Thing.from_json(["not", "an", "object"])  # type: ignore[arg-type]


@given(st.integers(0, 2**62), st.sampled_from(Kind), st.lists(st.integers(0, 9), max_size=3),
       st.none() | st.text(max_size=5), st.floats(0, 1e9))
def test_any_record_round_trips(size, kind, shape, note, ratio):
    thing = Thing(size, kind, Case.of("c", "p", "v4-8"), tuple(shape), note=note, ratio=ratio)
    assert from_json(Thing, json.loads(json.dumps(to_json(thing)))) == thing


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: str(p.relative_to(ROOT / "golden")))
def test_every_golden_file_reads_and_writes_back_byte_for_byte(path):
    text = path.read_text()
    golden = parse_document(text, path)
    case = Case.parse(json.loads(text)["case"])
    usable = Usable.from_json(golden.usable).to_json() if golden.usable is not None else None
    document = golden_document(case, golden.figures, toolchain=golden.toolchain,
                               compiler_options=golden.compiler_options,
                               details=Details.from_json(golden.details).to_json(), usable=usable)
    assert dumps(document) == text


def test_the_goldens_are_all_here():
    assert len(GOLDENS) >= 180, "golden/ is read from the checkout"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("report*.json")))
def test_a_stored_report_reads_and_writes_back_byte_for_byte(name):
    text = (FIXTURES / name).read_text()
    report = load_report(FIXTURES / name)
    assert report.outcomes and dumps_report(report) == text
    assert dumps_report(Report.from_json(json.loads(dumps_report(report)))) == text


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("cache-*.json")))
def test_a_stored_cache_entry_reads_and_writes_back_byte_for_byte(name):
    raw = (FIXTURES / name).read_bytes()
    entry = json.loads(raw)
    details = Details.from_json(entry["details"])
    assert details.to_json() == entry["details"]
    rebuilt = {k: v for k, v in entry.items() if k != "seal"} | {"details": details.to_json()}
    assert sealed(rebuilt) == raw.rstrip(b"\n")


@pytest.mark.parametrize("path", sorted((ROOT / "calibration").glob("*.json")), ids=lambda p: p.name)
def test_a_calibration_record_reads_and_writes_back_byte_for_byte(path):
    from aotcheck.gate.calibration import Calibration

    text = path.read_text()
    assert json.dumps(Calibration.from_json(json.loads(text)).to_json(), indent=2, sort_keys=True) + "\n" == text
