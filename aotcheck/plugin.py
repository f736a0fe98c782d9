"""The pytest plugin: a front end of a few lines per hook over :class:`aotcheck.session.GateSession`.

Options and ini values become :class:`~aotcheck.settings.GateSettings`; each
planned case becomes one test item; each item's :class:`~aotcheck.gate.outcome.Outcome`
travels as JSON in the report's ``user_properties`` (so pytest-xdist carries it
to the controller and JUnit XML records it); the controller's session finishes
the run (stale goldens, the JSON report) and the summary is rendered by
:mod:`aotcheck.render.summary`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from typing import Any

import pytest

from aotcheck.errors import AotcheckError
from aotcheck.ini import read_ini
from aotcheck.pipeline.case import Case
from aotcheck.programs.loader import note_loaded
from aotcheck.programs.registry import registrations
from aotcheck.records import Record
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.render.summary import header_lines, session_summary
from aotcheck.render.text import outcome_message
from aotcheck.session import GateSession
from aotcheck.units import clip_runs
from aotcheck.settings import (BY_NAME, GateSettings, Setting, SettingsError, add_pytest_options, read_settings,
                               split_list)
from aotcheck.usage import check_ini_keys, invocation_problem

NODE_PREFIX = "aotcheck::"
PROPERTY = "aotcheck"
CASE_PROPERTY = "aotcheck.case"  # Each item's case, in its JSON form: what its reports are about, whatever happens.


def pytest_addoption(parser: pytest.Parser) -> None:
    add_pytest_options(parser)


def settings_from_pytest(config: pytest.Config) -> GateSettings:
    """Options over ini values (aotcheck.settings), parsed by the session's own rules."""

    def option(setting: Setting) -> Any:
        return config.getoption(setting.pytest.lstrip("-").replace("-", "_")) if setting.pytest else None

    def ini(setting: Setting) -> Any:
        try:
            return config.getini(setting.ini)
        except ValueError as e:  # A bool pytest cannot read.
            raise SettingsError(f"{setting.ini}: {e}; write true or false") from None

    return GateSettings.parse(rootdir=config.rootpath, **read_settings(option=option, ini=ini), front_end="pytest")


# Options whose value is a path: given after a space, pytest takes an existing path for a
# test path while it decides the rootdir (before plugins add options), which can move
# the rootdir and golden/ with it.
PATH_OPTIONS = ("--aot-golden-dir", "--aot-cache-dir", "--aot-report")


def check_invocation(args: list[str]) -> None:
    """Usage errors for option spellings that mislead pytest (see PATH_OPTIONS; launch flags after a
    space, which pytest reads as an option of its own), turn the gate off by accident (an empty
    ``--aot-topologies=``), or are given twice (the last would win without a word)."""
    problem = invocation_problem(args, front_end="pytest")
    if problem:
        raise pytest.UsageError(problem)
    flag = BY_NAME["libtpu_init_args"].pytest
    for i, arg in enumerate(args):
        if arg == flag:
            value = args[i + 1] if i + 1 < len(args) else None
            raise pytest.UsageError(clip_runs(
                f"{flag} needs its value after '=': {flag}={value or '--xla_...'}" + (
                    f" (given after a space, pytest reads {value!r} as an option of its own; quote the whole "
                    f"value when it holds several flags: '{flag}={value} ...')" if value else "")))
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


_REGISTERED = [registrations()]  # The count when the last plugin was registered.


def pytest_plugin_registered(plugin: object) -> None:
    """A conftest file whose import registered configs: the compile workers import it too (see
    programs/loader.py). pytest registers each conftest right after importing it."""
    file, now = getattr(plugin, "__file__", None), registrations()
    if isinstance(plugin, types.ModuleType) and file and os.path.basename(file) == "conftest.py" \
            and now != _REGISTERED[0]:
        note_loaded(plugin.__name__, file)
    _REGISTERED[0] = now


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # Before pytest's last parse of the command line, which would fail on launch flags after a space
    # with only "unrecognized arguments".
    check_invocation(list(early_config.invocation_params.args))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "aotcheck: an AOT compile case generated by aotcheck, or a test of yours "
                                       "that goes with them (sharded with them under --aot-shard)")
    config.addinivalue_line("markers", "aotcheck_case: an AOT compile case generated by aotcheck (only those)")
    check_invocation(list(config.invocation_params.args))
    # A misspelt aot_* key would switch its check off without a word: in the ini file, or given with -o.
    overrides = [o.partition("=")[0].strip() for o in config.getoption("override_ini") or []]
    try:
        if config.inipath is not None:
            check_ini_keys(read_ini(config.inipath).values, where=config.inipath)
        check_ini_keys(overrides, where="pytest -o")
    except AotcheckError as e:
        raise pytest.UsageError(clip_runs(str(e))) from None
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
        raise pytest.UsageError(clip_runs(str(e))) from None
    if _measures_here(config):
        session.start_workers()
    try:
        session.prepare()
    except SettingsError as e:
        session.close()
        raise pytest.UsageError(clip_runs(str(e))) from None
    session.interruption.install()  # SIGTERM and SIGHUP end the run as Ctrl-C does (summary, report, workers stopped).
    config.pluginmanager.register(AotPlugin(config, session), "aotcheck-session")


class GateOff:
    """Says in the header that the gate was turned off for this run."""

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return ["aotcheck: off for this run (--aot-topologies=none)"]


class AotFailure(Exception):
    """A failed case; its message is the whole explanation (no traceback)."""


@dataclasses.dataclass(frozen=True)
class Carried(Record):
    """What each of an item's reports carries whatever happens to it (a skip, a failure outside the check):
    its case, so that no reader parses it back from the node's id (through pytest-xdist too)."""

    case: Case


class AotCollector(pytest.Collector):
    """Parent of the generated items (they belong to no test file)."""

    def collect(self) -> list[pytest.Item]:
        return []


class AotItem(pytest.Item):
    """One case: the session checks it; the outcome rides on the report."""

    def __init__(self, *, case: Case, gate: GateSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.user_properties.append((CASE_PROPERTY, json.dumps(Carried(case).to_json())))
        self.gate = gate
        self.add_marker("aotcheck")
        self.add_marker("aotcheck_case")

    def runtest(self) -> None:
        outcome = self.gate.check(self.case)
        self.user_properties.append((PROPERTY, json.dumps(outcome.to_json(), sort_keys=True)))
        self.user_properties += [(f"aotcheck.{k}", v) for k, v in sorted((outcome.figures or {}).items())]
        if outcome.failed:
            raise AotFailure(outcome_message(outcome))

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
        for planned in self.plan.cases:
            case, skip = planned.case, planned.skip
            item = AotItem.from_parent(parent, name=case.id, case=case, gate=self.session)
            if skip:
                item.add_marker(pytest.mark.skip(reason=skip))
            new.append(item)
        items.extend(new)
        # Report them as collected, so "collected N items" and deselection counts include them.
        self.config.hook.pytest_collectreport(report=pytest.CollectReport(parent.nodeid, "passed", None, new))
        if self.session.settings.cases:  # --aot-case (an accept command) runs the cases it names, nothing else.
            others = {i.nodeid for i in items if not isinstance(i, (AotItem, AotBuildErrorItem))}
        else:
            others = self.plan.other_shards([i.nodeid for i in items if _users_aotcheck_test(i)])
        if others:  # Your own aotcheck-marked tests are sharded too: each runs in one shard.
            self.config.hook.pytest_deselected(items=[i for i in items if i.nodeid in others])
            items[:] = [i for i in items if i.nodeid not in others]

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return header_lines(self.session.header())

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
            if any(bill.failed for bill in self.report.bills):  # No item holds a bill: the run fails itself.
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            elif self._empty_shard() and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
                session.exitstatus = pytest.ExitCode.OK  # Fewer cases than shards: this one has nothing to check.

    def _empty_shard(self) -> bool:
        return bool(self.plan.shard) and not self.plan.cases and bool(self.plan.matrix)

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self.report is not None and (self.report.outcomes or self.report.stale or self.report.removed
                                        or self.report.notes or self._empty_shard()):
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
    properties = dict(report.user_properties)
    if PROPERTY in properties:
        return Outcome.from_json(json.loads(properties[PROPERTY]))
    case = Carried.from_json(json.loads(properties[CASE_PROPERTY])).case
    if report.skipped:  # The reason as the session words it (pytest prefixes "Skipped: ").
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return Outcome.skip(case, reason.removeprefix("Skipped: "))
    if report.failed and report.when != "teardown":
        return Outcome.internal_error(case, str(report.longrepr))
    return None
