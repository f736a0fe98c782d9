"""aotcheck.programs.xla_flags: XLA_FLAGS as XLA reads it (the doctests hold the messages; the worker's
crash path is tests/e2e/test_hardening_process.py's)."""

from aotcheck.programs.xla_flags import unknown_xla_flags, xla_flags_problem


def test_tpu_flags_in_xla_flags_are_named_and_others_are_left_alone():
    assert xla_flags_problem("--xla_dump_to=/tmp/x") is None
    assert "--noxla_tpu_x, a TPU compiler flag" in xla_flags_problem("--noxla_tpu_x --xla_dump_to=/tmp")
    said = unknown_xla_flags(['Could not open file "junk" to read flags for environment variable "XLA_FLAGS"'])
    assert said.startswith("XLA_FLAGS is 'junk': XLA reads a value that does not start with '--' as the name")
    assert unknown_xla_flags(["nothing to see"]) is None
