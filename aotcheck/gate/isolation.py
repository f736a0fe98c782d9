"""Where a case is measured: in a worker process that serves only its chip family.

No libtpu compile runs in the process of the session (pytest's, or the CLI's):

- libtpu can die inside a compile (a SIGSEGV in this libtpu for some 7x
  programs), and the host can kill a compile that outgrows its memory. A worker
  that dies fails only the case it was compiling, as :class:`WorkerCrashed`
  naming the signal and the last lines the worker printed; the next case of
  that family gets a fresh worker.
- libtpu carries compiler state across chip families within one process (see
  :mod:`aotcheck.targets.families`), and a golden must not depend on which cases
  happened to run before it: a worker compiles for one family only.

A case the figures cache answers by its unchanged inputs needs no compiler: it is answered in the
session's process (:func:`aotcheck.pipeline.measure.answered`: nothing traced, libtpu not loaded),
and a family's worker starts only when one of its cases must be lowered. A warm run starts none.

A worker (:mod:`aotcheck.gate.worker`) speaks JSON lines on a private pipe: a request names a case, the
modules that register configs (imported in the worker exactly as the parent
imported them) and the figures cache; a reply carries the figures and the
worker's peak host memory for that case, or the error's type and message, so
the parent re-raises the same exception class. The worker's stderr comes to the
parent line by line: libtpu's start-up noise is dropped, the rest passed on,
and the last lines kept for a crash report.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable
from typing import Any

from aotcheck import _runtime
from aotcheck.errors import WorkerCrashed, error_from_json
from aotcheck.gate.process import FamilyWorker, worker_environment
from aotcheck.gate.worker import WorkerRequest
from aotcheck.pipeline.cache import FiguresCache
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.inputs import jax_settings
from aotcheck.pipeline.measure import answered
from aotcheck.pipeline.measurement import Measurement
from aotcheck.programs.loader import LoaderError, loaded_sources, main_has_no_file, main_script
from aotcheck.programs.options import SCOPED_VMEM_FLAG, OptionsError
from aotcheck.programs.xla_flags import unknown_xla_flags
from aotcheck.programs.registry import REGISTRY, ConfigNotFound, Registry, RegistryError
from aotcheck.targets.topology import Topology


class Measurer:
    """Measures cases in chip-family worker processes: ``measurer(case) -> Measurement``.

    Workers find configs the way the parent registered them: by importing the
    modules whose import registered configs (conftest files, config modules) and
    those that define what ``registry`` holds (``aotcheck.REGISTRY``, or a registry
    of the user's that is a module-level name of one of them).

    Raises what :func:`aotcheck.pipeline.measure.measure` raises, with the same
    exception classes, or :class:`WorkerCrashed` when the worker died; a crashed
    worker is replaced by a fresh one for the next case.
    """

    def __init__(self, *, cache: FiguresCache | None = None, keep_hlo: bool = False, hbm_headroom: float = 1.0,
                 memory_fraction: tuple[float | None, str] | None = None, export: str | None = None,
                 fit: str | None = None,
                 compiler_options: dict[str, str] | None = None, presets: bool = True,
                 registry: Registry = REGISTRY) -> None:
        if os.environ.get(_runtime.WORKER_ENV):  # A script imported to find configs runs a gate at import.
            raise LoaderError("aotcheck starts no compile processes inside a compile process: a script it imported "
                              "there to register its configs runs aotcheck at its top level. Put the code that runs "
                              "it under `if __name__ == \"__main__\":`, so importing it only registers.")
        self.registry = registry
        self._where: tuple[str, str] | None = None
        self.cache = cache
        self.keep_hlo = keep_hlo  # Bring back each program's optimized HLO text (for --explain, --dump-hlo).
        self.hbm_headroom = hbm_headroom  # What a fit search may fill.
        self.memory_fraction = memory_fraction  # A GPU process's share (the ini's) and its name: a GPU search's limit.
        self.export = export  # Where each case's executable is staged (the session publishes those that pass).
        self.fit = fit  # Search this knob on every case (else each config's own ``fit``).
        self.compiler_options = dict(compiler_options or {})  # The caller's (the user's launch flags).
        self.presets = presets  # aotcheck's per-chip presets under them.
        self.notes: list[str] = []  # What workers had to say once (e.g. an unwritable cache).
        self._workers: dict[str, FamilyWorker] = {}
        # Cases answered (or not: None) from the cache in this process while the workers were being decided.
        self._answers: dict[tuple[Case, str | None], Measurement | None] = {}
        self._jax_config: dict[str, str] | None = None  # JAX's settings once the configs were registered.
        # Why no worker can start in this environment (a TPU flag in XLA_FLAGS), once known: every case
        # is that error, and no worker is started to die of it.
        # XLA_FLAGS is judged by what XLA does with it (some --xla_tpu_* flags it knows): a worker that
        # aborts on an unknown flag dooms the run with that flag named (see _crash_cause).
        self._doomed: str | None = None
        _runtime.remove_dumps()  # What killed workers (kill -9, the OOM killer) left behind.

    def locate(self) -> tuple[str, str] | None:
        """Where a worker finds the registry (see :meth:`Registry.locate`): asked once its configs are
        registered; RegistryError when a worker could not find it."""
        if self._where is None:
            self._where = self.registry.locate(loaded_sources())
        return self._where

    def prestart(self, topologies: Iterable[Topology]) -> None:
        """Starts the workers of ``topologies``' families now, so their start-up (importing jax, loading
        libtpu) overlaps with each other and with the first cases."""
        if self._doomed:  # Each case says why; a worker would only die of it, noisily.
            return
        for topology in sorted({t.family: t for t in topologies}.values(), key=lambda t: t.family):
            if topology.family not in self._workers:
                self._workers[topology.family] = FamilyWorker(topology)

    def settle(self) -> None:
        """Notes JAX's settings as the registering modules left them, which a worker's match: the session
        answers a case itself only while its own still match (a test module may change them, and a key
        digested under other settings than the worker's could find an answer the worker would not give)."""
        self._jax_config = jax_settings()

    def start_for(self, cases: Iterable[tuple[Case, str | None]]) -> None:
        """Starts the workers these cases (with the knob each searches) need: with a cache that may answer,
        only those of families with a case it does not (the cases before it answered here, kept); else
        every family's, at once, so their start-up overlaps with each other's and the first cases'."""
        cases = list(cases)
        if not self._may_answer():
            return self.prestart(c.topology for c, _ in cases)
        for case, fit in cases:
            if case.topology.family in self._workers or (case, fit) in self._answers:
                continue
            found = self._answers[(case, fit)] = self.answer(case, fit)
            if found is None:
                self.prestart([case.topology])

    def _may_answer(self) -> bool:
        return (self.cache is not None and self.export is None and not self._doomed and self.cache.may_answer()
                and (self._jax_config is None or self._jax_config == jax_settings()))

    def answer(self, case: Case, fit: str | None = None) -> Measurement | None:
        """The case's measurement from the cache, answered in this process (no worker, no compiler), as its
        worker would answer it; None where it must be lowered, or a worker must judge (its config builds
        differently on each call, and the worker compares the programs).

        Example (no figures cache: only a worker's compile answers):
            >>> Measurer().answer(Case.parse("lm/train_step@v4-8x1")) is None
            True
        """
        if not self._may_answer():
            return None
        seen = self._build_seen(case)
        if seen is not None and seen["unstable"] is not None:
            return None
        found = answered(case, registry=self.registry, cache=self.cache, fit=fit if fit is not None else self.fit,
                         hbm_headroom=self.hbm_headroom, memory_fraction=self.memory_fraction,
                         compiler_options=self.compiler_options, presets=self.presets,
                         environ=worker_environment(case.topology))
        for note in self.cache.notes if self.cache is not None else ():
            if note not in self.notes:
                self.notes.append(note)
        # Measured by this process: its peak memory, as a worker's answer carries the worker's.
        return dataclasses.replace(found, host_peak_bytes=_runtime.peak_rss_bytes()) if found is not None else None

    def retain(self, families: set[str] | frozenset[str]) -> None:
        """Stops the started workers of families not in ``families`` (started early for a target
        whose cases were all deselected)."""
        for family in [f for f in self._workers if f not in families]:
            self._workers.pop(family).close()

    def __call__(self, case: Case, *, fit: str | None = None) -> Measurement:
        """Measures ``case`` in its family's worker; ``fit``: search this knob (else :attr:`fit`, or the policy)."""
        if self._doomed:
            raise OptionsError(self._doomed)
        key, family = (case, fit), case.topology.family
        # A family whose worker runs has a case to compile: its worker answers the rest (cached or not), so
        # no case of a cold run is digested twice, here and there.
        found = self._answers.pop(key) if key in self._answers else \
            self.answer(case, fit) if family not in self._workers else None
        if found is not None:
            return found
        worker = self._workers.get(family) or self._workers.setdefault(family, FamilyWorker(case.topology))
        try:
            reply = worker.request(WorkerRequest(
                case=case,
                sources=tuple(dict.fromkeys([*loaded_sources(), *self.registry.sources()])),
                registry=self.locate(),
                main=main_script(),
                build=self._build_seen(case),
                cache=self.cache.spec if self.cache else None,
                hlo=self.keep_hlo,
                hbm_headroom=self.hbm_headroom,
                memory_fraction=self.memory_fraction,
                export=self.export,
                fit=fit if fit is not None else self.fit,
                compiler_options=self.compiler_options,
                presets=self.presets,
            ))
        except WorkerCrashed as e:
            self._workers.pop(family, None)
            worker.close()
            raise self._crash_cause(e, case) from None
        if family in case.topology.platform.fresh_worker_families:
            self._workers.pop(family).close()
            self.prestart([case.topology])  # The next case of the family finds its fresh worker started.
        for note in reply.notes:
            if note not in self.notes:
                self.notes.append(note)
        if reply.error is not None:
            error = error_from_json(reply.error)
            host = _runtime.memory_limit_problem(str(error)) if isinstance(error, _runtime.HostError) else None
            if host is not None:  # libtpu could not be mapped: the host's limit, not "reinstall libtpu".
                raise _runtime.HostError(host) from None
            if isinstance(error, ConfigNotFound) and main_has_no_file():
                raise ConfigNotFound(
                    f"{error} This session's main program has no file (an interactive session, a notebook or "
                    "`python -c`), so configs registered there cannot be registered again in a compile process: "
                    "register them in a module or script file (python -m aotcheck check --module FILE, "
                    "aot_config_modules, conftest.py), or measure in this process (measure=...).") from None
            raise error
        if reply.measurement is None:
            raise WorkerCrashed(f"The compile process for {case.id} answered neither figures nor an error.")
        return reply.measurement

    def _build_seen(self, case: Case) -> dict[str, Any] | None:
        """What this process's build of the case's config looks like (its fingerprint's digest) and
        whether building it again gave another config (:meth:`Entry.unstable`): the worker builds the
        config anew and checks that the program it lowers is the one this build describes."""
        try:
            entry = self.registry.get(case.config)
            seen = entry.fingerprint()
        except RegistryError:  # Not registered or not built here: the worker says so itself.
            return None
        if seen is None:
            return None
        return {"digest": seen.digest, "unstable": entry.unstable()}

    def _crash_cause(self, crash: WorkerCrashed, case: Case) -> Exception:
        """What a worker's death was, when its last lines or this host's limits say: a flag in
        ``XLA_FLAGS`` XLA does not know (every later case is that error, and no worker starts again),
        memory the host's limit would not map; else the crash, with a word on the limit if one is set,
        and the case's scoped VMEM limit where it was below the chip's default."""
        small = self._small_vmem_limit(case)
        if small is not None:
            crash = WorkerCrashed(str(crash), signal_name=crash.signal_name, tail=crash.tail, log=crash.log,
                                  small_vmem_limit=small)
        lines = [*crash.tail, *crash.log]
        unknown = unknown_xla_flags(lines)
        if unknown is not None:
            self._doomed = unknown
            self.close(kill=True)
            return OptionsError(unknown)
        host = _runtime.memory_limit_problem("\n".join(lines))
        if host is not None:
            return _runtime.HostError(f"the compile process died ({crash.signal_name}): {host}")
        limits = _runtime.memory_limits()
        if limits:
            caps = "; ".join(words for words, _ in limits)
            return WorkerCrashed(f"{crash}\nThis run's {caps}: a compile process that cannot map "
                                 "memory can die this way. If the cap is near what a compile maps (libtpu alone "
                                 "maps about 0.6 GiB), raise or lift it (ulimit -v unlimited).",
                                 signal_name=crash.signal_name, tail=crash.tail, log=crash.log,
                                 small_vmem_limit=crash.small_vmem_limit)
        return crash

    def _small_vmem_limit(self, case: Case) -> dict[str, int] | None:
        """The case's scoped VMEM limit (its config's launch flags, then the caller's) where it is below
        its chip's default, as ``{"kib", "default_kib"}``; None otherwise. Presets are not consulted
        (that would load libtpu here): none sets a limit below a chip's default."""
        default = case.topology.device.scoped_vmem_bytes
        try:
            options = {**self.registry.get(case.config).program(case.program).options, **self.compiler_options}
        except (RegistryError, OptionsError):
            options = dict(self.compiler_options)
        kib = str(options.get(SCOPED_VMEM_FLAG) or "")
        if default is None or not (kib.isascii() and kib.isdigit()) or int(kib) * 1024 >= default:
            return None
        return {"kib": int(kib), "default_kib": default // 1024}

    def close(self, *, kill: bool = False) -> None:
        """Stops every worker process: all asked at once, then each given what is left of
        :attr:`FamilyWorker.STOP_SECONDS` (none with ``kill``, as after an interruption)."""
        workers = list(self._workers.values())
        self._workers.clear()
        for worker in workers:
            worker.stop()
        deadline = time.monotonic() + (0 if kill else FamilyWorker.STOP_SECONDS)
        for worker in workers:
            worker.close(timeout=deadline - time.monotonic())
