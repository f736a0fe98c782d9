"""A compile worker's process, seen from the session: started in its platform's environment, asked one
case at a time on a private pipe, its output filtered (libtpu's noise dropped) and held per case, and
its death told as :class:`~aotcheck.errors.WorkerCrashed` with the signal and its last lines.

Which cases go to which worker, and when one starts, is :mod:`aotcheck.gate.isolation`'s business.
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

from aotcheck import _runtime
from aotcheck.errors import WorkerCrashed
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


def worker_environment(topology: Topology) -> dict[str, str]:
    """The environment a compile worker for ``topology`` runs in: this process's, less the launch flags
    and with the platform's own settings (a case answered in the session digests this one)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env[_runtime.WORKER_ENV] = "1"
    # The session took the environment's launch flags as compiler options (settings.ENVIRONMENT_FLAGS),
    # which the cache key and goldens record; libtpu reading them too would compile what neither records.
    env.pop("LIBTPU_INIT_ARGS", None)
    env.update(topology.platform.environment)  # No runtime: JAX_PLATFORMS=cpu (targets/platform.py).
    return env


class FamilyWorker:
    """A child process that measures cases of one chip family."""

    TAIL_LINES = 12

    def __init__(self, topology: Topology) -> None:
        self.family = family = topology.family
        read_fd, write_fd = os.pipe()  # Replies come on their own pipe: stdout and stderr stay free for noise.
        env = worker_environment(topology)
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
