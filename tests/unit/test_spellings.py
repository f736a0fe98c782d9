"""Setting spellings (aotcheck.spellings): one leaf module the settings table, the front ends and render/ read."""

import pytest

from aotcheck.settings import SETTINGS
from aotcheck.spellings import SPELLINGS, flag_names, ini_override, names_in_messages, option


def test_every_setting_has_one_spelling_and_every_spelling_a_setting():
    assert [s.name for s in SETTINGS] == list(SPELLINGS)
    assert all((s.pytest, s.cli, s.ini) == tuple(SPELLINGS[s.name]) for s in SETTINGS)


@pytest.mark.parametrize("front_end", ["pytest", "cli"])
def test_no_two_settings_share_a_flag_or_key(front_end):
    flags = [getattr(s, front_end) for s in SPELLINGS.values() if getattr(s, front_end)]
    keys = [s.ini for s in SPELLINGS.values() if s.ini]
    assert len(flags) == len(set(flags)) and len(keys) == len(set(keys))
    assert all(k.startswith("aot_") for k in keys)
    assert all(f.startswith("--aot-") for f in flags if front_end == "pytest" and f != "--update-golden")


def test_a_message_names_a_setting_as_the_user_wrote_it():
    names = names_in_messages(flag_names("cli"), from_ini=["fit", "report"])  # report has no ini key.
    assert (names["fit"], names["report"], names["tolerances"]) == ("aot_fit", "--report", "aot_tolerances")


def test_an_accept_command_spells_options_for_pytest():
    assert option("cases", "a/b@v4-8x1") == "--aot-case=a/b@v4-8x1"
    assert ini_override("hbm_headroom", "0.9") == ["-o", "aot_hbm_headroom=0.9"]
    with pytest.raises(AssertionError, match="hbm_headroom has no pytest option"):
        option("hbm_headroom", "0.9")
