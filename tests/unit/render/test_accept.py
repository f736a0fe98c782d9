"""Accept commands worded (aotcheck.render.accept): each runs as a shell splits it and selects what it names.

FAKE: records made by hand (no compile); tests/e2e/test_server.py runs a printed command for real.
"""

import shlex

from hypothesis import given, strategies as st

from aotcheck.gate.outcome import Accept
from aotcheck.pipeline.case import Case
from aotcheck.programs.names import Bucket
from aotcheck.render.accept import accept_all_command, accept_case_command, glob_quote

AXES = st.dictionaries(st.sampled_from(["tokens", "seqs"]), st.integers(1, 4096), min_size=1)
ARGS = st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12), max_size=3)


@given(AXES, ARGS)
def test_a_cases_command_splits_back_to_its_id_and_its_runs_options(axes, args):
    case = Case("llm", "step", Case.of("llm", "step", "v5e-16").target, Bucket(axes))
    words = shlex.split(accept_case_command(Accept(case, tuple(args))))
    assert words == ["pytest", "--update-golden", f"--aot-case={case.id}", *args]
    assert Case.parse(words[2].split("=", 1)[1]) == case  # The bucket comes back as a value.


def test_a_set_of_cases_is_selected_by_configs_and_targets_each_quoted_as_a_glob():
    command = accept_all_command([Case.of("lm[v2]", "prefill", "v4-8"), Case.of("toy", "step", "v5e-16", 2)])
    assert shlex.split(command) == ["pytest", "--update-golden", "--aot-configs=lm[[]v2],toy",
                                    "--aot-topologies=v4-8x1,v5e-16x2"]
    assert glob_quote("a*b?[c") == "a[*]b[?][[]c"
