"""Each setting's reader (aotcheck.readers): what a user wrote, read, or an error naming the setting as
written and the fix."""

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from aotcheck.pipeline.case import Case
from aotcheck.readers import (MISSING_VALUE, Reading, SettingsError, read_cases, read_headroom, read_launch_flags,
                              read_slices, split_list)

SAID = {"slices": "aot_slices", "cases": "--aot-case", "hbm_headroom": "aot_hbm_headroom",
        "libtpu_init_args": "--aot-libtpu-init-args"}


def reading(**given):
    return Reading(Path("/p"), SAID, given)


@given(st.lists(st.integers(1, 64), min_size=1, max_size=4))
def test_slice_counts_read_back_in_either_separator(counts):
    text = ", ".join(map(str, counts))
    assert read_slices(text, reading(slices=text)) == counts
    assert split_list([text, "x y"]) == [*map(str, counts), "x", "y"]


def test_a_bad_value_names_the_setting_as_the_user_wrote_it():
    with pytest.raises(SettingsError, match=r"^aot_slices: '٣' is not a slice count; .*e\.g\. aot_slices = 1,2$"):
        read_slices("٣", reading(slices="٣"))  # A digit, but not an ASCII one.
    with pytest.raises(SettingsError, match=r"aot_hbm_headroom: '1.5' must be a number in \(0, 1\]"):
        read_headroom("1.5", reading(hbm_headroom="1.5"))
    with pytest.raises(SettingsError, match=r"--aot-libtpu-init-args needs its value after '='"):
        read_launch_flags(MISSING_VALUE, reading(libtpu_init_args=MISSING_VALUE))


def test_case_ids_are_read_as_cases_with_their_bucket_and_a_bad_one_names_the_form():
    cases = read_cases(["llm/step[tokens=16]@v5e-16x1", " lm/prefill@v4-8x1 ", "llm/step[tokens=16]@v5e-16x1"],
                       reading())
    assert cases == (Case.of("llm", "step[tokens=16]", "v5e-16"), Case.of("lm", "prefill", "v4-8"))
    assert dict(cases[0].bucket) == {"tokens": 16}
    with pytest.raises(SettingsError, match=r"--aot-case: 'lm/prefill' is not a case id: .* e\.g\. "
                                            r"--aot-case=lm-tiny/train_step@v4-8x1, quoted for the shell"):
        read_cases(["lm/prefill"], reading())
