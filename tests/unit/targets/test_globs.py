"""aotcheck.targets.globs: which targets a config's glob names (issue 52, V53)."""

import pytest

from aotcheck.targets.globs import target_matches, unmatched_globs
from aotcheck.targets.topology import Target


@pytest.mark.parametrize("glob, one, two", [("v5e-16", True, True), ("v5e-16x1", True, False), ("v5e-*", True, True),
                                            ("v5litepod-16", True, True), ("V5E-16", True, True), ("*x2", False, True),
                                            ("v4-*", False, False)])
def test_a_topology_names_each_of_its_slices_and_a_target_only_itself(glob, one, two):
    assert (target_matches(Target.of("v5e-16"), glob), target_matches(Target.of("v5e-16", 2), glob)) == (one, two)


def test_globs_that_name_no_target_are_found():
    assert unmatched_globs(["*", "7x-8x*", "h100-*", "cpu-2", "v5e1", "h100-3"]) == ["v5e1", "h100-3"]
