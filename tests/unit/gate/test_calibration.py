"""aotcheck.gate.calibration: the committed chip records (calibration/) re-derived by the model, as CI
checks them; the records' schema. The records are real: the chip's side read on one v5e chip, the
deviceless figures compiled under requirements-oldest.lock (their source says how)."""

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from aotcheck.gate.calibration import Calibration, CalibrationError, agreements, boot_of, read_records, write_record

ROOT = Path(__file__).resolve().parents[3]
RECORDS = read_records(ROOT / "calibration")
BY_CASE = {r.case: r for r in RECORDS}


def test_every_committed_record_is_whole_and_every_verdict_agrees_with_its_chip():
    assert len(RECORDS) >= 3
    for record in RECORDS:
        found = agreements(record)
        assert found, record.case
        assert [a for a in found if not a.agrees] == [], record.case
        assert record.toolchain == {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}  # The oldest lock's.
        assert record.bytes_limit == 16_909_336_064 == record.topology.device.runtime_bytes


def test_llm_256k_starts_at_its_pool_and_its_largest_pool_is_the_chips():
    """Issue 51's must-show: under the oldest lock, llm-256k on v5e-1 starts at 4,282 pages, the largest
    pool that starts within 1% of the chip's 4,434, on the runtime's 16,909,336,064 bytes."""
    record = BY_CASE["llm-256k/*@v5e-1x1"]
    boot = boot_of(record, 4282)
    assert boot.start.value == "starts" and boot.usable_bytes == 16_909_336_064
    assert abs((boot.usable_bytes - boot.total_bytes) - 265_000_000) < 1_000_000  # The chip: 265 MB left.
    assert boot.kv_evict_max_pages == 4434 and boot.kv_max_pages == 4394  # Ratio 1.000 and 0.991.
    failed = boot_of(record, 4435)
    assert not failed.boots and failed.tips == "structured_decode[seqs=512]"  # The chip's E0101.
    assert failed.asked_bytes == record.figures["structured_decode[seqs=512]"]["temp_bytes"]
    assert 0 < failed.asked_bytes - failed.free_bytes < 2**20  # 309 KB short, as the chip found by one page.
    # Idle programs' code, what the chip evicted from 4,394 pages up: 95.6 MB there.
    assert boot.code_bytes == 95_662_080


def test_the_old_rule_of_every_programs_temporaries_is_what_the_chip_refutes():
    """Summing every loaded program's temporaries said WILL NOT START at 4,282 pages (3,096 the largest):
    the chip started. The records would catch a model that went back to it."""
    record = BY_CASE["llm-256k/*@v5e-1x1"]
    summed = sum(f["temp_bytes"] + f["generated_code_bytes"] for f in record.figures.values())
    weights = record.figures["step[tokens=512]"]["peak_params_bytes"]
    assert (record.bytes_limit - weights - summed) // record.boot["page_bytes"] == 3095  # Below 4,282 (3,096 on the compiler's limit): refuted.


def test_a_record_whose_chip_saw_otherwise_disagrees():
    record = BY_CASE["llm-256k/*@v5e-1x1"]
    data = record.to_json()
    data["boot"]["trials"][0]["started"] = False
    assert not all(a.agrees for a in agreements(Calibration.from_json(data)))
    fit = copy.deepcopy(BY_CASE["lm-1b/prefill@v5e-1x1"].to_json())
    fit["fit"]["ran"] = False
    assert [a.what for a in agreements(Calibration.from_json(fit)) if not a.agrees] == ["fits at batch=224"]


@pytest.mark.parametrize("broken, says", [
    ({"schema": 2}, "schema 2, not 1"),
    ({"bytes_limit": "16G"}, "bytes_limit '16G': a positive integer"),
    ({"step": None, "fit": None}, "missing step or fit or boot"),
    ({"fit": {"at": "prefill[batch=224]", "knob": "batch"}}, "missing fit.answer, fit.step, fit.ran, fit.above"),
    ({"step": {"at": "prefill[batch=1]", "code_bytes": None, "reserved_bytes": None, "footprint_bytes": None,
               "seconds": None}}, "missing figures['prefill[batch=1]']"),
])
def test_a_record_that_is_not_whole_is_refused_naming_what_is_missing(broken, says, tmp_path):
    data = {**BY_CASE["lm-1b/prefill@v5e-1x1"].to_json(), **broken}
    with pytest.raises(CalibrationError, match="^" + __import__("re").escape(says)):
        Calibration.from_json(data)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=r"bad\.json: not a calibration record"):
        read_records(tmp_path)


@given(st.sampled_from(RECORDS))
def test_a_record_reads_back_as_written(record):
    assert Calibration.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_records_are_written_whole_one_file_per_case_target_and_toolchain(tmp_path):
    for record in RECORDS:
        path = write_record(tmp_path, record)
        assert path.name == record.file_name and path.read_text() == (ROOT / "calibration" / path.name).read_text()
    assert len(list(tmp_path.iterdir())) == len(RECORDS)
