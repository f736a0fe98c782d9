"""Program ids and buckets (aotcheck.programs.names): a bucket is a value, its id made and read back in one place."""

import pytest
from hypothesis import given, strategies as st

from aotcheck.errors import ConfigError
from aotcheck.pipeline.case import Case
from aotcheck.programs.names import Bucket, name_problem, parse_program_id, program_id

POINTS = st.dictionaries(st.sampled_from(["tokens", "seqs", "pages", "len"]), st.integers(1, 1 << 20), min_size=1)


@given(POINTS)
def test_a_program_id_reads_back_to_its_bucket(point):
    name = program_id("decode", Bucket(point))
    assert parse_program_id(name) == ("decode", Bucket(point))
    case = Case.parse(f"llm/{name}@v5e-8x1")  # A case id like any other, its bucket a value.
    assert (case.program, case.bucket, case.id) == ("decode", Bucket(point), f"llm/{name}@v5e-8x1")
    assert case == Case.of("llm", name, "v5e-8") and hash(case) == hash(Case.of("llm", name, "v5e-8"))


@given(POINTS)
def test_a_bucket_is_an_immutable_ordered_mapping(point):
    bucket = Bucket(point)
    assert dict(bucket) == point and list(bucket) == list(point)
    assert bucket == Bucket(dict(reversed(point.items()))) or len(point) > 1  # Order is part of the value.
    with pytest.raises(AttributeError):
        bucket.x = 1


def test_a_program_that_is_no_bucket_is_its_whole_name():
    assert parse_program_id("train_step") == ("train_step", Bucket())
    assert parse_program_id("f[x=1.5]") == ("f[x=1.5]", Bucket())  # Not sizes: not a bucket.
    assert program_id("train_step", Bucket()) == "train_step"


@pytest.mark.parametrize("point, match", [
    ({"to kens": 16}, "bucket axis 'to kens' is not a name.*e.g. 'to_kens'"),
    ({"tokens": 0}, r"bucket size tokens=0 is not a size; give an int >= 1"),
    ({"tokens": True}, r"bucket size tokens=True is not a size"),
])
def test_a_bad_bucket_is_refused_naming_the_axis(point, match):
    with pytest.raises(ConfigError, match=match):
        Bucket(point)


def test_a_program_name_may_not_carry_brackets_which_are_its_buckets():
    assert "'[', ']'" in name_problem("step[tokens=16]", "Program")
    assert name_problem("step", "Program") is None and name_problem("a,b", "Config") is not None
