"""aotcheck.targets.families: the books of chip families a process compiled for, and the one warning
when a second TPU family follows (libtpu carries compiler state across them; XLA's GPU compiler
does not). The books are reset per test (tests/conftest.py), so each test's are its own."""

import warnings

import pytest

from aotcheck.targets.families import family_of, note_family


@pytest.mark.parametrize("name, family", [("v5litepod-16", "v5e"), ("v4-8", "v4"), ("7x-8", "7x"),
                                          ("h100-8", "h100"), ("cpu-4", "cpu")])
def test_a_topology_is_kept_by_its_family(name, family):
    assert family_of(name) == family


def test_a_second_tpu_family_warns_once_naming_both():
    note_family("v4-8")
    note_family("v4-16")  # The same family: nothing to say.
    with pytest.warns(RuntimeWarning, match=r"compiled for v4 and now compiles for v5e\. libtpu carries") as said:
        note_family("v5e-16")
        note_family("v6e-8")  # Said once per process.
    assert len(said) == 1


def test_gpus_and_host_cpus_keep_no_books():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("h100-8", "a100-8", "cpu-4", "v4-8", "h200-8"):
            note_family(name)  # Only one TPU family among them: no warning.
