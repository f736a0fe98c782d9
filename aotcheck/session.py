"""The gate session: everything the gate decides, with or without pytest.

A :class:`GateSession` takes parsed :class:`GateSettings` and owns the matrix
(registered configs x programs x targets, skips with their reasons, this
shard's part), measures each case with family isolation and the figures cache,
judges it against its golden, finds stale goldens, prunes them after a full
``--update-golden``, and writes the JSON report. The pytest plugin
(:mod:`aotcheck.plugin`) and ``python -m aotcheck check`` (:mod:`aotcheck.cli`)
are thin front ends over it, so both give the same verdicts, goldens and report.

Example (a pytest-free gate over a registry of one config, on host CPU devices, measured in
this process; without ``measure=``, compile workers find a registry of one's own where it is a
module-level name of the module that registers into it):
    >>> import tempfile
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> from aotcheck import FunctionConfig, Registry
    >>> registry = Registry()
    >>> _ = registry.register("double", FunctionConfig(fn=lambda x: 2 * x, make_args=lambda mesh: (
    ...     jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)))
    >>> root = tempfile.mkdtemp()
    >>> settings = GateSettings.parse(rootdir=root, topologies=["cpu-2"], update=True, cache_dir=None)
    >>> from aotcheck.pipeline.measure import measure
    >>> with GateSession(settings, registry=registry, measure=lambda case: measure(case, registry=registry)) as session:
    ...     report = session.run()
    >>> [(o.case.id, o.verdict.value, o.golden_action.value) for o in report.outcomes]
    [('double/step@cpu-2x1', 'accepted', 'created')]
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import re
import signal
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from aotcheck import _runtime
from aotcheck.pipeline.cache import FiguresCache
from aotcheck.pipeline.case import Case
from aotcheck.gate.check import Measure, check_case
from aotcheck.gate.compare import DEFAULT_TOLERANCES, Tolerance, ToleranceError, check_knob_tolerances, parse_tolerances
from aotcheck.gate.golden import GoldenError, GoldenStore, parse_document, toolchain_note
from aotcheck.gate.isolation import Measurer
from aotcheck.pipeline.measure import fit_knob, unsupported_reason
from aotcheck.pipeline.measurement import COST_FIGURES, figure_names
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report, write_report
from aotcheck.gate.shard import ShardError, assign_shards, expected_seconds, parse_shard, shard_of_name
from aotcheck.programs.knobs import knobs_offered
from aotcheck.programs.loader import LoaderError, load_config_modules
from aotcheck.programs.options import (OptionsError, format_libtpu_init_args, parse_libtpu_init_args, refusal_lines,
                                       runtime_only)
from aotcheck.programs.registry import REGISTRY, Registry, RegistryError
from aotcheck.render.accept import accept_all_command
from aotcheck.render.summary import header_lines
from aotcheck.render.text import outcome_message
from aotcheck.settings import example, flag_names, names_in_messages
from aotcheck.targets.families import family_of
from aotcheck.targets.topology import Target, TopologyError, check_num_slices, expand_targets


class Interruption:
    """SIGTERM (what CI runners send on cancel and timeout) and SIGHUP (a closed terminal or ssh
    session) end a run as Ctrl-C does: a KeyboardInterrupt in the session process, so the finished
    cases are kept, reported and summarised, and the compile workers are stopped. :attr:`signal`
    names what ended the run. A SIGHUP that was ignored when the run started (``nohup``) stays ignored.

    Example:
        >>> import os, signal
        >>> interruption = Interruption().install()
        >>> try:
        ...     os.kill(os.getpid(), signal.SIGTERM)
        ...     for _ in range(100): __import__("time").sleep(0.01)
        ... except KeyboardInterrupt:
        ...     print("interrupted by", interruption.signal)
        ... finally:
        ...     interruption.restore()
        interrupted by SIGTERM
    """

    # The signals that end a run as Ctrl-C does (SIGHUP where the platform has it).
    SIGNALS: tuple[signal.Signals, ...] = tuple(
        s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> "Interruption":
        if threading.current_thread() is threading.main_thread():  # Only the main thread may set handlers.
            for signum in self.SIGNALS:
                if signum != signal.SIGTERM and signal.getsignal(signum) is signal.SIG_IGN:
                    continue  # nohup: the user asked to outlive the terminal.
                self._previous[signum] = signal.signal(signum, self._raise)
        return self

    def _raise(self, signum: int, frame: Any) -> None:
        self.signal = signal.Signals(signum).name
        raise KeyboardInterrupt

    def note(self) -> None:
        """Records an interruption that came some other way (Ctrl-C)."""
        self.signal = self.signal or "SIGINT"

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            if previous is not None:
                signal.signal(signum, previous)
        self._previous = {}


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the option and the fix."""


# How each front end spells its options, for error messages (aotcheck.settings declares them).
PYTEST_FLAGS = flag_names("pytest")
CLI_FLAGS = flag_names("cli")
METRIC_DRIFT = ("fail", "warn")
DEFAULT_OPTIONS = ("aotcheck", "none")


def split_list(value: str | Sequence[str] | None) -> list[str]:
    """``"a,b c"`` or ``["a,b", "c"]`` -> ``["a", "b", "c"]``."""
    texts = [value] if isinstance(value, str) else list(value or [])
    return [v for text in texts for v in re.split(r"[,\s]+", text) if v]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateSettings:
    """Everything a gate run needs, parsed and checked (see :meth:`parse`)."""

    rootdir: Path
    targets: tuple[Target, ...]
    config_globs: tuple[str, ...] = ()
    golden_dir: Path
    golden_dir_option: str | None = None  # As given on the command line (the accept command repeats it).
    update: bool = False
    strict: bool = False
    tolerances: tuple[tuple[str, Tolerance], ...] = DEFAULT_TOLERANCES
    report_path: Path | None = None
    hbm_headroom: float = 1.0
    fit: str | None = None  # Search this knob on every config that offers it and names no ``fit`` of its own.
    cache_dir: Path | None = None
    shard: tuple[int, int] | None = None
    config_modules: tuple[str, ...] = ()
    metric_drift: str = "fail"
    compiler_options: dict[str, str] = dataclasses.field(default_factory=dict)  # The user's launch flags.
    presets: bool = True  # aotcheck's per-chip presets under the user's options (aot_default_options).
    libtpu_init_args_option: str | None = None  # As given on the command line (accept commands repeat it).
    flags: Mapping[str, str] = dataclasses.field(default_factory=lambda: PYTEST_FLAGS)  # For messages.

    @classmethod
    def parse(
        cls,
        *,
        rootdir: str | os.PathLike[str],
        topologies: str | Sequence[str] = (),
        slices: str | Sequence[str] = (),
        configs: str | Sequence[str] = (),
        golden_dir: str = "golden",
        golden_dir_option: str | None = None,
        update: bool = False,
        strict: bool = False,
        tolerances: Sequence[str] = (),
        report: str | None = None,
        hbm_headroom: str | float = 1.0,
        fit: str | None = None,
        cache_dir: str | None = ".aotcheck-cache",
        shard: str | None = None,
        config_modules: Sequence[str] = (),
        metric_drift: str = "fail",
        libtpu_init_args: str | Sequence[str] = "",
        default_options: str = "aotcheck",
        libtpu_init_args_option: str | None = None,
        flags: Mapping[str, str] = PYTEST_FLAGS,
        from_ini: Collection[str] = (),
    ) -> "GateSettings":
        """Parses option values as users write them; SettingsError names the bad one: by its flag, or by
        its ini key when the ini gave it (``from_ini``, from :func:`aotcheck.settings.read_settings`)."""
        root = Path(rootdir)
        said = names_in_messages(flags, from_ini)
        counts = []
        for text in split_list(slices):
            if not text.isdigit() or int(text) < 1:
                raise SettingsError(f"{said['slices']}: {text!r} is not a slice count; give integers >= 1, "
                                    f"e.g. {example(said['slices'], '1,2')}")
            try:
                counts.append(check_num_slices(int(text)))
            except TopologyError as e:
                raise SettingsError(f"{said['slices']}: {e}") from None
        try:
            targets = expand_targets(split_list(topologies), counts or [1])
        except TopologyError as e:
            raise SettingsError(f"{said['topologies']}: {e}") from None
        try:
            parsed_tolerances = parse_tolerances(tolerances, known=figure_names())
        except ToleranceError as e:
            raise SettingsError(f"{said['tolerances']}: {e}") from None
        try:
            headroom = float(hbm_headroom)
            if not 0 < headroom <= 1:
                raise ValueError
        except ValueError:
            raise SettingsError(f"{said['hbm_headroom']}: {hbm_headroom!r} must be a number in (0, 1], e.g. 0.95") from None
        fit = (fit or "").strip() or None
        if fit is not None and not fit.isidentifier():
            raise SettingsError(f"{said['fit']}: {fit!r} is not a knob name; name what to search on every config, "
                                f"e.g. {example(said['fit'], 'batch')} (a config may offer more knobs in knobs=)")
        try:
            parsed_shard = parse_shard(shard) if shard else None
        except ShardError as e:
            raise SettingsError(str(e).replace("--aot-shard", flags["shard"])) from None
        drift = (metric_drift or "fail").strip().lower()
        if drift not in METRIC_DRIFT:
            raise SettingsError(f"{said['metric_drift']}: {metric_drift!r} must be 'fail' (figures new or gone "
                                "against the golden fail the case) or 'warn' (they pass with a warning)")
        init_args = libtpu_init_args if isinstance(libtpu_init_args, str) else " ".join(libtpu_init_args or ())
        try:
            compiler_options = parse_libtpu_init_args(init_args, what=said["libtpu_init_args"])
        except OptionsError as e:
            raise SettingsError(str(e)) from None
        presets = (default_options or "aotcheck").strip().lower()
        if presets not in DEFAULT_OPTIONS:
            raise SettingsError(f"{said['default_options']}: {default_options!r} must be 'aotcheck' (aotcheck's "
                                "per-chip presets under your options) or 'none' (only your options, as your job "
                                "sends them)")
        report_path = Path(report) if report else None
        if report_path is not None and (report_path.is_dir() or report_path.name in ("", ".", "..")):
            raise SettingsError(f"{flags['report']}: {report} is a directory; give a file path, "
                                f"e.g. {flags['report']}={(report_path / 'aot-report.json').as_posix()}")
        if report_path is not None and any(p.exists() and not p.is_dir() for p in report_path.parents):
            raise SettingsError(f"{flags['report']}: {report} lies under a file, not a directory; "
                                "give a path in a directory")
        return cls(
            rootdir=root,
            targets=tuple(targets),
            config_globs=tuple(split_list(configs)),
            golden_dir=root / golden_dir,
            golden_dir_option=golden_dir_option,
            update=update,
            strict=strict,
            tolerances=parsed_tolerances,
            report_path=report_path,
            hbm_headroom=headroom,
            fit=fit,
            cache_dir=root / cache_dir if cache_dir else None,
            shard=parsed_shard,
            config_modules=tuple(config_modules),
            metric_drift=drift,
            compiler_options=compiler_options,
            presets=presets == "aotcheck",
            libtpu_init_args_option=libtpu_init_args_option,
            flags=flags,
        )

    @property
    def golden_label(self) -> str:
        """The golden directory as reports name it: relative to the rootdir when inside it."""
        try:
            return self.golden_dir.resolve().relative_to(self.rootdir.resolve()).as_posix()
        except ValueError:
            return str(self.golden_dir)


def check_knob_globs(settings: GateSettings, registry: Registry) -> None:
    """SettingsError for an ``aot_tolerances`` line over ``fit_max_`` figures that no knob has (``fit_max_batchh``):
    the knobs are the registered configs', known once they are loaded. Configs are built only for such a line."""
    knobs = {"batch", *([settings.fit] if settings.fit else [])}
    globs = [glob for glob, _ in settings.tolerances if glob.startswith("fit_max_")]
    if all(any(fnmatch.fnmatchcase(f"fit_max_{knob}", glob) for knob in knobs) for glob in globs):
        return
    for entry in registry:
        try:
            configs = entry.configs()
        except RegistryError:
            continue  # Its build error is that config's, reported with its cases.
        for config in configs:
            knobs.update([*knobs_offered(config), *([config.fit] if getattr(config, "fit", None) else [])])
    try:
        check_knob_tolerances(settings.tolerances, known=figure_names(), knobs=knobs)
    except ToleranceError as e:
        raise SettingsError(f"{settings.flags['tolerances']}: {e}") from None


class Planned(NamedTuple):
    """A case of the matrix: if it cannot run on its target, why; the knob whose largest fitting size
    is searched on it, if any (:func:`aotcheck.pipeline.measure.fit_knob`)."""

    case: Case
    skip: str | None
    knob: str | None = None


class Plan(NamedTuple):
    """The matrix a session checks."""

    cases: list[Planned]
    broken: dict[str, str]  # Config name -> why building it failed.
    empty_reason: str | None  # Why there is nothing to check, if there is not.


class GateSession:
    """One gate run: plan, check each case, finish with stale goldens and the report.

    Use as a context manager (or call :meth:`close`): it may start one compile
    process per chip family.
    """

    def __init__(self, settings: GateSettings, *, registry: Registry = REGISTRY, measure: Measure | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.store = GoldenStore(settings.golden_dir)
        self.cache = FiguresCache(settings.cache_dir) if settings.cache_dir else None
        self._measurer = None if measure else Measurer(cache=self.cache, hbm_headroom=settings.hbm_headroom,
                                                          fit_default=settings.fit,
                                                          compiler_options=settings.compiler_options,
                                                          presets=settings.presets, registry=registry)
        self.measure: Measure = measure or self._measurer  # type: ignore[assignment]
        self.outcomes: dict[str, Outcome] = {}
        self._recorded: dict[str, float] = {}  # Case id -> its golden's compile CPU seconds (0: none), read once.
        self.interruption = Interruption()  # Front ends install it for the run's life.
        self.warnings: list[str] = []
        self._noted: set[str] = set()
        self._plans: dict[tuple[bool, tuple[str, ...]], Plan] = {}
        self._knobs_of: tuple[Plan | None, dict[str, str | None]] = (None, {})

    # Setting up ----------------------------------------------------------------

    def prepare(self) -> None:
        """Checks what a run needs before any case: config modules, a writable golden directory
        under update, a usable cache (else runs uncached, with a warning), host devices for cpu-N."""
        if self.settings.update:
            try:
                self.store.check_writable()
            except GoldenError as e:
                raise SettingsError(str(e)) from None
        try:
            load_config_modules(self.settings.config_modules, rootdir=self.settings.rootdir)
        except LoaderError as e:
            raise SettingsError(f"aot_config_modules: {e}") from None
        empty = self.plan(sharded=False).empty_reason
        if empty:  # A selection that selects nothing would pass having checked nothing.
            hint = ("to run without the gate, say so: --aot-topologies=none" if self.settings.flags is PYTEST_FLAGS
                    else "python -m aotcheck configs lists them")
            raise SettingsError(f"nothing to check: {empty}; {hint}")
        check_knob_globs(self.settings, self.registry)  # fit_max_<knob> tolerance lines, now that configs are known.
        if self._measurer is not None:
            try:
                self._measurer.locate()
            except RegistryError as e:
                raise SettingsError(str(e)) from None
        if self.cache is not None and not self.cache.usable():
            self.warnings.append(f"aotcheck: the figures cache {self.cache.root} is not writable; running uncached.")
            self.cache = None
            if self._measurer is not None:
                self._measurer.cache = None
        report = self.settings.report_path
        if report is not None and report.parent.exists() and not os.access(report.parent, os.W_OK):
            raise SettingsError(f"the report's directory {report.parent} is not writable; "
                                "give --aot-report (or --report) a path you can write")
        # cpu-N needs N host devices, fixed when JAX's CPU backend starts: the compile workers
        # (which alone compile) read the count from the environment.
        cpu = max((t.num_devices for t in self.settings.targets if t.topology.platform == "cpu"), default=0)
        if cpu:
            if int(os.environ.get("JAX_NUM_CPU_DEVICES", "0") or 0) < max(cpu, 8):
                os.environ["JAX_NUM_CPU_DEVICES"] = str(max(cpu, 8))

    def __enter__(self) -> "GateSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stops the compile processes this session started (at once after an interruption)."""
        if self._measurer is not None:
            self._measurer.close(kill=self.interruption.signal is not None)

    # The matrix -------------------------------------------------------------------

    def plan(self, *, sharded: bool = True) -> Plan:
        """Every selected case (with a skip reason or None), configs that failed to build, and
        why the matrix is empty if it is. ``sharded``: only this session's shard. Computed once
        per run (again only if configs were registered since)."""
        key = (sharded, tuple(self.registry.names()))
        if key not in self._plans:
            self._plans[key] = self._plan(sharded=sharded)
        return self._plans[key]

    def _plan(self, *, sharded: bool) -> Plan:
        cases: list[Planned] = []
        broken: dict[str, str] = {}
        entries = self.registry.select(list(self.settings.config_globs) or None)
        twins = self.registry.case_twins()
        for entry in entries:
            try:
                if entry.name in twins:
                    raise RegistryError(twins[entry.name])
                programs = entry.programs()
            except RegistryError as e:
                broken[entry.name] = str(e)
                continue
            for program, config in programs.items():
                for target in self.settings.targets:
                    case = Case(entry.name, program, target)
                    cases.append(Planned(case, unsupported_reason(config, case),
                                         fit_knob(config, case, fit_default=self.settings.fit)))
        empty = None
        if not entries:
            globs = ", ".join(self.settings.config_globs)
            empty = (
                f"no registered config matches {self.settings.flags['configs']}={globs} "
                f"(registered: {', '.join(self.registry.names())})"
                if len(self.registry) else
                "no configs are registered: call aotcheck.register(...) in the rootdir conftest.py "
                "or in a module listed in the aot_config_modules ini option"
            )
        if sharded and self.settings.shard:
            k, n = self.settings.shard
            shard_of = self._shard_of([p.case for p in cases])
            cases = [p for p in cases if shard_of[p.case.id] == k]
            broken = broken if k == 1 else {}  # A broken config fails once, in the first shard.
        return Plan(cases, broken, empty)

    def expected_seconds(self, cases: Sequence[Case]) -> dict[str, float]:
        """Case id -> the compile CPU seconds its golden recorded (a guess from its kind without one):
        what shards are balanced by. Each golden is read once per session."""
        for case in cases:
            if case.id not in self._recorded:
                try:
                    golden = self.store.read(case)
                except GoldenError:
                    golden = None
                self._recorded[case.id] = (sum(float(golden.figures.get(name, 0.0)) for name in COST_FIGURES)
                                           if golden is not None else 0.0)
        return expected_seconds(cases, self._recorded)

    def _shard_of(self, cases: Sequence[Case]) -> dict[str, int]:
        """Case id -> its shard among this session's ``--aot-shard`` N, weighed by :meth:`expected_seconds`."""
        assert self.settings.shard is not None
        return assign_shards(cases, self.settings.shard[1], seconds=self.expected_seconds(cases))

    def other_shards_tests(self, names: Sequence[str]) -> set[str]:
        """Of a user's own tests (node ids), those that belong to another shard than this session's."""
        if not self.settings.shard:
            return set()
        k, n = self.settings.shard
        return {name for name in names if shard_of_name(name, n) != k}

    def shard_seconds(self) -> tuple[float, float] | None:
        """(this shard's expected compile seconds, the whole matrix's), when sharded."""
        if not self.settings.shard:
            return None
        cases = [p.case for p in self.plan(sharded=False).cases]
        every, shard_of = self.expected_seconds(cases), self._shard_of(cases)
        mine = sum(seconds for case_id, seconds in every.items() if shard_of[case_id] == self.settings.shard[0])
        return mine, sum(every.values())

    # Cases ---------------------------------------------------------------------------

    def accept_args(self) -> list[str]:
        """The settings of this run that change what it compiles or measures, as the accept command (a
        pytest run, whichever front end this is) must repeat them: the launch flags given on the command
        line (the ini's are read again), aotcheck's presets off, a fit search and its headroom, and the
        config modules ``python -m aotcheck check --module`` added. Settings pytest has no option for
        are given as ini overrides (``-o aot_default_options=none``); repeating an ini's own value is
        harmless, leaving one out would accept other figures than this run's."""
        s = self.settings
        args = [f"--aot-libtpu-init-args={s.libtpu_init_args_option}"] if s.libtpu_init_args_option is not None else []
        if s.fit:
            args.append(f"--aot-fit={s.fit}")
        if not s.presets:
            args += ["-o", "aot_default_options=none"]
        if s.hbm_headroom != 1.0:
            args += ["-o", f"aot_hbm_headroom={s.hbm_headroom:g}"]
        if s.config_modules and s.flags is CLI_FLAGS:
            args += ["-o", "aot_config_modules=" + "\n".join(s.config_modules)]
        return args

    def accept_command(self, case: Case) -> str:
        """The command that accepts this case's current figures as its golden (the one builder,
        :func:`aotcheck.gate.upgrade.accept_all_command`, with this program selected)."""
        given = self.settings.golden_dir_option  # As given (it may override the ini's), even "golden".
        return accept_all_command([case.id], extra=[*([f"--aot-golden-dir={given}"] if given else []),
                                                    *self.accept_args(), "-k", case.program])

    def _knobs(self) -> dict[str, str | None]:
        """Case id -> the knob its plan searches (the plan is memoised; so is this view of it)."""
        plan = self.plan(sharded=False)
        if self._knobs_of[0] is not plan:
            self._knobs_of = (plan, {p.case.id: p.knob for p in plan.cases})
        return self._knobs_of[1]

    def golden_file(self, case: Case) -> str:
        return str(self.store.path(case))

    def check(self, case: Case) -> Outcome:
        """Measures and judges one case, and words its message."""
        s = self.settings
        knob = self._knobs().get(case.id)
        # The compile workers search the knob the plan chose (a measure of one's own decides for itself).
        measure = functools.partial(self._measurer, fit=knob) if self._measurer is not None and knob else self.measure
        outcome = check_case(case, measure=measure, store=self.store, tolerances=s.tolerances,
                             update=s.update, strict=s.strict, hbm_headroom=s.hbm_headroom,
                             metric_drift=s.metric_drift)
        # Notes the compile workers raised on this case ride with it (under xdist, to the controller).
        worker_notes = self._measurer.notes if self._measurer is not None else []
        new = [n for n in worker_notes if n not in self._noted]
        self._noted.update(new)
        # The message is the one worded field: the report's readers (Markdown, annotations) show it as is.
        return dataclasses.replace(outcome, notes=[*outcome.notes, *new], message=outcome_message(
            outcome, golden_file=self.golden_file(case), accept=self.accept_command(case)))

    def start_workers(self) -> None:
        """Starts the compile workers of the run's TPU topologies now, before the configs are built and
        the cases selected, so their start-up (jax, libtpu, a warm-up compile) overlaps with that.
        :meth:`prestart` later stops those no selected case needs. (A ``cpu-N`` worker waits for
        :meth:`prepare`, which sets its device count.)"""
        if self._measurer is not None:
            self._measurer.prestart({family_of(t.topology) for t in self.settings.targets
                                     if t.topology.platform != "cpu"})

    def prestart(self, cases: Sequence[Case]) -> None:
        """Starts the compile workers these cases need, in parallel, before the first case runs, and
        stops any started early that none of them needs."""
        if self._measurer is not None:
            families = {family_of(c.topology) for c in cases}
            self._measurer.retain(families)
            self._measurer.prestart(families)

    def record(self, outcome: Outcome) -> None:
        self.outcomes[outcome.case.id] = outcome

    def run(self, on_outcome: Callable[[Outcome], None] | None = None) -> Report:
        """The whole gate without pytest: prepare, check every planned case, finish."""
        self.prepare()
        return self.check_all(on_outcome)

    def check_all(self, on_outcome: Callable[[Outcome], None] | None = None) -> Report:
        """Checks every planned case of a prepared session (skips recorded as such), then finishes."""
        plan = self.plan()
        self.prestart([p.case for p in plan.cases if not p.skip])
        for planned in plan.cases:
            outcome = Outcome.skip(planned.case, planned.skip) if planned.skip else self.check(planned.case)
            self.record(outcome)
            if on_outcome:
                on_outcome(outcome)
        return self.finish()

    # The end ---------------------------------------------------------------------------

    def stale_goldens(self) -> list[str]:
        """Golden files with no registered (config, program): judged on the whole registry,
        so deselected, skipped and other-shard cases never count."""
        known: set[tuple[str, str]] = set()
        unbuildable: set[str] = set()
        for entry in self.registry:
            try:
                known.update((entry.name, p) for p in entry.programs())
            except RegistryError:
                unbuildable.add(entry.name)
        stale = []
        for rel in self.store.cases():  # Only files aotcheck wrote: a user's own JSON is never stale.
            case = Case.parse(rel.removesuffix(".json"))
            if case.config not in unbuildable and (case.config, case.program) not in known:
                stale.append(rel)
        return stale

    def whole_matrix_ran(self) -> bool:
        """Whether every case of every registered config has an outcome here (prune only then)."""
        plan = self.plan(sharded=False)
        if plan.broken or len(self.registry.select(list(self.settings.config_globs) or None)) != len(self.registry):
            return False  # Some registered config was left out: its goldens' fate is not ours to judge.
        return all(p.case.id in self.outcomes for p in plan.cases)

    def finish(self) -> Report:
        """Stale goldens (removed after a full update), broken configs, the report written."""
        stale = self.stale_goldens()
        removed: list[str] = []
        if self.settings.update and stale and self.whole_matrix_ran():
            for rel in stale:
                try:
                    (self.store.root / rel).unlink(missing_ok=True)
                    removed.append(rel)
                except OSError as e:
                    self.warnings.append(f"aotcheck: could not remove the stale golden {rel}: {e.strerror or e}")
            stale = [rel for rel in stale if rel not in removed]
        if self.interruption.signal:
            planned = len(self.plan().cases)
            self.warnings.append(
                f"aotcheck: interrupted ({self.interruption.signal}) after {len(self.outcomes)} of {planned} cases: "
                "the finished ones are reported" + (" and their goldens written" if self.settings.update else "")
                + "; the rest did not run, and no stale golden was removed.")
        report = Report(list(self.outcomes.values()), golden_dir=self.settings.golden_label, stale=stale,
                        removed=removed, broken=self.plan().broken, shard=self.settings.shard,
                        notes=self.notes())
        if self.settings.report_path:
            try:
                write_report(self.settings.report_path, report)
            except OSError as e:
                report.notes.append(f"aotcheck: could not write the report {self.settings.report_path}: "
                                    f"{e.strerror or e}")
        return report

    def notes(self) -> list[str]:
        """What the session has to say once: warnings from setting up and from the compile workers."""
        worker_notes = self._measurer.notes if self._measurer is not None else []
        case_notes = [n for o in self.outcomes.values() for n in o.notes]
        return list(dict.fromkeys([*self.warnings, *worker_notes, *case_notes]))

    def header(self) -> list[str]:
        s = self.settings
        lines = header_lines(targets=[t.name for t in s.targets], golden_dir=str(self.store.root), update=s.update,
                             cache_dir=str(self.cache.root) if self.cache else None, shard=s.shard,
                             shard_seconds=self.shard_seconds(),
                             toolchain=self.toolchain(), foreign=self.foreign_toolchain_goldens())
        if s.presets:
            lines += refusal_lines({family_of(t.topology) for t in s.targets})
        if s.compiler_options or not s.presets:
            sent = {k: v for k, v in s.compiler_options.items() if not runtime_only(k)}
            dropped = len(s.compiler_options) - len(sent)
            lines.append("aotcheck: your launch flags: " + (format_libtpu_init_args(sent) or "none")
                         + (f" ({dropped} runtime-only dropped)" if dropped else "")
                         + ("" if s.presets else "; aotcheck's presets off (aot_default_options = none)"))
        if s.fit:
            lines.append(f"aotcheck: fit search of {s.fit!r} on every config that offers it (a few compiles each; "
                         f"gated as fit_max_{s.fit})")
        if not s.update and not self.store.root.is_dir():
            lines.append(f"aotcheck: WARNING: the golden directory {self.store.root} does not exist, so every case "
                         f"will be missing its golden. The rootdir is {s.rootdir}; if your goldens are elsewhere, "
                         "pass --aot-golden-dir=PATH (with '='), or create them with --update-golden.")
        return lines

    def toolchain(self) -> dict[str, str | None]:
        """The versions behind this run's figures: jax's, libtpu's where a target is a TPU (or the host's
        CPU), the CUDA plugin's where one is a GPU."""
        platforms = {t.topology.platform for t in self.settings.targets} or {"tpu"}
        out: dict[str, str | None] = {}
        for platform in sorted(platforms, key=lambda p: p == "gpu"):
            out.update(_runtime.toolchain(platform))
        return out

    def foreign_toolchain_goldens(self) -> list[str]:
        """Golden files made with another toolchain, each with the versions it names."""
        out = []
        for rel, path in self.store.cases().items():
            try:
                golden = parse_document(path.read_text(), path)
            except (GoldenError, OSError, ValueError):  # Unreadable goldens fail their own case.
                continue
            platform = _platform_of(rel)
            if toolchain_note(golden.toolchain, platform=platform):
                out.append(f"{rel}: " + ", ".join(f"{k} {golden.toolchain.get(k)}" for k in _runtime.toolchain(platform)))
        return out


def _platform_of(golden_path: str) -> str:
    """The platform of a golden file's case (``lm/prefill@h100-8x1.json``: gpu)."""
    try:
        return Case.parse(golden_path.removesuffix(".json")).topology.platform
    except ValueError:  # A name from a table aotcheck no longer has: judged as a TPU golden.
        return "tpu"


def exit_status(report: Report) -> int:
    """0 when every case passed and every config built, else 1."""
    return 0 if report.passed else 1
