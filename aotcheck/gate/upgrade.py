"""A toolchain upgrade, as the gate saw it: which cases were judged against goldens made with another
toolchain, which of their figures moved and by how much, which did not move, and which way it went: an
upgrade (this run's versions newer), a downgrade (the goldens' newer: the CI lock or this machine is behind
them, and their figures are not to be overwritten), or a change that is neither.

The most reported memory regressions in this field come from toolchain bumps, so a run under a new
jax or libtpu says in one table what the bump did (:mod:`aotcheck.render.upgrade` words it for the
terminal and the Markdown summary), with the one command that accepts it all (:mod:`aotcheck.render.accept`).

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> from pathlib import Path
    >>> from aotcheck.gate.compare import Change, Row, Tolerance
    >>> from aotcheck.gate.golden import Golden
    >>> from aotcheck.gate.outcome import Outcome
    >>> from aotcheck.gate.verdict import Verdict
    >>> old = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
    >>> now = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "libtpu": "0.0.50.1"}
    >>> golden = Golden({"peak_bytes": 100}, old, {}, Path("golden.json"))
    >>> moved = Outcome(Case.of("lm", "prefill", "v4-8"), Verdict.REGRESSION, golden=golden,
    ...                 changes=[Row("peak_bytes", 100.0, 120.0, Tolerance(0.01), Change.REGRESSION)])
    >>> still = Outcome(Case.of("lm", "prefill", "v5e-16"), Verdict.PASS, golden=golden)
    >>> up = find_upgrade([moved, still], now=now)
    >>> up.before, [(c, [r.metric for r in rows]) for c, rows in up.moved], up.unmoved
    ({'jax': '0.10.2', 'jaxlib': '0.10.2', 'libtpu': '0.0.42.1'}, [('lm/prefill@v4-8x1', ['peak_bytes'])], ['lm/prefill@v5e-16x1'])
    >>> up.direction, find_upgrade([moved, still], now={"jax": "0.9.9", "libtpu": "0.0.42.1"}).direction
    ('upgrade', 'downgrade')
    >>> find_upgrade([still], now=old) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from aotcheck.gate.compare import Change, Row
from aotcheck.gate.golden import version_step
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case


class Upgrade(NamedTuple):
    """Cases judged against goldens of another toolchain.

    Attributes:
        before: The goldens' toolchain (the most common one when they differ).
        now: This run's toolchain.
        moved: ``(case id, rows)`` for each case with a figure beyond tolerance, new or gone.
        unmoved: Case ids whose figures all stayed within tolerance.
        cases: Every case of the upgrade (what the accept command covers), by id.
        direction: ``"upgrade"`` when every version that differs is newer now than in every golden,
            ``"downgrade"`` when every one is older (the goldens are ahead: never accept these figures over
            them), ``"change"`` otherwise (some newer, some older, or a version that does not compare).
        steps: Package -> how its version now stands to the goldens' (:func:`version_step`, or newer than
            some goldens', older than others'), for each that differs.
    """

    before: dict[str, str | None]
    now: dict[str, str | None]
    moved: list[tuple[str, list[Row]]]
    unmoved: list[str]
    cases: list[Case]
    direction: str = "upgrade"
    steps: dict[str, str] = {}


def find_upgrade(outcomes: Sequence[Outcome], *, now: Mapping[str, str | None]) -> Upgrade | None:
    """The upgrade these outcomes show, or None when every compared golden has this toolchain.

    Only the versions both record are compared: a GPU golden records the CUDA plugin where a TPU
    golden records libtpu (each case's own note compares all of its platform's)."""
    foreign = [o for o in outcomes if o.golden is not None
               and any(o.golden.toolchain.get(k) != v for k, v in now.items() if k in o.golden.toolchain)]
    if not foreign:
        return None
    seen: dict[tuple[tuple[str, str | None], ...], int] = {}
    for o in foreign:
        key = tuple((k, o.golden.toolchain.get(k)) for k in now if k in o.golden.toolchain)
        seen[key] = seen.get(key, 0) + 1
    before = dict(max(seen, key=lambda k: seen[k]))
    moved, unmoved = [], []
    for o in sorted(foreign, key=lambda o: o.case.id):
        rows = [r for r in o.changes if r.change is not Change.OK]
        if rows or o.verdict in (Verdict.METRICS_CHANGED,):
            moved.append((o.case.id, rows))
        else:
            unmoved.append(o.case.id)
    steps: dict[str, set[str]] = {}
    for o in foreign:
        for k, v in now.items():
            if k in o.golden.toolchain and o.golden.toolchain[k] != v:
                steps.setdefault(k, set()).add(version_step(o.golden.toolchain[k], v))
    said = {k: found.pop() if len(found) == 1 else "not comparable" if "not comparable" in found
            else "newer than some goldens', older than others'" for k, found in steps.items()}
    ways = set(said.values())
    direction = "upgrade" if ways == {"newer"} else "downgrade" if ways == {"older"} else "change"
    return Upgrade(before, dict(now), moved, unmoved, [o.case for o in sorted(foreign, key=lambda o: o.case.id)],
                   direction, said)
