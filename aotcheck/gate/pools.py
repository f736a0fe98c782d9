"""Every pool a job may land on: one program's fit searches on several targets (a config's
``fit_targets`` over v5p-8 and v4-8, say) read as one answer, the largest size that fits them all,
and which pool limits it. A scheduler that falls back from one pool to another runs the job where
nobody compiled it unless the gate did (marin #6345: a step that fit v5p-8 OOMed on v4-8 three days
running).

Example (FAKE outcomes: searches as the gate records them, nothing compiles):
    >>> from aotcheck.figures.fit import Fit
    >>> from aotcheck.figures.program import Details
    >>> from aotcheck.gate.outcome import Outcome
    >>> from aotcheck.gate.verdict import Verdict
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.pipeline.measurement import Measurement
    >>> def searched(topology, size):
    ...     case = Case.parse(f"canary/train_step@{topology}" + ("" if "x" in topology else "x1"))
    ...     fit = Fit("batch", 32, 4, size, None, None, probes=4)
    ...     return Outcome(case, Verdict.PASS, measured=Measurement(case, {}, {}, 1.0, details=Details(fit=fit)))
    >>> [(program, p.max_size, p.limiting) for program, p in pooled_fits([searched("v5p-8", 96), searched("v4-8", 20)])]
    [('canary/train_step', 20, ('v4-8x1',))]
    >>> pooled_fits([searched("v5p-8", 96), searched("v5p-8x2", 20)])  # Two slice counts: no pools.
    []
"""

from __future__ import annotations

from collections.abc import Sequence

from aotcheck.figures.fit import Fit, Pools, over_pools
from aotcheck.gate.outcome import Outcome


def pooled_fits(outcomes: Sequence[Outcome]) -> list[tuple[str, Pools]]:
    """``(config/program, what fits every pool)`` for each program whose fit was searched on two pools or
    more: targets of as many slices (a job's slice count is its own, not a pool it falls back to), the
    same knob; a serving bucket is a program of its own. In the order of each program's first case."""
    found: dict[tuple[str, int, str], dict[str, Fit]] = {}
    for o in outcomes:
        fit = o.details.fit if o.details is not None else None
        if fit is not None:
            key = (f"{o.case.config}/{o.case.program_id}", o.case.num_slices, fit.knob)
            found.setdefault(key, {})[o.case.target.name] = fit
    return [(program, over_pools(fits)) for (program, _, _), fits in found.items() if len(fits) > 1]
