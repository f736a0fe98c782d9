"""Readers of the gate's settings: each turns what a user wrote (an option, an ini line) into what
:class:`~aotcheck.settings.GateSettings` holds, or raises a :class:`SettingsError` that names the
setting as the user wrote it and the fix. The table that pairs each setting with its reader is
:data:`aotcheck.settings.SETTINGS`.

Example:
    >>> r = Reading(Path("/p"), {"slices": "--aot-slices"}, {"slices": "1,x"})
    >>> split_list("a,b c"), example("--aot-slices", "1,2"), example("aot_slices", "1,2")
    (['a', 'b', 'c'], '--aot-slices=1,2', 'aot_slices = 1,2')
    >>> read_slices("1,x", r)
    Traceback (most recent call last):
    ...
    aotcheck.readers.SettingsError: --aot-slices: 'x' is not a slice count; give integers >= 1, e.g. --aot-slices=1,2
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from aotcheck.errors import AotcheckError
from aotcheck.gate.compare import Tolerance, ToleranceError, parse_tolerances
from aotcheck.gate.shard import ShardError, parse_shard
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import figure_names
from aotcheck.pipeline.store import StoreError, check_url
from aotcheck.programs.options import OptionsError, parse_libtpu_init_args
from aotcheck.targets.topology import Target, TopologyError, check_num_slices, expand_targets
from aotcheck.units import read_count

MISSING_VALUE = "\0missing"  # An option given with no value (the plugin names the fix before pytest's parse fails).


class SettingsError(AotcheckError, ValueError):
    """A setting that cannot be used; the message names the option and the fix."""


class Reading(NamedTuple):
    """What a row's reader sees besides its value: the rootdir, how a message names each setting,
    and every setting's value as given (a reader may need another's: the targets, the slice counts)."""

    rootdir: Path
    said: Mapping[str, str]
    given: Mapping[str, Any]


def split_list(value: str | Sequence[str] | None) -> list[str]:
    """``"a,b c"`` or ``["a,b", "c"]`` -> ``["a", "b", "c"]``."""
    texts = [value] if isinstance(value, str) else list(value or [])
    return [v for text in texts for v in re.split(r"[,\s]+", text) if v]


def example(name: str, value: str) -> str:
    """A setting with a value, as written where ``name`` (a flag or an ini key) is written."""
    return f"{name}={value}" if name.startswith("-") else f"{name} = {value}"


def read_slices(value: Any, r: Reading) -> list[int]:
    counts = []
    for text in split_list(value):
        if not text.isdecimal() or not text.isascii() or read_count(text) < 1:
            raise SettingsError(f"{r.said['slices']}: {text!r} is not a slice count; give integers >= 1, "
                                f"e.g. {example(r.said['slices'], '1,2')}")
        try:
            counts.append(check_num_slices(read_count(text)))
        except TopologyError as e:
            raise SettingsError(f"{r.said['slices']}: {e}") from None
    return counts


def read_targets(value: Any, r: Reading) -> tuple[Target, ...]:
    counts = read_slices(r.given["slices"], r)  # Its errors first, as the slices come first on a target.
    try:
        return tuple(expand_targets(split_list(value), counts or [1]))
    except TopologyError as e:
        raise SettingsError(f"{r.said['topologies']}: {e}") from None


def read_tolerances(value: Any, r: Reading) -> tuple[tuple[str, Tolerance], ...]:
    try:
        return tuple(parse_tolerances(value, known=figure_names()))
    except ToleranceError as e:
        raise SettingsError(f"{r.said['tolerances']}: {e}") from None


def read_headroom(value: Any, r: Reading) -> float:
    try:
        headroom = float(value)
        if not 0 < headroom <= 1:
            raise ValueError
    except ValueError:
        raise SettingsError(f"{r.said['hbm_headroom']}: {value!r} must be a number in (0, 1], e.g. 0.95") from None
    return headroom


def read_memory_fraction(value: Any, r: Reading) -> float | None:
    if not (value or "").strip():
        return None
    try:
        fraction = float(value)
        if not 0 < fraction <= 1:
            raise ValueError
    except ValueError:
        raise SettingsError(f"{r.said['memory_fraction']}: {value!r} must be a number in (0, 1], the share of a GPU's "
                            "memory your served process runs with (its XLA_PYTHON_CLIENT_MEM_FRACTION), "
                            "e.g. 0.9") from None
    return fraction


def read_knob(value: Any, r: Reading) -> str | None:
    fit = (value or "").strip() or None
    if fit is not None and not fit.isidentifier():
        raise SettingsError(f"{r.said['fit']}: {fit!r} is not a knob name; name what to search on every config, "
                            f"e.g. {example(r.said['fit'], 'batch')} (a config may offer more knobs in knobs=)")
    return fit


def read_shard(value: Any, r: Reading) -> tuple[int, int] | None:
    try:
        return parse_shard(value) if value else None
    except ShardError as e:
        raise SettingsError(f"{r.said['shard']}: {e}") from None


def read_launch_flags(value: Any, r: Reading) -> dict[str, str]:
    if value == MISSING_VALUE:  # Bare, from addopts or PYTEST_ADDOPTS (the command line's is caught earlier).
        raise SettingsError(f"{r.said['libtpu_init_args']} needs its value after '=': "
                            f"{r.said['libtpu_init_args']}=--xla_...")
    text = value if isinstance(value, str) else " ".join(value or ())
    try:
        return parse_libtpu_init_args(text, what=r.said["libtpu_init_args"])
    except OptionsError as e:
        raise SettingsError(str(e)) from None


def read_report_path(value: Any, r: Reading) -> Path | None:
    path = Path(value) if value else None
    flag = r.said["report"]
    if path is not None and (path.is_dir() or path.name in ("", ".", "..")):
        raise SettingsError(f"{flag}: {value} is a directory; give a file path, "
                            f"e.g. {flag}={(path / 'aot-report.json').as_posix()}")
    if path is not None and any(p.exists() and not p.is_dir() for p in path.parents):
        raise SettingsError(f"{flag}: {value} lies under a file, not a directory; give a path in a directory")
    return path


def read_export(value: Any, r: Reading) -> str | None:
    """Where passing cases' executables go: a directory (relative to the rootdir) or a store URL."""
    text = str(value or "").strip()
    if not text:
        return None
    if "://" in text:
        try:
            return check_url(text)
        except StoreError as e:
            raise SettingsError(f"{r.said['export']}: {e}") from None
    path = Path(text) if Path(text).is_absolute() else r.rootdir / text
    if path.exists() and not path.is_dir():
        raise SettingsError(f"{r.said['export']}: {text} is a file; give a directory (made if absent) or a store URL")
    return str(path)


def read_cases(value: Any, r: Reading) -> tuple[Case, ...]:
    cases = []
    for text in value or ():
        try:
            cases.append(Case.parse(text.strip()))
        except ValueError as e:
            raise SettingsError(f"{r.said['cases']}: {text!r} is not a case id: {e} Give one as a case's accept "
                                f"command prints it, e.g. {example(r.said['cases'], 'lm-tiny/train_step@v4-8x1')}, "
                                "quoted for the shell") from None
    return tuple(dict.fromkeys(cases))


def read_cache_dir(value: Any, r: Reading) -> Path | None:
    return r.rootdir / value if value and not r.given.get("no_cache") else None


def read_cache_url(value: Any, r: Reading) -> str | None:
    url = (value or "").strip()
    if not url or r.given.get("no_cache"):
        return None
    if not r.given.get("cache_dir"):
        raise SettingsError(f"{r.said['cache_url']}: a shared cache sits behind the local one, and "
                            f"{r.said['cache_dir']} is empty; give a directory, e.g. "
                            f"{example(r.said['cache_dir'], '.aotcheck-cache')}")
    try:
        return check_url(url)
    except StoreError as e:
        raise SettingsError(f"{r.said['cache_url']}: {e}") from None
