"""Which Python line made an HLO instruction: ``metadata={source_file= source_line=}``, or its
``stack_frame_id`` into the module's frame tables (``FileNames``, ``FileLocations``, ``StackFrames``).

A line is named twice (:class:`Lines`): the user's (the innermost frame outside installed
packages: the call into a model installed as a package) and the model library's (the innermost
frame outside :data:`FRAMEWORKS`, inside the call: ``esm2quinox/_esm2.py:123``), the second only
where it is another line. An instruction with ``source_file``/``source_line`` and no frames (an
older jax) names one line: the library's is None.

Example:
    >>> from aotcheck.figures.hlo import parse_instruction
    >>> inst = parse_instruction('%d = f32[2]{0} dot(%a, %b), metadata={op_name="jit(f)/dot_general" '
    ...                          'source_file="/elsewhere/model.py" source_line=9}')
    >>> metadata(inst, "op_name"), instruction_source(inst, {}), instruction_library(inst, {})
    ('jit(f)/dot_general', 'model.py:9', None)
"""

from __future__ import annotations

import functools
import os
import re
import sysconfig
from collections.abc import Mapping
from typing import Any, NamedTuple

FRAMEWORKS = frozenset({
    # JAX itself, and what it is built on or ships with.
    "jax", "jaxlib", "jax_plugins", "libtpu", "numpy", "ml_dtypes", "opt_einsum", "scipy",
    # The libraries a model is written *with* (layers, optimizers, checkpoints, array types),
    # whose lines say how a layer works, not which of the model's layers it is.
    "flax", "optax", "equinox", "haiku", "chex", "orbax", "jaxtyping", "typeguard", "beartype",
    "einops", "treescope", "etils", "wadler_lindig", "typing_extensions", "keras", "kauldron",
    # aotcheck (its train step, its adapters, its own reference model) and the runners that call it.
    "aotcheck", "_pytest", "pytest", "pluggy",
})
"""Top-level packages no model lives in: a frame in one of them (or in Python's standard library:
typing, functools, contextlib, ...) is never a model library's line. A model installed as a package
(``esm2quinox``, ``gemma``) is any other package; its innermost frame names the line of the model
that made an op, where the user's line (outside installed packages) names only the call into it."""


def short_source(path: str, line: str | int) -> str:
    """``file:line``, the file as a reader finds it: an installed one from its site-packages (a
    virtual environment inside the working directory too), else relative to the working directory,
    else from its top-level package (``aotcheck/models/lm.py``), else its base name.

    Example:
        >>> short_source(os.path.join(os.getcwd(), "models", "lm.py"), 88)
        'models/lm.py:88'
        >>> import tempfile
        >>> package = os.path.join(tempfile.mkdtemp(), "pkg", "models")
        >>> os.makedirs(package)
        >>> for d in (package, os.path.dirname(package)):
        ...     open(os.path.join(d, "__init__.py"), "w").close()
        >>> short_source(os.path.join(package, "lm.py"), 12)
        'pkg/models/lm.py:12'
        >>> short_source("/venv/lib/python3.11/site-packages/flax/linen/linear.py", 12)
        'flax/linen/linear.py:12'
        >>> short_source(os.path.join(os.getcwd(), ".venv/lib/python3.12/site-packages/esm2quinox/_esm2.py"), 231)
        'esm2quinox/_esm2.py:231'
        >>> short_source("/elsewhere/model.py", 7)
        'model.py:7'
    """
    if "site-packages" + os.sep in path:
        return f"{path.split('site-packages' + os.sep, 1)[1]}:{line}"
    here = os.getcwd() + os.sep
    if path.startswith(here):
        return f"{path[len(here):]}:{line}"
    top = os.path.dirname(path)
    while os.path.exists(os.path.join(top, "__init__.py")):
        top = os.path.dirname(top)
    if top != os.path.dirname(path):
        return f"{os.path.relpath(path, top)}:{line}"
    return f"{os.path.basename(path)}:{line}"


_TABLE_ROW = re.compile(r"^(\d+) (.*)$")
_INSTALLED = re.compile(r"[\\/](?:site|dist)-packages[\\/]")
# aotcheck's own machinery (its train step, its adapters' calls into a library): never a user's line.
_MACHINERY = re.compile(r"[\\/]aotcheck[\\/](?:adapters|programs)[\\/]")
_STDLIB = re.compile(r"[\\/]lib[\\/]python\d+(?:\.\d+)?[\\/](?!(?:site|dist)-packages[\\/])")


class Lines(NamedTuple):
    """The lines one stack frame names: the user's, and the model library's where that is another."""

    source: str  # The innermost frame outside installed packages (and Python's): the user's code ("model.py:88").
    library: str | None = None  # The innermost frame outside FRAMEWORKS, within the user's call.


@functools.lru_cache(maxsize=4096)
def is_framework(path: str) -> bool:
    """Whether a frame's file is Python's own or in one of :data:`FRAMEWORKS` (by top-level package).

    Example:
        >>> [is_framework(p) for p in ("/venv/lib/python3.12/site-packages/equinox/nn/_linear.py",
        ...                            "/venv/lib/python3.12/site-packages/esm2quinox/_esm2.py",
        ...                            "/usr/lib/python3.12/functools.py", "/elsewhere/model.py")]
        [True, False, True, False]
    """
    installed = _INSTALLED.split(path, maxsplit=1)
    if len(installed) == 2:
        return re.split(r"[\\/.]", installed[1], maxsplit=1)[0] in FRAMEWORKS
    if _is_stdlib(path):
        return True
    if path.startswith("<"):  # <string>: code with no file.
        return False
    top = os.path.dirname(path)
    while os.path.exists(os.path.join(top, "__init__.py")):
        top = os.path.dirname(top)
    package = os.path.relpath(path, top).split(os.sep)[0] if top != os.path.dirname(path) else os.path.basename(path)
    return package.removesuffix(".py") in FRAMEWORKS


@functools.lru_cache(maxsize=4096)
def _is_stdlib(path: str) -> bool:
    """Whether a file is Python's own (``functools``, ``contextlib``, ``<frozen runpy>``), here or as
    another machine lays it out (``.../lib/python3.12/``, not its site-packages)."""
    if path.startswith("<"):
        return path.startswith("<frozen")
    if _INSTALLED.search(path):
        return False
    stdlib = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")} - {None}
    return bool(_STDLIB.search(path)) or any(path.startswith(d.rstrip(os.sep) + os.sep) for d in stdlib)  # type: ignore[union-attr]


def _lines(chain: list[tuple[str, int]]) -> Lines | None:
    """The two picks of one frame's chain (innermost first)."""
    if not chain:
        return None
    # JAX leaves Python's own files out of its tables; an older one or another runtime may not.
    user = next((i for i, (path, _) in enumerate(chain) if "site-packages" not in path and not _is_stdlib(path)), None)
    source = short_source(*chain[user if user is not None else 0])
    # The library's line is looked for inside the user's call only: frames outside it (the runner
    # that called the user's code) name no line of the model.
    inside = chain[:user + 1] if user is not None else chain
    library = next((short_source(*loc) for loc in inside if not is_framework(loc[0])), None)
    if library is not None and user is not None and _MACHINERY.search(chain[user][0]):
        # A packaged model's step called by one of aotcheck's adapters (MaxText's): no line of the
        # user's made it, so the library's line is the source.
        return Lines(library, None)
    return Lines(source, library if library != source else None)


def stack_frames(text: str) -> dict[int, Lines]:
    """Stack frame id -> the :class:`Lines` it names, from an HLO module's frame tables.

    An instruction's ``metadata={... stack_frame_id=N}`` points into these tables
    (``FileNames``, ``FileLocations``, ``StackFrames``), printed before the first
    computation. A frame's ``source`` is its innermost line outside installed
    packages and Python's own files (the user's model or step, not optax's internals;
    the innermost if all are); its ``library`` the innermost line within that call outside
    :data:`FRAMEWORKS` (a model installed as a package), None where that is the same.

    Example (optax called by the user's loss; a packaged model's layer under equinox, called by
    the user's line 90):
        >>> frames = stack_frames('''HloModule m
        ... FileNames
        ... 1 "/venv/lib/python3.11/site-packages/optax/_src/base.py"
        ... 2 "/elsewhere/model.py"
        ... 3 "/venv/lib/python3.11/site-packages/equinox/nn/_linear.py"
        ... 4 "/venv/lib/python3.11/site-packages/esm2quinox/_layer.py"
        ...
        ... FunctionNames
        ... 1 "loss"
        ...
        ... FileLocations
        ... 1 {file_name_id=2 function_name_id=1 line=88 end_line=88 column=4 end_column=4}
        ... 2 {file_name_id=1 function_name_id=1 line=12 end_line=12 column=4 end_column=4}
        ... 3 {file_name_id=2 function_name_id=1 line=90 end_line=90 column=4 end_column=4}
        ... 4 {file_name_id=4 function_name_id=1 line=67 end_line=67 column=4 end_column=4}
        ... 5 {file_name_id=3 function_name_id=1 line=9 end_line=9 column=4 end_column=4}
        ...
        ... StackFrames
        ... 1 {file_location_id=1 parent_frame_id=0}
        ... 2 {file_location_id=2 parent_frame_id=2}
        ... 3 {file_location_id=3 parent_frame_id=0}
        ... 4 {file_location_id=4 parent_frame_id=4}
        ... 5 {file_location_id=5 parent_frame_id=5}
        ... ''')
        >>> frames[2]
        Lines(source='model.py:88', library=None)
        >>> frames[5]
        Lines(source='model.py:90', library='esm2quinox/_layer.py:67')
    """
    tables: dict[str, dict[int, str]] = {}
    table = None
    for line in text.splitlines():
        if line.startswith(("ENTRY", "%")):
            break
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table = tables.setdefault(line, {})
            continue
        row = _TABLE_ROW.match(line)
        if table is not None and row:
            table[int(row[1])] = row[2]
    files = {k: v.strip('"') for k, v in tables.get("FileNames", {}).items()}
    locations = {}
    for k, v in tables.get("FileLocations", {}).items():
        found = re.search(r"file_name_id=(\d+).*?\bline=(\d+)", v)
        if found and int(found[1]) in files:
            locations[k] = (files[int(found[1])], int(found[2]))
    frames = {}
    for k, v in tables.get("StackFrames", {}).items():
        found = re.search(r"file_location_id=(\d+) parent_frame_id=(\d+)", v)
        if found:
            frames[k] = (int(found[1]), int(found[2]) - 1)  # Printed parent ids are one past (0: no parent).
    out = {}
    for frame in frames:
        chain, seen, current = [], set(), frame
        while current in frames and current not in seen:
            seen.add(current)
            location = locations.get(frames[current][0])
            if location:
                chain.append(location)
            current = frames[current][1]
        lines = _lines(chain)
        if lines:
            out[frame] = lines
    return out


def metadata(inst: Any, key: str) -> str | None:
    """One field of an instruction's ``metadata={...}`` (``op_name``, ``source_line``, ...), or None."""
    match = re.search(rf'\b{key}=("([^"]*)"|\d+)', inst.attrs)
    return None if not match else (match[2] if match[2] is not None else match[1])


def _frame(inst: Any, frames: Mapping[int, Lines | str]) -> Lines | None:
    frame = metadata(inst, "stack_frame_id")
    found = frames.get(int(frame)) if frame else None
    return Lines(found) if isinstance(found, str) else found  # A table of plain lines: the user's only.


def instruction_source(inst: Any, frames: Mapping[int, Lines | str]) -> str | None:
    """The Python line that made ``inst``: its ``source_file``/``source_line``, or its stack frame's
    user line (``frames``: :func:`stack_frames`)."""
    file, line = metadata(inst, "source_file"), metadata(inst, "source_line")
    if file and line:
        return short_source(file, line)
    found = _frame(inst, frames)
    return found.source if found else None


def instruction_library(inst: Any, frames: Mapping[int, Lines | str]) -> str | None:
    """The model library's line that made ``inst`` where it is not :func:`instruction_source`'s
    (a model installed as a package); None with no stack frame (``source_file`` names one line)."""
    if metadata(inst, "source_file") and metadata(inst, "source_line"):
        return None
    found = _frame(inst, frames)
    return found.library if found else None
