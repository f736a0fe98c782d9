"""Will a server start: its boot budget on a target, from its buckets' figures.

A serving engine loads its weights, allocates its KV pool, then loads every bucket's program before
it takes traffic. Loading a TPU program reserves its HBM for as long as it stays loaded: its
generated code *and* its temporaries, not only the code (OpenXLA's error E0101 is a load failing to
"reserve" a program's memory, whose fix is fewer temporaries; tpu-inference frees programs'
``bytes_reserved`` with ``jax.clear_caches()``; tpu-inference #3408: the programs of gemma-4 on
tpu7x-8 "total ~6GiB+ at load", past what a pool at 0.95 of memory leaves). So the budget is

    weights + KV pool + the sum over every bucket of (generated code + temporaries)  <=  usable

per device, where usable is what the compiler lets a device use. On a GPU, XLA's client takes a
run's temporaries from its pool and gives them back, so the budget there holds every bucket's code and
the largest bucket's temporaries, against the device's memory times the fraction the process runs
with (``XLA_PYTHON_CLIENT_MEM_FRACTION``, JAX's default 0.75).
What it cannot know: allocations outside XLA's programs (the runtime's own reserve, a framework's
buffers, fragmentation), and each step's outputs, allocated per run.

Example (FAKE figures, as a server's buckets record them; nothing compiles):
    >>> from aotcheck.targets.topology import parse_topology
    >>> GiB = 2**30
    >>> def bucket(tokens, code, temp):
    ...     return (f"step[tokens={tokens}]", {"peak_params_bytes": 10 * GiB, "peak_kv_cache_bytes": 4 * GiB,
    ...                                        "generated_code_bytes": code, "temp_bytes": temp})
    >>> boot = boot_budget([bucket(16, GiB // 4, GiB // 2), bucket(64, GiB // 4, 2 * GiB)], parse_topology("v5e-1"))
    >>> boot.boots, boot.tips, boot.total_bytes / GiB, round(boot.usable_bytes / GiB, 2), boot.usable.fraction
    (False, 'step[tokens=64]', 17.0, 15.75, None)
    >>> round(boot.kv_max_bytes / GiB, 2), round(boot.kv_max_fraction, 3)  # The pool that boots: 2.75 GiB.
    (2.75, 0.81)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from aotcheck.programs.names import parse_program_id
from aotcheck.targets.topology import Topology

FIGURES = ("peak_params_bytes", "peak_kv_cache_bytes", "generated_code_bytes", "temp_bytes")


@dataclasses.dataclass(frozen=True)
class Usable:
    """What a device may hold, and where that comes from.

    Attributes:
        bytes: The bytes.
        fraction: The share of the device's memory the process runs with (None: the compiler's limit).
        variable: The environment variable that sets the share in the served process (a GPU's
            ``XLA_PYTHON_CLIENT_MEM_FRACTION``).
        source: Where the share was given: the config (``"llm's memory_fraction"``), the ini
            (``"aot_memory_fraction"``) or the environment (the variable); None: the platform's default.
    """

    bytes: int
    fraction: float | None = None
    variable: str | None = None
    source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Usable":
        fraction, variable = data.get("fraction"), data.get("variable")
        # Reports before the source was recorded said only whether the variable gave it.
        source = data.get("source", variable if data.get("given") else None)
        return cls(int(data["bytes"]), None if fraction is None else float(fraction), variable, source)


@dataclasses.dataclass(frozen=True)
class Boot:
    """A server's boot budget on one target, per device.

    Attributes:
        weights_bytes: Its parameters.
        kv_bytes: Its KV pool as configured.
        code_bytes: Every bucket's generated code, summed (all are loaded at start-up).
        temp_bytes: Every bucket's temporaries, summed where a loaded program keeps its reservation
            (TPU), else the largest bucket's (GPU).
        usable: What a device may hold, and where that comes from.
        programs: How many programs are loaded.
        tips: What first crosses ``usable_bytes`` as the server starts (``"weights"``, ``"kv"``, or the
            program id of the bucket whose loading does, in :func:`load_order`); None when it boots.
        kv_max_bytes: The largest KV pool with which it boots (0: not even without one).
        memory_bytes: The memory an engine's utilization is a share of (:func:`engine_base`).
        bytes_per_page: The KV pool's bytes per page, where its configured pages are known.
    """

    weights_bytes: int
    kv_bytes: int
    code_bytes: int
    temp_bytes: int
    usable: Usable
    programs: int
    tips: str | None
    kv_max_bytes: int
    memory_bytes: int
    bytes_per_page: float | None = None

    @property
    def usable_bytes(self) -> int:
        return self.usable.bytes

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.code_bytes + self.temp_bytes

    @property
    def boots(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    @property
    def kv_max_fraction(self) -> float:
        """The largest pool as an engine's memory utilization: (weights + pool) over what the engine takes
        a share of (``memory_bytes``)."""
        return (self.weights_bytes + self.kv_max_bytes) / self.memory_bytes if self.memory_bytes else 0.0

    @property
    def kv_max_pages(self) -> int | None:
        return int(self.kv_max_bytes // self.bytes_per_page) if self.bytes_per_page else None

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "usable": self.usable.to_json(), "usable_bytes": self.usable_bytes,
                "boots": self.boots, "total_bytes": self.total_bytes, "kv_max_fraction": self.kv_max_fraction,
                "kv_max_pages": self.kv_max_pages}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Boot":
        """The inverse of :meth:`to_json` (its derived fields recomputed); KeyError/ValueError if malformed."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in names}, "usable": Usable.from_json(data["usable"])})


def usable_memory(topology: Topology, environ: Mapping[str, str] | None = None, *,
                  fraction: tuple[float, str] | None = None) -> Usable | None:
    """What a device of ``topology`` may hold (None: a host's CPU, which has no budget of its own).
    ``fraction``: the share of memory the served process runs with and where it was given (the config or
    the ini), over the environment's variable; else the variable, else the platform's default.

    Example:
        >>> from aotcheck.targets.topology import parse_topology
        >>> h100 = parse_topology("h100-8")
        >>> usable_memory(h100, {}).fraction, usable_memory(h100, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}).source
        (0.75, 'XLA_PYTHON_CLIENT_MEM_FRACTION')
        >>> usable_memory(h100, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}, fraction=(0.95, "aot_memory_fraction")).fraction
        0.95
    """
    device, platform = topology.device, topology.platform
    if not device.memory_limit_bytes:
        return None
    if platform.memory_fraction is None:  # The compiler's limit: no share of it is the process's to set.
        return Usable(int(device.memory_limit_bytes))
    default, variable = platform.memory_fraction
    share, source = fraction if fraction is not None else (None, None)
    if share is None:
        given = (os.environ if environ is None else environ).get(variable)
        try:
            share = float(given) if given else None
            if share is not None and not 0 < share <= 1:
                raise ValueError(given)
            source = variable if share is not None else None
        except ValueError:  # Not a share: the process would not run with it either; the default is said.
            share = None
    return Usable(int(int(device.memory_bytes or 0) * (share or default)), share or default, variable, source)


def engine_base(topology: Topology) -> int:
    """The memory a serving engine's ``gpu_memory_utilization`` is a share of, per device: on a TPU the
    runtime's ``bytes_limit`` (tpu-inference's ``determine_available_memory`` caps the pool at
    utilization x the sum of ``device.memory_stats()["bytes_limit"]``: the compiler's limit, 94.75 GiB
    on a 7x device, the "94.7 GiB" of tpu-inference #3408), on a GPU its whole memory (vLLM's)."""
    device = topology.device
    if topology.platform.memory_fraction is None:
        return int(device.memory_limit_bytes or device.memory_bytes or 0)
    return int(device.memory_bytes or 0)


def load_order(program_ids: Sequence[str], programs: Sequence[str] = ()) -> list[str]:
    """The order a server loads its buckets as it warms up: its programs in the order it declares them
    (``programs``, the names; any other after, by name), each program's buckets ascending, as
    tpu-inference's ``capture_model`` precompiles the backbone, then sampling, then structured decoding.

    Example:
        >>> load_order(["sample[tokens=64,seqs=8]", "step[tokens=64]", "step[tokens=16]"], ["step", "sample"])
        ['step[tokens=16]', 'step[tokens=64]', 'sample[tokens=64,seqs=8]']
    """
    def key(program_id: str) -> tuple[int, str, tuple[int, ...]]:
        name, bucket = parse_program_id(program_id)
        rank = list(programs).index(name) if name in programs else len(programs)
        return rank, name, tuple(bucket.values())

    return sorted(program_ids, key=key)


def boot_budget(buckets: Sequence[tuple[str, Mapping[str, float]]], topology: Topology, *,
                pages: int | None = None, environ: Mapping[str, str] | None = None,
                usable: Usable | None = None, programs: Sequence[str] = ()) -> Boot | None:
    """The boot budget of a server whose buckets (program id, figures) run on ``topology``, loaded in
    :func:`load_order` of its ``programs`` (what tips it is the first whose loading crosses the limit);
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
    keep = topology.platform.programs_keep_temporaries
    # Each load as it adds to what is held (on a GPU a bucket's temporaries count only above the largest so far).
    loads, largest = [], 0
    by_id = dict(buckets)
    for program in load_order(list(by_id), programs):
        f = by_id[program]
        temp_now = int(f["temp_bytes"]) if keep else max(0, int(f["temp_bytes"]) - largest)
        largest = max(largest, int(f["temp_bytes"]))
        loads.append((program, int(f["generated_code_bytes"]) + temp_now))
    tips, held = None, 0
    for part, size in (("weights", weights), ("kv", kv), *loads):
        held += size
        if held > room.bytes:
            tips = part
            break
    code = sum(int(f["generated_code_bytes"]) for _, f in buckets)
    temps = [int(f["temp_bytes"]) for _, f in buckets]
    temp = sum(temps) if keep else max(temps)
    kv_max = max(0, room.bytes - weights - code - temp)
    return Boot(weights, kv, code, temp, room, len(buckets), tips, kv_max,
                engine_base(topology), kv / pages if pages and kv else None)
