"""A shared store behind the local figures cache: an object store (``gs://``, ``s3://``, ``az://``) or a
directory (``file://``), by URL, through fsspec.

Runners that share one store compile a case once between them. The store is a convenience, never a
dependency: every call is bounded by a timeout, and the first failure (the store down, slow, or
refusing this runner's credentials) switches it off for the rest of the process with one note, so the
run goes on compiling locally. What is written is whole: one object per entry, put in a single
request (an object store shows a reader the old object or the new one, never a part), and in a
directory a temporary file renamed over the entry. Credentials and endpoints are the cloud SDK's own
(its environment variables and files; ``AWS_ENDPOINT_URL`` for an S3-compatible store): aotcheck has
no setting for them.

Example (a directory as the store):
    >>> import tempfile
    >>> store = SharedStore("file://" + tempfile.mkdtemp())
    >>> store.get("ab/abc.json") is None  # Absent: a miss, not a failure.
    True
    >>> store.put("ab/abc.json", b'{"x": 1}')
    >>> store.get("ab/abc.json"), store.down, store.notes
    (b'{"x": 1}', None, [])
    >>> SharedStore("file:///x", write=False).put("ab/abc.json", b"{}")  # Read-only: nothing written.
"""

from __future__ import annotations

import errno
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from aotcheck._files import atomic_write_bytes
from aotcheck.errors import AotcheckError

T = TypeVar("T")

# The schemes a shared cache may name, and the fsspec package each one needs (fsspec itself is installed).
SCHEMES: dict[str, str | None] = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
                                  "file": None}
TIMEOUT_SECONDS = 20.0
_CLIENT_OPTIONS: dict[str, dict[str, Any]] = {
    "s3": {"config_kwargs": {"connect_timeout": 5, "read_timeout": 15, "retries": {"max_attempts": 2}}},
}  # One request; past it the store counts as down for the rest of the process.


class StoreError(AotcheckError, ValueError):
    """A cache URL aotcheck cannot use: an unknown scheme, or its fsspec package not installed."""


# Where each store's SDK takes its credentials from: never a URL (it would be printed, reported and logged).
CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the runner's role)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (or the runner's service account)",
    "az": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY",
}
_SECRET_PARAMS = ("key", "secret", "token", "sig", "password", "credential", "signature")


def redacted(url: str) -> str:
    """``url`` with what may be a secret replaced by ``***``: credentials before the bucket, and the
    value of a query parameter that names a key, secret, token or signature.

    Example:
        >>> redacted("s3://AKIA123:s3cr3t@bucket/aot"), redacted("az://c/p?sig=abc&sv=2024")
        ('s3://***@bucket/aot', 'az://c/p?sig=***&sv=2024')
    """
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    path, question, query = path.partition("?")
    if question:
        query = "&".join(f"{name}=***" if any(s in name.lower() for s in _SECRET_PARAMS) else f"{name}{eq}{value}"
                         for name, eq, value in (part.partition("=") for part in query.split("&")))
    return f"{scheme}{sep}{authority}{slash}{path}{question}{query}"


def check_url(url: str) -> str:
    """``url`` if aotcheck can reach a store there, else a StoreError naming the fix. A URL that holds
    credentials is refused, and never repeated: they come from the SDK's own environment.

    Example:
        >>> check_url("file:///srv/aot-cache")
        'file:///srv/aot-cache'
        >>> check_url("ftp://host/cache")
        Traceback (most recent call last):
        ...
        aotcheck.pipeline.store.StoreError: 'ftp://host/cache' is not a store aotcheck reads: give gs://BUCKET/PATH, s3://BUCKET/PATH, az://CONTAINER/PATH or file:///DIRECTORY.
    """
    scheme, sep, rest = url.partition("://")
    if redacted(url) != url:
        where = CREDENTIALS.get({"gcs": "gs", "abfs": "az"}.get(scheme, scheme))
        raise StoreError(f"{redacted(url)!r} holds credentials, and aotcheck takes none from a URL (it would print "
                         f"them in the header, the notes and the report): give the URL without them"
                         + (f", and set {where}" if where else "") + ".")
    if not sep or scheme not in SCHEMES or not rest.strip("/"):
        raise StoreError(f"{url!r} is not a store aotcheck reads: give gs://BUCKET/PATH, s3://BUCKET/PATH, "
                         "az://CONTAINER/PATH or file:///DIRECTORY.")
    package = SCHEMES[scheme]
    if package is not None:
        import importlib.util

        if importlib.util.find_spec(package) is None:
            extra = " (or pip install 'aotcheck[s3]')" if package == "s3fs" else ""
            raise StoreError(f"{url!r}: a {scheme}:// store is read through fsspec's {package}, which is not "
                             f"installed: pip install {package}{extra}.")
    return url


class SharedStore:
    """Named objects (``ab/abc.json``) under a URL; ``write=False``: read only (a pull request from a fork)."""

    def __init__(self, url: str, *, write: bool = True, timeout: float = TIMEOUT_SECONDS) -> None:
        self.url = check_url(url).rstrip("/")
        self.write = write
        self.timeout = timeout
        self.down: str | None = None  # Why the store is off for this process, once it is.
        self.notes: list[str] = []
        self._fs: Any = None

    def __repr__(self) -> str:
        return f"SharedStore({self.url!r}, write={self.write})"

    @property
    def local(self) -> Path | None:
        """The directory a ``file://`` store is, else None."""
        return Path(self.url.partition("://")[2]) if self.url.startswith("file://") else None

    def where(self, name: str) -> str:
        """The URL of the object ``name``."""
        return f"{self.url}/{name}"

    def get(self, name: str) -> bytes | None:
        """The object's bytes; None when it is absent or the store is down. A read refused for lack of
        permission is a miss too (S3 answers 403, not 404, for an absent object to a runner that may not
        list the bucket), said once."""
        def read() -> bytes | None:
            try:
                if self.local is not None:
                    return (self.local / name).read_bytes()
                return self._filesystem().cat_file(self._path(name))
            except FileNotFoundError:
                return None
            except PermissionError as e:
                self._once(f"aotcheck: reading the shared figures cache {self.url} was refused ({_reason(e)}); "
                           "each such read is a miss. A runner needs to read objects (and, on S3, to list the bucket).")
                return None
        return self._bounded(read)

    def put(self, name: str, data: bytes) -> None:
        """Writes the object whole (one request; a renamed file in a directory); nothing when read-only.
        A write refused for lack of permission stops this process's writes, not its reads."""
        if not self.write:
            return

        def write() -> None:
            try:
                if self.local is not None:
                    return atomic_write_bytes(self.local / name, data)
                return self._filesystem().pipe_file(self._path(name), data)
            except OSError as e:
                # Refused, or a read-only file system (a file:// store on a read-only mount): writes stop, reads
                # go on (hardening round 5, V22: EROFS turned the store off, said as unreachable).
                if not isinstance(e, PermissionError) and e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise
                self.write = False
                self._once(f"aotcheck: the shared figures cache {self.url} refuses this runner's writes "
                           f"({_reason(e)}); it is read, and nothing more is written to it.")
                return None
        self._bounded(write)

    def _once(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def _path(self, name: str) -> str:
        return f"{self.url.partition('://')[2]}/{name}"

    def _filesystem(self) -> Any:
        if self._fs is None:
            import fsspec

            # The SDK's own configuration (environment, files); aotcheck only asks for a fresh client that
            # gives up soon on a dead endpoint (botocore retries a refused connection for seconds).
            scheme = self.url.partition("://")[0]
            self._fs = fsspec.filesystem(scheme, skip_instance_cache=True, **_CLIENT_OPTIONS.get(scheme, {}))
        return self._fs

    def _bounded(self, call: Callable[[], T]) -> T | None:
        """``call()`` in a daemon thread, for at most :attr:`timeout` seconds; the first failure turns the
        store off, and is None (a thread left hanging on a dead connection holds up nothing, not even the
        exit)."""
        if self.down is not None:
            return None
        answer: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)

        def run() -> None:
            try:
                answer.put((True, call()))
            except BaseException as e:  # Reported to the caller's thread below.
                answer.put((False, e))
        threading.Thread(target=run, name="aotcheck-shared-cache", daemon=True).start()
        try:
            ok, value = answer.get(timeout=self.timeout)
        except queue.Empty:
            return self._off(f"no answer within {self.timeout:g} s")
        if ok:
            return value
        if isinstance(value, (KeyboardInterrupt, SystemExit)):
            raise value
        return self._off(_reason(value))

    def _off(self, reason: str) -> None:
        self.down = reason
        self.notes.append(f"aotcheck: the shared figures cache {self.url} is unreachable ({reason}); "
                          "this run compiles what the local cache lacks, and shares nothing.")


def _reason(error: BaseException) -> str:
    """An error of the store's client in one line, the same for every object (its class and what it
    says before naming any one object or URL), so that each process's note reads alike.

    Example:
        >>> _reason(OSError('Could not connect to the endpoint URL: "http://127.0.0.1:9/b/ab/abc.json"'))
        'OSError: Could not connect to the endpoint URL'
    """
    text = str(error).strip().splitlines()[0].split(":")[0].strip() if str(error).strip() else ""
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


__all__ = ["SCHEMES", "SharedStore", "StoreError", "TIMEOUT_SECONDS", "check_url"]
