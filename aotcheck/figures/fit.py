"""How much room is left: the largest batch (or other knob) whose program compiles and fits HBM.

Peak memory is close to affine in the batch for a fixed program, so two
compiles predict the limit and two more confirm it: the prediction fits and one
step above does not. When a confirmation disagrees (remat and fusion choices
make steps), the search falls back to bisection between what is known to fit
and what is known not to. The answer is always confirmed by real compiles: the
max fits, the next step does not (or the search says it hit its upper bound).

Sizes are whole steps: a batch must divide over the devices it is sharded on.

Example (FAKE probe: an affine peak, so nothing compiles):
    >>> def probe(size):  # 1 GiB of parameters, 3 MiB per sequence; 16 GiB of HBM
    ...     peak = 2**30 + size * 3 * 2**20
    ...     return Probe(size, peak, peak <= 16 * 2**30)
    >>> found = search(probe, configured=64, step=8, limit=16 * 2**30)
    >>> found.max_size, found.probes, found.bisected
    (5120, 4, False)

Where the line bends (a fusion choice makes a step), bisection finds the answer:

    >>> def stepped(size):
    ...     peak = 2**30 + size * 3 * 2**20 + (2 * 2**30 if size > 3000 else 0)
    ...     return Probe(size, peak, peak <= 16 * 2**30)
    >>> found = search(stepped, configured=64, step=8, limit=16 * 2**30)
    >>> found.max_size, found.bisected
    (4432, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

from aotcheck.records import Record, field
from aotcheck.errors import Overflow
from aotcheck.figures.attribution import PeakBuffer
from aotcheck.targets.usable import Usable

DEFAULT_UPPER = 4096  # The search's upper bound, in multiples of the configured size.


class Probe(NamedTuple):
    """One compile of the program at ``size``: its peak (None when XLA ran out of memory) and whether it
    fits; ``refused``: XLA refused it for a memory space other than HBM (a kernel's VMEM), not for HBM;
    ``needed``: what XLA said it needs when it ran out of HBM (its record's ``size_bytes``: a point on the
    line all the same)."""

    size: int
    peak_bytes: int | None
    fits: bool
    refused: Overflow | None = None
    needed: int | None = None

    @property
    def bytes(self) -> int | None:
        """The program's memory at this size, measured or as XLA stated it."""
        return self.peak_bytes if self.peak_bytes is not None else self.needed


@dataclasses.dataclass(frozen=True)
class Fit(Record):
    """What a fit search found.

    Attributes:
        knob: What was searched (``batch`` by default).
        configured: The config's own size.
        step: Sizes searched are multiples of it.
        max_size: The largest size that compiled and fit (0: not even ``step``).
        peak_at_max: Its peak per device.
        peak_at_configured: The peak at the configured size.
        probes: Compiles the search asked for (a cache hit counts: it stands for one).
        bisected: The affine prediction was not confirmed; bisection found the answer.
        upper_bound: ``max_size`` is the search's upper bound: the real limit may be higher.
        smallest_peak: The peak at ``step`` when even that did not fit (None otherwise, or when XLA ran out).
        split_at_max: The peak at the max by class (``peak_*_bytes``), when attributed.
        buffers_at_max: The largest buffers at the peak at the max: what fills the memory there.
        refused: The size one step above the max (``step`` when nothing fits) did not compile because an op
            overflows another memory space than HBM (a kernel's VMEM): what XLA said. None: HBM is the limit.
        usable: What the search held a device to, where less than its memory: a GPU process's share
            (:func:`aotcheck.targets.usable.usable_memory`). None: the device's memory (a TPU).
    """

    knob: str
    configured: int
    step: int
    max_size: int
    peak_at_max: int | None
    peak_at_configured: int | None
    probes: int
    bisected: bool = False
    upper_bound: bool = False
    smallest_peak: int | None = None
    split_at_max: dict[str, int] = dataclasses.field(default_factory=dict)
    buffers_at_max: list[PeakBuffer] = dataclasses.field(default_factory=list)
    # Each written only when there is one: goldens of TPU searches bound by HBM stay as they were.
    refused: Overflow | None = field(default=None, omit="none")
    usable: Usable | None = field(default=None, omit="none")


def search(
    probe: Callable[[int], Probe], *, configured: int, step: int, limit: int, upper: int | None = None,
    knob: str = "batch",
) -> Fit:
    """The largest multiple of ``step`` that ``probe`` says fits (see the module's docstring).

    ``limit`` is the HBM a device may use (the affine model's target); ``upper``
    caps the search (default :data:`DEFAULT_UPPER` times the configured size).
    """
    base = max(1, configured // step)
    top = max(base, (upper // step) if upper else DEFAULT_UPPER * base)
    seen: dict[int, Probe] = {}

    def at(k: int) -> Probe:
        if k not in seen:
            seen[k] = probe(k * step)
        return seen[k]

    def done(lo: int, *, bisected: bool) -> Fit:
        above = seen.get(lo + 1)  # What stopped it: HBM, or another memory space.
        return Fit(knob, configured, step, lo * step, at(lo).peak_bytes if lo else None, at(base).peak_bytes,
                   len(seen), bisected, upper_bound=lo == top, refused=above.refused if above else None)

    if not at(base).fits:
        if base == 1 or not at(1).fits:
            return Fit(knob, configured, step, 0, None, at(base).peak_bytes, len(seen), smallest_peak=at(1).peak_bytes,
                       refused=at(1).refused)
        lo, hi = 1, base
    else:
        lo, hi = base, None
        # A second point far from the first makes the line's slope exact where it matters. Assuming
        # no fixed part (all of the peak grows with the size) underestimates the limit: 90% of that
        # should fit, and lands close to the limit.
        peak = at(base).peak_bytes or 1
        second = min(top, max(base + 1, int(0.9 * base * limit / peak)))
        if at(second).fits:
            lo = second
        else:
            hi = second
        if lo == top:
            return done(lo, bisected=False)
    for _ in range(2):  # The prediction, then once more through the probe nearest the limit.
        predicted = _predict(seen, limit)
        if predicted is None or (hi is not None and hi - lo <= 1):
            break
        k = min(top, max(lo + 1, min(predicted, (hi - 1) if hi else top)))
        if at(k).fits:
            lo = k
            if k == top:
                return done(lo, bisected=False)
            if not at(k + 1).fits:
                return done(k, bisected=False)
            lo = k + 1
            if lo == top:  # The cap fits: never probe past it.
                return done(lo, bisected=False)
        else:
            hi = k
            if at(k - 1).fits:
                return done(k - 1, bisected=False)
            hi = k - 1
    # Bisection: find a size that does not fit (doubling), then halve the gap.
    if hi is not None and hi - lo <= 1:
        return done(lo, bisected=False)
    while hi is None:
        k = min(2 * lo, top)
        if at(k).fits:
            lo = k
            if k == top:
                return done(lo, bisected=True)
        else:
            hi = k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid).fits else (lo, mid)
    return done(lo, bisected=True)


def _predict(seen: Mapping[int, Probe], limit: int) -> int | None:
    """The largest k whose affine peak stays within ``limit``: through the largest size that fits and the
    smallest that does not (its peak, or what XLA said it needs), where both are known; else through the
    two largest that fit."""
    fitting = sorted((k, p.bytes) for k, p in seen.items() if p.fits and p.bytes is not None)
    over = sorted((k, p.bytes) for k, p in seen.items() if not p.fits and p.bytes is not None)
    over = [point for point in over if fitting and point[0] > fitting[-1][0]]
    if fitting and over:
        (k0, p0), (k1, p1) = fitting[-1], over[0]
    elif len(fitting) >= 2:
        (k0, p0), (k1, p1) = fitting[-2], fitting[-1]
    else:
        return None
    slope = (p1 - p0) / (k1 - k0)
    if slope <= 0:
        return None
    return int((limit - p0) // slope) + k0


@dataclasses.dataclass(frozen=True)
class Pools(Record):
    """A fit over several pools a job may land on (a scheduler's fallbacks: v5p-8, else v4-8).

    Attributes:
        knob: What was searched.
        max_size: The largest size that fits every pool: the smallest pool's answer, down to a
            multiple of every pool's step (a batch must divide over each pool's devices).
        step: The step every pool's size is a multiple of (their least common multiple).
        limiting: The pools whose own answer is the smallest: what a larger size would not fit.
        fits: Each pool's own search, by target name, in the order given.
    """

    knob: str
    max_size: int
    step: int
    limiting: tuple[str, ...]
    fits: dict[str, Fit] = field(key="pools")

    __json_extra__ = {"probes": lambda pools: pools.probes}

    @property
    def probes(self) -> int:
        return sum(f.probes for f in self.fits.values())


def over_pools(fits: Mapping[str, Fit]) -> Pools:
    """What fits every pool, from each pool's own search (each confirmed by its compiles: its max fits,
    one step above does not). A smaller size fits a pool wherever memory does not shrink as the knob
    grows, which is what the search assumes within a pool too.

    Example (FAKE searches, as :func:`search` would return them):
        >>> fit = lambda size, step: Fit("batch", 32, step, size, None, None, probes=4)
        >>> pools = over_pools({"v5p-8x1": fit(96, 4), "v4-8x1": fit(20, 4), "h100-8x1": fit(60, 8)})
        >>> pools.max_size, pools.step, pools.limiting, pools.probes
        (16, 8, ('v4-8x1',), 12)
    """
    if not fits:
        raise ValueError("over_pools needs at least one pool's search")
    knobs = {f.knob for f in fits.values()}
    if len(knobs) != 1:
        raise ValueError(f"over_pools: the pools searched different knobs ({', '.join(sorted(knobs))})")
    step = math.lcm(*(f.step for f in fits.values()))
    smallest = min(f.max_size for f in fits.values())
    limiting = tuple(name for name, f in fits.items() if f.max_size == smallest)
    return Pools(knobs.pop(), smallest // step * step, step, limiting, dict(fits))
