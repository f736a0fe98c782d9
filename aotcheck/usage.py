"""What is wrong with how a run was asked for, before anything reads it: an ini key spelled near one of
aotcheck's (a typo would switch its check off without a word), an option given twice (the last would win
without a word), a value after a space that a parser would read as an option of its own.

Example:
    >>> invocation_problem(["--aot-topologies=v4-8", "--aot-topologies=v5e-16"], front_end="pytest")
    '--aot-topologies is given 2 times; give it once (its last value would win without a word)'
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence

from aotcheck.readers import SettingsError
from aotcheck.settings import INI_KEYS, SETTINGS


def check_ini_keys(keys: Collection[str], *, where: object) -> None:
    """A SettingsError for an ini key aotcheck does not read that is spelled near one it does (a typo would
    switch its check off without a word): an ``aot_*`` key it does not know, a known key with hyphens, in
    capitals or without its underscore (``aot-hbm-headroom``, ``aothbm_headroom``), and a flag that has no
    ini key (``aot_shard``: per run, on the command line), each naming what to write instead.

    Example:
        >>> check_ini_keys(["aot_topologies", "addopts"], where="pytest.ini")
        >>> check_ini_keys(["aot_hbm_headrom"], where="pytest.ini")
        Traceback (most recent call last):
        ...
        aotcheck.readers.SettingsError: pytest.ini: aot_hbm_headrom is not an aotcheck setting, so nothing reads it; did you mean aot_hbm_headroom? (every key: aotcheck check --help, pytest --help)
        >>> check_ini_keys(["aot-hbm-headroom"], where="pytest.ini")
        Traceback (most recent call last):
        ...
        aotcheck.readers.SettingsError: pytest.ini: aot-hbm-headroom is not an aotcheck setting, so nothing reads it; write it aot_hbm_headroom (every key: aotcheck check --help, pytest --help)
        >>> check_ini_keys(["aot_shard"], where="pytest.ini")
        Traceback (most recent call last):
        ...
        aotcheck.readers.SettingsError: pytest.ini: aot_shard is not an aotcheck setting, so nothing reads it; the shard is given per run, on the command line: --aot-shard (pytest), --shard (aotcheck check) (every key: aotcheck check --help, pytest --help)
    """
    for key in sorted(keys):
        hint = _ini_key_hint(key)
        if hint is not None:
            raise SettingsError(f"{where}: {key} is not an aotcheck setting, so nothing reads it; {hint} "
                                "(every key: aotcheck check --help, pytest --help)")


def _ini_key_hint(key: str) -> str | None:
    """What to write for ``key``, an ini key spelled near aotcheck's; None for a key aotcheck reads, or one
    that is no near spelling of its keys (another plugin's)."""
    if key in INI_KEYS:
        return None
    norm = key.strip().lower().replace("-", "_")
    if not norm.startswith("aot"):
        return None
    norm = norm if norm.startswith("aot_") else "aot_" + norm[3:].lstrip("_")
    flag_only = {f"aot_{s.name}": s for s in SETTINGS if not s.ini and (s.pytest or s.cli)}
    flag_only.update({f"aot_{s.pytest.lstrip('-').replace('-', '_')}": s for s in flag_only.copy().values() if s.pytest})
    if norm in flag_only:
        s = flag_only[norm]
        flags = ", ".join(f"{flag} ({front})" for flag, front in ((s.pytest, "pytest"), (s.cli, "aotcheck check")) if flag)
        return f"the {s.name.replace('_', ' ')} is given per run, on the command line: {flags}"
    if norm in INI_KEYS:
        return f"write it {norm}"
    near = difflib.get_close_matches(norm, sorted(INI_KEYS), n=1, cutoff=0.6)
    if near:
        return f"did you mean {near[0]}?"
    return f"aotcheck reads {', '.join(sorted(INI_KEYS))}." if key.lower().startswith("aot_") else None


def repeated_options(args: Sequence[str], *, front_end: str) -> list[str]:
    """The settings' value options given more than once in ``args`` (a command line), in order: the last
    would win without a word. Options that append (``--module``) may repeat.

    Example:
        >>> repeated_options(["--aot-topologies=v4-8", "-k", "x", "--aot-topologies", "v5e-16"], front_end="pytest")
        ['--aot-topologies']
        >>> repeated_options(["--module", "a.py", "--module=b.py", "--topologies", "v4-8"], front_end="cli")
        []
    """
    flags = {getattr(s, front_end) for s in SETTINGS if getattr(s, front_end) and s.action not in ("append", "store_true")}
    seen: list[str] = []
    repeated: list[str] = []
    for arg in args:
        if arg == "--":
            break
        flag = arg.partition("=")[0]
        if flag in flags:
            if flag in seen and flag not in repeated:
                repeated.append(flag)
            seen.append(flag)
    return repeated


def dash_value(args: Sequence[str], *, front_end: str) -> str | None:
    """A usage message for a value option followed by a value that starts with ``-`` (``--shard -1/4``):
    the parser reads the value as an option of its own and says only "expected one argument".

    Example:
        >>> dash_value(["check", "--shard", "-1/4"], front_end="cli")
        "--shard -1/4: write --shard=-1/4 (given after a space, '-1/4' reads as an option of its own); --shard is K/N, 1 <= K <= N, e.g. --shard=1/4"
        >>> dash_value(["--shard=1/4"], front_end="cli") is None
        True
    """
    flags = {getattr(s, front_end): s for s in SETTINGS if getattr(s, front_end) and s.action != "store_true"}
    for flag, value in zip(args, args[1:]):
        if flag in flags and value.startswith("-") and value[1:2].isdigit():
            setting = flags[flag]
            hint = f"; {flag} is K/N, 1 <= K <= N, e.g. {flag}=1/4" if setting.name == "shard" else ""
            return f"{flag} {value}: write {flag}={value} (given after a space, {value!r} reads as an option of its own){hint}"
    return None


def invocation_problem(args: Sequence[str], *, front_end: str) -> str | None:
    """What is wrong with a command line before its parser reads it: an option given twice (the last would
    win without a word), or a value after a space that reads as an option (:func:`dash_value`)."""
    twice = repeated_options(args, front_end=front_end)
    if twice:
        return (f"{twice[0]} is given {sum(a.partition('=')[0] == twice[0] for a in args)} times; give it once (its "
                "last value would win without a word)")
    return dash_value(args, front_end=front_end)
