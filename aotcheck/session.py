"""The gate session: one run, with or without pytest.

A :class:`GateSession` takes parsed :class:`~aotcheck.settings.GateSettings`, asks
:mod:`aotcheck.plan` for the matrix once (cases with their skips and knobs, this shard's
part, stale goldens), measures each case with family isolation and the figures cache,
judges it against its golden, prunes stale goldens after a full ``--update-golden``, and
writes the JSON report. The pytest plugin
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
    >>> from aotcheck.settings import GateSettings
    >>> settings = GateSettings.parse(rootdir=root, topologies=["cpu-2"], update=True, cache_dir=None)
    >>> from aotcheck.pipeline.measure import measure
    >>> with GateSession(settings, registry=registry, measure=lambda case: measure(case, registry=registry)) as session:
    ...     report = session.run()
    >>> [(o.case.id, o.verdict.value, o.golden_action.value) for o in report.outcomes]
    [('double/step@cpu-2x1', 'accepted', 'created')]
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aotcheck.gate.analysis import analyse
from aotcheck.gate.bill import split_groups
from aotcheck.gate.check import Measure, check_case
from aotcheck.gate.golden import GoldenError, GoldenStore, parse_document, toolchain_note
from aotcheck.gate.isolation import Measurer
from aotcheck.gate.outcome import Accept, Outcome
from aotcheck.gate.report import Report, write_report
from aotcheck.gate.run import Interrupted, RunHeader
from aotcheck.gate.ship import ship
from aotcheck.interruption import Interruption
from aotcheck.pipeline.case import Case
from aotcheck.plan import Plan, check_cases, check_fit_knob, check_knob_globs, make_plan, stale_goldens
from aotcheck.programs.loader import LoaderError, load_config_modules
from aotcheck.programs.options import runtime_only
from aotcheck.programs.registry import REGISTRY, Registry, RegistryError
from aotcheck.programs.serving import Server
from aotcheck.settings import GateSettings, SettingsError
from aotcheck.spellings import flag_names, ini_override, option
from aotcheck.targets.platform import TPU, Platform
from aotcheck.targets.topology import Target


class GateSession:
    """One gate run: plan, check each case, finish with stale goldens and the report.

    Use as a context manager (or call :meth:`close`): it may start one compile
    process per chip family.
    """

    def __init__(self, settings: GateSettings, *, registry: Registry = REGISTRY, measure: Measure | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.store = GoldenStore(settings.golden_dir)
        # A golden is what a compile says: an update run writes the cache but takes no answer from it.
        self.cache = settings.cache.open() if settings.cache else None
        # Each case's executable is staged by its compile; those that pass their gate ship (gate.ship).
        self._staging = tempfile.mkdtemp(prefix="aotcheck-export-") if settings.export else None
        self._measurer = None if measure else Measurer(cache=self.cache, hbm_headroom=settings.hbm_headroom,
                                                          memory_fraction=self.memory_fraction, export=self._staging,
                                                          compiler_options=settings.compiler_options,
                                                          presets=settings.presets, registry=registry)
        self.measure: Measure = measure or self._measurer  # type: ignore[assignment]
        self.outcomes: dict[str, Outcome] = {}
        self.interruption = Interruption()  # Front ends install it for the run's life.
        self.warnings: list[str] = []
        self._noted: set[str] = set()
        self._plan: tuple[tuple[str, ...], Plan] | None = None  # (the registry's names it was made for, the plan)

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
        check_cases(self.settings, self.plan(), self.registry)  # A case id that names nothing.
        empty = self.plan().empty_reason
        if empty:  # A selection that selects nothing would pass having checked nothing.
            hint = (f"to run without the gate, say so: {self.settings.flags['topologies']}=none"
                    if self.settings.front_end == "pytest" else "python -m aotcheck configs lists them")
            raise SettingsError(f"nothing to check: {empty}; {hint}")
        check_knob_globs(self.settings, self.registry)  # fit_max_<knob> tolerance lines, now that configs are known.
        check_fit_knob(self.settings, self.plan(), self.registry)  # A fit search that would search nothing.
        if self._measurer is not None:
            try:
                self._measurer.locate()
            except RegistryError as e:
                raise SettingsError(str(e)) from None
            self._measurer.settle()  # The configs are registered: JAX's settings as a worker's will be.
        if self.cache is not None and not self.cache.usable():
            shared = self.cache.shared  # Hardening round 5, V21: the store went with it, unnamed.
            store = f" (the shared store {shared.url} behind it is not read or written either)" if shared else ""
            self.warnings.append(f"aotcheck: the figures cache {self.cache.root} is not writable; running uncached"
                                 f"{store}.")
            self.cache = None
            if self._measurer is not None:
                self._measurer.cache = None
        report = self.settings.report_path
        if report is not None and report.parent.exists() and not os.access(report.parent, os.W_OK):
            raise SettingsError(f"the report's directory {report.parent} is not writable; "
                                f"give {flag_names('pytest')['report']} (or {flag_names('cli')['report']}) a path you can write")
        # cpu-N needs N host devices, fixed when JAX's CPU backend starts: the compile workers
        # (which alone compile) read the count from the environment.
        cpu = max((t.num_devices for t in self.settings.targets if t.topology.platform.host_devices), default=0)
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
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)

    # The matrix -------------------------------------------------------------------

    def plan(self) -> Plan:
        """The run's plan (:mod:`aotcheck.plan`): made once, again only if configs were registered since."""
        names = tuple(self.registry.names())
        if self._plan is None or self._plan[0] != names:
            self._plan = (names, make_plan(self.settings, self.registry, self.store))
        return self._plan[1]

    # Cases ---------------------------------------------------------------------------

    def accept_args(self) -> list[str]:
        """The settings of this run that change what it compiles or measures, as the accept command (a
        pytest run, whichever front end this is) must repeat them: the launch flags given on the command
        line (the ini's are read again), aotcheck's presets off, a fit search and its headroom, and the
        config modules ``python -m aotcheck check --module`` added. Settings pytest has no option for
        are given as ini overrides (``-o aot_default_options=none``); repeating an ini's own value is
        harmless, leaving one out would accept other figures than this run's."""
        s = self.settings  # The accept command is a pytest run.
        args = [option("libtpu_init_args", s.libtpu_init_args_option)] if s.libtpu_init_args_option is not None else []
        if s.fit:
            args.append(option("fit", s.fit))
        if not s.presets:
            args += ini_override("default_options", "none")
        if s.hbm_headroom != 1.0:
            args += ini_override("hbm_headroom", f"{s.hbm_headroom:g}")
        if s.config_modules and s.front_end == "cli":
            args += ini_override("config_modules", "\n".join(s.config_modules))
        return args

    def accept(self, case: Case) -> Accept:
        """The command that accepts this case's current figures as its golden, as a record: the case by
        its id, the golden directory as given (it may override the ini's, even "golden"), the run's options."""
        given = self.settings.golden_dir_option
        return Accept(case, (*([option("golden_dir", given)] if given else []), *self.accept_args()))

    def golden_file(self, case: Case) -> str:
        return str(self.store.path(case))

    def check(self, case: Case) -> Outcome:
        """Measures and judges one case; the outcome carries where its golden is and its accept command."""
        s = self.settings
        # The compile workers search the knob the plan chose (a measure of one's own decides for itself).
        measure = functools.partial(self._measurer, fit=self.plan().knob(case)) if self._measurer is not None \
            else self.measure
        # What a device may hold for a server's bucket: its config's memory fraction, else the ini's, else the
        # environment's.
        server = self.plan().servers.get(case.config, Server(case.config, ()))
        room = server.usable(case.topology, self.memory_fraction) if case.bucket else None
        outcome = check_case(case, measure=measure, store=self.store, tolerances=s.tolerances,
                             update=s.update, strict=s.strict, hbm_headroom=s.hbm_headroom,
                             metric_drift=s.metric_drift, usable=room.to_json() if room is not None else None)
        # Notes the compile workers raised on this case ride with it (under xdist, to the controller).
        worker_notes = self._measurer.notes if self._measurer is not None else []
        shipped, problem = ship(self._staging, s.export, outcome, self.store.path(case), strict=s.strict) \
            if self._staging is not None and s.export else (None, None)
        new = [n for n in [*worker_notes, *([problem] if problem else [])] if n not in self._noted]
        self._noted.update(new)
        return dataclasses.replace(outcome, notes=[*outcome.notes, *new], golden_file=self.golden_file(case),
                                   accept=self.accept(case), shipped=shipped)

    def start_workers(self) -> None:
        """Starts the compile workers of the run's TPU topologies now, before the configs are built and
        the cases selected, so their start-up (jax, libtpu, a warm-up compile) overlaps with that, when
        the run will compile: it has no figures cache that may answer (a warm run's cases are answered
        here, and it starts no worker). :meth:`prestart` later stops those no selected case needs. (A
        ``cpu-N`` worker waits for :meth:`prepare`, which sets its device count.)"""
        if self._measurer is not None and not (self.cache is not None and self.cache.may_answer()):
            self._measurer.prestart(t.topology for t in self.settings.targets if not t.topology.platform.host_devices)

    def prestart(self, cases: Sequence[Case]) -> None:
        """Starts the compile workers these cases need, in parallel, before the first case runs (with a
        figures cache, those of families with a case it does not answer), and stops any started early
        that none of them needs."""
        if self._measurer is not None:
            self._measurer.retain({c.topology.family for c in cases})
            self._measurer.start_for((c, self.plan().knob(c)) for c in cases)

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

    def finish(self) -> Report:
        """Stale goldens (removed after a full update), broken configs, the report written."""
        plan = self.plan()
        stale = stale_goldens(self.registry, self.store)
        removed: list[str] = []
        if self.settings.update and stale and plan.whole_matrix_ran(self.outcomes):
            for rel in stale:
                try:
                    (self.store.root / rel).unlink(missing_ok=True)
                    removed.append(rel)
                except OSError as e:
                    self.warnings.append(f"aotcheck: could not remove the stale golden {rel}: {e.strerror or e}")
            stale = [rel for rel in stale if rel not in removed]
        interrupted = Interrupted(self.interruption.signal, len(self.outcomes), len(plan.cases),
                                  self.settings.update) if self.interruption.signal else None
        partial = split_groups([p.case for p in plan.matrix], [p.case for p in plan.cases])
        # An update accepts a server's bill as it accepts a case's figures (what it kept may sum beyond it).
        found = analyse(list(self.outcomes.values()), plan.servers, toolchain=self.toolchain(),
                        tolerances=self.settings.tolerances, accept_into=self.store if self.settings.update else None,
                        partial=partial, memory_fraction=self.memory_fraction)
        report = Report(found.outcomes, golden_dir=self.settings.golden_label, stale=stale,
                        removed=removed, broken=plan.broken, shard=self.settings.shard,
                        notes=self.notes(), toolchain=self.toolchain(), bills=found.bills, accept_args=self.accept_args(),
                        interrupted=interrupted, matrix=plan.matrix_digest, servers=dict(plan.servers),
                        pools=found.pools, upgrade=found.upgrade)
        if self.settings.report_path:
            try:
                write_report(self.settings.report_path, report)
            except OSError as e:
                report.notes.append(f"aotcheck: could not write the report {self.settings.report_path}: "
                                    f"{e.strerror or e}")
        return report

    @property
    def memory_fraction(self) -> tuple[float | None, str]:
        """The ini's (or a setting's) share of a GPU's memory, with how the run names it."""
        return self.settings.memory_fraction, self.settings.said.get("memory_fraction", "aot_memory_fraction")

    def notes(self) -> list[str]:
        """What the session has to say once: warnings from setting up and from the compile workers."""
        worker_notes = self._measurer.notes if self._measurer is not None else []
        case_notes = [n for o in self.outcomes.values() for n in o.notes]
        return list(dict.fromkeys([*self.warnings, *worker_notes, *case_notes]))

    def header(self) -> RunHeader:
        """What the run says before its first case, as a record (the front ends word it)."""
        s = self.settings
        given = bool(s.compiler_options) or not s.presets
        plan = self.plan()
        return RunHeader(
            targets=tuple(t.name for t in s.targets), golden_dir=str(self.store.root), update=s.update,
            cache=self.cache.spec if self.cache else None, shard=s.shard,
            shard_seconds=plan.shard_seconds(), toolchain=self.toolchain(),
            foreign=tuple(self.foreign_toolchain_goldens()),
            families=tuple(sorted({t.topology.family for t in self.targets()})) if s.presets else None,
            launch_flags={k: v for k, v in s.compiler_options.items() if not runtime_only(k)} if given else None,
            dropped=sum(1 for k in s.compiler_options if runtime_only(k)),
            environment_flags_used=s.environment_flags_used,
            unused_environment_flags=s.environment_flags if s.environment_flags and not s.environment_flags_used else None,
            unused_cache=tuple((name, s.said.get(name, s.flags[name]), value, s.said.get(moot, s.flags[moot]))
                               for name, value, moot in s.unused_cache),
            fit=s.fit, golden_dir_missing=not s.update and not self.store.root.is_dir(), rootdir=str(s.rootdir),
            golden_dir_state=golden_dir_state(self.store.root),
            front_end=s.front_end,
            declared=tuple((config, tuple(t.name for t in own)) for config, own in plan.declared.items()),
            no_eval=plan.no_eval)

    def targets(self) -> tuple[Target, ...]:
        """The run's targets, then those its configs declare beyond them (:attr:`aotcheck.plan.Plan.declared`)."""
        return tuple(dict.fromkeys([*self.settings.targets, *(t for own in self.plan().declared.values() for t in own)]))

    def platforms(self) -> list[Platform]:
        """The platforms of this run's targets (TPU's when there are none), the TPU's first."""
        # The CUDA plugin's version last, as the header has always said it (TPU and host both say libtpu's).
        return sorted({t.topology.platform for t in self.targets()} or {TPU}, key=lambda p: (p.toolchain_last, p.name))

    def toolchain(self) -> dict[str, str | None]:
        """The versions behind this run's figures: jax's, libtpu's where a target is a TPU (or the host's
        CPU), the CUDA plugin's where one is a GPU: what the header and the report record."""
        out: dict[str, str | None] = {}
        for platform in self.platforms():
            out.update(platform.toolchain())
        return out

    def foreign_toolchain_goldens(self) -> list[str]:
        """Golden files made with another toolchain, each with the versions it names."""
        out = []
        for case, path in self.store.cases().items():
            try:
                golden = parse_document(path.read_text(), path)
            except (GoldenError, OSError, ValueError):  # Unreadable goldens fail their own case.
                continue
            platform, rel = case.topology.platform, case.golden_relpath
            # A platform whose compiler is not installed judges none of its goldens: no upgrade table to promise.
            if None not in platform.toolchain().values() \
                    and toolchain_note(golden.toolchain, platform=platform):
                out.append(f"{rel}: " + ", ".join(f"{k} {golden.toolchain.get(k)}" for k in platform.toolchain()))
        return out


def golden_dir_state(root: Path) -> str | None:
    """What the golden directory is where it is no directory (hardening round 5, V80-V82: a file and a dangling
    link were said not to exist); None for a directory."""
    if root.is_dir():
        return None
    return "a file" if root.exists() else "a dangling link" if root.is_symlink() else "absent"


def exit_status(report: Report) -> int:
    """0 when every case passed, every config built and no start-up bill grew, else 1."""
    return 0 if report.passed else 1
