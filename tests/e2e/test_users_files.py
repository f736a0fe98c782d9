"""Nothing a user wrote is lost or overwritten: goldens aotcheck did not write, configs whose goldens would
collide, symbolic links, accept commands that select exactly what they name. Real pytest runs.
"""

import json
import shlex

import pytest
from faults import no_aotcheck_traceback
from toy import CONFTEST, golden, plant_stale, run


@pytest.mark.heavy  # A real run of 7 s (2 cores): the default run's budget keeps one of its kind.
def test_a_full_update_removes_only_goldens_aotcheck_wrote(project):
    run(project, "--aot-topologies=v4-8", "--update-golden").assert_outcomes(passed=2)
    mine = {"OWNERS.json": '{"owners": ["@ml-infra"]}\n', "toy/notes.json": '["why the peak is what it is"]\n',
            "toy/step@v5e-4x1.json": '{"figures": {"peak_bytes": 1}}\n',  # A case's name, not aotcheck's text.
            "toy/hand-made@v4-8x1.json": '{"format": 1, "case": "toy/step@v4-8x1", "figures": {}}\n'}
    for rel, text in mine.items():
        (project.path / "golden" / rel).write_text(text)
    stale = plant_stale(project)  # One aotcheck wrote, for a config that is gone.
    result = run(project, "--aot-topologies=v4-8", "--update-golden")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*removed stale golden gone/step@v4-8x1.json*"])
    assert not stale.exists() and result.stdout.str().count("stale golden") == 1, result.stdout.str()[-2000:]
    assert {rel: (project.path / "golden" / rel).read_text() for rel in mine} == mine
    no_aotcheck_traceback(result.stdout.str())


CASE_TWINS = '''
def fn(name="step"):
    return aotcheck.FunctionConfig(fn=lambda x, w: jnp.tanh(x @ w), make_args=make_args, program=name)

aotcheck.register("Toy2", fn())
aotcheck.register("toy2", fn())
aotcheck.register("twin-programs", lambda: [fn("Decode"), fn("decode")])
aotcheck.register("nothing", lambda: [])
aotcheck.register("no-methods", aotcheck.InferenceConfig(
    init_fn=lambda rng: {}, partition_rules=(), methods={}, input_batch_spec={}))
aotcheck.register("bad-program", fn("my step"))
aotcheck.register("slashed", fn("a/b"))
'''


def test_configs_that_cannot_have_a_golden_of_their_own_fail_to_build(project):
    project.makeconftest(CONFTEST + CASE_TWINS)
    result = run(project, "--aot-topologies=v4-8", "--update-golden")
    result.assert_outcomes(passed=2, failed=7)
    out = result.stdout.str()
    for words in [
        "Configs 'Toy2', 'toy2' differ only in letter case: their golden files would be one file on macOS and Windows",
        "Config 'twin-programs' defines programs 'Decode' and 'decode', which differ only in letter case",
        "Config 'nothing' built no config (its builder returned an empty list)",
        "Config 'no-methods' defines no program (an InferenceConfig with methods={})",
        "Config 'bad-program': Program name 'my step' must be non-empty, without '/', '@', '[', ']' or spaces.",
        "Config 'slashed': Program name 'a/b' must be non-empty",
    ]:
        assert words in out, (words, out[-3000:])
    assert out.count("Configs 'Toy2', 'toy2' differ only in letter case") >= 2  # Both fail: neither is the real one.
    assert sorted(p.name for p in (project.path / "golden").iterdir()) == ["toy"]
    no_aotcheck_traceback(out)


@pytest.mark.heavy  # A real run of 7 s (2 cores): the default run's budget keeps one of its kind.
def test_the_accept_command_selects_a_config_named_with_glob_characters(project):
    project.makeconftest(CONFTEST + '\naotcheck.register("toy[v2]", aotcheck.FunctionConfig(fn=lambda x, w: x @ w, '
                         'make_args=make_args))\n')
    result = run(project, "--aot-topologies=v4-8")
    result.assert_outcomes(passed=1, failed=2)
    line = next(line for line in result.stdout.lines if line.startswith("To create it: ") and "toy[v2]" in line)
    command = shlex.split(line.split(": ", 1)[1])
    assert command[:2] == ["pytest", "--update-golden"] and "--aot-case=toy[v2]/step@v4-8x1" in command, line
    accepted = run(project, *command[1:])
    accepted.assert_outcomes(passed=1, deselected=1)  # toy[v2]'s case alone: not toy's, nor the project's own test.
    assert golden(project, "toy[v2]/step@v4-8x1.json").exists() and not golden(project).exists()


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_a_golden_that_is_a_symbolic_link_is_written_through(project, tmp_path_factory, edit_toy):
    # A golden kept elsewhere (a shared checkout) and linked in: an update writes its target, the link stays.
    elsewhere = tmp_path_factory.mktemp("shared") / "toy-step-v4-8.json"
    run(project, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden").assert_outcomes(passed=2)
    golden(project).rename(elsewhere)
    golden(project).symlink_to(elsewhere)
    run(project, "--aot-topologies=v4-8", "--aot-configs=toy").assert_outcomes(passed=2)  # Read through it.
    before = json.loads(elsewhere.read_text())["figures"]["peak_bytes"]
    edit_toy(width=512)
    result = run(project, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden")
    result.assert_outcomes(passed=2)
    assert golden(project).is_symlink() and golden(project).resolve() == elsewhere.resolve()
    assert json.loads(elsewhere.read_text())["figures"]["peak_bytes"] > before
    no_aotcheck_traceback(result.stdout.str())
