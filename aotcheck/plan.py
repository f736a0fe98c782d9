"""The plan of a gate run, as a value: the matrix, its skips and knobs, broken configs, shards, stale goldens.

:func:`make_plan` reads the settings, the registry and the golden store once and returns a
frozen :class:`Plan`; nothing in it calls back into a session. The session runs the plan's
cases; the pytest plugin turns them into items; both ask the plan, not each other, which
shard a test belongs to and whether the whole matrix ran.

Example (a registry of one config on two host targets, no goldens yet):
    >>> import tempfile
    >>> import jax, jax.numpy as jnp
    >>> from aotcheck import FunctionConfig, Registry
    >>> from aotcheck.gate.golden import GoldenStore
    >>> from aotcheck.settings import GateSettings
    >>> registry = Registry()
    >>> _ = registry.register("double", FunctionConfig(fn=lambda x: 2 * x, make_args=lambda mesh: (
    ...     jax.ShapeDtypeStruct((8, 128), jnp.float32),), min_devices=4))
    >>> settings = GateSettings.parse(rootdir=tempfile.mkdtemp(), topologies="cpu-2,cpu-4", shard="1/2")
    >>> plan = make_plan(settings, registry, GoldenStore(settings.golden_dir))
    >>> [(p.case.id, p.skip is not None) for p in plan.matrix]
    [('double/step@cpu-2x1', True), ('double/step@cpu-4x1', False)]
    >>> len(plan.cases), plan.shard, plan.complete, plan.knob(plan.matrix[1].case)  # One case in each shard.
    (1, (1, 2), True, None)
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import hashlib
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from aotcheck.figures.table import fit_max
from aotcheck.gate.compare import ToleranceError, check_knob_tolerances, over_knobs
from aotcheck.gate.golden import GoldenError, GoldenStore
from aotcheck.gate.shard import assign_shards, expected_seconds, shard_of_name
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measure import fit_knob, unsupported_reason
from aotcheck.pipeline.measurement import COST_FIGURES, figure_names
from aotcheck.programs.knobs import knobs_offered
from aotcheck.programs.registry import Registry, RegistryError
from aotcheck.programs.serving import Server, server_of
from aotcheck.readers import SettingsError, example
from aotcheck.settings import GateSettings
from aotcheck.targets.globs import declared_targets
from aotcheck.targets.topology import Target


class Planned(NamedTuple):
    """A case of the matrix: if it cannot run on its target, why; the knob whose largest fitting size
    is searched on it, if any (:func:`aotcheck.pipeline.measure.fit_knob`)."""

    case: Case
    skip: str | None
    knob: str | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """The matrix a run checks, decided once.

    Attributes:
        matrix: Every selected case, over every shard.
        cases: This run's shard of them (all of them when not sharded).
        broken: Config name -> why building it failed (reported by the first shard only).
        empty_reason: Why there is nothing to check, if there is not.
        shard: ``(K, N)`` when the run is shard K of N.
        seconds: Case id -> the compile CPU seconds its golden recorded (a guess from its kind without
            one): what shards are balanced by (read only when sharded).
        shard_of: Case id -> its shard (when sharded).
        complete: Whether every registered config was selected and built, so that a run of every case
            is a run of the whole matrix (stale goldens are pruned only after one).
        declared: Config name -> the targets it declares by name (``targets=("v5e-1x1",)``) that the run's
            topologies do not list: it is compiled there too (:func:`aotcheck.targets.globs.declared_targets`).
        servers: Config name -> its :class:`~aotcheck.programs.serving.Server` (its programs' order, its KV
            pool's knob and pages, its memory fraction), for each selected config that is a server.
        no_eval: The selected configs with a train step and no eval step (``eval_step=None``, or a train
            step given as a function of its own): the run's header says so once for each.
    """

    matrix: tuple[Planned, ...]
    cases: tuple[Planned, ...]
    broken: Mapping[str, str]
    empty_reason: str | None
    shard: tuple[int, int] | None = None
    # Read-only, and made per plan: Python 3.11's dataclasses refuse a mappingproxy as a shared default.
    seconds: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    shard_of: Mapping[str, int] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    complete: bool = True
    declared: Mapping[str, tuple[Target, ...]] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    servers: Mapping[str, Server] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    no_eval: tuple[str, ...] = ()

    def knob(self, case: Case) -> str | None:
        """The knob the plan searches on ``case`` (None: no search)."""
        return self._knobs.get(case.id)

    @functools.cached_property  # A frozen dataclass's own __dict__: computed once.
    def _knobs(self) -> dict[str, str | None]:
        return {p.case.id: p.knob for p in self.matrix}

    def shard_seconds(self) -> tuple[float, float] | None:
        """(this shard's expected compile seconds, the whole matrix's), when sharded."""
        if not self.shard:
            return None
        mine = sum(s for case_id, s in self.seconds.items() if self.shard_of[case_id] == self.shard[0])
        return mine, sum(self.seconds.values())

    def other_shards(self, names: Sequence[str]) -> set[str]:
        """Of a user's own tests (node ids), those that belong to another shard than this run's."""
        if not self.shard:
            return set()
        k, n = self.shard
        return {name for name in names if shard_of_name(name, n) != k}

    @functools.cached_property
    def matrix_digest(self) -> str:
        """A digest of the matrix's case ids (every shard's): the shards of one run record the same one, so a
        merge of shards of different matrices (another config list, other targets) is told apart."""
        ids = "\n".join(sorted(p.case.id for p in self.matrix))
        return hashlib.sha256(ids.encode()).hexdigest()[:16]

    def whole_matrix_ran(self, done: Collection[str]) -> bool:
        """Whether every case of every registered config is among ``done`` (case ids): prune only then."""
        return self.complete and all(p.case.id in done for p in self.matrix)


def make_plan(settings: GateSettings, registry: Registry, store: GoldenStore) -> Plan:
    """Every selected case (with a skip reason and its knob), configs that failed to build, why the
    matrix is empty if it is, and this run's shard of it."""
    matrix: list[Planned] = []
    broken: dict[str, str] = {}
    wanted = set(settings.cases)
    # A case names its config: --aot-case selects by the id alone, whatever the globs say.
    selected = [e for e in registry if e.name in {c.config for c in wanted}] if wanted else \
        registry.select(list(settings.config_globs) or None)
    twins = registry.case_twins()
    declared: dict[str, tuple[Target, ...]] = {}
    servers: dict[str, Server] = {}
    no_eval: list[str] = []
    for entry in selected:
        try:
            if entry.name in twins:
                raise RegistryError(twins[entry.name])
            programs = entry.programs()
        except RegistryError as e:
            broken[entry.name] = str(e)
            continue
        if "train_step" in programs and "eval_step" not in programs:
            no_eval.append(entry.name)
        server = server_of(entry.name, programs.values())
        if server is not None:
            servers[entry.name] = server
        for config in programs.values():
            # A target the config names is compiled whatever the run lists; a run with no targets
            # (--aot-topologies=none) checks nothing.
            own = [t for t in declared_targets(config.targets) if t not in settings.targets] if settings.targets else []
            if own:
                declared[entry.name] = tuple(dict.fromkeys([*declared.get(entry.name, ()), *own]))
            for target in (*settings.targets, *own):
                case = Case.for_config(entry.name, config, target)
                if wanted and case not in wanted:
                    continue
                matrix.append(Planned(case, unsupported_reason(config, case),
                                      fit_knob(config, case, fit_default=settings.fit)))
    empty = None
    if wanted and not matrix and not broken:
        empty = f"no registered case is {' or '.join(sorted(c.id for c in wanted))}"
    elif not selected:
        globs = ", ".join(settings.config_globs)
        empty = (f"no registered config matches {settings.flags['configs']}={globs} "
                 f"(registered: {', '.join(registry.names())})" if len(registry) else
                 "no configs are registered: call aotcheck.register(...) in the rootdir conftest.py "
                 "or in a module listed in the aot_config_modules ini option")
    # Configs named one by one are those alone, however many are registered now: a config registered only
    # sometimes (on another host, under a variable) keeps its goldens (hardening round 5, V85).
    named = any(glob != "*" for glob in settings.config_globs)
    complete = not broken and len(selected) == len(registry) and not wanted and not named
    if not settings.shard:
        return Plan(tuple(matrix), tuple(matrix), MappingProxyType(broken), empty, complete=complete,
                    declared=MappingProxyType(declared), servers=MappingProxyType(servers), no_eval=tuple(no_eval))
    k, n = settings.shard
    seconds = recorded_seconds([p.case for p in matrix], store)
    shard_of = assign_shards([p.case for p in matrix], n, seconds=seconds)
    return Plan(tuple(matrix), tuple(p for p in matrix if shard_of[p.case.id] == k),
                MappingProxyType(broken if k == 1 else {}),  # A broken config fails once, in the first shard.
                empty, settings.shard, MappingProxyType(seconds), MappingProxyType(shard_of), complete,
                MappingProxyType(declared), MappingProxyType(servers), tuple(no_eval))


def recorded_seconds(cases: Sequence[Case], store: GoldenStore) -> dict[str, float]:
    """Case id -> the compile CPU seconds its golden recorded (a guess from its kind without one)."""
    recorded: dict[str, float] = {}
    for case in cases:
        try:
            golden = store.read(case)
        except GoldenError:
            golden = None
        recorded[case.id] = (sum(float(golden.figures.get(name, 0.0)) for name in COST_FIGURES)
                             if golden is not None else 0.0)
    return expected_seconds(cases, recorded)


def stale_goldens(registry: Registry, store: GoldenStore) -> list[str]:
    """Golden files with no registered (config, program): judged on the whole registry, so deselected,
    skipped and other-shard cases never count; a config that does not build keeps its goldens."""
    known: set[tuple[str, str]] = set()
    unbuildable: set[str] = set()
    for entry in registry:
        try:
            known.update((entry.name, p) for p in entry.programs())
        except RegistryError:
            unbuildable.add(entry.name)
    stale = []
    for case in store.cases():  # Only files aotcheck wrote: a user's own JSON is never stale.
        if case.config not in unbuildable and (case.config, case.program_id) not in known:
            stale.append(case.golden_relpath)
    return stale


def check_cases(settings: GateSettings, plan: Plan, registry: Registry) -> None:
    """SettingsError for a ``--aot-case`` that names no registered case (a typo would accept nothing and
    pass), naming the nearest case ids there are."""
    found = {p.case for p in plan.matrix}
    missing = [c for c in settings.cases if c not in found and c.config not in plan.broken]
    if not missing:
        return
    known = [Case.for_config(entry.name, config, target).id for entry in registry for config in _built(entry)
             for target in {c.target for c in missing}]
    near = difflib.get_close_matches(missing[0].id, known, n=3, cutoff=0.5)
    raise SettingsError(f"{example(settings.said.get('cases', settings.flags['cases']), missing[0].id)}: no registered "
                        f"config has this case" + (f"; did you mean {', '.join(near)}?" if near else
                                                   " (aotcheck configs lists the configs and their programs)"))


def _built(entry: Any) -> list[Any]:
    try:
        return entry.configs()
    except RegistryError:
        return []


def check_fit_knob(settings: GateSettings, plan: Plan, registry: Registry) -> None:
    """SettingsError for a fit search (``--aot-fit=btach``) that no selected case offers: the fit gate
    would run on nothing and pass. Names the knobs the registered configs offer, the nearest first."""
    if not settings.fit or any(p.knob == settings.fit for p in plan.matrix):
        return
    offered: set[str] = set()
    for entry in registry:
        try:
            configs = entry.configs()
        except RegistryError:
            continue
        for config in configs:
            offered.update(knobs_offered(config))
    near = difflib.get_close_matches(settings.fit, sorted(offered), n=1)
    raise SettingsError(
        f"{example(settings.said.get('fit', settings.flags['fit']), settings.fit)}: no selected case offers a knob named {settings.fit!r}, so the fit "
        f"search would run on nothing; " + (f"did you mean {near[0]}? " if near else "")
        + (f"the registered configs offer: {', '.join(sorted(offered))}" if offered else
           "no registered config offers a knob (a trainer's is batch; FunctionConfig(knobs=...) names others)"))


def check_knob_globs(settings: GateSettings, registry: Registry) -> None:
    """SettingsError for an ``aot_tolerances`` line over ``fit_max_`` figures that no knob has (``fit_max_batchh``):
    the knobs are the registered configs', known once they are loaded. Configs are built only for such a line."""
    knobs = {"batch", *([settings.fit] if settings.fit else [])}
    globs = [glob for glob, _ in settings.tolerances if over_knobs(glob)]
    if all(any(fnmatch.fnmatchcase(fit_max(knob), glob) for knob in knobs) for glob in globs):
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
