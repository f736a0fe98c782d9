"""aotcheck.pipeline.case: a case's id is made in one place and read back to the same value, its
bucket carried as a value (the id and the golden's name derived from it)."""

import pytest
from hypothesis import given, strategies as st

import aotcheck
from aotcheck.pipeline.case import Case
from aotcheck.programs.names import Bucket
from aotcheck.targets.topology import MAX_DEVICES, Target, TopologyError, parse_topology, topology_names

names = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_."), min_size=1, max_size=12)
axes = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz_"), min_size=1, max_size=8)
buckets = st.dictionaries(axes, st.integers(1, 2**31 - 1), max_size=3).map(Bucket)
targets = st.sampled_from(topology_names() + ["cpu-8"]).flatmap(
    lambda name: st.tuples(st.just(name), st.integers(1, min(64, MAX_DEVICES // parse_topology(name).num_devices))))


@given(names, names, targets, buckets)
def test_an_id_reads_back_to_the_same_case_bucket_and_all(config, program, target, bucket):
    case = Case(config, program, Target.of(*target), bucket)
    assert Case.parse(case.id) == case and hash(Case.parse(case.id)) == hash(case)
    assert case.golden_relpath == case.id + ".json"
    assert Case.of(config, case.program_id, *target) == case  # The program by its id, bucket included.
    assert ("[" in case.id) == bool(bucket)  # A bucket shows in the id; a plain program's id has none.


def test_a_bucket_reads_in_its_axes_order_and_is_not_the_same_case_as_another():
    one = Case.parse("llm/step[tokens=64,seqs=8]@v5e-8x1")
    assert (one.program, list(one.bucket.items()), one.program_id) == (
        "step", [("tokens", 64), ("seqs", 8)], "step[tokens=64,seqs=8]")
    assert one != Case.parse("llm/step[tokens=16,seqs=8]@v5e-8x1") and one != Case.parse("llm/step@v5e-8x1")


def test_a_registered_functions_case_takes_its_program_and_bucket():
    function = aotcheck.FunctionConfig(fn=lambda x: x, make_args=lambda mesh: (), program="step")
    case = Case.for_config("llm", function, Target.of("v5e-8"))
    assert case.id == "llm/step@v5e-8x1" and case.bucket == Bucket()


@pytest.mark.parametrize("text", ["lm-tiny", "lm-tiny/train_step", "lm-tiny@v4-8", "a/b/c@v4-8x1", "a/b@v4 8",
                                  " a/b@v4-8x1"])
def test_what_is_not_an_id_is_a_value_error_naming_the_form(text):
    with pytest.raises(ValueError, match=r"Not a case id: .* \(expected CONFIG/PROGRAM@TOPOLOGYxSLICES\)"):
        Case.parse(text)


def test_an_id_with_an_unknown_target_names_the_topology():
    with pytest.raises(TopologyError, match="v5e-17"):
        Case.parse("lm/step@v5e-17x1")
