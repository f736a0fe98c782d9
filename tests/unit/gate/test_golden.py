"""aotcheck.gate.golden, as Hypothesis properties: a golden written and read back is the same, in
stable bytes, whole or not at all; a corrupt one names its file."""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from aotcheck.gate.golden import GoldenError, GoldenStore, dumps, golden_document, parse_document
from aotcheck.gate.verdict import GoldenAction
from aotcheck.pipeline.case import Case
from aotcheck.targets.topology import MAX_DEVICES, parse_topology, topology_names

values = st.integers(0, 2**50)
names = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_."), min_size=1, max_size=12)
targets = st.sampled_from(topology_names() + ["cpu-8"]).flatmap(
    lambda name: st.tuples(st.just(name), st.integers(1, min(64, MAX_DEVICES // parse_topology(name).num_devices))))
cases = st.builds(lambda config, program, target: Case.of(config, program, *target), names, names, targets)


@given(cases, st.dictionaries(st.text(min_size=1, max_size=20), st.one_of(values, st.floats(0, 1e30))),
       st.dictionaries(st.text(max_size=10), st.text(max_size=10)))
def test_golden_round_trip(case, figures, options):
    with tempfile.TemporaryDirectory() as root:
        store = GoldenStore(root)
        toolchain = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
        assert store.write(case, figures, toolchain=toolchain, compiler_options=options) is GoldenAction.CREATED
        golden = store.read(case)
        assert golden.figures == pytest.approx(figures) and golden.compiler_options == options
        assert store.write(case, figures, toolchain=toolchain, compiler_options=options) is GoldenAction.UNCHANGED
        text = store.path(case).read_text()
        assert text == dumps(json.loads(text))  # Sorted keys, stable bytes.
        assert list(Path(root).rglob("*.tmp")) == []  # No temporary left behind.


def test_corrupt_documents_name_their_file():
    path = Path("golden/x/y@v4-8x1.json")
    for text in ("[]", "{", '{"figures": [], "toolchain": {}, "compiler_options": {}}'):
        with pytest.raises(GoldenError, match=str(path)):
            parse_document(text, path)
    doc = golden_document(Case.of("a", "b", "v4-8", 1), {"flops": 2.0**40}, toolchain={}, compiler_options={})
    assert doc["figures"]["flops"] == 2**40 and isinstance(doc["figures"]["flops"], int)


@given(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1", "-0.5"]),
       st.sampled_from(["peak_bytes", "flops", "compile_cpu_seconds"]))
def test_a_golden_figure_that_is_not_finite_or_is_negative_is_a_corrupt_golden(text, name):
    # json reads NaN, Infinity and 1e400 (inf) as floats: NaN compares false with everything, so it would
    # pass every comparison and gate nothing.
    document = '{"figures": {"%s": %s, "argument_bytes": 1}, "toolchain": {}, "compiler_options": {}}' % (name, text)
    with pytest.raises(GoldenError, match=f"figure '{name}' is .*figures are finite and never negative"):
        parse_document(document, Path("g.json"))


def test_a_golden_path_that_is_no_golden_file_is_said_as_what_it_is(tmp_path):
    """Hardening round 5, V77-V82: a directory, a symlink loop, a golden dir that is a file or a dangling link
    were told to fix their permissions, or said not to exist."""
    import pytest

    from aotcheck.gate.golden import GoldenError, GoldenStore
    from aotcheck.pipeline.case import Case
    from aotcheck.session import golden_dir_state

    store, case = GoldenStore(tmp_path / "golden"), Case.of("lm", "prefill", "v4-8")
    store.path(case).mkdir(parents=True)
    with pytest.raises(GoldenError, match="is a directory, not a golden file: remove it"):
        store.read(case)
    store.path(case).rmdir()
    store.path(case).symlink_to(store.path(case))
    with pytest.raises(GoldenError, match="is a symbolic link that loops"):
        store.read(case)
    assert golden_dir_state(tmp_path / "golden") is None and golden_dir_state(tmp_path / "nowhere") == "absent"
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert golden_dir_state(tmp_path / "file") == "a file" and golden_dir_state(tmp_path / "dangling") == "a dangling link"
    for root, what in (("file", "a file, not a directory"), ("dangling", "a symbolic link whose target does not exist")):
        with pytest.raises(GoldenError, match=f"is {what}; --update-golden writes goldens into a directory there"):
            GoldenStore(tmp_path / root).check_writable()
