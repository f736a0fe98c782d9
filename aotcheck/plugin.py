"""The pytest plugin: a front end of a few lines per hook over :class:`aotcheck.session.GateSession`.

Options and ini values become :class:`~aotcheck.session.GateSettings`; each
planned case becomes one test item; each item's :class:`~aotcheck.gate.outcome.Outcome`
travels as JSON in the report's ``user_properties`` (so pytest-xdist carries it
to the controller and JUnit XML records it); the controller's session finishes
the run (stale goldens, the JSON report) and the summary is rendered by
:mod:`aotcheck.render.text`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from aotcheck.gate.case import Case
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.render.text import session_summary
from aotcheck.session import PYTEST_FLAGS, GateSession, GateSettings, SettingsError, split_list

NODE_PREFIX = "aotcheck::"
PROPERTY = "aotcheck"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aotcheck", "aotcheck: AOT-compile registered configs for TPU topologies")
    group.addoption("--aot-topologies", help="topologies to check, e.g. v4-8,v5e-16 (v5e-16x2: 2 slices only); "
                    "'none' turns the gate off for this run. Without any (here or in the ini), the plugin "
                    "adds no tests.")
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
    group.addoption("--aot-fit", metavar="KNOB",
                    help="search the largest KNOB (e.g. batch) that fits on every config that offers it, "
                    "gated as fit_max_KNOB (default: each config's own fit=)")
    group.addoption("--aot-libtpu-init-args", metavar="FLAGS",
                    help="your job's LIBTPU_INIT_ARGS string, e.g. '--aot-libtpu-init-args=--xla_tpu_scoped_vmem_limit_kib=98304 "
                    "--xla_tpu_enable_latency_hiding_scheduler=true' (runtime-only flags are dropped)")
    group.addoption("--aot-shard", metavar="K/N", help="run only shard K of N of the case matrix (for CI runners)")
    parser.addini("aot_topologies", "default --aot-topologies", type="args", default=[])
    parser.addini("aot_slices", "default --aot-slices", type="args", default=[])
    parser.addini("aot_configs", "default --aot-configs", type="args", default=[])
    parser.addini("aot_golden_dir", "default --aot-golden-dir, relative to the rootdir", default="golden")
    parser.addini("aot_cache_dir", "default --aot-cache-dir, relative to the rootdir", default=".aotcheck-cache")
    parser.addini("aot_strict", "default --aot-strict", type="bool", default=False)
    parser.addini("aot_hbm_headroom", "fail a case whose peak exceeds this share of the device's HBM (default 1.0)",
                  default="1.0")
    parser.addini("aot_fit", "default --aot-fit", default="")
    parser.addini("aot_tolerances", "per-metric tolerances, one per line: GLOB = REL% [+ ABS[unit]]",
                  type="linelist", default=[])
    parser.addini("aot_metric_drift", "figures new or gone against a golden: fail (default) or warn",
                  default="fail")
    parser.addini("aot_libtpu_init_args", "default --aot-libtpu-init-args: your job's LIBTPU_INIT_ARGS string",
                  default="")
    parser.addini("aot_default_options", "aotcheck's per-chip compiler presets under your options: aotcheck "
                  "(default) or none (only your options, as your job sends them)", default="aotcheck")
    parser.addini("aot_config_modules", "modules or .py files (rootdir-relative) that register configs",
                  type="linelist", default=[])


def settings_from_pytest(config: pytest.Config) -> GateSettings:
    """Options over ini values, parsed by the session's own rules."""

    def pick(option: str) -> Any:
        value = config.getoption(option)
        return value if value is not None else config.getini(option)

    strict = config.getoption("aot_strict")
    if strict is None:
        try:
            strict = config.getini("aot_strict")
        except ValueError as e:
            raise SettingsError(f"aot_strict: {e}; write true or false") from None
    return GateSettings.parse(
        rootdir=config.rootpath,
        topologies=pick("aot_topologies"),
        slices=pick("aot_slices"),
        configs=pick("aot_configs"),
        golden_dir=pick("aot_golden_dir"),
        golden_dir_option=config.getoption("aot_golden_dir"),
        update=config.getoption("update_golden"),
        strict=strict,
        tolerances=config.getini("aot_tolerances"),
        report=config.getoption("aot_report"),
        hbm_headroom=config.getini("aot_hbm_headroom"),
        fit=pick("aot_fit"),
        cache_dir=None if config.getoption("aot_no_cache") else pick("aot_cache_dir"),
        shard=config.getoption("aot_shard"),
        config_modules=config.getini("aot_config_modules"),
        metric_drift=config.getini("aot_metric_drift"),
        libtpu_init_args=pick("aot_libtpu_init_args"),
        default_options=config.getini("aot_default_options"),
        libtpu_init_args_option=config.getoption("aot_libtpu_init_args"),
        flags=PYTEST_FLAGS,
    )


# Options whose value is a path: given after a space, pytest takes an existing path for a
# test path while it decides the rootdir (before plugins add options), which can move
# the rootdir and golden/ with it.
PATH_OPTIONS = ("--aot-golden-dir", "--aot-cache-dir", "--aot-report")


def check_invocation(args: list[str]) -> None:
    """Usage errors for option spellings that mislead pytest (see PATH_OPTIONS) or turn the gate off
    by accident (an empty ``--aot-topologies=``)."""
    for i, arg in enumerate(args):
        if arg in PATH_OPTIONS and i + 1 < len(args):
            value = args[i + 1]
            raise pytest.UsageError(
                f"{arg} {value}: write {arg}={value}. Given after a space, pytest also reads {value!r} as a "
                "test path while it decides the rootdir, which can move the rootdir and the golden directory "
                "with it (every case would then miss its golden).")
        given = arg.partition("=")[2] if arg.startswith("--aot-topologies=") else \
            args[i + 1] if arg == "--aot-topologies" and i + 1 < len(args) else None
        if given is not None and not split_list(given):  # "", ",", " ": no topology, yet not "none".
            raise pytest.UsageError(
                f"--aot-topologies is empty ({given!r} names no topology). To turn the gate off for this run, say "
                "so: --aot-topologies=none")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "aotcheck: an AOT compile case generated by aotcheck, or a test of yours "
                                       "that goes with them (sharded with them under --aot-shard)")
    config.addinivalue_line("markers", "aotcheck_case: an AOT compile case generated by aotcheck (only those)")
    check_invocation(list(config.invocation_params.args))
    if (config.getoption("aot_topologies") or "").strip().lower() == "none":
        config.pluginmanager.register(GateOff(), "aotcheck-off")
        return
    ini = config.getini("aot_topologies")
    if config.getoption("aot_topologies") is None and ini and not split_list(ini):
        raise pytest.UsageError(f"aot_topologies in {config.inipath} is empty ({' '.join(ini)!r} names no "
                                "topology): name topologies (e.g. aot_topologies = v4-8 v5e-16), or remove the line")
    try:
        settings = settings_from_pytest(config)
        if not settings.targets:
            return  # No topology asked for: stay out of ordinary test runs.
        session = GateSession(settings)
    except SettingsError as e:
        raise pytest.UsageError(str(e)) from None
    if _measures_here(config):
        session.start_workers()
    try:
        session.prepare()
    except SettingsError as e:
        session.close()
        raise pytest.UsageError(str(e)) from None
    session.interruption.install()  # SIGTERM ends the run as Ctrl-C does (summary, report, workers stopped).
    config.pluginmanager.register(AotPlugin(config, session), "aotcheck-session")


class GateOff:
    """Says in the header that the gate was turned off for this run."""

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return ["aotcheck: off for this run (--aot-topologies=none)"]


class AotFailure(Exception):
    """A failed case; its message is the whole explanation (no traceback)."""


class AotCollector(pytest.Collector):
    """Parent of the generated items (they belong to no test file)."""

    def collect(self) -> list[pytest.Item]:
        return []


class AotItem(pytest.Item):
    """One case: the session checks it; the outcome rides on the report."""

    def __init__(self, *, case: Case, gate: GateSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.gate = gate
        self.add_marker("aotcheck")
        self.add_marker("aotcheck_case")

    def runtest(self) -> None:
        outcome = self.gate.check(self.case)
        self.user_properties.append((PROPERTY, json.dumps(outcome.to_json(), sort_keys=True)))
        self.user_properties += [(f"aotcheck.{k}", v) for k, v in sorted((outcome.figures or {}).items())]
        if outcome.failed:
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
        self.add_marker("aotcheck_case")

    def runtest(self) -> None:
        raise AotFailure(self.error)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, 0, self.name


class AotPlugin:
    """The hooks: each delegates to the session."""

    def __init__(self, config: pytest.Config, session: GateSession) -> None:
        self.config = config
        self.session = session
        self.plan = session.plan()
        self.report: Report | None = None

    @pytest.hookimpl(tryfirst=True)  # Before -k/-m deselection, so they select our items too.
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        parent = AotCollector.from_parent(session, name="aotcheck", nodeid="aotcheck")
        new: list[pytest.Item] = [AotBuildErrorItem.from_parent(parent, name=f"{name}/<build>", error=error)
                                  for name, error in self.plan.broken.items()]
        for case, skip in self.plan.cases:
            item = AotItem.from_parent(parent, name=case.id, case=case, gate=self.session)
            if skip:
                item.add_marker(pytest.mark.skip(reason=skip))
            new.append(item)
        items.extend(new)
        # Report them as collected, so "collected N items" and deselection counts include them.
        self.config.hook.pytest_collectreport(report=pytest.CollectReport(parent.nodeid, "passed", None, new))
        others = self.session.other_shards_tests([i.nodeid for i in items if _users_aotcheck_test(i)])
        if others:  # Your own aotcheck-marked tests are sharded too: each runs in one shard.
            self.config.hook.pytest_deselected(items=[i for i in items if i.nodeid in others])
            items[:] = [i for i in items if i.nodeid not in others]

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return self.session.header()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        # After deselection: start the compile workers the selected cases need. Under xdist each
        # worker starts them as its cases arrive instead (it cannot know which it will get).
        if _measures_here(self.config):
            self.session.prestart([i.case for i in session.items if isinstance(i, AotItem) and not _skipped(i)])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid.startswith(NODE_PREFIX) and "<build>" not in report.nodeid:
            outcome = outcome_of(report)
            if outcome is not None and outcome.case.id not in self.session.outcomes:
                self.session.record(outcome)

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        self.session.interruption.note()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.session.interruption.restore()
        self.session.close()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not hasattr(self.config, "workerinput"):  # The controller finishes; xdist workers do not.
            self.report = self.session.finish()

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self.report is not None and (self.report.outcomes or self.report.stale or self.report.removed
                                        or self.report.notes):
            terminalreporter.write_sep("=", "aotcheck summary")
            terminalreporter.write_line("\n".join(session_summary(self.report, update=self.session.settings.update,
                                                                   accept_args=self.session.accept_args())))


def _measures_here(config: pytest.Config) -> bool:
    """Whether this process will measure cases and knows it now: not under ``--collect-only``, not
    xdist's controller (its workers measure) nor one of its workers (each starts compile workers as
    its cases arrive: it cannot know which it will get)."""
    dist = config.getoption("dist", "no")
    return not hasattr(config, "workerinput") and not config.option.collectonly and dist in ("no", None)


def _users_aotcheck_test(item: pytest.Item) -> bool:
    return item.get_closest_marker("aotcheck") is not None and item.get_closest_marker("aotcheck_case") is None


def _skipped(item: pytest.Item) -> bool:
    return item.get_closest_marker("skip") is not None


def outcome_of(report: pytest.TestReport) -> Outcome | None:
    """The item's outcome from a report: the one it carried, else one made from pytest's verdict
    (a skip, or a failure outside the check); None for a phase that says nothing."""
    for name, value in report.user_properties:
        if name == PROPERTY:
            return Outcome.from_json(json.loads(value))
    case = Case.parse(report.nodeid[len(NODE_PREFIX):])
    if report.skipped:  # The reason as the session words it (pytest prefixes "Skipped: ").
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return Outcome.skip(case, reason.removeprefix("Skipped: "))
    if report.failed and report.when != "teardown":
        return Outcome.internal_error(case, str(report.longrepr))
    return None
