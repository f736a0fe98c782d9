"""Which chip families this process has compiled for: libtpu carries compiler state across them.

Measured with libtpu 0.0.42.1: after one compile for v5e, v5p or v6e, a process
compiles the *same* lowered v4 multi-slice program differently (lm-1b prefill on
v4-8 x2: 308 all-gathers instead of 200, +3.4 GiB of collectives per device),
while a fresh process, or one that only ever compiled for v4, always gives the
same figures. Loading a topology does not do it; compiling does. libtpu 0.0.50.1 compiles
that program the same either way (tests/unit/gate/test_isolation.py); the books and the isolation stay
for the oldest supported libtpu and for programs that may still show state.

This module only keeps the books (the compile path notes each family it
compiles for; a platform says whether its compiler carries state across
families, :attr:`~aotcheck.targets.platform.Platform.state_crosses_families`);
:mod:`aotcheck.gate.isolation` decides where a case runs.

Example:
    >>> from aotcheck.targets.families import family_of
    >>> family_of("v5litepod-16"), family_of("cpu-4")
    ('v5e', 'cpu')
"""

from __future__ import annotations

import threading
import warnings

from aotcheck.targets.topology import Topology, parse_topology

_compiled: set[str] = set()  # Families this process has compiled for.
_warned = False
_lock = threading.Lock()


def family_of(topology: str | Topology) -> str:
    """``"v4"``, ``"v5e"``, ``"h100"``, ... or ``"cpu"``: what a compile worker is kept per."""
    return parse_topology(topology).family


def note_family(topology: str | Topology) -> None:
    """Records a compile for ``topology``'s family; warns once when a second TPU family follows
    (libtpu's state; XLA's GPU compiler keeps none across GPU models)."""
    global _warned
    topo = parse_topology(topology)
    if not topo.platform.state_crosses_families:
        return
    family = topo.family
    with _lock:
        others = _compiled - {family}
        _compiled.add(family)
        if not others or _warned:
            return
        _warned = True
    warnings.warn(
        f"aotcheck: this process compiled for {', '.join(sorted(others))} and now compiles for {family}. "
        f"libtpu carries compiler state across chip families, so these figures may differ from a fresh "
        f"process's. The pytest plugin isolates families; in scripts, compile one family per process.",
        RuntimeWarning,
        stacklevel=3,
    )
