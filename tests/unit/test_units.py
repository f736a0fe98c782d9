"""units.py: how numbers read. Properties: the unit is the largest that keeps the number under its base."""

import re

from hypothesis import given, strategies as st

from aotcheck.units import fmt_bytes, fmt_count, fmt_pct, fmt_share

BINARY = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
SI = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


@given(st.integers(0, 2**50))
def test_bytes_read_back_to_within_their_rounding(n):
    value, unit = re.fullmatch(r"(\d+(?:\.\d\d)?) (B|KiB|MiB|GiB|TiB)", fmt_bytes(n)).groups()
    assert abs(float(value) * BINARY[unit] - n) <= 0.005 * BINARY[unit] * (1 + 1e-9)  # Half a cent, and float's own error.
    assert unit == "TiB" or float(value) < 1024 or round(n / BINARY[unit], 2) == 1024.0  # The largest unit under 1024.


@given(st.floats(0, 1e20, allow_nan=False))
def test_counts_read_back_to_within_their_rounding(n):
    value, unit = re.fullmatch(r"(\d+(?:\.\d\d)?) ?([KMGTPE]?)", fmt_count(n)).groups()
    assert abs(float(value) * SI[unit] - n) <= 0.5 * SI[unit] * (1 if unit == "" else 0.01)


def test_missing_values_read_as_a_dash_and_changes_carry_their_sign():
    assert fmt_bytes(None) == fmt_count(None) == fmt_pct(None) == "-"
    assert fmt_pct(0.25) == "+25.0%" and fmt_pct(-0.5) == "-50.0%" and fmt_share(0.00012) == "0.012%"
