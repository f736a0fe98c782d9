"""settings.py: each setting's row carries its default, choices and reader; GateSettings.parse is a loop over them."""

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from aotcheck.settings import SETTINGS, GateSettings, SettingsError, read_settings
from aotcheck.spellings import flag_names


def test_every_field_of_the_settings_comes_from_a_row_and_every_default_from_its_row():
    fields = {f.name for f in dataclasses.fields(GateSettings)}
    from_rows = {s.field if s.field is not None else s.name for s in SETTINGS} - {""}
    assert from_rows == fields - {"rootdir", "front_end", "golden_dir_option", "libtpu_init_args_option",
                                 "environment_flags", "environment_flags_used", "said", "unused_cache"}  # Not a row's.
    defaults = GateSettings.parse(rootdir="/p")
    assert defaults.targets == () and defaults.golden_dir == Path("/p/golden") and defaults.update is False
    assert defaults.cache_dir == Path("/p/.aotcheck-cache") and defaults.hbm_headroom == 1.0
    assert defaults.metric_drift == "fail" and defaults.presets is True and defaults.fit is None


@pytest.mark.parametrize("name, value, front_end, message", [
    ("metric_drift", "Maybe", "pytest", "aot_metric_drift: 'Maybe' must be 'fail' (figures new or gone against the "
     "golden fail the case) or 'warn' (they pass with a warning)"),
    ("default_options", "all", "cli", "--default-options: 'all' must be 'aotcheck' (aotcheck's per-chip presets "
     "under your options) or 'none' (only your options, as your job sends them)"),
    ("slices", "0", "cli", "--slices: '0' is not a slice count; give integers >= 1, e.g. --slices=1,2"),
    ("shard", "3/2", "pytest", "--aot-shard: '3/2': K must be between 1 and N (N >= 1), e.g. 1/2."),
    ("hbm_headroom", "1.5", "pytest", "aot_hbm_headroom: '1.5' must be a number in (0, 1], e.g. 0.95"),
    ("fit", "per device", "cli", "--fit: 'per device' is not a knob name"),
    ("memory_fraction", "0", "pytest", "aot_memory_fraction: '0' must be a number in (0, 1], the share of a GPU's "
     "memory your served process runs with (its XLA_PYTHON_CLIENT_MEM_FRACTION), e.g. 0.9"),
    ("memory_fraction", "most", "cli", "aot_memory_fraction: 'most' must be a number in (0, 1]"),
])
def test_a_bad_value_is_named_as_the_front_end_spells_it(name, value, front_end, message):
    with pytest.raises(SettingsError) as raised:
        GateSettings.parse(rootdir="/p", front_end=front_end, **{name: value})
    assert str(raised.value).startswith(message)


def test_the_memory_fraction_is_read_from_the_ini_and_empty_is_none():
    assert GateSettings.parse(rootdir="/p").memory_fraction is None
    assert GateSettings.parse(rootdir="/p", memory_fraction=" 0.9 ", from_ini=["memory_fraction"]).memory_fraction == 0.9


def test_a_value_the_ini_gave_is_named_by_its_ini_key():
    with pytest.raises(SettingsError, match=r"^aot_slices: 'x' is not a slice count; give integers >= 1, "
                                            r"e\.g\. aot_slices = 1,2"):
        GateSettings.parse(rootdir="/p", slices="x", from_ini=["slices"])


def test_choices_are_case_and_space_blind_and_empty_is_the_default():
    parsed = GateSettings.parse(rootdir="/p", metric_drift=" WARN ", default_options="")
    assert parsed.metric_drift == "warn" and parsed.presets is True
    assert GateSettings.parse(rootdir="/p", default_options="None").presets is False


def test_no_cache_turns_the_cache_off_from_either_front_end():
    assert GateSettings.parse(rootdir="/p", no_cache=True).cache_dir is None
    assert GateSettings.parse(rootdir="/p", cache_dir=None).cache_dir is None
    values = read_settings(option=lambda s: True if s.name == "no_cache" else None, ini=lambda s: s.default)
    assert GateSettings.parse(rootdir="/p", **values).cache_dir is None


def test_an_unknown_keyword_is_a_type_error_naming_the_settings():
    with pytest.raises(TypeError, match="unknown settings \\['topology'\\]; the settings are topologies, slices"):
        GateSettings.parse(rootdir="/p", topology="v4-8")


def test_messages_name_settings_as_each_front_end_spells_them():
    pytest_flags, cli_flags = flag_names("pytest"), flag_names("cli")
    assert GateSettings.parse(rootdir="/p").flags == pytest_flags
    assert GateSettings.parse(rootdir="/p", front_end="cli").flags == cli_flags
    assert (pytest_flags["fit"], cli_flags["fit"], cli_flags["hbm_headroom"]) == ("--aot-fit", "--fit", "aot_hbm_headroom")


@given(st.lists(st.sampled_from(["v4-8", "v5e-16", "cpu-2", "h100-8"]), min_size=1, max_size=4),
       st.lists(st.integers(1, 4), max_size=3))
def test_targets_are_each_topology_at_each_slice_count_once(topologies, slices):
    parsed = GateSettings.parse(rootdir="/p", topologies=",".join(topologies), slices=[str(n) for n in slices])
    expected = {f"{t}x{n}" for t in topologies for n in (slices or [1])}
    assert {t.name for t in parsed.targets} == expected and len(parsed.targets) == len(expected)


def test_the_environments_launch_flags_are_read_only_by_a_run_that_compiles():
    """A shell whose LIBTPU_INIT_ARGS aotcheck cannot read must not break pytest runs with the gate off."""
    off = GateSettings.parse(rootdir="/p", environment_flags="-single_dash_flag")
    assert not off.environment_flags_used and off.compiler_options == {}
    with pytest.raises(SettingsError, match=r"LIBTPU_INIT_ARGS \(in the environment\): '-single_dash_flag'"):
        GateSettings.parse(rootdir="/p", topologies="v4-8", environment_flags="-single_dash_flag")
    given = GateSettings.parse(rootdir="/p", topologies="v4-8", libtpu_init_args="--xla_a=1",
                               environment_flags="--xla_b=2")
    assert given.compiler_options == {"xla_a": "1"} and not given.environment_flags_used
