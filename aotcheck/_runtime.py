"""Process setup for deviceless TPU compiles, and the toolchain versions.

libtpu reads its environment once, when it loads, so everything here must run
before the first topology is requested. Importing :mod:`aotcheck` does it.

Example:
    >>> sorted(toolchain()), os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"]
    (['jax', 'jaxlib', 'libtpu'], '1')
    >>> is_compiler_noise("W1201 TPU_WORKER_HOSTNAMES is not set"), is_compiler_noise("F1201 Check failed")
    (True, False)
    >>> is_compiler_noise("W1203 06:38:51.736183   16938 spmd_partitioner.cc:666] [SPMD] Involuntary full ...")
    True
    >>> reset_peak_rss(); block = bytearray(64 << 20); peak_rss_bytes() > 64 << 20
    True
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import importlib.metadata
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator

from aotcheck.errors import AotcheckError

# Several processes (pytest-xdist workers) load libtpu at once; without this the
# second one fails on libtpu's multi-process lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# No metadata server to ask on a CPU machine (axlearn sets the same).
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
# libtpu writes its warnings (the SPMD partitioner's "Involuntary full rematerialization" among them)
# to log files in TPU_LOG_DIR, not to stderr; aotcheck reads this process's file around each compile
# (compiler_warnings). Level 2 and up would drop them: the files keep warnings, never INFO.
if int(os.environ.get("TPU_MIN_LOG_LEVEL", "1") or 1) != 1:
    os.environ["TPU_MIN_LOG_LEVEL"] = "1"


def has_accelerator() -> bool:
    """Whether this host has a TPU or an NVIDIA GPU attached (their device files)."""
    return any(glob.glob(pattern) for pattern in ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*"))


# On a host without an accelerator, jax's backend start-up would load libtpu as a *runtime*, which
# finds no TPU and prints a wall of errors, in every process that touches a jax array (pytest's,
# each xdist worker's). Deviceless topologies need no runtime: they work with the CPU backend
# alone (both toolchains, tested). A user's own JAX_PLATFORMS, or a real accelerator, wins.
if "JAX_PLATFORMS" not in os.environ and not has_accelerator():
    os.environ["JAX_PLATFORMS"] = "cpu"

# Lines libtpu prints on every deviceless load; they say nothing to our users.
_LIBTPU_NOISE = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "Logging before InitGoogle",
    "Source Location Trace",
    "libtpu_init_utils.cc",
    "Failed to find host bounds",
    # XLA's GPU scheduler, on a program over 80% of the GPU's memory: aotcheck's HBM verdict says it better.
    "indicates an error in the calculation",
)


# Set in aotcheck's compile worker processes: their parent reads their stderr line by
# line, filters the noise and keeps the last lines for a crash report, so the worker
# must not hide anything in a temporary file (a crash would lose it).
WORKER_ENV = "AOTCHECK_COMPILE_WORKER"


# XLA's own INFO and WARNING log lines (absl's format: level, date, time, thread, file:line]), which the
# CUDA plugin writes to stderr on every GPU compile ("[SPMD] Involuntary full rematerialization ...");
# errors (E) and fatal checks (F) are kept: a crash report needs them.
_XLA_LOG = re.compile(r"^[IW]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w.-]+:\d+\] ")


def is_compiler_noise(line: str) -> bool:
    """Whether ``line`` is one of libtpu's start-up lines, or XLA's INFO/WARNING log, that say nothing to a user."""
    return not line.strip() or any(noise in line for noise in _LIBTPU_NOISE) or bool(_XLA_LOG.match(line))


@contextlib.contextmanager
def no_persistent_cache() -> Iterator[None]:
    """JAX's persistent compilation cache off for one of aotcheck's compiles, whatever a user's library
    turned on (MaxText's config setup sets ``jax_compilation_cache_dir``): a deviceless executable written
    there cannot be read back (later runs warn), and a cache on adds XLA cache options to the compile."""
    import jax  # Here: this module is imported where jax is not yet wanted.

    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)


@contextlib.contextmanager
def quiet_compiler_stderr() -> Iterator[None]:
    """Captures file descriptor 2 and re-emits what is not libtpu start-up noise.

    libtpu writes from C++ straight to the descriptor, so redirecting
    ``sys.stderr`` would not catch it. In a compile worker it does nothing: the
    parent filters the worker's stderr as it arrives.
    """
    if os.environ.get(WORKER_ENV):
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # No real descriptor (e.g. an embedded interpreter).
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().decode(errors="replace").splitlines() if not is_compiler_noise(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def libtpu_override() -> str | None:
    """The libtpu.so ``TPU_LIBRARY_PATH`` makes jax load, when it is not the libtpu package's own (a
    parent process's jax sets it to the one it loaded, and children inherit it); else None."""
    override = os.environ.get("TPU_LIBRARY_PATH")
    if not override:
        return None
    try:
        import importlib.util  # noqa: PLC0415

        spec = importlib.util.find_spec("libtpu")
        own = os.path.join(os.path.dirname(spec.origin), "libtpu.so") if spec and spec.origin else None
    except (ImportError, ValueError):
        own = None
    if own is not None and os.path.realpath(own) == os.path.realpath(override):
        return None
    return override


def _libtpu() -> str | None:
    """The libtpu package's version, or the libtpu.so loaded instead (:func:`libtpu_override`)."""
    version = _version("libtpu")
    override = libtpu_override()
    return version if override is None else f"{override} (TPU_LIBRARY_PATH; the libtpu package here is {version})"


# The packages whose versions pin a compiler's figures: libtpu (TPU and host targets), and the CUDA
# plugin's compiler (the plugin package itself holds jax's CUDA kernels; this one, XLA).
LIBTPU = "libtpu"
CUDA_COMPILER = "jax-cuda12-pjrt"


@functools.cache
def toolchain(compiler: str = LIBTPU) -> dict[str, str | None]:
    """The versions that determine compiled figures: jax, jaxlib and ``compiler``, the package of the
    compiler (libtpu: the libtpu.so jax loads; or the CUDA plugin's). ``targets.platform`` says which
    package each platform's programs compile with.

    Golden figures are only comparable when these match.

    Example:
        >>> list(toolchain(CUDA_COMPILER))
        ['jax', 'jaxlib', 'jax-cuda12-pjrt']
    """
    return {"jax": _version("jax"), "jaxlib": _version("jaxlib"),
            compiler: _libtpu() if compiler == LIBTPU else _version(compiler)}


def reset_peak_rss() -> None:
    """Starts a new peak-RSS measurement for this process (Linux: ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # Not Linux, or not allowed: the peak then covers the process's whole life.
        pass


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory since :func:`reset_peak_rss` (or since it started)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * (1 if sys.platform == "darwin" else 1024)
    except (ImportError, OSError):
        return None


def libtpu_available() -> bool:
    """Whether the ``libtpu`` package (XLA's TPU compiler) is installed."""
    return _version("libtpu") is not None


class HostError(AotcheckError, RuntimeError):
    """This host, not the config, kept a case from being measured: scratch space is full, libtpu
    cannot be loaded. The message says what to fix on the host."""


# Below this, XLA's dumps (the buffer assignment that splits the peak) may not have fitted.
SCRATCH_FLOOR_BYTES = 64 << 20


def scratch_problem(directory: str) -> str | None:
    """Why the filesystem of ``directory`` (a temporary directory) cannot take XLA's dumps, or None.

    Example:
        >>> scratch_problem(tempfile.gettempdir()) is None  # This machine has room.
        True
    """
    try:
        free = shutil.disk_usage(directory).free
    except OSError as e:
        return f"the temporary directory {directory} cannot be read ({e.strerror or e})"
    if free >= SCRATCH_FLOOR_BYTES:
        return None
    return (f"the temporary directory {os.path.dirname(directory) or directory} (TMPDIR) is out of space "
            f"({free / 2**10:.0f} KiB free): XLA's buffer dump, which splits the peak by class, did not fit. "
            "Free some space, or point TMPDIR at a larger disk")


# XLA's dumps go to a temporary directory per compile, named for the process that made it, so a
# directory left by a process that was killed (kill -9, the OOM killer) can be told from a live one's.
DUMP_PREFIX = "aotcheck-dump-"
_DUMP_NAME = re.compile(rf"^{DUMP_PREFIX}(?:(\d+)-)?")


def dump_directory() -> tempfile.TemporaryDirectory[str]:
    """A temporary directory for one compile's dumps (removed when the context ends)."""
    return tempfile.TemporaryDirectory(prefix=f"{DUMP_PREFIX}{os.getpid()}-")


def _tpu_log_dir() -> str:
    """Where libtpu writes this process's logs: the user's TPU_LOG_DIR, else a directory of this
    process's, named as dumps are (``remove_dumps`` removes it once the process is gone)."""
    if not os.environ.get("TPU_LOG_DIR"):
        os.environ["TPU_LOG_DIR"] = made = tempfile.mkdtemp(prefix=f"{DUMP_PREFIX}{os.getpid()}-tpu-logs-")
        # Removed when this process ends (its compile workers, which log there too, end before it): a run
        # leaves nothing in TMPDIR. A process killed outright leaves it to remove_dumps.
        atexit.register(shutil.rmtree, made, ignore_errors=True)
    return os.environ["TPU_LOG_DIR"]


_tpu_log_dir()  # Before libtpu loads: it reads TPU_LOG_DIR once.


def _warning_logs() -> dict[str, int]:
    """libtpu's WARNING log files of this process (one more after a rotation), with their sizes."""
    pattern = os.path.join(glob.escape(_tpu_log_dir()), f"*.log.WARNING.*.{os.getpid()}")
    sizes = {}
    for path in glob.glob(pattern):
        try:
            sizes[path] = os.path.getsize(path)
        except OSError:
            continue
    return sizes


@contextlib.contextmanager
def compiler_warnings() -> Iterator[list[str]]:
    """The warning lines libtpu logged while the block ran (filled in when it ends): read from its
    own log file (it prints only errors to stderr), so stderr and a crash's last words are untouched.

    Example (no compile, no warning):
        >>> with compiler_warnings() as lines:
        ...     pass
        >>> lines
        []
    """
    before = _warning_logs()
    found: list[str] = []
    try:
        yield found
    finally:
        for path in sorted(_warning_logs()):
            try:
                with open(path, "rb") as f:
                    f.seek(before.get(path, 0))
                    found.extend(f.read().decode(errors="replace").splitlines())
            except OSError:
                continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # Someone else's process.
        return True
    return True


def remove_dumps(pid: int | None = None) -> list[str]:
    """Removes dump directories of process ``pid`` (a worker just stopped), or, without one, those
    whose process is gone (and unnamed ones over an hour old, from versions that named none).
    Returns the directories removed.

    Example:
        >>> import subprocess, sys
        >>> gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
        ...                       capture_output=True, text=True).stdout.strip()
        >>> left = tempfile.mkdtemp(prefix=f"{DUMP_PREFIX}{gone}-")
        >>> mine = dump_directory()
        >>> left in remove_dumps(), os.path.isdir(mine.name)
        (True, True)
        >>> mine.cleanup()
    """
    removed = []
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        match = _DUMP_NAME.match(name)
        if not match:
            continue
        path = os.path.join(root, name)
        owner = int(match[1]) if match[1] else None
        try:
            if pid is not None:
                doomed = owner == pid
            elif owner is not None:
                doomed = owner != os.getpid() and not _alive(owner)
            else:
                doomed = time.time() - os.stat(path).st_mtime > 3600
        except OSError:
            continue
        if doomed:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def memory_limits() -> list[tuple[str, int]]:
    """The memory limits set on this process (inherited by its compile workers), each as its words
    (``address space capped at 0.95 GiB (ulimit -v 1000000, RLIMIT_AS)``) and bytes: ``ulimit -v``
    (RLIMIT_AS, the address space, which every mapping counts against: libtpu's 0.6 GB library, each
    thread's stack) and ``ulimit -d`` (RLIMIT_DATA); none where unset or unreadable."""
    try:
        import resource  # noqa: PLC0415  (POSIX only)
    except ImportError:
        return []
    out = []
    for name, flag, what in (("RLIMIT_AS", "-v", "address space"), ("RLIMIT_DATA", "-d", "data segment")):
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            soft, _ = resource.getrlimit(which)
        except (OSError, ValueError):
            continue
        if soft != resource.RLIM_INFINITY and soft >= 0:
            out.append((f"{what} is capped at {soft / 2**30:.2f} GiB (ulimit {flag} {soft // 1024}, {name})", int(soft)))
    return out


# What a process says when it cannot map or allocate memory: a library's segments (dlopen), libtpu's
# own mmap of itself, a thread's stack (pthread_create's EAGAIN), the heap.
_MAPPING_FAILURE = re.compile(
    r"Cannot allocate memory|failed to map segment|mmap error: 12|\bENOMEM\b|Could not mmap|"
    r"pthread_create\(\) failed|std::bad_alloc|\bMemoryError\b")


def _evidence(text: str) -> str:
    """The words around the first mapping failure in ``text``: the clause that says it."""
    for line in text.splitlines():
        match = _MAPPING_FAILURE.search(line)
        if match:
            start = max(0, match.start() - 100)
            start = (line.find(" ", start, match.start()) + 1 or start) if start else 0  # At a word.
            end = min(len(line), match.end() + 60)
            for stop in (")", ";"):
                found = line.find(stop, match.end())
                if found != -1:
                    end = min(end, found)
            return ("..." if start else "") + line[start:end].strip() + ("..." if end < len(line.rstrip()) else "")
    return ""


def memory_limit_problem(text: str) -> str | None:
    """When ``text`` (an error, a dead compile process's last lines) says mapping or allocating memory
    failed, what to tell the user: the host's memory limit (named, where this process has one), not
    libtpu's install nor the config. None when it says no such thing.

    Example:
        >>> memory_limit_problem("Check failed: x == y") is None
        True
        >>> print(memory_limit_problem("libtpu.so: failed to map segment from shared object"))  # doctest: +ELLIPSIS
        the host's memory...could not map what it needed (libtpu.so: failed to map segment from shared object)...
    """
    if _MAPPING_FAILURE.search(text) is None:
        return None
    evidence = _evidence(text)
    limits = memory_limits()
    if limits:
        caps = "; ".join(words for words, _ in limits)
        return (f"the host's memory limit, not libtpu's install nor your config: this run's {caps}, and the "
                f"compile process could not map what it needed ({evidence}). Loading libtpu alone maps about "
                "0.6 GiB, and a compile more: raise or lift the limit for this run (ulimit -v unlimited), or "
                "run where it allows more.")
    return (f"the host's memory, not libtpu's install nor your config: the compile process could not map what it "
            f"needed ({evidence}). Free memory or run on a larger machine; a container's or the kernel's "
            "overcommit limit can do this too.")


def host_memory_bytes() -> int | None:
    """This host's physical memory, None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
