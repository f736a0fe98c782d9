"""Files written whole or not at all, with the user's umask: goldens, cache entries, reports, ``init``'s files.

A leaf module, so every layer that writes a file uses the same writer.
"""

from __future__ import annotations

import os
import tempfile
import time
from glob import escape as glob_escape
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str, *, mode: int | None = None) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.json"
        >>> atomic_write_text(path, "{}")
        >>> path.read_text()
        '{}'
    """
    atomic_write_bytes(path, text.encode(), mode=mode)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Writes ``data`` to ``path`` via a temporary file and a rename: never half-written.

    The file gets ``mode``, else the permissions the user's umask gives a new file (not
    the temporary file's 0600), and temporary files a killed writer left for the same
    path (over a minute old: a live writer's are newer) are removed first.

    A symbolic link is written through: its target gets the text, the link stays a link
    (a golden kept elsewhere and linked in stays where its owner keeps it).

    Example:
        >>> import os, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "case.json"
        >>> _ = (path.parent / ".case.json.killed.tmp").write_text("half")
        >>> os.utime(path.parent / ".case.json.killed.tmp", (0, 0))
        >>> atomic_write_bytes(path, b"{}")
        >>> sorted(p.name for p in path.parent.iterdir()), oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
        (['case.json'], True)
    """
    if path.is_symlink():
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
        try:
            if time.time() - leftover.stat().st_mtime > 60:
                leftover.unlink()
        except OSError:  # Gone already, or not ours to remove.
            pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask() if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def probe_writable(root: Path) -> None:
    """Creates ``root`` if needed and writes and removes a file there; raises OSError if it cannot."""
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=root, prefix=".aotcheck-probe-"):
        pass
