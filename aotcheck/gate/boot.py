"""Will a server start: its boot budget on a target, from its buckets' figures.

A serving engine loads its weights, allocates its KV pool, then compiles and runs every bucket's
program once before it takes traffic. What a TPU's runtime holds then was read on a v5e chip
(``memory_stats()`` around every load and run; jax 0.10.2, libtpu 0.0.42.1, 2026-12-07):

- compiling takes no HBM; a program's generated code enters memory at its first run;
- temporaries are **one** reservation at the bottom of memory, sized to the program running (never
  one per loaded program: eight programs of 2 GiB temporaries each ran beside an 11 GiB buffer);
- the running program's own inputs and outputs are live beside the weights and the pool;
- buffers win over programs, and when memory runs short idle programs' code is evicted, to be
  loaded again at their next run.

So on a TPU a server **starts** when, per device,

    weights + KV pool + the sum of every bucket's code + the largest (temporaries + live I/O) of a bucket  <=  bytes_limit

It **starts, but programs reload on every switch** where only evicting idle code makes room
(weights + pool + one bucket's code + its temporaries + its I/O fit, for every bucket), and otherwise
it **will not start**: the first bucket in load order whose run finds no room fails as libtpu's
E0101 says ("Attempting to reserve <its temporaries> at the bottom of memory ... <free>"). The limit
is the runtime's ``bytes_limit`` (:attr:`~aotcheck.targets.platform.DeviceSpec.runtime_bytes`:
measured on v5e, 2 MiB below the compiler's; published or inferred elsewhere). On llm-256k at
4,282 pages the chip started with 265 MB to spare; the largest pool that started was 4,434 pages
(this rule: 4,394 with every program resident, 4,434 with idle code evicted).

On a GPU, XLA's client takes a run's temporaries from its pool and every program's code stays, so
the budget there holds every bucket's code and the largest bucket's temporaries, against the
device's memory times the fraction the process runs with (``XLA_PYTHON_CLIENT_MEM_FRACTION``, JAX's
default 0.75). What neither rule knows: allocations outside XLA's programs (a framework's buffers,
fragmentation).

Example (FAKE figures, as a server's buckets record them; nothing compiles):
    >>> from aotcheck.targets.topology import parse_topology
    >>> GiB = 2**30
    >>> def bucket(tokens, code, temp, io=0):
    ...     return (("step", Bucket(tokens=tokens)), {"peak_params_bytes": 10 * GiB, "peak_kv_cache_bytes": 4 * GiB,
    ...                                        "generated_code_bytes": code, "temp_bytes": temp,
    ...                                        "argument_bytes": 14 * GiB + io, "output_bytes": 0, "alias_bytes": 0})
    >>> boot = boot_budget([bucket(16, GiB // 8, GiB // 2), bucket(64, GiB // 8, GiB, io=GiB // 4)], parse_topology("v5e-1"))
    >>> boot.start.value, boot.running, boot.total_bytes / GiB  # 10 + 4 + 0.25 of code + 1 + 0.25 of I/O.
    ('starts', 'step[tokens=64]', 15.5)
    >>> round(boot.kv_max_bytes / GiB, 3), round(boot.kv_evict_max_bytes / GiB, 3)  # Resident code; evicted.
    (4.248, 4.373)
    >>> tight = boot_budget([bucket(16, GiB // 4, GiB // 2), bucket(64, GiB // 4, 2 * GiB)], parse_topology("v5e-1"))
    >>> tight.start.value, tight.tips, tight.asked_bytes / GiB, round(tight.free_bytes / GiB, 3)
    ('will not start', 'step[tokens=64]', 2.0, 1.498)
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from collections.abc import Mapping, Sequence

from aotcheck.records import Record
from aotcheck.programs.names import Bucket, program_id
from aotcheck.targets.topology import Topology
from aotcheck.targets.usable import Usable, usable_memory

FIGURES = ("peak_params_bytes", "peak_kv_cache_bytes", "generated_code_bytes", "temp_bytes",
           "argument_bytes", "output_bytes", "alias_bytes")


class Start(enum.Enum):
    """How a server starts: every program resident, only with idle programs' code evicted, or not."""

    STARTS = "starts"
    RELOADS = "starts, reloading programs"
    FAILS = "will not start"

    @property
    def rank(self) -> int:
        """Worse is higher: a server that newly crosses to a higher rank fails the gate."""
        return list(Start).index(self)


@dataclasses.dataclass(frozen=True)
class Boot(Record):
    """A server's boot budget on one target, per device.

    Attributes:
        weights_bytes: Its parameters.
        kv_bytes: Its KV pool as configured.
        code_bytes: Every bucket's generated code, summed (each enters memory at its first run).
        temp_bytes: The temporaries of the bucket whose run asks the most (``running``).
        io_bytes: That bucket's live inputs and outputs beyond the weights and the pool (a TPU's; 0 on a
            GPU, whose rule counts none).
        usable: What a device may hold, and where that comes from.
        programs: How many programs are loaded.
        running: The bucket whose run asks the most: temporaries + I/O on a TPU, temporaries on a GPU.
        tips: What first finds no room as the server starts (``"weights"``, ``"kv"``, or the program id
            of the bucket whose run does, in :func:`load_order`); None when it starts.
        kv_max_bytes: The largest KV pool with which it starts, every program resident (0: none).
        kv_evict_max_bytes: The largest with which it starts once idle programs' code is evicted (a TPU's
            runtime does; equal to ``kv_max_bytes`` where the runtime does not).
        memory_bytes: The memory an engine's utilization is a share of (:func:`engine_base`).
        bytes_per_page: The KV pool's bytes per page, where its configured pages are known.
        asked_bytes: What the bucket that tips it asks of the runtime (its temporaries: E0101's
            "Attempting to reserve"); None when it starts or weights or pool tip it.
        free_bytes: What is free when it asks, idle code evicted (E0101's "free"); None as ``asked_bytes``.
    """

    weights_bytes: int
    kv_bytes: int
    code_bytes: int
    temp_bytes: int
    io_bytes: int
    usable: Usable
    programs: int
    running: str | None
    tips: str | None
    kv_max_bytes: int
    kv_evict_max_bytes: int
    memory_bytes: int
    bytes_per_page: float | None = None
    asked_bytes: int | None = None
    free_bytes: int | None = None

    # Its verdicts, written beside the figures for a reader of the report; never read back.
    __json_extra__ = {name: operator.attrgetter(name) for name in (
        "usable_bytes", "boots", "start", "total_bytes", "kv_max_fraction", "kv_max_pages", "kv_evict_max_pages")}

    @property
    def usable_bytes(self) -> int:
        return self.usable.bytes

    @property
    def total_bytes(self) -> int:
        """Everything resident at the run that asks the most, every program's code loaded."""
        return self.weights_bytes + self.kv_bytes + self.code_bytes + self.temp_bytes + self.io_bytes

    @property
    def start(self) -> Start:
        if self.total_bytes <= self.usable_bytes:
            return Start.STARTS
        return Start.RELOADS if self.tips is None else Start.FAILS

    @property
    def boots(self) -> bool:
        """It starts (reloading programs or not)."""
        return self.start is not Start.FAILS

    @property
    def kv_max_fraction(self) -> float:
        """The largest pool as an engine's memory utilization: (weights + pool) over what the engine takes
        a share of (``memory_bytes``)."""
        return (self.weights_bytes + self.kv_max_bytes) / self.memory_bytes if self.memory_bytes else 0.0

    @property
    def kv_max_pages(self) -> int | None:
        return int(self.kv_max_bytes // self.bytes_per_page) if self.bytes_per_page else None

    @property
    def kv_evict_max_pages(self) -> int | None:
        return int(self.kv_evict_max_bytes // self.bytes_per_page) if self.bytes_per_page else None


def engine_base(topology: Topology) -> int:
    """The memory a serving engine's ``gpu_memory_utilization`` is a share of, per device: on a TPU the
    runtime's ``bytes_limit`` (tpu-inference's ``determine_available_memory`` caps the pool at
    utilization x the sum of ``device.memory_stats()["bytes_limit"]``: 16,909,336,064 on a v5e chip,
    about 94.75 GiB on a 7x device, the "94.7 GiB" of tpu-inference #3408), on a GPU its whole memory
    (vLLM's)."""
    device = topology.device
    if topology.platform.memory_fraction is None:
        return int(device.runtime_bytes or device.memory_bytes or 0)
    return int(device.memory_bytes or 0)


Program = tuple[str, Bucket]
"""A server's program as a value: its name and its bucket (a case's ``program`` and ``bucket``)."""


def load_order(buckets: Sequence[Program], programs: Sequence[str] = ()) -> list[Program]:
    """The order a server loads its buckets as it warms up: its programs in the order it declares them
    (``programs``, the names; any other after, by name), each program's buckets ascending, as
    tpu-inference's ``capture_model`` precompiles the backbone, then sampling, then structured decoding.

    Example:
        >>> load_order([("sample", Bucket(tokens=64, seqs=8)), ("step", Bucket(tokens=64)), ("step", Bucket(tokens=16))],
        ...            ["step", "sample"])
        [('step', Bucket(tokens=16)), ('step', Bucket(tokens=64)), ('sample', Bucket(tokens=64, seqs=8))]
    """
    def key(program: Program) -> tuple[int, str, tuple[int, ...]]:
        name, bucket = program
        rank = list(programs).index(name) if name in programs else len(programs)
        return rank, name, tuple(bucket.values())

    return sorted(buckets, key=key)


def bucket_io(figures: Mapping[str, float]) -> int:
    """A bucket's live inputs and outputs beyond the weights and the pool (those the server holds
    anyway): its arguments and outputs, less what aliases, less its weights and pool.

    Example (llm-256k's structured_decode[seqs=512]: logits in, bitmask, logits out):
        >>> bucket_io({"argument_bytes": 5_395_782_144, "output_bytes": 262_144_000, "alias_bytes": 0,
        ...            "peak_params_bytes": 5_117_202_432, "peak_kv_cache_bytes": 0})
        540723712
    """
    held = figures["argument_bytes"] + figures["output_bytes"] - figures["alias_bytes"]
    return max(0, int(held - figures["peak_params_bytes"] - figures["peak_kv_cache_bytes"]))


def boot_budget(buckets: Sequence[tuple[Program, Mapping[str, float]]], topology: Topology, *,
                pages: int | None = None, environ: Mapping[str, str] | None = None,
                usable: Usable | None = None, programs: Sequence[str] = ()) -> Boot | None:
    """The boot budget of a server whose buckets (:data:`Program`, figures) run on ``topology``, each run
    once in :func:`load_order` of its ``programs`` (what tips it is the first whose run finds no room);
    None when a bucket lacks a figure the budget needs. ``pages``: the configured pages of the KV pool,
    to say the largest pool in pages too; ``usable``: what a device may hold, as the gate's run found it
    (:func:`usable_memory` by default)."""
    if not buckets or any(name not in figures for _, figures in buckets for name in FIGURES):
        return None
    # Every bucket holds the server's weights, those its program does not read too (kept: ServingConfig).
    weights = int(max(f["peak_params_bytes"] for _, f in buckets))
    kv = int(max(f["peak_kv_cache_bytes"] for _, f in buckets))
    room = usable if usable is not None else usable_memory(topology, environ)
    if room is None:
        return None
    tpu = topology.platform.runtime_reserves_temporaries
    by_id = dict(buckets)
    order = load_order(list(by_id), programs)
    code = {p: int(by_id[p]["generated_code_bytes"]) for p in order}
    temp = {p: int(by_id[p]["temp_bytes"]) for p in order}
    io = {p: bucket_io(by_id[p]) if tpu else 0 for p in order}
    # What a bucket's run asks beyond weights, pool and code: on a TPU its own temporaries and I/O (one
    # reservation, re-made for the program running); on a GPU the pool's high-water mark so far.
    ask, largest = {}, 0
    for p in order:
        largest = max(largest, temp[p])
        ask[p] = temp[p] + io[p] if tpu else largest
    running = max(order, key=lambda p: ask[p])
    # Each run in load order: resident so far, else (a TPU) with idle programs' code evicted.
    tips, asked, free, loaded = None, None, None, 0
    if weights > room.bytes:
        tips = "weights"
    elif weights + kv > room.bytes:
        tips = "kv"
    else:
        for p in order:
            loaded += code[p]
            resident = code[p] if tpu else loaded
            if weights + kv + resident + ask[p] > room.bytes:
                tips, asked = program_id(*p), temp[p]  # The record names a program by its id.
                free = max(0, room.bytes - weights - kv - resident - (ask[p] - temp[p]))
                break
    total_code = sum(code.values())
    kv_max = max(0, room.bytes - weights - total_code - ask[running])
    kv_evict = max(0, room.bytes - weights - max(code[p] + ask[p] for p in order)) if tpu else kv_max
    return Boot(weights, kv, total_code, temp[running], io[running], room, len(buckets), program_id(*running), tips,
                kv_max, kv_evict, engine_base(topology), kv / pages if pages and kv else None, asked, free)
