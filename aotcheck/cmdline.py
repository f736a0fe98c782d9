"""aotcheck's command line, read: a parser whose usage errors name the fix, counts checked as such,
``--topology`` with ``--slices``, and the ini read without pytest (:mod:`aotcheck.cli` declares the
commands).

Example:
    >>> read_target(argparse.Namespace(topology="h100-16", slices=None)).name
    'h100-8x2'
    >>> positive("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '0' is not a count >= 1
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from pathlib import Path

from aotcheck.ini import Ini, find_ini
from aotcheck.settings import GateSettings, Setting, read_settings
from aotcheck.usage import check_ini_keys
from aotcheck.targets.topology import Target, TopologyError, split_target
from aotcheck.units import clip_runs, read_count


def count(text: str) -> int:
    if not (text.isascii() and text.isdecimal()):
        raise argparse.ArgumentTypeError(f"{clip_runs(text)!r} is not a count >= 0")
    return read_count(text)


def positive(text: str) -> int:
    if not (text.isascii() and text.isdecimal()) or read_count(text) < 1:
        raise argparse.ArgumentTypeError(f"{clip_runs(text)!r} is not a count >= 1")
    return read_count(text)


def ini_values(ini: Ini) -> Callable[[Setting], Any]:
    """How ``aotcheck`` reads a setting's ini value without pytest, by its type (aotcheck.settings)."""
    check_ini_keys(ini.values, where=ini.path)
    read = {"args": ini.args, "linelist": ini.lines, "bool": ini.flag}

    def value(setting: Setting) -> Any:
        if not setting.ini:
            return setting.default
        return read[setting.kind](setting.ini) if setting.kind in read else ini.get(setting.ini, setting.default)

    return value


def read_target(args: argparse.Namespace) -> Target:
    """``--topology`` with ``--slices``: a count in the name (``v4-8x2``, ``h100-16``) is the count.

    Example:
        >>> read_target(argparse.Namespace(topology="h100-8", slices=2)).name
        'h100-8x2'
    """
    if "," in args.topology:
        raise TopologyError(f"--topology {args.topology}: this command takes one target; `aotcheck fit` takes "
                            "several pools (the largest size that fits every one).")
    topology, fixed = split_target(args.topology)
    if fixed is not None and args.slices not in (None, fixed):
        raise TopologyError(f"--topology {args.topology} names {fixed} slices (hosts) and --slices says {args.slices}: "
                            "give the count once.")
    return Target.of(topology, fixed or (1 if args.slices is None else args.slices))


def read_targets(args: argparse.Namespace) -> list[Target]:
    """``--topology`` as one or several pools (``v5p-8,v4-8``), each read as :func:`read_target` reads one.

    Example:
        >>> [t.name for t in read_targets(argparse.Namespace(topology="v5p-8, v4-8x2", slices=None))]
        ['v5p-8x1', 'v4-8x2']
    """
    names = [n.strip() for n in args.topology.split(",")]
    if not all(names):
        raise TopologyError(f"--topology {args.topology!r} names an empty pool; give pools as v5p-8,v4-8.")
    targets = [read_target(argparse.Namespace(topology=name, slices=args.slices)) for name in names]
    twice = sorted({t.name for t in targets if [u.name for u in targets].count(t.name) > 1})
    if twice:
        raise TopologyError(f"--topology names {', '.join(twice)} twice; give each pool once.")
    return targets


class Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), whose usage errors add the fix where argparse's own
    words mislead: see :func:`launch_flags_hint`."""

    argv: Sequence[str] = ()  # The command line being parsed (main sets it), for the hint.

    def error(self, message: str) -> Any:
        super().error(message + launch_flags_hint(message, Parser.argv, known=self._option_string_actions))


# Flags whose value is a string of launch flags (``--xla_...=...``).
LAUNCH_FLAG_OPTIONS = ("--libtpu-init-args",)


def launch_flags_hint(message: str, argv: Sequence[str], *, known: Any = ()) -> str:
    """argparse reads a value that starts with ``--`` as an option of its own, so ``--libtpu-init-args --xla_x=1``
    (a space) is "expected one argument": the hint gives the spelling it takes. ``known``: the options of the
    command, where the flags given stop.

    Example:
        >>> launch_flags_hint("argument --libtpu-init-args: expected one argument",
        ...                   ["fit", "m", "--libtpu-init-args", "--xla_a=1", "--xla_b=2", "--json"], known={"--json"})
        "; argparse reads a value that starts with -- as an option of its own: use --libtpu-init-args='--xla_a=1 --xla_b=2'"
    """
    args = list(argv)
    for flag in LAUNCH_FLAG_OPTIONS:
        if f"argument {flag}: expected one argument" not in message or flag not in args:
            continue
        given = []
        for arg in args[args.index(flag) + 1:]:
            if not arg.startswith("-") or arg == "--" or arg.split("=", 1)[0] in known:
                break
            given.append(arg)
        value = " ".join(given) or "--xla_..."
        spelled = f"{flag}='{value}'" if "'" not in value else f"{flag}={shlex.quote(value)}"
        return f"; argparse reads a value that starts with -- as an option of its own: use {spelled}"
    return ""


COMPILE_SETTINGS = ("libtpu_init_args", "default_options", "config_modules")


def compile_options(args: argparse.Namespace) -> dict[str, object]:
    """The caller's options and the presets switch for ``compile`` and ``fit``, as ``check`` reads them."""
    ini = find_ini(Path.cwd())
    values = read_settings(option=lambda s: getattr(args, s.name, None) if s.name in COMPILE_SETTINGS else None,
                           ini=ini_values(ini))
    settings = GateSettings.parse(rootdir=ini.rootdir, front_end="cli", cache_dir=None,
                                  libtpu_init_args=values["libtpu_init_args"],
                                  default_options=values["default_options"], hbm_headroom=values["hbm_headroom"],
                                  memory_fraction=values["memory_fraction"], from_ini=values["from_ini"],
                                  environment_flags=values["environment_flags"])
    return {"compiler_options": settings.compiler_options, "presets": settings.presets,
            "hbm_headroom": settings.hbm_headroom, "memory_fraction": (settings.memory_fraction, "aot_memory_fraction")}
