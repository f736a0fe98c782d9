"""A run's records (aotcheck.gate.run): its header and an interruption, worded only by render/.

FAKE: records made by hand (no compile): what is tested is that they carry what the words need.
"""

from pathlib import Path

from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.gate.run import Interrupted, RunHeader
from aotcheck.pipeline.cache import CacheSpec
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.render.summary import header_lines, session_summary


def test_an_interruption_crosses_the_report_and_is_worded_in_the_summary():
    stop = Interrupted("SIGTERM", done=1, planned=4, update=True)
    report = Report([Outcome(Case.of("lm", "prefill", "v4-8"), Verdict.PASS)], interrupted=stop)
    assert Report.from_json(report.to_json()).interrupted == stop
    lines = session_summary(report, update=True)
    assert "aotcheck: interrupted (SIGTERM) after 1 of 4 cases: the finished ones are reported and their goldens " \
           "written; the rest did not run, and no stale golden was removed." in lines


def test_a_header_says_each_thing_its_record_holds_in_the_front_ends_spelling():
    header = RunHeader(targets=("v5e-16x1",), golden_dir="/p/golden", update=False,
                       launch_flags={"xla_x": "1"}, families=None, fit="batch", golden_dir_missing=True,
                       rootdir="/p", front_end="cli", unused_environment_flags="--xla_y=2")
    text = "\n".join(header_lines(header))
    assert "your launch flags: --xla_x=1; aotcheck's presets off (aot_default_options = none)" in text
    assert "fit search of 'batch'" in text and "gated as fit_max_batch" in text
    assert "pass --golden-dir=PATH, or create them with --update-golden" in text  # The CLI's flags.
    assert "LIBTPU_INIT_ARGS (--xla_y=2) is not used: --libtpu-init-args (or aot_libtpu_init_args)" in text
    quiet = header_lines(RunHeader(targets=("cpu-4x1",), golden_dir="g", update=True, cache=CacheSpec(Path("c"), read=False)))
    assert len(quiet) == 1 and "(updating)" in quiet[0] and "figures cache c (written, not read" in quiet[0]


def test_a_header_names_the_shared_cache_and_whether_the_run_writes_to_it():
    shared = header_lines(RunHeader(targets=("v5e-16x1",), golden_dir="g", update=False,
                                    cache=CacheSpec(Path("c"), url="s3://b/aot", shares=False)))[0]
    assert "figures cache c, shared through s3://b/aot (read only);" in shared
    writes = header_lines(RunHeader(targets=("v5e-16x1",), golden_dir="g", update=False,
                                    cache=CacheSpec(Path("c"), url="gs://b/aot", shares=True)))[0]
    assert "shared through gs://b/aot;" in writes
