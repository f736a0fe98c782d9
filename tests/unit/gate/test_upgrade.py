"""aotcheck.gate.upgrade: a run judged against goldens of another toolchain says which way it went
(an upgrade, a downgrade, neither), what moved and what did not. FAKE outcomes made by hand (the
comparison's rows as the gate makes them; nothing compiles)."""

from pathlib import Path

import pytest

from aotcheck.gate.compare import Change, Row, Tolerance
from aotcheck.gate.golden import Golden
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.upgrade import find_upgrade
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case

NOW = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "libtpu": "0.0.50.1"}


def judged(topology, toolchain, *, grew=False, verdict=None):
    golden = Golden({"peak_bytes": 100}, toolchain, {}, Path("g.json"))
    rows = [Row("peak_bytes", 100.0, 130.0, Tolerance(0.01), Change.REGRESSION)] if grew else []
    return Outcome(Case.of("lm", "prefill", topology), verdict or (Verdict.REGRESSION if grew else Verdict.PASS),
                   golden=golden, changes=rows)


@pytest.mark.parametrize("before, direction, steps", [
    ({"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}, "upgrade",
     {"jax": "newer", "jaxlib": "newer", "libtpu": "newer"}),
    ({**NOW, "libtpu": "0.0.51"}, "downgrade", {"libtpu": "older"}),
    ({**NOW, "jax": "0.10.2", "libtpu": "0.0.51"}, "change", {"jax": "newer", "libtpu": "older"}),
    ({**NOW, "libtpu": "nightly"}, "change", {"libtpu": "not comparable"}),
])
def test_the_direction_is_where_every_version_that_differs_went(before, direction, steps):
    up = find_upgrade([judged("v4-8", before)], now=NOW)
    assert (up.direction, up.steps, up.before) == (direction, steps, {k: before[k] for k in NOW})


def test_what_moved_and_what_did_not_and_the_goldens_most_common_toolchain():
    old = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
    other = {**old, "libtpu": "0.0.40"}
    outcomes = [judged("v4-8", old, grew=True), judged("v5e-16", old), judged("v6e-8", other), judged("v5p-8", NOW)]
    up = find_upgrade(outcomes, now=NOW)
    assert up.before == old  # Two goldens of three made with it.
    assert [(case, [r.metric for r in rows]) for case, rows in up.moved] == [("lm/prefill@v4-8x1", ["peak_bytes"])]
    assert up.unmoved == ["lm/prefill@v5e-16x1", "lm/prefill@v6e-8x1"]
    assert "lm/prefill@v5p-8x1" not in up.cases  # Judged against its own toolchain: not part of it.
    steps = find_upgrade([judged("v4-8", old), judged("v5e-16", {**NOW, "libtpu": "0.0.51"})], now=NOW).steps
    assert steps["libtpu"] == "newer than some goldens', older than others'"


def test_a_gpu_golden_is_compared_only_on_the_versions_it_records():
    gpu = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "jax-cuda12-pjrt": "0.12.0.1"}
    assert find_upgrade([judged("h100-8", gpu)], now=NOW) is None  # No libtpu there: nothing differs.
    assert find_upgrade([judged("v4-8", NOW)], now=NOW) is None
