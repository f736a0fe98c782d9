"""The pytest plugin: registered configs x topologies x slices as test items.

Thin glue over :mod:`aotcheck.check`: options and ini values in, one item per
case, each item's :class:`~aotcheck.check.Outcome` out through the report's
``user_properties`` (so xdist carries it to the controller and JUnit XML
records it), and a summary, a JSON report and stale-golden detection on the
controller.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from aotcheck import _runtime
from aotcheck.cache import FiguresCache
from aotcheck.case import Case
from aotcheck.compare import Tolerance, ToleranceError, parse_tolerances
from aotcheck.golden import GoldenError, GoldenStore
from aotcheck.loader import LoaderError, load_config_modules
from aotcheck.registry import REGISTRY, RegistryError
from aotcheck.shard import ShardError, assign_shards, parse_shard
from aotcheck.topology import Topology, TopologyError, parse_target, reserve_cpu_devices

NODE_PREFIX = "aotcheck::"
PROPERTY = "aotcheck"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aotcheck", "aotcheck: AOT-compile registered configs for TPU topologies")
    group.addoption("--aot-topologies", help="topologies to check, e.g. v4-8,v5e-16 (v5e-16x2: 2 slices only). "
                    "Without any (here or in the ini), the plugin adds no tests.")
    group.addoption("--aot-slices", help="slice counts for every topology, e.g. 1,2 (default 1)")
    group.addoption("--aot-configs", help="glob(s) over config names, e.g. 'lm-*' (default all)")
    group.addoption("--aot-golden-dir", help="golden directory (default golden/ at the rootdir)")
    group.addoption("--update-golden", action="store_true", default=False,
                    help="write the figures of the cases that run as their goldens (and pass them); "
                    "cases that do not run are left alone")
    group.addoption("--aot-strict", action="store_true", default=None,
                    help="fail on improvements beyond tolerance too, to keep baselines tight")
    group.addoption("--aot-report", metavar="PATH", help="write every case's figures, golden and verdict as JSON")
    group.addoption("--aot-cache-dir", help="figures cache directory (default .aotcheck-cache at the rootdir)")
    group.addoption("--aot-no-cache", action="store_true", default=False,
                    help="compile every case, neither reading nor writing the figures cache")
    group.addoption("--aot-shard", metavar="K/N", help="run only shard K of N of the case matrix (for CI runners)")
    parser.addini("aot_topologies", "default --aot-topologies", type="args", default=[])
    parser.addini("aot_slices", "default --aot-slices", type="args", default=[])
    parser.addini("aot_configs", "default --aot-configs", type="args", default=[])
    parser.addini("aot_golden_dir", "default --aot-golden-dir, relative to the rootdir", default="golden")
    parser.addini("aot_cache_dir", "default --aot-cache-dir, relative to the rootdir", default=".aotcheck-cache")
    parser.addini("aot_strict", "default --aot-strict", type="bool", default=False)
    parser.addini("aot_hbm_headroom", "fail a case whose peak exceeds this share of the device's HBM (default 1.0)",
                  default="1.0")
    parser.addini("aot_tolerances", "per-metric tolerances, one per line: GLOB = REL% [+ ABS[unit]]",
                  type="linelist", default=[])
    parser.addini("aot_config_modules", "modules or .py files (rootdir-relative) that register configs",
                  type="linelist", default=[])


def _split(value: str | None) -> list[str]:
    return [v for v in re.split(r"[,\s]+", value or "") if v]


@dataclasses.dataclass
class Settings:
    """The plugin's settings, parsed and checked."""

    targets: list[tuple[Topology, int]]
    config_globs: list[str]
    store: GoldenStore
    update: bool
    strict: bool
    tolerances: tuple[tuple[str, Tolerance], ...]
    report_path: Path | None
    hbm_headroom: float = 1.0
    cache: FiguresCache | None = None
    shard: tuple[int, int] | None = None

    @classmethod
    def from_config(cls, config: pytest.Config) -> "Settings":
        def pick(option: str, ini: str) -> list[str]:
            value = config.getoption(option)
            return _split(value) if value is not None else list(config.getini(ini))

        try:
            slices = [_parse_slices(s) for s in pick("aot_slices", "aot_slices")] or [1]
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        targets: list[tuple[Topology, int]] = []
        for text in pick("aot_topologies", "aot_topologies"):
            try:
                topology, fixed = parse_target(text)
            except TopologyError as e:
                raise pytest.UsageError(f"--aot-topologies: {e}") from None
            for n in [fixed] if fixed else slices:
                if (topology, n) not in targets:
                    targets.append((topology, n))
        try:
            tolerances = parse_tolerances(config.getini("aot_tolerances"))
        except ToleranceError as e:
            raise pytest.UsageError(f"aot_tolerances: {e}") from None
        try:
            headroom = float(config.getini("aot_hbm_headroom"))
            if not 0 < headroom <= 1:
                raise ValueError
        except ValueError:
            raise pytest.UsageError(
                f"aot_hbm_headroom: {config.getini('aot_hbm_headroom')!r} must be a number in (0, 1], e.g. 0.95"
            ) from None
        try:
            shard = parse_shard(config.getoption("aot_shard")) if config.getoption("aot_shard") else None
        except ShardError as e:
            raise pytest.UsageError(str(e)) from None
        cache_dir = config.getoption("aot_cache_dir") or config.getini("aot_cache_dir")
        cache = None if config.getoption("aot_no_cache") else FiguresCache(config.rootpath / cache_dir)
        golden_dir = config.getoption("aot_golden_dir") or config.getini("aot_golden_dir")
        strict = config.getoption("aot_strict")
        report = config.getoption("aot_report")
        return cls(
            targets=targets,
            config_globs=pick("aot_configs", "aot_configs"),
            store=GoldenStore(config.rootpath / golden_dir),
            update=config.getoption("update_golden"),
            strict=config.getini("aot_strict") if strict is None else strict,
            tolerances=tolerances,
            report_path=Path(report) if report else None,
            hbm_headroom=headroom,
            cache=cache,
            shard=shard,
        )


def _parse_slices(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--aot-slices: {text!r} is not a slice count; give integers >= 1, e.g. --aot-slices=1,2")
    return int(text)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "aotcheck: an AOT compile case generated by aotcheck")
    settings = Settings.from_config(config)
    if not settings.targets:
        return  # No topology asked for: stay out of ordinary test runs.
    if settings.update:
        try:
            settings.store.check_writable()
        except GoldenError as e:
            raise pytest.UsageError(str(e)) from None
    try:
        load_config_modules(config.getini("aot_config_modules"), rootdir=config.rootpath)
    except LoaderError as e:
        raise pytest.UsageError(f"aot_config_modules: {e}") from None
    if settings.cache is not None and not settings.cache.usable():
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(
                f"aotcheck: the figures cache {settings.cache.root} is not writable; running uncached."
            ),
            stacklevel=2,
        )
        settings.cache = None
    # cpu-N needs N host devices, fixed when JAX's CPU backend starts: ask now.
    cpu_devices = max((t.num_devices * n for t, n in settings.targets if not t.is_tpu), default=0)
    if cpu_devices:
        reserve_cpu_devices(cpu_devices)
    config.pluginmanager.register(AotSession(config, settings), "aotcheck-session")


class AotFailure(Exception):
    """A failed case; its message is the whole explanation (no traceback)."""


class AotCollector(pytest.Collector):
    """Parent of the generated items (they belong to no test file)."""

    def collect(self) -> list[pytest.Item]:
        return []


class AotItem(pytest.Item):
    """One case: compile, compare with golden, maybe accept."""

    def __init__(self, *, case: Case, aot: "AotSession", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.aot = aot
        self.add_marker("aotcheck")

    def runtest(self) -> None:
        from aotcheck.check import check_case  # Deferred: imports jax.
        from aotcheck.isolation import run_case_isolated

        s = self.aot.settings
        files = REGISTRY.source_files()
        cache_dir = str(s.cache.root) if s.cache else None
        outcome = check_case(
            self.case, store=s.store, tolerances=s.tolerances, update=s.update, hbm_headroom=s.hbm_headroom,
            runner=lambda case: run_case_isolated(case, config_files=files, cache_dir=cache_dir),
        )
        self.user_properties.append((PROPERTY, json.dumps(outcome.to_json(), sort_keys=True)))
        for name, value in sorted((outcome.figures or {}).items()):
            self.user_properties.append((f"aotcheck.{name}", value))
        if outcome.failed(strict=s.strict):
            raise AotFailure(outcome.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, AotFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, 0, self.case.id


class AotBuildErrorItem(pytest.Item):
    """Stands for a config whose builder failed, so the failure has a place to show."""

    def __init__(self, *, error: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error
        self.add_marker("aotcheck")

    def runtest(self) -> None:
        raise AotFailure(self.error)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, 0, self.name


class AotSession:
    """Per-session state: builds the items, gathers outcomes, reports."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.empty_reason: str | None = None
        self.stale: list[str] = []  # Set by the controller at session end.
        self.removed: list[str] = []

    # Collection -------------------------------------------------------------

    def matrix(self) -> tuple[list[tuple[Case, str | None]], list[tuple[str, str]]]:
        """All selected cases (with a skip reason or None), and configs that failed to build."""
        from aotcheck.runner import unsupported_reason

        cases, broken = [], []
        entries = REGISTRY.select(self.settings.config_globs or None)
        for entry in entries:
            try:
                programs = entry.programs()
            except RegistryError as e:
                broken.append((entry.name, str(e)))
                continue
            for program, cfg in programs.items():
                for topology, slices in self.settings.targets:
                    case = Case(entry.name, program, topology.name, slices)
                    cases.append((case, unsupported_reason(cfg, case)))
        if not entries:
            globs = ", ".join(self.settings.config_globs)
            self.empty_reason = (
                f"no registered config matches --aot-configs={globs} (registered: {', '.join(REGISTRY.names())})"
                if len(REGISTRY) else
                "no configs are registered: call aotcheck.register(...) in the rootdir conftest.py "
                "or in a module listed in the aot_config_modules ini option"
            )
        return cases, broken

    @pytest.hookimpl(tryfirst=True)  # Before -k/-m deselection, so they select our items too.
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        parent = AotCollector.from_parent(session, name="aotcheck", nodeid="aotcheck")
        cases, broken = self.matrix()
        if self.settings.shard:
            k, n = self.settings.shard
            shard_of = assign_shards([c for c, _ in cases], n)
            cases = [(c, skip) for c, skip in cases if shard_of[c.id] == k]
            broken = broken if k == 1 else []  # A broken config fails once, in the first shard.
        new: list[pytest.Item] = [
            AotBuildErrorItem.from_parent(parent, name=f"{name}/<build>", error=error) for name, error in broken
        ]
        for case, skip in cases:
            item = AotItem.from_parent(parent, name=case.id, case=case, aot=self)
            if skip:
                item.add_marker(pytest.mark.skip(reason=skip))
            new.append(item)
        items.extend(new)
        # Report them as collected, so "collected N items" and deselection counts include them.
        self.config.hook.pytest_collectreport(report=pytest.CollectReport(parent.nodeid, "passed", None, new))

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        s = self.settings
        toolchain = ", ".join(f"{k} {v}" for k, v in _runtime.toolchain().items())
        targets = ", ".join(f"{t.name}x{n}" for t, n in s.targets)
        cache = f"figures cache {s.cache.root}" if s.cache else "no figures cache"
        shard = f"; shard {s.shard[0]}/{s.shard[1]}" if s.shard else ""
        lines = [f"aotcheck: {targets}; goldens in {s.store.root}{' (updating)' if s.update else ''}; "
                 f"{cache}{shard}; {toolchain}"]
        foreign = self._foreign_toolchain_goldens()
        if foreign:
            lines.append(f"aotcheck: WARNING: {len(foreign)} golden file(s) were made with another toolchain "
                         f"({foreign[0]}); their figures may differ for that reason alone")
        return lines

    def _foreign_toolchain_goldens(self) -> list[str]:
        from aotcheck.golden import parse_document

        now = _runtime.toolchain()
        out = []
        for rel, path in self.settings.store.cases().items():
            try:
                golden = parse_document(path.read_text(), path)
            except (GoldenError, OSError):
                continue
            if any(golden.toolchain.get(k) != v for k, v in now.items()):
                out.append(f"{rel}: " + ", ".join(f"{k} {golden.toolchain.get(k)}" for k in now))
        return out

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> list[str]:
        if self.empty_reason:
            return [f"aotcheck: nothing to check: {self.empty_reason}"]
        return []

    # Results ----------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.nodeid.startswith(NODE_PREFIX):
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                outcome = json.loads(value)
                outcome["failed"] = report.failed
                self.outcomes[outcome["case"]] = outcome
                return
        if report.skipped or (report.failed and report.when != "teardown"):
            case_id = report.nodeid[len(NODE_PREFIX):]
            reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.outcomes.setdefault(case_id, {"case": case_id, "verdict": "skipped" if report.skipped else "error",
                                               "message": reason, "failed": report.failed})

    def _is_controller(self) -> bool:
        return not hasattr(self.config, "workerinput")

    def stale_goldens(self) -> list[str]:
        """Golden files with no registered (config, program): judged on the whole registry,
        so deselected, skipped and other-shard cases never count."""
        known: set[tuple[str, str]] = set()
        unbuildable: set[str] = set()
        for entry in REGISTRY:
            try:
                known.update((entry.name, p) for p in entry.programs())
            except RegistryError:
                unbuildable.add(entry.name)
        stale = []
        for rel in self.settings.store.cases():
            try:
                case = Case.parse(rel.removesuffix(".json"))
                parse_target(f"{case.topology}x{case.num_slices}")
            except (ValueError, TopologyError):
                stale.append(rel)
                continue
            if case.config in unbuildable or case.golden_relpath != rel:
                continue
            if (case.config, case.program) not in known:
                stale.append(rel)
        return stale

    def _whole_matrix_ran(self) -> bool:
        cases, broken = self.matrix()
        if broken or len(REGISTRY.select(self.settings.config_globs or None)) != len(REGISTRY):
            return False  # Some registered config was left out: its goldens' fate is not ours to judge.
        return all(case.id in self.outcomes for case, _ in cases)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        from aotcheck.isolation import close_workers

        close_workers()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self._is_controller():
            return
        self.stale = self.stale_goldens()
        if self.settings.update and self.stale and self._whole_matrix_ran():
            for rel in self.stale:
                (self.settings.store.root / rel).unlink(missing_ok=True)
            self.removed, self.stale = self.stale, []
        if self.settings.report_path:
            from aotcheck.report import write_report

            write_report(self.settings.report_path, list(self.outcomes.values()), stale=self.stale,
                         shard=self.settings.shard)

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if not self._is_controller() or not (self.outcomes or self.stale):
            return
        from aotcheck.report import terminal_summary

        tr = terminalreporter
        tr.write_sep("=", "aotcheck summary")
        tr.write_line(terminal_summary(list(self.outcomes.values())))
        improved = [o for o in self.outcomes.values() if o["verdict"] == "improvement" and not o["failed"]]
        for o in improved:
            tr.write_line("")
            tr.write_line(f"note: {o['message']}")
        if self.settings.update:
            actions = [o.get("golden_action") for o in self.outcomes.values()]
            counts = {a: actions.count(a) for a in ("created", "changed", "unchanged")}
            tr.write_line(
                f"\naotcheck --update-golden: {counts['created']} created, {counts['changed']} changed, "
                f"{counts['unchanged']} unchanged; golden files of cases that did not run were left alone."
            )
        for rel in self.removed:
            tr.write_line(f"aotcheck: removed stale golden {rel}")
        if self.stale:
            tr.write_line(
                f"\naotcheck: WARNING: {len(self.stale)} stale golden file(s) with no registered case: "
                + ", ".join(self.stale)
                + ". Remove them, or run --update-golden over the whole matrix (no -k, no --aot-configs).",
                yellow=True,
            )
