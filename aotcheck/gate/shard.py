"""Splitting the case matrix across CI runners: deterministic, balanced, complete.

Cases are weighed by what their compile costs (a train step several times an
inference method; more slices, more work), then dealt heaviest first to the
lightest shard, ties by id, so every runner computes the same split from the
same matrix and every case lands in exactly one shard.

Example:
    >>> from aotcheck.gate.case import Case
    >>> from aotcheck.gate.shard import assign_shards, parse_shard
    >>> parse_shard("2/3")
    (2, 3)
    >>> cases = [Case.of("lm", p, "v4-8", 1) for p in ("train_step", "prefill", "sample_decode")]
    >>> sorted(assign_shards(cases, 2).items())
    [('lm/prefill@v4-8x1', 2), ('lm/sample_decode@v4-8x1', 2), ('lm/train_step@v4-8x1', 1)]
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable

from aotcheck.gate.case import Case


class ShardError(ValueError):
    """A shard spec that is not K/N with 1 <= K <= N."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)``: shard K (1-based) of N."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise ShardError(f"--aot-shard: {text!r} is not K/N (e.g. 1/4: the first of 4 shards).")
    k, n = int(match[1]), int(match[2])
    if n < 1 or not 1 <= k <= n:
        raise ShardError(f"--aot-shard: {text!r}: K must be between 1 and N (N >= 1), e.g. 1/{max(n, 1)}.")
    return k, n


def case_weight(case: Case) -> float:
    """Relative compile cost: train steps (forward, backward, optimizer) outweigh inference."""
    program = 4.0 if case.program == "train_step" else 1.0
    return program * (1.0 + 0.5 * (case.num_slices - 1))


def assign_shards(cases: Iterable[Case], num_shards: int) -> dict[str, int]:
    """Case id -> shard (1-based), greedy by weight (longest processing time first)."""
    heap = [(0.0, shard) for shard in range(1, num_shards + 1)]
    out: dict[str, int] = {}
    for case in sorted(set(cases), key=lambda c: (-case_weight(c), c.id)):
        load, shard = heapq.heappop(heap)
        out[case.id] = shard
        heapq.heappush(heap, (load + case_weight(case), shard))
    return out
