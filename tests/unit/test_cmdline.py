"""aotcheck's command line, read (aotcheck.cmdline): counts, targets and the launch-flags hint."""

import argparse

import pytest
from hypothesis import given, strategies as st

from aotcheck.cmdline import count, launch_flags_hint, positive, read_target, read_targets
from aotcheck.targets.topology import TopologyError


@given(st.integers(0, 10**6))
def test_counts_read_as_written(n):
    assert count(str(n)) == n
    if n:
        assert positive(str(n)) == n


@pytest.mark.parametrize("text", ["-1", "1.5", "٣", "", "0x10"])
def test_a_count_that_is_not_ascii_digits_is_refused_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError, match="is not a count >= 0"):
        count(text)


def test_a_target_counts_its_slices_once():
    assert read_target(argparse.Namespace(topology="v5e-16", slices=None)).name == "v5e-16x1"
    assert read_target(argparse.Namespace(topology="v5e-16x2", slices=2)).name == "v5e-16x2"
    with pytest.raises(TopologyError, match="names 2 slices .* and --slices says 3: give the count once"):
        read_target(argparse.Namespace(topology="v5e-16x2", slices=3))


def test_launch_flags_after_a_space_get_the_spelling_argparse_takes():
    argv = ["compile", "m", "--libtpu-init-args", "--xla_a=1", "--json"]
    hint = launch_flags_hint("argument --libtpu-init-args: expected one argument", argv, known={"--json"})
    assert hint.endswith("use --libtpu-init-args='--xla_a=1'")
    assert launch_flags_hint("argument --topology: expected one argument", argv) == ""


def test_pools_given_badly_are_named_and_one_target_takes_no_list():
    with pytest.raises(TopologyError, match="names an empty pool; give pools as v5p-8,v4-8"):
        read_targets(argparse.Namespace(topology="v4-8,,v5e-16", slices=None))
    with pytest.raises(TopologyError, match="names v4-8x1 twice; give each pool once"):
        read_targets(argparse.Namespace(topology="v4-8,v4-8x1", slices=None))
    with pytest.raises(TopologyError, match="this command takes one target; `aotcheck fit` takes several pools"):
        read_target(argparse.Namespace(topology="v4-8,v5e-16", slices=None))
    assert [t.name for t in read_targets(argparse.Namespace(topology="v5p-8,h100-8", slices=2))] == [
        "v5p-8x2", "h100-8x2"]  # --slices applies to every pool.
