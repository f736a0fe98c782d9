"""aotcheck.usage: what is wrong with how a run was asked for (the front ends' words for each are pinned in
tests/e2e/test_bad_command_line.py)."""

import pytest

from aotcheck.readers import SettingsError
from aotcheck.usage import check_ini_keys, dash_value, invocation_problem


@pytest.mark.parametrize("key, said", [("aot-hbm-headroom", "write it aot_hbm_headroom"),
                                       ("aothbm_headroom", "write it aot_hbm_headroom"),
                                       ("Aot_Hbm_Headroom", "write it aot_hbm_headroom"),
                                       ("aot_shard", "the shard is given per run, on the command line"),
                                       ("aot_tolerance", "did you mean aot_tolerances?")])
def test_a_key_near_aotchecks_is_refused_with_its_spelling(key, said):
    with pytest.raises(SettingsError) as raised:
        check_ini_keys([key], where="tox.ini")
    assert str(raised.value).startswith(f"tox.ini: {key} is not an aotcheck setting, so nothing reads it; {said}")


def test_other_plugins_keys_and_aotchecks_own_pass():
    check_ini_keys(["addopts", "timeout", "aot_topologies", "aot_tolerances"], where="tox.ini")


def test_an_invocation_names_a_repeated_option_before_a_dashed_value():
    assert invocation_problem(["--shard", "-1/4"], front_end="cli") == dash_value(["--shard", "-1/4"], front_end="cli")
    assert invocation_problem(["--shard=1/4", "--shard=2/4"], front_end="cli").startswith("--shard is given 2 times")
    assert invocation_problem(["--shard=1/4"], front_end="cli") is None
