"""The gate's settings, declared once: each one's pytest option, ini key, CLI flag, default and help.

Both front ends are generated from :data:`SETTINGS`: the pytest plugin's options and ini keys
(:func:`add_pytest_options`), ``aotcheck check``'s flags (:func:`add_cli_arguments`), how each
reads a value (option over ini over default: :func:`read_settings`), and the name an error
message gives a setting (:func:`flag_names`: the front end's flag, else the ini key).
:meth:`aotcheck.session.GateSettings.parse` then checks the values, whichever front end read them.

Example:
    >>> flag_names("pytest")["topologies"], flag_names("cli")["topologies"], flag_names("cli")["tolerances"]
    ('--aot-topologies', '--topologies', 'aot_tolerances')
    >>> values = read_settings(option=lambda s: {"topologies": "v4-8"}.get(s.name), ini=lambda s: s.default)
    >>> values["topologies"], values["golden_dir"], values["cache_dir"], values["update"]
    ('v4-8', 'golden', '.aotcheck-cache', False)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple


class Setting(NamedTuple):
    """One setting of the gate (a keyword of ``GateSettings.parse``) and how each front end spells it."""

    name: str
    pytest: str | None  # The plugin's option, e.g. "--aot-topologies" (None: ini only).
    cli: str | None  # ``aotcheck check``'s flag (None: ini only).
    ini: str | None  # The [pytest] ini key both front ends read (None: a flag only).
    kind: str  # The ini value's type, as pytest's addini takes it: "string", "args", "linelist", "bool".
    default: Any  # When neither the flag nor the ini says.
    help: str  # The plugin's option help.
    ini_help: str = ""  # The ini key's help (default: "default <option>").
    cli_help: str = ""  # The CLI flag's help (default: the plugin's).
    action: str | None = None  # "store_true" for a switch; "append": the CLI flag adds to the ini's lines.
    metavar: str | None = None


SETTINGS: tuple[Setting, ...] = (
    Setting("topologies", "--aot-topologies", "--topologies", "aot_topologies", "args", [],
            "topologies to check, e.g. v4-8,v5e-16,h100-8 (v5e-16x2: 2 slices only); 'none' turns the gate off for this "
            "run. Without any (here or in the ini), the plugin adds no tests.",
            cli_help="e.g. v4-8,v5e-16,h100-8 (v5e-16x2: 2 slices only)"),
    Setting("slices", "--aot-slices", "--slices", "aot_slices", "args", [],
            "slice counts for every topology, e.g. 1,2 (default 1)", cli_help="slice counts for every topology, e.g. 1,2"),
    Setting("configs", "--aot-configs", "--configs", "aot_configs", "args", [],
            "glob(s) over config names, e.g. 'lm-*' (default all)", cli_help="glob(s) over config names, e.g. 'lm-*'"),
    Setting("golden_dir", "--aot-golden-dir", "--golden-dir", "aot_golden_dir", "string", "golden",
            "golden directory (default golden/ at the rootdir)",
            ini_help="default --aot-golden-dir, relative to the rootdir",
            cli_help="golden directory (default: aot_golden_dir, or golden/)"),
    Setting("update", "--update-golden", "--update-golden", None, "bool", False,
            "write the figures of the cases that run as their goldens (and pass them); cases that do not run are "
            "left alone", cli_help="accept the figures of the cases that run", action="store_true"),
    Setting("strict", "--aot-strict", "--strict", "aot_strict", "bool", False,
            "fail on improvements beyond tolerance too, to keep baselines tight",
            cli_help="fail on improvements beyond tolerance too", action="store_true"),
    Setting("report", "--aot-report", "--report", None, "string", None,
            "write every case's figures, golden and verdict as JSON", cli_help="write the JSON report here",
            metavar="PATH"),
    Setting("shard", "--aot-shard", "--shard", None, "string", None,
            "run only shard K of N of the case matrix (for CI runners)",
            cli_help="run only shard K of N of the matrix", metavar="K/N"),
    Setting("fit", "--aot-fit", "--fit", "aot_fit", "string", "",
            "search the largest KNOB (e.g. batch) that fits on every config that offers it and names no fit= of "
            "its own, gated as fit_max_KNOB",
            cli_help="search the largest KNOB (e.g. batch) that fits on every config that offers it and names "
            "no fit= of its own (default: aot_fit)", metavar="KNOB"),
    Setting("libtpu_init_args", "--aot-libtpu-init-args", "--libtpu-init-args", "aot_libtpu_init_args", "string", "",
            "your job's LIBTPU_INIT_ARGS string, e.g. '--aot-libtpu-init-args=--xla_tpu_scoped_vmem_limit_kib=98304 "
            "--xla_tpu_enable_latency_hiding_scheduler=true' (runtime-only flags are dropped)",
            ini_help="default --aot-libtpu-init-args: your job's LIBTPU_INIT_ARGS string",
            cli_help="your job's LIBTPU_INIT_ARGS string, e.g. --libtpu-init-args='--xla_tpu_scoped_vmem_limit_kib=98304' "
            "(default: aot_libtpu_init_args)", metavar="FLAGS"),
    Setting("default_options", None, "--default-options", "aot_default_options", "string", "aotcheck",
            "aotcheck's per-chip compiler presets under your options: aotcheck (default) or none (only your options, "
            "as your job sends them)",
            cli_help="aotcheck (its per-chip presets under your options; the default) or none (only your options, "
            "as your job sends them)"),
    Setting("cache_dir", "--aot-cache-dir", "--cache-dir", "aot_cache_dir", "string", ".aotcheck-cache",
            "figures cache directory (default .aotcheck-cache at the rootdir)",
            ini_help="default --aot-cache-dir, relative to the rootdir",
            cli_help="figures cache directory (default .aotcheck-cache)"),
    Setting("no_cache", "--aot-no-cache", "--no-cache", None, "bool", False,
            "compile every case, neither reading nor writing the figures cache",
            cli_help="compile every case; no figures cache", action="store_true"),
    Setting("hbm_headroom", None, None, "aot_hbm_headroom", "string", "1.0",
            "fail a case whose peak exceeds this share of the device's HBM (default 1.0)"),
    Setting("tolerances", None, None, "aot_tolerances", "linelist", [],
            "per-metric tolerances, one per line: GLOB = REL% [+ ABS[unit]]"),
    Setting("metric_drift", None, None, "aot_metric_drift", "string", "fail",
            "figures new or gone against a golden: fail (default) or warn"),
    Setting("config_modules", None, "--module", "aot_config_modules", "linelist", [],
            "modules or .py files (rootdir-relative) that register configs",
            cli_help="module or .py file that registers configs (repeatable; the rootdir's conftest.py is always "
            "read)", action="append"),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def flag_names(front_end: str) -> dict[str, str]:
    """How ``front_end`` (``"pytest"`` or ``"cli"``) names each setting in a message: its flag, else its ini key."""
    return {s.name: getattr(s, front_end) or s.ini for s in SETTINGS if getattr(s, front_end) or s.ini}


def names_in_messages(flags: Mapping[str, str], from_ini: Collection[str] = ()) -> dict[str, str]:
    """How a message names each setting: the front end's ``flags``, but the ini key for a value the
    ini gave (``from_ini``), since that is what the user wrote.

    Example:
        >>> names = names_in_messages(flag_names("pytest"), from_ini=["slices"])
        >>> names["slices"], names["topologies"], example(names["slices"], "1,2"), example(names["topologies"], "v4-8")
        ('aot_slices', '--aot-topologies', 'aot_slices = 1,2', '--aot-topologies=v4-8')
    """
    return {**flags, **{name: BY_NAME[name].ini for name in from_ini if name in BY_NAME and BY_NAME[name].ini}}


def example(name: str, value: str) -> str:
    """A setting with a value, as written where ``name`` (a flag or an ini key) is written."""
    return f"{name}={value}" if name.startswith("-") else f"{name} = {value}"


def add_pytest_options(parser: Any) -> None:
    """The plugin's options (one group) and ini keys, from the table."""
    group = parser.getgroup("aotcheck", "aotcheck: AOT-compile registered configs for TPU topologies and GPU hosts")
    for s in SETTINGS:
        if s.pytest:
            extra: dict[str, Any] = {"action": "store_true", "default": None if s.ini else False} \
                if s.action == "store_true" else {"metavar": s.metavar} if s.metavar else {}
            group.addoption(s.pytest, help=s.help, **extra)
    for s in SETTINGS:
        if s.ini:
            help_text = s.ini_help or (f"default {s.pytest}" if s.pytest else s.help)
            parser.addini(s.ini, help_text, type=s.kind, default=s.default)


def add_cli_arguments(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """``aotcheck``'s flags for the settings ``names`` (all that have a CLI flag by default)."""
    for s in SETTINGS:
        if s.cli and (names is None or s.name in names):
            extra: dict[str, Any] = {"action": s.action} if s.action else {}
            if s.action == "store_true":  # Not given: None, so that the ini's value counts.
                extra["default"] = None if s.ini else False
            if s.metavar:
                extra["metavar"] = s.metavar
            parser.add_argument(s.cli, dest=s.name, help=s.cli_help or s.help, **extra)


def read_settings(*, option: Callable[[Setting], Any], ini: Callable[[Setting], Any]) -> dict[str, Any]:
    """Every setting's value as ``GateSettings.parse`` takes it: the front end's ``option`` (None when not
    given) over the ``ini`` value (the default when the file says nothing); a CLI flag that appends adds
    to the ini's lines; ``golden_dir_option`` and ``libtpu_init_args_option`` keep what the command line
    said (accept commands repeat it); ``--no-cache`` turns the cache off; ``from_ini``: the settings whose
    value the ini gave (the command line said nothing), so that an error names the ini key the user wrote."""
    out: dict[str, Any] = {}
    from_ini: list[str] = []
    for s in SETTINGS:
        given = option(s)
        if s.ini and (given is None or (s.action == "append" and not given)):
            from_ini.append(s.name)
        if s.action == "append":
            out[s.name] = list(ini(s) if s.ini else []) + list(given or [])
        elif s.action == "store_true":
            out[s.name] = bool(given) if given is not None or not s.ini else ini(s)
        else:
            out[s.name] = given if given is not None else (ini(s) if s.ini else s.default)
    out["from_ini"] = tuple(from_ini)
    out["golden_dir_option"] = option(BY_NAME["golden_dir"])
    out["libtpu_init_args_option"] = option(BY_NAME["libtpu_init_args"])
    if out.pop("no_cache"):
        out["cache_dir"] = None
    return out

