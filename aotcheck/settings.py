"""The gate's settings, declared once: each one's pytest option, ini key, CLI flag, default, help, choices and reader.

Both front ends are generated from :data:`SETTINGS`: the pytest plugin's options and ini keys
(:func:`add_pytest_options`), ``aotcheck check``'s flags (:func:`add_cli_arguments`), how each
reads a value (option over ini over default: :func:`read_settings`), and the name an error
message gives a setting (:func:`flag_names`: the front end's flag, else the ini key).
:meth:`GateSettings.parse` then checks the values, whichever front end read them: a loop over
the rows, each with its choices and its reader (as Hypothesis's settings carry their validators),
so a default is written once, in its row.

Example:
    >>> values = read_settings(option=lambda s: {"topologies": "v4-8"}.get(s.name), ini=lambda s: s.default)
    >>> values["topologies"], values["golden_dir"], values["cache_dir"], values["update"]
    ('v4-8', 'golden', '.aotcheck-cache', False)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from aotcheck.gate.compare import Tolerance
from aotcheck.pipeline.cache import CacheSpec
from aotcheck.pipeline.case import Case
from aotcheck.programs.options import OptionsError, parse_libtpu_init_args
from aotcheck.readers import (MISSING_VALUE, Reading, SettingsError, read_cache_dir, read_cache_url, read_cases,
                              read_export, read_headroom, read_knob, read_launch_flags, read_memory_fraction, read_report_path,
                              read_shard, read_slices, read_targets, read_tolerances, split_list)
from aotcheck.spellings import ENVIRONMENT_FLAGS, FRONT_ENDS, SPELLINGS, flag_names, names_in_messages
from aotcheck.targets.topology import Target


class Setting(NamedTuple):
    """One setting of the gate (a keyword of ``GateSettings.parse``); how each front end spells it is
    :data:`aotcheck.spellings.SPELLINGS`'s."""

    name: str
    kind: str  # The ini value's type, as pytest's addini takes it: "string", "args", "linelist", "bool".
    default: Any  # When neither the flag nor the ini says.
    help: str  # The plugin's option help.
    ini_help: str = ""  # The ini key's help (default: "default <option>").
    cli_help: str = ""  # The CLI flag's help (default: the plugin's).
    action: str | None = None  # "store_true" for a switch; "append": the CLI flag adds to the ini's lines.
    metavar: str | None = None
    # The values it takes, each with what it means (a message lists them); given case- and space-blind.
    choices: tuple[tuple[str, str], ...] = ()
    field: str | None = None  # The GateSettings field it sets (default: its name; "": none).
    read: Callable[[Any, Reading], Any] | None = None  # Value as given -> as GateSettings holds it (SettingsError).

    @property
    def pytest(self) -> str | None:
        """The plugin's option, e.g. "--aot-topologies" (None: ini only)."""
        return SPELLINGS[self.name].pytest

    @property
    def cli(self) -> str | None:
        """``aotcheck check``'s flag (None: ini only)."""
        return SPELLINGS[self.name].cli

    @property
    def ini(self) -> str | None:
        """The [pytest] ini key both front ends read (None: a flag only)."""
        return SPELLINGS[self.name].ini

    def parsed(self, value: Any, reading: Reading) -> Any:
        """``value`` checked against the choices and read; a choice's empty value is the default."""
        if self.choices:
            said = reading.said[self.name]
            if isinstance(value, str) and not value.strip() and said.startswith("-"):  # --cache-mode '' said nothing.
                raise SettingsError(f"{said} is given empty; give " + " or ".join(
                    f"'{v}' ({meaning})" for v, meaning in self.choices) + f", or leave it out for '{self.default}'")
            value = (value or self.default).strip().lower()
            if value not in dict(self.choices):
                raise SettingsError(f"{reading.said[self.name]}: {reading.given[self.name]!r} must be "
                                    + " or ".join(f"'{v}' ({meaning})" for v, meaning in self.choices))
        return self.read(value, reading) if self.read else value


SETTINGS: tuple[Setting, ...] = (
    Setting("topologies", "args", [],
            "topologies to check, e.g. v4-8,v5e-16,h100-8 (v5e-16x2: 2 slices only); 'none' turns the gate off for this "
            "run. Without any (here or in the ini), the plugin adds no tests.",
            cli_help="e.g. v4-8,v5e-16,h100-8 (v5e-16x2: 2 slices only)",
            field="targets", read=read_targets),
    Setting("slices", "args", [],
            "slice counts for every topology, e.g. 1,2 (default 1)", cli_help="slice counts for every topology, e.g. 1,2",
            field="", read=read_slices),
    Setting("configs", "args", [],
            "glob(s) over config names, e.g. 'lm-*' (default all)", cli_help="glob(s) over config names, e.g. 'lm-*'",
            field="config_globs", read=lambda v, r: tuple(split_list(v))),
    Setting("cases", "string", [],
            "run only this case, by its id (CONFIG/PROGRAM@TOPOLOGYxSLICES, e.g. 'llm/step[tokens=16]@v5e-16x1'; "
            "repeatable): its config and target, whatever the topologies and configs say",
            action="append", metavar="ID", read=read_cases),
    Setting("golden_dir", "string", "golden",
            "golden directory (default golden/ at the rootdir)",
            ini_help="default --aot-golden-dir, relative to the rootdir",
            cli_help="golden directory (default: aot_golden_dir, or golden/)",
            read=lambda v, r: r.rootdir / v),
    Setting("update", "bool", False,
            "write the figures of the cases that run as their goldens (and pass them); cases that do not run are "
            "left alone", cli_help="accept the figures of the cases that run", action="store_true",
            read=lambda v, r: bool(v)),
    Setting("strict", "bool", False,
            "fail on improvements beyond tolerance too, to keep baselines tight",
            cli_help="fail on improvements beyond tolerance too", action="store_true",
            read=lambda v, r: bool(v)),
    Setting("report", "string", None,
            "write every case's figures, golden and verdict as JSON", cli_help="write the JSON report here",
            metavar="PATH",
            field="report_path", read=read_report_path),
    Setting("export", "string", "",
            "write each case that passes its gate as its serialized executable and a manifest under this "
            "directory or store URL (gs://, s3://, az://, file://), for the job to load instead of compiling",
            cli_help="write each passing case's executable and manifest here (a directory or a store URL)",
            metavar="DIR", read=read_export),
    Setting("shard", "string", None,
            "run only shard K of N of the case matrix (for CI runners)",
            cli_help="run only shard K of N of the matrix", metavar="K/N",
            read=read_shard),
    Setting("fit", "string", "",
            "search the largest KNOB (e.g. batch) that fits on every config that offers it and names no fit= of "
            "its own, gated as fit_max_KNOB",
            cli_help="search the largest KNOB (e.g. batch) that fits on every config that offers it and names "
            "no fit= of its own (default: aot_fit)", metavar="KNOB",
            read=read_knob),
    Setting("libtpu_init_args", "string", "",
            "your job's LIBTPU_INIT_ARGS string, e.g. '--aot-libtpu-init-args=--xla_tpu_scoped_vmem_limit_kib=98304 "
            "--xla_tpu_enable_latency_hiding_scheduler=true' (runtime-only flags are dropped)",
            ini_help="default --aot-libtpu-init-args: your job's LIBTPU_INIT_ARGS string",
            cli_help="your job's LIBTPU_INIT_ARGS string, e.g. --libtpu-init-args='--xla_tpu_scoped_vmem_limit_kib=98304' "
            "(default: aot_libtpu_init_args)", metavar="FLAGS",
            field="compiler_options", read=read_launch_flags),
    Setting("default_options", "string", "aotcheck",
            "aotcheck's per-chip compiler presets under your options: aotcheck (default) or none (only your options, "
            "as your job sends them)",
            cli_help="aotcheck (its per-chip presets under your options; the default) or none (only your options, "
            "as your job sends them)",
            field="presets", read=lambda v, r: v == "aotcheck",
            choices=(("aotcheck", "aotcheck's per-chip presets under your options"),
                     ("none", "only your options, as your job sends them"))),
    Setting("cache_dir", "string", ".aotcheck-cache",
            "figures cache directory (default .aotcheck-cache at the rootdir)",
            ini_help="default --aot-cache-dir, relative to the rootdir",
            cli_help="figures cache directory (default .aotcheck-cache)",
            read=read_cache_dir),
    Setting("no_cache", "bool", False,
            "compile every case, neither reading nor writing the figures cache",
            cli_help="compile every case; no figures cache", action="store_true",
            field=""),
    Setting("cache_url", "string", "",
            "a figures cache the runners share, behind the local one: gs://BUCKET/PATH, s3://BUCKET/PATH, "
            "az://CONTAINER/PATH or file:///DIRECTORY (credentials and endpoints: the cloud SDK's own)",
            ini_help="default --aot-cache-url: the figures cache the runners share",
            cli_help="a figures cache the runners share, behind the local one (gs://, s3://, az://, file://)",
            metavar="URL", read=read_cache_url),
    Setting("cache_mode", "string", "readwrite",
            "the shared figures cache: readwrite (default) or read (answer from it, write nothing: a pull request "
            "from a fork)",
            choices=(("readwrite", "answer from the shared cache and add what this run compiles"),
                     ("read", "answer from the shared cache, write nothing to it")),
            field="cache_shares", read=lambda v, r: v == "readwrite"),
    Setting("hbm_headroom", "string", "1.0",
            "fail a case whose peak exceeds this share of the device's HBM (default 1.0)",
            read=read_headroom),
    Setting("memory_fraction", "string", "",
            "the share of a GPU's memory a served process runs with (its XLA_PYTHON_CLIENT_MEM_FRACTION), for "
            "servers' boot budgets: a config's memory_fraction wins over it, and it over the environment's",
            read=read_memory_fraction),
    Setting("tolerances", "linelist", [],
            "per-metric tolerances, one per line: GLOB = REL% [+ ABS[unit]]",
            read=read_tolerances),
    Setting("metric_drift", "string", "fail",
            "figures new or gone against a golden: fail (default) or warn",
            choices=(("fail", "figures new or gone against the golden fail the case"),
                     ("warn", "they pass with a warning"))),
    Setting("config_modules", "linelist", [],
            "modules or .py files (rootdir-relative) that register configs",
            cli_help="module or .py file that registers configs (repeatable; the rootdir's conftest.py is always "
            "read)", action="append",
            read=lambda v, r: tuple(v)),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
INI_KEYS: frozenset[str] = frozenset(s.ini for s in SETTINGS if s.ini)


def add_pytest_options(parser: Any) -> None:
    """The plugin's options (one group) and ini keys, from the table."""
    group = parser.getgroup("aotcheck", "aotcheck: AOT-compile registered configs for TPU topologies and GPU hosts")
    for s in SETTINGS:
        if s.pytest:
            extra: dict[str, Any] = {"action": "store_true", "default": None if s.ini else False} \
                if s.action == "store_true" else {"metavar": s.metavar} if s.metavar else {}
            if s.action == "append":
                extra["action"] = "append"
            if s.name == "libtpu_init_args":  # Its value starts with "--": after a space, argparse would say only
                extra.update(nargs="?", const=MISSING_VALUE)  # "expected one argument" (the plugin says why).
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


def read_settings(*, option: Callable[[Setting], Any], ini: Callable[[Setting], Any],
                  environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
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
    out["environment_flags"] = environ.get(ENVIRONMENT_FLAGS)
    return out




def check_environment_fraction(targets: Sequence[Target], environ: Mapping[str, str] = os.environ) -> None:
    """A SettingsError for a memory share in the environment that a run's GPU targets would read and no
    process runs with (``XLA_PYTHON_CLIENT_MEM_FRACTION=abc``, ``1.5``, ``0``): JAX's own start-up would
    print a traceback for it, and a boot budget taking the default instead would judge another server.

    Example:
        >>> from aotcheck.targets.topology import Target
        >>> check_environment_fraction([Target.of("h100-8")], {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"})
        >>> check_environment_fraction([Target.of("v4-8")], {"XLA_PYTHON_CLIENT_MEM_FRACTION": "abc"})  # No GPU.
        >>> check_environment_fraction([Target.of("h100-8")], {"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"})
        Traceback (most recent call last):
        ...
        aotcheck.readers.SettingsError: XLA_PYTHON_CLIENT_MEM_FRACTION='1.5' (in the environment) is not a share of a GPU's memory: give a number in (0, 1], e.g. XLA_PYTHON_CLIENT_MEM_FRACTION=0.9, or unset it (JAX's default is 0.75)
    """
    shares = {t.topology.platform.memory_fraction for t in targets if t.topology.platform.memory_fraction}
    for default, variable in sorted(shares, key=lambda share: share[1]):
        given = environ.get(variable)
        if given is None or not given.strip():
            continue
        try:
            ok = 0 < float(given) <= 1
        except ValueError:
            ok = False
        if not ok:
            raise SettingsError(f"{variable}={given!r} (in the environment) is not a share of a GPU's memory: give a "
                                f"number in (0, 1], e.g. {variable}=0.9, or unset it (JAX's default is {default})")


# The order the rows are read in: with several bad values, the error names the first of these (as it always
# has); the rows' own order is the options' order in --help.
_CHECKED_FIRST = ("slices", "topologies", "tolerances", "hbm_headroom", "fit", "shard", "metric_drift",
                  "libtpu_init_args", "default_options", "report")
PARSE_ORDER = tuple(sorted(SETTINGS, key=lambda s: _CHECKED_FIRST.index(s.name) if s.name in _CHECKED_FIRST
                           else len(_CHECKED_FIRST)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateSettings:
    """Everything a gate run needs, parsed and checked (see :meth:`parse`; each field's default is its
    row's in :data:`SETTINGS`).

    Example:
        >>> settings = GateSettings.parse(rootdir="/p", topologies="v4-8,v5e-16x2", slices="1,2", fit="batch")
        >>> [t.name for t in settings.targets], settings.fit, settings.cache_dir, settings.presets
        (['v4-8x1', 'v4-8x2', 'v5e-16x2'], 'batch', PosixPath('/p/.aotcheck-cache'), True)
        >>> GateSettings.parse(rootdir="/p", metric_drift="maybe")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        aotcheck.readers.SettingsError: aot_metric_drift: 'maybe' must be 'fail' (figures new or gone ...) or 'warn' (...)
    """

    rootdir: Path
    front_end: str  # "pytest" or "cli": how messages name a setting, and what a hint may suggest.
    targets: tuple[Target, ...]
    config_globs: tuple[str, ...]
    cases: tuple[Case, ...]  # Only these cases (their targets are the run's), when given.
    golden_dir: Path
    golden_dir_option: str | None  # As given on the command line (the accept command repeats it).
    update: bool
    strict: bool
    tolerances: tuple[tuple[str, Tolerance], ...]
    report_path: Path | None
    export: str | None  # Where each passing case's executable and manifest go (a directory or a store URL).
    hbm_headroom: float
    memory_fraction: float | None  # A GPU server's share of memory (aot_memory_fraction), over the environment's.
    fit: str | None  # Search this knob on every config that offers it and names no ``fit`` of its own.
    cache_dir: Path | None
    cache_url: str | None  # The shared store behind the local cache (None: none, or no cache at all).
    cache_shares: bool  # Whether this run writes to the shared store (aot_cache_mode = readwrite).
    shard: tuple[int, int] | None
    config_modules: tuple[str, ...]
    metric_drift: str
    compiler_options: dict[str, str]  # The user's launch flags.
    presets: bool  # aotcheck's per-chip presets under the user's options (aot_default_options).
    libtpu_init_args_option: str | None  # As given on the command line (accept commands repeat it).
    # The environment's LIBTPU_INIT_ARGS, and whether it is this run's launch flags (no setting gave any).
    environment_flags: str | None = None
    environment_flags_used: bool = False
    # Cache settings given that change nothing, as (setting, its value, the setting that makes it moot): a
    # cache URL beside no_cache, a read mode with no shared cache (hardening round 5, V19/V20: both silent).
    unused_cache: tuple[tuple[str, str, str], ...] = ()
    # How a message names each setting: its flag, or its ini key where the ini gave the value.
    said: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def parse(cls, *, rootdir: str | os.PathLike[str], front_end: str = "pytest", from_ini: Collection[str] = (),
              golden_dir_option: str | None = None, libtpu_init_args_option: str | None = None,
              environment_flags: str | None = None, **values: Any) -> "GateSettings":
        """Parses option values as users write them (keywords: the rows' names; a row not given takes its
        default); SettingsError names the bad one: by its flag, or by its ini key when the ini gave it
        (``from_ini``, from :func:`read_settings`). ``environment_flags``: the environment's
        ``LIBTPU_INIT_ARGS``, this run's launch flags when it compiles something and no setting gives any
        (an accept command then repeats them as the option); a run with no targets leaves it alone.

        Example:
            >>> s = GateSettings.parse(rootdir="/p", topologies="v4-8", environment_flags="--xla_tpu_scoped_vmem_limit_kib=65536")
            >>> s.compiler_options, s.environment_flags_used, s.libtpu_init_args_option
            ({'xla_tpu_scoped_vmem_limit_kib': '65536'}, True, '--xla_tpu_scoped_vmem_limit_kib=65536')
            >>> GateSettings.parse(rootdir="/p", topologies="v4-8", environment_flags="junk")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            aotcheck.readers.SettingsError: LIBTPU_INIT_ARGS (in the environment): 'junk' is not a flag; ...
            >>> GateSettings.parse(rootdir="/p", environment_flags="junk").environment_flags_used  # The gate is off.
            False
        """
        environment_flags = environment_flags if environment_flags and environment_flags.strip() else None
        unknown = sorted(set(values) - set(BY_NAME))
        if unknown:
            raise TypeError(f"GateSettings.parse() got unknown settings {unknown}; the settings are {', '.join(BY_NAME)}")
        if front_end not in FRONT_ENDS:
            raise TypeError(f"GateSettings.parse(front_end={front_end!r}): the front ends are {', '.join(FRONT_ENDS)}")
        given = {s.name: values.get(s.name, s.default) for s in SETTINGS}
        reading = Reading(Path(rootdir), names_in_messages(flag_names(front_end), from_ini), given)
        fields = {s.field if s.field is not None else s.name: s.parsed(given[s.name], reading) for s in PARSE_ORDER}
        fields.pop("", None)
        if fields["cases"]:  # A case names its target: the run's targets are the cases'.
            fields["targets"] = tuple(dict.fromkeys(case.target for case in fields["cases"]))
        if fields["memory_fraction"] is None:
            check_environment_fraction(fields["targets"])
        # The environment's launch flags, where this run compiles and no setting gave any (a run with the gate
        # off, in a shell whose LIBTPU_INIT_ARGS aotcheck cannot read, is none of aotcheck's business).
        used = environment_flags is not None and not given.get("libtpu_init_args") and bool(fields["targets"])
        if used:
            assert environment_flags is not None
            try:
                fields["compiler_options"] = parse_libtpu_init_args(
                    environment_flags, what=f"{ENVIRONMENT_FLAGS} (in the environment)")
            except OptionsError as e:
                raise SettingsError(f"{e} (or unset {ENVIRONMENT_FLAGS}: aotcheck takes it as your job's launch "
                                    "flags)") from None
            libtpu_init_args_option = environment_flags
        url = str(given.get("cache_url") or "").strip()
        unused = ((("cache_url", url, "no_cache"),) if url and given.get("no_cache") else ()) + (
            (("cache_mode", "read", "cache_url"),) if given.get("cache_mode") == "read" and not url else ())
        return cls(rootdir=reading.rootdir, front_end=front_end, golden_dir_option=golden_dir_option,
                   libtpu_init_args_option=libtpu_init_args_option, environment_flags=environment_flags,
                   environment_flags_used=used, unused_cache=unused, said=dict(reading.said), **fields)

    @property
    def cache(self) -> CacheSpec | None:
        """The figures cache this run uses, as the one value the session and its workers open (None: none)."""
        return CacheSpec(self.cache_dir, not self.update, self.cache_url, self.cache_shares) if self.cache_dir else None

    @property
    def flags(self) -> dict[str, str]:
        """How this run's front end names each setting in a message."""
        return flag_names(self.front_end)

    @property
    def golden_label(self) -> str:
        """The golden directory as reports name it: relative to the rootdir when inside it."""
        try:
            return self.golden_dir.resolve().relative_to(self.rootdir.resolve()).as_posix()
        except ValueError:
            return str(self.golden_dir)
