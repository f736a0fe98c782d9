"""The compile worker's side: a request read, the case measured in this process, a reply written.

A worker (started by :class:`aotcheck.gate.process.FamilyWorker`) reads one
:class:`WorkerRequest` per line on stdin and writes one reply per line on its private pipe:
the :class:`~aotcheck.pipeline.measurement.Measurement`'s JSON form, or the error's
(:func:`aotcheck.errors.error_to_json`), with what its caches and probes had to say.
It finds the config the way the parent registered it (the same modules imported, the
registry where the parent found it) and refuses a config whose builds differ.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aotcheck.records import Record, field
from aotcheck import _runtime
from aotcheck.errors import CompileError, OutOfMemory, error_to_json
from aotcheck.pipeline.cache import CacheSpec, FiguresCache
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measure import measure
from aotcheck.pipeline.measurement import Measurement
from aotcheck.programs.compile import warm_up
from aotcheck.programs.loader import import_main_script, import_sources, imported
from aotcheck.programs.lowering import lower_function
from aotcheck.targets.presets import probe_notes, recheck_presets
from aotcheck.programs.registry import REGISTRY, ConfigNotFound, Registry, RegistryError


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerRequest(Record):
    """What the session asks a compile worker: one case, measured as the plan decided, with one JSON form.

    Example:
        >>> from pathlib import Path
        >>> request = WorkerRequest(case=Case.parse("lm/prefill@v4-8x1"), sources=(("conftest", "/p/conftest.py"),),
        ...                         cache=CacheSpec(Path(".aotcheck-cache")), fit="batch")
        >>> WorkerRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
        True
    """

    case: Case
    # What the parent imported to register (conftest files, config modules), then the modules defining
    # what the registry holds (a builder imported from elsewhere, a script's own): (module, path) pairs.
    sources: tuple[tuple[str, str], ...] = ()
    registry: tuple[str, str] | None = None  # Where the registry is (module, name); None: aotcheck.REGISTRY.
    main: str | None = None  # The parent's own script, imported there when nothing else registered the config.
    build: Mapping[str, Any] | None = None  # The session's build of the config (its digest; whether builds differ).
    cache: CacheSpec | None = None  # The session's figures cache, opened here as it is there.
    hlo: bool = False  # Bring back the optimized HLO text (--explain, --dump-hlo).
    hbm_headroom: float = 1.0  # What a fit search may fill.
    # A GPU process's share of memory as the run gives it (the ini's), with its name: a GPU fit search's limit.
    memory_fraction: tuple[float | None, str] | None = None
    export: str | None = None  # Where the case's executable and manifest are staged (pipeline.export).
    fit: str | None = None  # The knob whose largest fitting size to search (the plan chose it), or None.
    compiler_options: Mapping[str, str] = field(default_factory=dict)  # The user's launch flags.
    presets: bool = True  # aotcheck's per-chip presets under them.


@dataclasses.dataclass(frozen=True)
class WorkerReply(Record):
    """What a compile worker answers a request: the measurement, or the error's JSON form
    (:func:`aotcheck.errors.error_to_json`), with what its caches and probes had to say."""

    measurement: Measurement | None = field(default=None, omit="none")
    error: dict[str, Any] | None = field(default=None, omit="none")
    notes: list[str] = field(default_factory=list)


def _watch_parent(parent: int) -> None:
    # A worker whose session process is gone (killed, or it died) stops at once, with its dump
    # directories, rather than finish a compile nobody will read.
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            _runtime.remove_dumps(pid=os.getpid())
            os._exit(1)


def _registry(where: Sequence[str] | None) -> Registry:
    """The registry a request names (None: ``aotcheck.REGISTRY``), found in the module the parent found it in."""
    if not where:
        return REGISTRY
    found = getattr(imported(where[0]), where[1], None)
    if not isinstance(found, Registry):
        raise RegistryError(f"The compile worker imported {where[0]} and found no Registry named {where[1]} there: "
                            "the parent made it where an import does not run (e.g. under "
                            "`if __name__ == '__main__':`). Make it at the module's top level.")
    return found


def _die_with_parent(parent: int) -> None:
    """Asks Linux to SIGKILL this process the moment its parent ends (``PR_SET_PDEATHSIG``). The watchdog
    thread alone took 1.6 to 8 s: it needs the GIL, which a compile or a trace can hold for seconds. Dump
    directories of a worker so ended are removed by the next run (``_runtime.remove_dumps``)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # No prctl to be had: the watchdog does it.
        return
    if os.getppid() != parent:  # The parent ended before the signal was set.
        os._exit(1)


def serve(reply_fd: int, warm: str | None = None, *, parent: int | None = None, parent_death: bool = False) -> None:
    """The child's loop: one request per line on stdin, one reply per line on ``reply_fd``; ``warm``: the
    chip family whose compiler to warm up first; ``parent``: the session's pid, as it gave it (read here,
    after seconds of imports, it may already be init's); ``parent_death``: end with the parent (the
    kernel's signal, when the parent's main thread started this process)."""
    parent = os.getppid() if parent is None else parent
    if os.getppid() != parent:  # The session ended while this process was starting.
        os._exit(1)
    if parent_death:
        _die_with_parent(parent)
    threading.Thread(target=_watch_parent, args=(parent,), name="aotcheck-parent-watch", daemon=True).start()
    os.set_inheritable(reply_fd, False)  # A process the compile starts must not hold the reply pipe open.
    replies = os.fdopen(reply_fd, "w")
    os.dup2(2, 1)  # Anything printed to stdout (libtpu, user code) goes to stderr.
    if warm:
        warm_up(warm)  # While the parent still collects: the first case's compile cost is its own.
    caches: dict[CacheSpec, FiguresCache] = {}
    for line in sys.stdin:
        measured, error = None, None
        try:
            measured = measure_request(WorkerRequest.from_json(json.loads(line)), caches)
        except Exception as e:  # Reported to the parent, which re-raises it as its own class.
            error = error_to_json(e)
        notes = [n for c in caches.values() for n in c.notes] + probe_notes()
        replies.write(json.dumps(WorkerReply(measured, error, notes).to_json()) + "\n")
        replies.flush()


def measure_request(request: WorkerRequest, caches: dict[CacheSpec, FiguresCache] | None = None) -> Measurement:
    """Measures the case a worker's request names, as the request says (its registry found the way the
    parent found it). A compile refused under presets a presets file said libtpu accepts is measured
    once more after a fresh probe (:func:`aotcheck.targets.presets.recheck_presets`)."""
    caches = {} if caches is None else caches
    sources = list(request.sources)
    import_sources(sources)
    registry = _registry(request.registry)
    case = request.case
    main = request.main
    try:
        entry = registry.get(case.config)
    except ConfigNotFound:
        if main:  # A script run as `python script.py` registered it (a config built by a helper's function).
            import_main_script(main)
        try:
            entry = registry.get(case.config)
        except ConfigNotFound as e:
            looked = ", ".join(dict.fromkeys([path for _, path in sources] + ([main] if main else []))) or "nothing"
            raise ConfigNotFound(f"{e} The compile process imported what registers configs in the session "
                                 f"({looked}), and none of it registered {case.config!r} at its top level.") from None
    _check_same_program(entry, case, request.build)
    cache = None if request.cache is None else caches.get(request.cache) or caches.setdefault(
        request.cache, request.cache.open())  # One per process: a shared store found down stays down.
    presets = request.presets

    def once() -> Measurement:
        _runtime.reset_peak_rss()
        return measure(case, registry=registry, cache=cache, fit=request.fit, hbm_headroom=request.hbm_headroom,
                       memory_fraction=request.memory_fraction, export=request.export, compiler_options=dict(request.compiler_options), presets=presets)

    try:
        result = once()
    except CompileError as e:
        # libtpu refused the program: if a presets file answered which presets it takes, the file may be
        # what is wrong (stale, edited): probe again and, when the probe disagrees, compile once more.
        if isinstance(e, OutOfMemory) or not presets or recheck_presets(case.topology, case.num_slices) is None:
            raise
        result = once()
    hlo = result.compiled.as_text() if request.hlo and result.compiled is not None else None
    return dataclasses.replace(result, host_peak_bytes=_runtime.peak_rss_bytes(), hlo_text=hlo)


def _check_same_program(entry: Any, case: Case, seen: dict[str, Any] | None) -> None:
    """Raises RegistryError when the config's builder gives another program on another call. Asked only
    where the builds differ (the session built it twice and got two configs, or this process's build is
    not the session's): the case's program is lowered from this process's build and from two fresh
    ones, and compared as text. Builds that differ only where the program does not (a temporary path,
    a counter in a name) pass."""
    if not seen:
        return
    mine = entry.fingerprint()
    if mine is None:  # It does not build here: measuring says why.
        return
    why = seen.get("unstable")
    if why is None and mine.digest == seen.get("digest"):
        return
    builds = [entry.configs()] + [entry.rebuilt()[0] for _ in range(2)]
    texts = []
    for configs in builds:
        config = next((c for c in configs if case.program_id in c.programs), None)
        if config is None:
            texts.append("(no such program)")
            continue
        lowered = lower_function(config, case.target)[case.program_id]
        texts.append(hashlib.sha256(lowered.as_text().encode()).hexdigest()[:16])
    if len(set(texts)) == 1:
        return
    where = (f"a second build in the session differed at {why}" if why is not None else
             f"this process's build is not the session's (fingerprints {mine.digest[:12]} and "
             f"{str(seen.get('digest'))[:12]})")
    raise RegistryError(
        f"Config {entry.name!r} builds a different program on each call: its {case.program_id} for {case.target}, "
        f"lowered from three builds in one compile process, gave {len(set(texts))} different programs "
        f"(sha256 {', '.join(texts)}), and {where}. "
        "aotcheck builds a config in the session and again in each compile process, so its figures, and their "
        "verdict against the golden, would be those of whichever build a process got. Make the builder return the "
        "same config on every call: seed any randomness, and read no clock, counter or environment into it.")
