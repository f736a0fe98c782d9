"""aotcheck.gate.pools and the pure fit over pools (aotcheck.figures.fit.over_pools): what fits every
pool a job may land on, as Hypothesis properties of the searches' answers, and the gate's outcomes
grouped into one answer per program. FAKE searches and outcomes (no compile): the real ones are
tests/e2e/test_cli.py's marin-shaped fit over v5p-8 and v4-8."""

import dataclasses
import math

import pytest
from hypothesis import given, strategies as st

from aotcheck.figures.fit import Fit, over_pools
from aotcheck.figures.program import Details
from aotcheck.gate.outcome import Failure, Outcome, Reason
from aotcheck.gate.pools import pooled_fits
from aotcheck.gate.verdict import Verdict
from aotcheck.errors import OutOfMemory
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.text import pools_lines

searches = st.dictionaries(st.sampled_from(["v5p-8x1", "v4-8x1", "v5e-16x1", "h100-8x1", "7x-8x1"]),
                           st.tuples(st.integers(0, 4096), st.sampled_from([1, 2, 4, 8, 16])), min_size=1)


def fit(size, step=4, knob="batch", probes=4):
    return Fit(knob, 32, step, size // step * step, None, None, probes=probes)


@given(searches)
def test_what_fits_every_pool_is_at_most_each_pools_answer_and_a_multiple_of_every_step(found):
    fits = {name: fit(size, step) for name, (size, step) in found.items()}
    pools = over_pools(fits)
    assert all(pools.max_size <= f.max_size for f in fits.values())
    assert pools.step == math.lcm(*(f.step for f in fits.values())) and pools.max_size % pools.step == 0
    smallest = min(f.max_size for f in fits.values())
    assert smallest - pools.step < pools.max_size <= smallest  # The largest such multiple.
    assert set(pools.limiting) == {n for n, f in fits.items() if f.max_size == smallest}
    assert pools.probes == 4 * len(fits) and list(pools.fits) == list(fits)


def test_pools_that_searched_different_knobs_are_not_one_answer():
    with pytest.raises(ValueError, match=r"searched different knobs \(batch, seq\)"):
        over_pools({"v4-8x1": fit(8), "v5p-8x1": fit(8, knob="seq")})


def outcome(config, program, topology, size, *, fits=True):
    case = Case.parse(f"{config}/{program}@{topology}" + ("" if "x" in topology else "x1"))
    details = Details(fit=fit(size))
    if fits:
        return Outcome(case, Verdict.PASS, measured=Measurement(case, {}, {}, 1.0, details=details))
    error = Failure.of(Reason.OUT_OF_MEMORY, OutOfMemory("RESOURCE_EXHAUSTED", details=details.to_json()))
    return Outcome(case, Verdict.OUT_OF_MEMORY, failed=True, error=error)


def test_the_gate_reads_one_answer_per_program_searched_on_several_pools():
    outcomes = [outcome("canary", "train_step", "v5p-8", 96), outcome("canary", "train_step", "v4-8", 20, fits=False),
                outcome("canary", "train_step", "v5p-8x2", 8),  # Another slice count: not a pool of these.
                outcome("canary", "prefill", "v5p-8", 64),  # One pool only: no answer over pools.
                outcome("llm", "step[tokens=64]", "v5e-16", 40), outcome("llm", "step[tokens=64]", "v6e-8", 48)]
    answers = {program: (p.max_size, p.limiting) for program, p in pooled_fits(outcomes)}
    # The OOM on v4-8 (the marin shape: the configured size fits v5p-8, not v4-8) carries its search too.
    assert answers == {"canary/train_step": (20, ("v4-8x1",)), "llm/step[tokens=64]": (40, ("v5e-16x1",))}


def test_the_answer_in_words_names_every_pool_its_own_answer_and_the_one_that_limits():
    pools = over_pools({"v5p-8x1": fit(96), "v4-8x1": fit(20), "h100-8x1": fit(60, step=8)})
    lines = pools_lines("canary/train_step", pools)
    assert lines[0] == ("canary/train_step: the largest batch that fits every pool (v5p-8x1, v4-8x1, h100-8x1) "
                        "is 16; v4-8x1 limits it")
    assert lines[1] == "  each pool's own: v5p-8x1 96, v4-8x1 20, h100-8x1 56 (every pool's batch is a multiple of 8)"
    assert lines[2] == "  12 compiles (v5p-8x1 4, v4-8x1 4, h100-8x1 4)"
    capped = dataclasses.replace(fit(256), upper_bound=True)  # The search's cap, not memory, stopped both.
    assert pools_lines("c/p", over_pools({"v4-8x1": capped, "v5e-16x1": capped}))[0] == (
        "c/p: the largest batch that fits every pool (v4-8x1, v5e-16x1) is 256 or more: v4-8x1 and v5e-16x1 "
        "reached the search's upper bound (fit_upper), not a limit")
    none = pools_lines("c/p", over_pools({"v5p-8x1": fit(8), "v4-8x1": fit(0)}))
    assert none == ["c/p: no batch fits every pool (v5p-8x1, v4-8x1) in steps of 4: v4-8x1 fits none.",
                    "  8 compiles (v5p-8x1 4, v4-8x1 4)"]
    # Found by review: v4-8 fits 4 (its step), but the common step is 8 (h100's).
    below = pools_lines("c/p", over_pools({"v4-8x1": fit(4), "h100-8x1": fit(64, step=8)}))
    assert below[0] == "c/p: no batch fits every pool (v4-8x1, h100-8x1) in steps of 8: v4-8x1 fits at most 4."
    mixed = over_pools({"v4-8x1": capped, "v5e-16x1": fit(256)})  # One capped, one stopped by memory.
    assert pools_lines("c/p", mixed)[0].endswith("is 256; v5e-16x1 limits it")


def test_aotcheck_report_gives_the_answer_over_pools_from_a_runs_report(tmp_path, capsys):
    from aotcheck.cli import main
    from aotcheck.gate.report import Report, write_report

    write_report(tmp_path / "r.json", Report([outcome("canary", "train_step", "v5p-8", 96),
                                              outcome("canary", "train_step", "v4-8", 20, fits=False)]))
    main(["report", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    # The report holds its cases failures first: the pools in that order.
    assert "canary/train_step: the largest batch that fits every pool (v4-8x1, v5p-8x1) is 20; v4-8x1 limits it" in out
