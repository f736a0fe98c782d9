"""A run's analyses, computed once: from its cases' outcomes and the plan's facts (its servers), what a
report carries beside the outcomes. A session calls :func:`analyse` as it finishes, and
:func:`aotcheck.gate.report.merge_reports` calls it again over the merged cases (with the servers, the
tolerance and what a device may hold that the shards recorded), so a merge judges as a run does; render/
only words the result.

What it gives (:class:`Analysis`):

- each server's start-up bill per target with its boot budget (:mod:`aotcheck.gate.bill`,
  :mod:`aotcheck.gate.boot`), accepted into the goldens by an update where it is beyond its tolerance, and
  the outcomes of the buckets so accepted marked changed;
- every program searched on several pools, as one answer over them (:mod:`aotcheck.gate.pools`);
- the toolchain upgrade the goldens show, if any (:mod:`aotcheck.gate.upgrade`).

Example (FAKE outcomes: a server's two buckets as the gate records them, nothing compiles):
    >>> from pathlib import Path
    >>> from aotcheck.gate.golden import Golden
    >>> from aotcheck.gate.verdict import Verdict
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.pipeline.measurement import Measurement
    >>> from aotcheck.programs.serving import Server
    >>> def bucket(tokens, seconds):
    ...     case = Case.of("llm", f"step[tokens={tokens}]", "v5e-8")
    ...     golden = Golden({"compile_cpu_seconds": 2.0}, {"jax": "0.0.1"}, {}, Path("g"))
    ...     return Outcome(case, Verdict.PASS, measured=Measurement(case, {"compile_cpu_seconds": seconds}, {}, 1.0),
    ...                    golden=golden)
    >>> found = analyse([bucket(16, 2.0), bucket(32, 40.0)], {"llm": Server("llm", ("step",))}, toolchain={"jax": "0.0.2"})
    >>> [(b.config, b.target, b.seconds, b.grew) for b in found.bills], found.pools
    ([('llm', 'v5e-8x1', 42.0, True)], [])
    >>> found.upgrade.before, found.upgrade.direction
    ({'jax': '0.0.1'}, 'upgrade')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from aotcheck.figures.fit import Pools
from aotcheck.gate.bill import Bill, accept_bills, served, startup_bills
from aotcheck.gate.compare import DEFAULT_TOLERANCES, Tolerance
from aotcheck.gate.golden import GoldenStore
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.pools import pooled_fits
from aotcheck.gate.upgrade import Upgrade, find_upgrade
from aotcheck.gate.verdict import GoldenAction
from aotcheck.programs.serving import Server
from aotcheck.targets.usable import Usable


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What a report carries beside its cases, derived from them once.

    Attributes:
        outcomes: The cases' outcomes; a bucket whose bill an update accepted is marked changed (its golden
            was rewritten).
        bills: Each server's start-up bill per target, with its boot (:class:`~aotcheck.gate.bill.Bill`).
        pools: ``(config/program, what fits every pool)`` for each program searched on several pools.
        upgrade: The toolchain upgrade the goldens show (None: every compared golden is of this toolchain).
    """

    outcomes: list[Outcome]
    bills: list[Bill]
    pools: list[tuple[str, Pools]]
    upgrade: Upgrade | None


def analyse(outcomes: Sequence[Outcome], servers: Mapping[str, Server], *, toolchain: Mapping[str, str | None],
            tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES, judge: bool = True,
            accept_into: GoldenStore | None = None, partial: Collection[tuple[str, str]] = (),
            usable: Mapping[tuple[str, str], Usable] | None = None,
            memory_fraction: tuple[float | None, str] = (None, "")) -> Analysis:
    """The run's analyses from its ``outcomes`` and its ``servers`` (:attr:`aotcheck.plan.Plan.servers`, or a
    report's). ``toolchain``: this run's versions (the upgrade is against them); ``tolerances``: the run's
    (a bill is judged under ``compile_cpu_seconds``'s), and ``judge=False`` sums bills without judging;
    ``accept_into``: an ``--update-golden`` run's golden store, where a bill beyond its tolerance is accepted
    (:func:`aotcheck.gate.bill.accept_bills`); ``partial``: the ``(config, target)`` of servers some of whose
    buckets ran in another shard (summed, not judged). What a device may hold per ``(config, target)``: as
    ``usable`` gives it (what the shards found), else the server's own memory fraction, else
    ``memory_fraction`` (the ini's share and how the run names it), else this process's environment."""
    room = {**_usable(outcomes, servers, memory_fraction), **(usable or {})}
    if accept_into is not None:
        bills = accept_bills(outcomes, accept_into, tolerances, partial=partial, usable=room, servers=servers)
    else:
        bills = startup_bills(outcomes, tolerances, judge=judge, partial=partial, usable=room, servers=servers)
    # A bill an update accepted rewrote its buckets' goldens: none of them is unchanged.
    accepted = {(b.config, b.target) for b in bills if b.accepted}
    outcomes = [dataclasses.replace(o, golden_action=GoldenAction.CHANGED)
                if (o.case.config, o.case.target.name) in accepted and o.golden_action is GoldenAction.UNCHANGED
                else o for o in outcomes]
    return Analysis(outcomes, bills, pooled_fits(outcomes), find_upgrade(outcomes, now=toolchain))


def _usable(outcomes: Sequence[Outcome], servers: Mapping[str, Server],
            memory_fraction: tuple[float | None, str]) -> dict[tuple[str, str], Usable]:
    """What a device may hold per served ``(config, target)`` among ``outcomes`` whose server is known: its
    own memory fraction, else ``memory_fraction``, else this process's environment (none on a host's CPU)."""
    out: dict[tuple[str, str], Usable] = {}
    for o in outcomes:
        key = (o.case.config, o.case.target.name)
        server = servers.get(o.case.config)
        if not served(o) or key in out or server is None:
            continue
        room = server.usable(o.case.topology, memory_fraction)
        if room is not None:
            out[key] = room
    return out
