"""Program ids and buckets (aotcheck.programs.names): a bucket is a value, its id made and read back in one place."""

import pytest
from hypothesis import given, strategies as st

from aotcheck.errors import ConfigError
from aotcheck.pipeline.case import Case
from aotcheck.programs.names import Bucket, name_problem, parse_program_id, program_id
from aotcheck.programs.registry import Registry, RegistryError

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


@pytest.mark.parametrize("name, said", [
    ("..", "Config name '..' would name its parent in a golden file's path; pick another name."),
    (".", "Config name '.' would name the golden directory itself in a golden file's path; pick another name."),
    ("x" * 300, "Config name of 300 bytes ('" + "x" * 40 + "'...) is too long: it names a golden directory, and file "
     "systems take at most 255 bytes a name; give it at most 200."),
])
def test_a_name_that_cannot_name_a_golden_path_says_why(name, said):
    """Hardening round 5, V83/V84: 300 characters compiled, then failed 'File name too long'; '..' was refused
    for characters it does not have."""
    assert name_problem(name, "Config") == said
    with pytest.raises(RegistryError, match="pick another name|give it at most 200"):
        Registry().register(name, lambda: None)
