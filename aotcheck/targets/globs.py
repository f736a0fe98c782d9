"""Globs over target names, as configs give them (``targets=``, ``fit_targets=``): which targets a glob
names, and globs that name none (a typo would skip a config everywhere, or search it nowhere)."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Sequence

from aotcheck.targets.topology import Target, TopologyError, _cpu_topology, split_target, topologies


def target_matches(target: Target, glob: str) -> bool:
    """Whether a config's target glob names ``target``: as ``TOPOLOGYxSLICES`` (``v5e-1x1``, ``7x-8x*``), or as
    a topology alone, which means each of its slices (``v5e-1``, ``v5e-*``; an alias too: ``v5litepod-16``).

    Example:
        >>> [target_matches(Target.parse("v5e-1x1"), g) for g in ("v5e-1x1", "v5e-1", "v5e-*", "v5litepod-1", "v5e-1x2")]
        [True, True, True, True, False]
    """
    if fnmatch.fnmatchcase(target.name, glob) or fnmatch.fnmatchcase(target.topology.name, glob):
        return True
    try:  # A plain name in another spelling (an alias, capitals).
        topology, slices = split_target(glob)
    except TopologyError:
        return False
    return topology == target.topology and slices in (None, target.num_slices)


def declared_targets(globs: Sequence[str]) -> tuple[Target, ...]:
    """The targets a config declares by name among its ``targets=`` globs: a ``TOPOLOGYxSLICES`` without a
    wildcard (``v5e-1x1``, not ``v5e-1`` or ``7x-8x*``). The plan compiles a config on these whatever the
    run's topologies are: a server sized for one slice is checked where it is deployed.

    Example:
        >>> [t.name for t in declared_targets(["v5e-1x1", "7x-8x*", "v4-8", "*", "v5litepod-4x2"])]
        ['v5e-1x1', 'v5e-4x2']
    """
    out: list[Target] = []
    for glob in globs:
        if any(c in glob for c in "*?["):
            continue
        try:
            topology, slices = split_target(glob)
        except TopologyError:
            continue  # A typo is unmatched_globs' to name, when the config is built.
        if slices is not None and Target(topology, slices) not in out:
            out.append(Target(topology, slices))
    return tuple(out)


def unmatched_globs(globs: Sequence[str]) -> list[str]:
    """The globs of ``globs`` that no target names (:func:`target_matches`).

    Example:
        >>> unmatched_globs(["v5e-1", "7x-8x*", "cpu-*", "*", "v5e1", "v5e-1x0"])
        ['v5e1', 'v5e-1x0']
    """
    return [g for g in globs if not _matches_some_target(g)]


@functools.lru_cache(maxsize=256)
def _matches_some_target(glob: str) -> bool:
    try:  # A name: of a topology or a target, in any spelling aotcheck reads.
        split_target(glob)
        return True
    except TopologyError:
        pass
    names = [t.name for t in (*topologies(), *(_cpu_topology(n) for n in (1, 2, 4, 8)))]
    return any(fnmatch.fnmatchcase(name, glob) or any(fnmatch.fnmatchcase(f"{name}x{k}", glob) for k in (1, 2, 3, 4))
               for name in names)
