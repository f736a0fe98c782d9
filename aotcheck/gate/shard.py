"""Splitting the case matrix across CI runners: deterministic, balanced, complete.

Cases are weighed by what their compile costs: the CPU seconds recorded in each
case's golden (``compile_cpu_seconds + lower_cpu_seconds``, committed, so every
runner reads the same numbers), and for a case without one a guess from its kind
(a train step four times an inference method; more slices, more work) in the
seconds the recorded cases show per unit of that guess. They are then dealt
heaviest first to the lightest shard, ties by id, so every runner computes the
same split from the same matrix and every case lands in exactly one shard.

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.gate.shard import assign_shards, parse_shard
    >>> parse_shard("2/3")
    (2, 3)
    >>> cases = [Case.of("lm", p, "v4-8", 1) for p in ("train_step", "prefill", "sample_decode")]
    >>> sorted(assign_shards(cases, 2).items())
    [('lm/prefill@v4-8x1', 2), ('lm/sample_decode@v4-8x1', 2), ('lm/train_step@v4-8x1', 1)]
    >>> seconds = expected_seconds(cases, {"lm/train_step@v4-8x1": 2.0, "lm/prefill@v4-8x1": 9.0})
    >>> seconds["lm/sample_decode@v4-8x1"]  # None recorded: its weight, 1, at the median 0.5 and 9 s per unit.
    4.75
    >>> sorted(assign_shards(cases, 2, seconds=seconds).items())
    [('lm/prefill@v4-8x1', 1), ('lm/sample_decode@v4-8x1', 2), ('lm/train_step@v4-8x1', 2)]
"""

from __future__ import annotations

import heapq
import re
import statistics
import zlib
from collections.abc import Callable, Iterable, Mapping

from aotcheck.errors import AotcheckError
from aotcheck.pipeline.case import Case
from aotcheck.units import read_count


class ShardError(AotcheckError, ValueError):
    """A shard spec that is not K/N with 1 <= K <= N."""


MAX_SHARDS = 10_000  # No CI splits one run 10,000 ways.
MAX_JOBS = 256  # GitHub Actions runs at most 256 jobs of one matrix: past it, a job runs several shards.
# The action runs a job's shards side by side, each a pytest session of its own (0.4-0.8 GB, its compile
# workers beside it): past 4 a runner's memory (16 GB on GitHub's larger ones) runs out (hardening round 5, V40).
MAX_SHARDS_PER_JOB = 4


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)``: shard K (1-based) of N."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise ShardError(f"{text!r} is not K/N (e.g. 1/4: the first of 4 shards).")
    k, n = read_count(match[1]), read_count(match[2])
    if n < 1 or not 1 <= k <= n:
        raise ShardError(f"{text!r}: K must be between 1 and N (N >= 1), e.g. 1/{min(max(n, 1), MAX_SHARDS)}.")
    if n > MAX_SHARDS:
        raise ShardError(f"{text!r}: {n:,} shards is more than a CI matrix runs (at most {MAX_SHARDS:,}); give the "
                         "number of runners, e.g. 1/4.")
    return k, n


def case_weight(case: Case) -> float:
    """Relative compile cost: train steps (forward, backward, optimizer) outweigh inference."""
    program = 4.0 if case.program == "train_step" else 1.0
    return program * (1.0 + 0.5 * (case.num_slices - 1))


def expected_seconds(cases: Iterable[Case], recorded: Mapping[str, float]) -> dict[str, float]:
    """Case id -> its expected compile seconds: ``recorded[id]`` (from its golden) where there is a
    positive one, else :func:`case_weight` times the median recorded seconds per unit of weight
    (1 s per unit when nothing is recorded)."""
    cases = list(cases)
    known = {c.id: float(recorded[c.id]) for c in cases if recorded.get(c.id, 0) > 0}
    per_unit = statistics.median(known[c.id] / case_weight(c) for c in cases if c.id in known) if known else 1.0
    return {c.id: known.get(c.id, case_weight(c) * per_unit) for c in cases}


def assign_shards(cases: Iterable[Case], num_shards: int, *, seconds: Mapping[str, float] | None = None
                  ) -> dict[str, int]:
    """Case id -> shard (1-based), greedy by cost, longest first (``seconds`` by case id, else
    :func:`case_weight`). No shard exceeds the best possible split by more than the largest case.

    Past :data:`MAX_JOBS` shards, a CI job runs several (:func:`job_layout`): cases are dealt to the
    jobs first (each weighed by how many shards it runs), then within each job to its shards, so that
    no *job* exceeds the best split by more than the largest case either."""
    def cost(case: Case) -> float:
        return seconds[case.id] if seconds is not None else case_weight(case)

    ordered = sorted(set(cases), key=lambda c: (-cost(c), c.id))
    if num_shards <= MAX_JOBS:
        return _deal(ordered, [(shard, 1) for shard in range(1, num_shards + 1)], cost)
    layout = job_layout(num_shards)
    job_of = _deal(ordered, [(job, len(shards)) for job, shards in enumerate(layout)], cost)
    out: dict[str, int] = {}
    for job, shards in enumerate(layout):
        out.update(_deal([c for c in ordered if job_of[c.id] == job], [(k, 1) for k in shards], cost))
    return out


def _deal(ordered: list[Case], bins: list[tuple[int, int]], cost: Callable[[Case], float]) -> dict[str, int]:
    """Each case (heaviest first) to the bin whose load per unit of capacity is least (``bins``: id,
    capacity); ties by id, so every runner deals alike."""
    # Bins past the case count get none: no heap entry for them (N may be large).
    heap = [(0.0, bin_id, capacity) for bin_id, capacity in bins[: len(ordered)]]
    heapq.heapify(heap)
    loads: dict[int, float] = {}
    out: dict[str, int] = {}
    for case in ordered:
        _, bin_id, capacity = heapq.heappop(heap)
        out[case.id] = bin_id
        loads[bin_id] = loads.get(bin_id, 0.0) + cost(case)
        heapq.heappush(heap, (loads[bin_id] / capacity, bin_id, capacity))
    return out


def shard_of_name(name: str, num_shards: int) -> int:
    """The shard (1-based) of a test that is not a case (a user's own ``aotcheck``-marked test), by
    a digest of its name: the same on every runner.

    Example:
        >>> shard_of_name("tests/test_model.py::test_shapes", 3) == shard_of_name("tests/test_model.py::test_shapes", 3)
        True
    """
    return zlib.crc32(name.encode()) % num_shards + 1


def github_layout(num_shards: int) -> list[range]:
    """The shards each job of a GitHub Actions matrix runs (``aotcheck shards N``): :func:`job_layout` over
    its 256 jobs; a ShardError, in the command's words, past what its jobs can run side by side.

    Example:
        >>> len(github_layout(1024)), github_layout(1024)[0]
        (256, range(1, 5))
        >>> github_layout(1025)
        Traceback (most recent call last):
        ...
        aotcheck.gate.shard.ShardError: aotcheck shards 1025: at most 1,024 shards (GitHub's 256 jobs of a matrix, 4 shards a job side by side, each a pytest session of its own: more would run a runner out of memory); e.g. aotcheck shards 1024
    """
    most = MAX_JOBS * MAX_SHARDS_PER_JOB
    if not 1 <= num_shards <= most:
        raise ShardError(f"aotcheck shards {num_shards}: at most {most:,} shards (GitHub's {MAX_JOBS} jobs of a matrix, "
                         f"{MAX_SHARDS_PER_JOB} shards a job side by side, each a pytest session of its own: more would "
                         f"run a runner out of memory); e.g. aotcheck shards {min(max(num_shards, 1), most)}")
    return job_layout(num_shards)


def job_layout(num_shards: int, *, max_jobs: int = MAX_JOBS) -> list[range]:
    """The shards (1-based) each CI job runs: ``num_shards`` over at most ``max_jobs`` jobs, each job
    the same number of consecutive shards (the last one fewer where they do not divide), so jobs carry
    alike loads whenever shards do (:func:`assign_shards` deals cases to shards, not to jobs).

    Example:
        >>> [f"{r.start}-{r.stop - 1}" for r in job_layout(10, max_jobs=4)]
        ['1-3', '4-6', '7-9', '10-10']
        >>> len(job_layout(1000)), len(job_layout(1000)[0]), len(job_layout(256))
        (250, 4, 256)
    """
    if num_shards < 1 or max_jobs < 1:
        raise ShardError(f"{num_shards} shards over {max_jobs} jobs: both must be at least 1.")
    per_job = -(-num_shards // max_jobs)
    return [range(first, min(first + per_job, num_shards + 1)) for first in range(1, num_shards + 1, per_job)]


def job_spans(layout: list[range]) -> list[str]:
    """Each job's shards as the action's ``shard`` input takes them: ``K``, or a span ``A-B``.

    Example:
        >>> job_spans(job_layout(5, max_jobs=2))
        ['1-3', '4-5']
    """
    return [f"{r.start}-{r.stop - 1}" if len(r) > 1 else str(r.start) for r in layout]


def job_loads(shard_of: Mapping[str, int], seconds: Mapping[str, float], layout: list[range]) -> list[float]:
    """Each job's expected seconds: the cases of the shards it runs (``shard_of``: case id -> shard)."""
    per_shard: dict[int, float] = {}
    for case_id, shard in shard_of.items():
        per_shard[shard] = per_shard.get(shard, 0.0) + seconds[case_id]
    return [sum(per_shard.get(k, 0.0) for k in shards) for shards in layout]
