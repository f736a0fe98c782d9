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

A worker (:mod:`aotcheck.gate.worker`) speaks JSON lines on a private pipe: a request names a case, the
modules that register configs (imported in the worker exactly as the parent
imported them) and the figures cache; a reply carries the figures and the
worker's peak host memory for that case, or the error's type and message, so
the parent re-raises the same exception class. The worker's stderr comes to the
parent line by line: libtpu's start-up noise is dropped, the rest passed on,
and the last lines kept for a crash report.
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from aotcheck import _runtime
from aotcheck.errors import WorkerCrashed, error_from_json
from aotcheck.pipeline.cache import FiguresCache
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.programs.loader import LoaderError, loaded_sources, main_has_no_file, main_script
from aotcheck.programs.options import SCOPED_VMEM_FLAG, OptionsError
from aotcheck.programs.xla_flags import unknown_xla_flags
from aotcheck.programs.registry import REGISTRY, ConfigNotFound, Registry, RegistryError
from aotcheck.gate.worker import WorkerReply, WorkerRequest
from aotcheck.targets.topology import Topology


def describe_exit(code: int) -> str:
    """``-11 -> 'SIGSEGV (signal 11)'``, ``1 -> 'exit status 1'``.

    Example:
        >>> describe_exit(-11), describe_exit(-9), describe_exit(1)
        ('SIGSEGV (signal 11)', 'SIGKILL (signal 9)', 'exit status 1')
    """
    if code < 0:
        try:
            return f"{signal.Signals(-code).name} (signal {-code})"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def killed_by_host(code: int) -> str:
    """What a worker's death by SIGKILL most likely means (nothing in aotcheck sends it mid-case).

    Example:
        >>> killed_by_host(-11)
        ''
        >>> print(killed_by_host(-9))  # doctest: +ELLIPSIS
         (SIGKILL: most likely the host's OOM killer or a memory limit; this host has ... GiB of memory; ...)
    """
    if code != -signal.SIGKILL:
        return ""
    total = _runtime.host_memory_bytes()
    memory = f"; this host has {total / 2**30:.1f} GiB of memory" if total else ""
    return (f" (SIGKILL: most likely the host's OOM killer or a memory limit{memory}; the compile needs more "
            "host memory than it had: run it on a larger machine, or alone with -n 0)")


# What a crash handler prints after the fact (stack addresses, core-dump plumbing): kept off
# the crash report, which shows the lines that say what happened.
_CRASH_BOILERPLATE = re.compile(
    r"^\s*(PC: )?@\s+0x|symbolize|coredump_hook\.cc|client\.cc:\d+\] RAW|process_state\.cc:\d+\] RAW"
)


class FamilyWorker:
    """A child process that measures cases of one chip family."""

    TAIL_LINES = 12

    def __init__(self, topology: Topology) -> None:
        self.family = family = topology.family
        read_fd, write_fd = os.pipe()  # Replies come on their own pipe: stdout and stderr stay free for noise.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        env[_runtime.WORKER_ENV] = "1"
        # The session took the environment's launch flags as compiler options (settings.ENVIRONMENT_FLAGS),
        # which the cache key and goldens record; libtpu reading them too would compile what neither records.
        env.pop("LIBTPU_INIT_ARGS", None)
        env.update(topology.platform.environment)  # No runtime: JAX_PLATFORMS=cpu (targets/platform.py).
        warm = None if topology.platform.host_devices else family  # What to warm up while the parent collects.
        # Linux ends a child when the *thread* that started it ends: only a worker started by the main thread
        # may ask for the parent-death signal (a session run from a pool's thread keeps the watchdog alone).
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             f"from aotcheck.gate.worker import serve; serve({write_fd}, {warm!r}, parent={os.getpid()}, "
             f"parent_death={main!r})"],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(write_fd,),
            text=True,
            errors="replace",
            env=env,
            # Its own session: a signal to the terminal's or CI's process group (Ctrl-C, a cancel's
            # SIGTERM) reaches the session process alone, which ends its workers; a worker whose
            # parent is gone ends itself (the kernel's parent-death signal; serve's watchdog).
            start_new_session=True,
        )
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "r")
        self.tail: collections.deque[str] = collections.deque(maxlen=self.TAIL_LINES)
        self._tail_lock = threading.Lock()
        # While a case runs, its output is held: passed on when the case ends, kept for the report
        # (not the terminal) when the worker dies on it, with its crash handler's stack.
        self._held: list[str] | None = None
        self._pump = threading.Thread(target=self._forward_stderr, name=f"aotcheck-{family}-stderr", daemon=True)
        try:
            self._pump.start()
        except BaseException:
            self.proc.kill()
            self.close()
            raise

    def _forward_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if _runtime.is_compiler_noise(line):
                continue
            with self._tail_lock:
                if not _CRASH_BOILERPLATE.search(line):
                    self.tail.append(line.rstrip("\n"))
                if self._held is not None:
                    self._held.append(line)
                    continue
            _write_stderr(line)

    def _release(self, *, show: bool) -> tuple[str, ...]:
        """Ends holding a case's output: passes it on (``show``) and returns it."""
        with self._tail_lock:
            held, self._held = self._held or [], None
        if show:
            _write_stderr("".join(held))
        return tuple(line.rstrip("\n") for line in held)

    def request(self, request: WorkerRequest) -> WorkerReply:
        """Sends one request and waits for its reply; WorkerCrashed if the worker dies first."""
        assert self.proc.stdin is not None
        with self._tail_lock:
            self._held = []
        try:
            self.proc.stdin.write(json.dumps(request.to_json()) + "\n")
            self.proc.stdin.flush()
            line = self._reply()
        except (BrokenPipeError, OSError):
            line = ""
        except BaseException:  # An interruption: what the case printed is still shown.
            self._release(show=True)
            raise
        if line:
            self._release(show=True)
            return WorkerReply.from_json(json.loads(line))
        code = self.proc.wait()
        self._pump.join(timeout=5)
        log = self._release(show=False)
        _runtime.remove_dumps(pid=self.proc.pid)
        how = describe_exit(code)
        with self._tail_lock:
            tail = tuple(self.tail)
        text = "\n".join(f"  {t}" for t in tail) or "  (nothing)"
        raise WorkerCrashed(
            f"the {self.family} compile process died with {how} while compiling {request.case}"
            f"{killed_by_host(code)}. Its last lines:\n{text}",
            signal_name=how, tail=tail, log=log,
        )

    def _reply(self) -> str:
        """The worker's reply line, waited for in short selects: the main thread comes back to Python between
        them, so a Ctrl-C or SIGTERM the kernel handed to another thread (the stderr pump, blocked in its own
        read) still raises here. A plain blocking read would wait for the worker's reply, minutes away."""
        fd = self.replies.fileno()
        while not select.select([fd], [], [], 0.25)[0]:
            pass
        return self.replies.readline()

    STOP_SECONDS = 2.0  # An idle worker ends at once when its stdin closes; a busy one is killed.

    def stop(self) -> None:
        """Asks the worker to stop: closing its stdin ends an idle worker's loop."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:  # A dead worker's pipe: nothing left to flush.
            pass

    def close(self, *, timeout: float = STOP_SECONDS) -> None:
        """Ends the worker (asked first; one still compiling after ``timeout``, as at an
        interruption, is killed) and every pipe to it, and removes its dump directories."""
        self.stop()
        try:
            self.proc.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _runtime.remove_dumps(pid=self.proc.pid)
        self._pump.join(timeout=5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.replies.close()


def _write_stderr(text: str) -> None:
    try:
        sys.stderr.write(text)
    except (OSError, ValueError):  # Our stderr is gone (session shutting down): keep reading.
        pass


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

    def retain(self, families: set[str] | frozenset[str]) -> None:
        """Stops the started workers of families not in ``families`` (started early for a target
        whose cases were all deselected)."""
        for family in [f for f in self._workers if f not in families]:
            self._workers.pop(family).close()

    def __call__(self, case: Case, *, fit: str | None = None) -> Measurement:
        """Measures ``case`` in its family's worker; ``fit``: search this knob (else :attr:`fit`, or the policy)."""
        if self._doomed:
            raise OptionsError(self._doomed)
        family = case.topology.family
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
