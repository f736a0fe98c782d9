"""Which Python line made an HLO instruction: ``metadata={source_file= source_line=}``, or its
``stack_frame_id`` into the module's frame tables (``FileNames``, ``FileLocations``, ``StackFrames``).

Example:
    >>> from aotcheck.figures.hlo import parse_instruction
    >>> inst = parse_instruction('%d = f32[2]{0} dot(%a, %b), metadata={op_name="jit(f)/dot_general" '
    ...                          'source_file="/elsewhere/model.py" source_line=9}')
    >>> metadata(inst, "op_name"), instruction_source(inst, {})
    ('jit(f)/dot_general', 'model.py:9')
"""

from __future__ import annotations

import os
import re
from typing import Any

def short_source(path: str, line: str | int) -> str:
    """``file:line``, the file as a reader finds it: relative to the working directory, else from its
    top-level package (``aotcheck/models/lm.py``) or its site-packages, else its base name.

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
        >>> short_source("/elsewhere/model.py", 7)
        'model.py:7'
    """
    here = os.getcwd() + os.sep
    if path.startswith(here):
        return f"{path[len(here):]}:{line}"
    if "site-packages" + os.sep in path:
        return f"{path.split('site-packages' + os.sep, 1)[1]}:{line}"
    top = os.path.dirname(path)
    while os.path.exists(os.path.join(top, "__init__.py")):
        top = os.path.dirname(top)
    if top != os.path.dirname(path):
        return f"{os.path.relpath(path, top)}:{line}"
    return f"{os.path.basename(path)}:{line}"


_TABLE_ROW = re.compile(r"^(\d+) (.*)$")


def stack_frames(text: str) -> dict[int, str]:
    """Stack frame id -> ``file:line`` of the Python line it names, from an HLO module's frame tables.

    An instruction's ``metadata={... stack_frame_id=N}`` points into these tables
    (``FileNames``, ``FileLocations``, ``StackFrames``), printed before the first
    computation. The line chosen for a frame is its innermost one outside installed
    packages (the user's model or step, not optax's internals); the innermost if all are.

    Example:
        >>> stack_frames('''HloModule m
        ... FileNames
        ... 1 "/venv/lib/python3.11/site-packages/optax/_src/base.py"
        ... 2 "/elsewhere/model.py"
        ...
        ... FunctionNames
        ... 1 "loss"
        ...
        ... FileLocations
        ... 1 {file_name_id=2 function_name_id=1 line=88 end_line=88 column=4 end_column=4}
        ... 2 {file_name_id=1 function_name_id=1 line=12 end_line=12 column=4 end_column=4}
        ...
        ... StackFrames
        ... 1 {file_location_id=1 parent_frame_id=1}
        ... 2 {file_location_id=2 parent_frame_id=2}
        ... ''')
        {1: 'model.py:88', 2: 'model.py:88'}
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
        pick = next((loc for loc in chain if "site-packages" not in loc[0]), chain[0] if chain else None)
        if pick:
            out[frame] = short_source(*pick)
    return out


def metadata(inst: Any, key: str) -> str | None:
    """One field of an instruction's ``metadata={...}`` (``op_name``, ``source_line``, ...), or None."""
    match = re.search(rf'\b{key}=("([^"]*)"|\d+)', inst.attrs)
    return None if not match else (match[2] if match[2] is not None else match[1])


def instruction_source(inst: Any, frames: dict[int, str]) -> str | None:
    """The Python line that made ``inst``: its ``source_file``/``source_line``, or its stack frame's."""
    file, line = metadata(inst, "source_file"), metadata(inst, "source_line")
    if file and line:
        return short_source(file, line)
    frame = metadata(inst, "stack_frame_id")
    return frames.get(int(frame)) if frame else None
