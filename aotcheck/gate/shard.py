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
from collections.abc import Iterable, Mapping

from aotcheck.errors import AotcheckError
from aotcheck.pipeline.case import Case
from aotcheck.units import read_count


class ShardError(AotcheckError, ValueError):
    """A shard spec that is not K/N with 1 <= K <= N."""


MAX_SHARDS = 10_000  # GitHub Actions runs at most 256 jobs of a matrix; no CI splits one run 10,000 ways.


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
    :func:`case_weight`). No shard exceeds the best possible split by more than the largest case."""
    def cost(case: Case) -> float:
        return seconds[case.id] if seconds is not None else case_weight(case)

    ordered = sorted(set(cases), key=lambda c: (-cost(c), c.id))
    # Shards past the case count get none: no heap entry for them (N may be large).
    heap = [(0.0, shard) for shard in range(1, min(num_shards, len(ordered)) + 1)]
    out: dict[str, int] = {}
    for case in ordered:
        load, shard = heapq.heappop(heap)
        out[case.id] = shard
        heapq.heappush(heap, (load + cost(case), shard))
    return out


def shard_of_name(name: str, num_shards: int) -> int:
    """The shard (1-based) of a test that is not a case (a user's own ``aotcheck``-marked test), by
    a digest of its name: the same on every runner.

    Example:
        >>> shard_of_name("tests/test_model.py::test_shapes", 3) == shard_of_name("tests/test_model.py::test_shapes", 3)
        True
    """
    return zlib.crc32(name.encode()) % num_shards + 1
