"""XLA's out-of-memory words read into one record, on each real form (``tests/fixtures/oom``):

- ``*.libtpu-0.0.50.1.txt``: captured from deviceless compiles here (v5e-1): HBM's short form (E1000), a
  Pallas kernel's scoped VMEM (E1001), SMEM scratch larger than the memory;
- ``tpu-hbm-short.libtpu-0.0.42.1.txt``: the chip's compiler's refusal, from calibration/ (lm-1b prefill at 225);
- ``*.field.txt``: forms no deviceless compile here produces, abridged from users' logs (op names shortened):
  TPU's long HBM form with its totals and largest allocations (a v4 job), a GPU's buffer assignment and allocator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aotcheck.errors import OutOfMemory, OutOfMemorySpace, error_from_json, error_to_json
from aotcheck.programs.oom import overflow_of

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "oom"
G, M, K = 2**30, 2**20, 2**10


def read(name: str):
    return overflow_of((FIXTURES / name).read_text())


def test_tpu_hbm_short_forms_say_what_and_how_much():
    o = read("tpu-hbm-short.libtpu-0.0.50.1.txt")
    assert (o.space, o.hbm, o.size_bytes, o.limit_bytes, o.limit) == ("hbm", True, 20 * G, round(15.75 * G), "capacity")
    assert o.breakdown == {"HLO temporaries": 20 * G} and o.allocations == ()
    chip = read("tpu-hbm-short.libtpu-0.0.42.1.txt")
    assert (chip.size_bytes, chip.limit_bytes) == (round(15.78 * G), round(15.75 * G))


def test_tpu_hbm_long_form_keeps_xlas_breakdown_and_largest_allocations():
    o = read("tpu-hbm-capacity.field.txt")
    assert (o.space, o.size_bytes, o.limit_bytes, o.excess_bytes) == ("hbm", round(30.75 * G) + round(33.05 * G),
                                                                       round(30.75 * G), round(33.05 * G))
    assert list(o.breakdown) == ["reserved", "program", "arguments", "global", "scoped", "HLO temp", "output"]
    assert o.breakdown["program"] == round(63.80 * G) and o.breakdown["arguments"] == 0
    assert o.breakdown["HLO temp"] == round(63.79 * G) and o.breakdown["scoped"] == round(4.56 * M)
    first, second = o.allocations
    assert (first.size_bytes, first.shape, first.kind, first.instruction) == (2 * G, "f32[32,4096,4096]", "HLO temp",
                                                                              "fusion.1265.remat3")
    assert first.op_name.endswith("attention/dot_general") and first.source == "/src/model/attention.py:1059"
    assert (second.size_bytes, second.shape, second.op_name, second.instruction) == (G, "bf16[32,4096,4096]", None, "copy.88")
    assert o.instruction is None and o.op_name is None  # The program's, not one op's: its allocations say what.


def test_tpu_vmem_scoped_and_smem_allocation_name_the_op():
    o = read("tpu-vmem-scoped.libtpu-0.0.50.1.txt")
    assert (o.space, o.hbm, o.size_bytes, o.limit_bytes, o.excess_bytes, o.limit) == ("vmem", False, 32 * M, 16 * M,
                                                                                     16 * M, "scoped")
    assert (o.instruction, o.op_name, o.op_shape, o.kernel) == ("_lambda_.1", "jit(<lambda>)/pallas_call",
                                                                "f32[32768,128]", True)
    s = read("tpu-smem-allocation.libtpu-0.0.50.1.txt")
    assert (s.space, s.size_bytes, s.limit_bytes, s.excess_bytes, s.tag, s.allocation_shape, s.instruction) == (
        "smem", 1049088, M, 1049088 - M, "scratch operand", "f32[262178]", "_lambda_.1")
    assert not o.breakdown and not s.breakdown


def test_gpu_forms_are_hbm_with_no_stated_capacity():
    o = read("gpu-buffer-assignment.field.txt")
    assert (o.space, o.hbm, o.size_bytes, o.limit_bytes) == ("hbm", True, 4770354232, None)
    assert o.breakdown["parameter allocation"] == round(372.76 * M) and o.breakdown["constant allocation"] == round(48.5 * K)
    assert o.breakdown["preallocated temp allocation"] == round(4.44 * G) and len(o.breakdown) == 6
    buffer, parameter = o.allocations
    assert (buffer.size_bytes, buffer.shape, buffer.instruction, buffer.source) == (6 * M, "f32[4096,128,3]", "concatenate",
                                                                                    "/src/models.py:689")
    assert (parameter.size_bytes, parameter.shape, parameter.kind) == (384 * K, "f32[256,128,3]", "parameter")
    a = read("gpu-allocator.field.txt")
    assert (a.space, a.size_bytes, a.limit_bytes, a.breakdown) == ("hbm", 3206250496, None, {})


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.txt")))
def test_every_form_crosses_the_pipe_as_its_class_and_record(name):
    """The compile's error, as compile_lowered makes it from each real message, survives the worker's JSON."""
    o = read(name)
    error = (OutOfMemory if o.hbm else OutOfMemorySpace)(f"Compiling x failed: {(FIXTURES / name).read_text()}", overflow=o)
    again = error_from_json(json.loads(json.dumps(error_to_json(error))))
    assert type(again) is type(error) and again.overflow == o


def test_old_records_read_as_before_and_write_byte_for_byte():
    """An overflow written before breakdowns were read (a report's, a golden fit's ``refused``) loads and writes unchanged."""
    old = {"space": "vmem", "size_bytes": 1, "limit_bytes": 0, "limit": "scoped", "excess_bytes": 1, "instruction": None,
           "op_name": None, "op_shape": None, "allocation_shape": None, "tag": None, "kernel": True, "source": None}
    again = error_from_json({"type": "aotcheck.errors.OutOfMemorySpace", "message": "m", "fields": {"overflow": old}})
    assert json.dumps(again.overflow.to_json()) == json.dumps(old)
    hbm = error_from_json({"type": "aotcheck.errors.OutOfMemory", "message": "m", "fields": {"details": {}}})
    assert hbm.overflow is None and error_to_json(hbm) == {"type": "aotcheck.errors.OutOfMemory", "message": "m",
                                                           "fields": {"details": {}}}


def test_calibration_reads_the_chips_refusal_with_the_same_reader():
    """`aotcheck calibrate` reads what the chip's compiler needed from its refusal through overflow_of too; the
    committed record (written by the former reader, which truncated to the byte) agrees to the byte's rounding."""
    from aotcheck.calibrate import _needed

    root = Path(__file__).resolve().parents[3]
    record = json.loads((root / "calibration" / "lm-1b.prefill@v5e-1x1@libtpu-0.0.42.1.transcribed.json").read_text())
    above = record["fit"]["above"]
    assert above["message"] == (FIXTURES / "tpu-hbm-short.libtpu-0.0.42.1.txt").read_text()
    assert _needed(above["message"]) == round(15.78 * G) and abs(_needed(above["message"]) - above["needed_bytes"]) <= 1
    assert _needed("RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem. Used 1.00M of 1.00M vmem.") is None
