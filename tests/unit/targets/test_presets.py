"""targets/presets.py's pure logic: the table by libtpu, the header's refusals, a presets file's checks.

The probe itself compiles (libtpu): tests/unit/programs/test_compile.py holds it against the table, and
tests/e2e/test_hardening_process.py runs a stale or edited presets file through real compiles.
"""

import json

from aotcheck.targets import presets


def test_the_table_answers_for_the_libtpus_it_knows_and_none_for_others():
    assert presets.known_refusal("v5e", "0.0.50.1") == frozenset()
    assert presets.known_refusal("v4", "0.0.50.1") and presets.known_refusal("v4", "0.0.42.1") == frozenset()
    assert presets.known_refusal("v4", "0.0.99") is None and presets.known_refusal("h100", "0.0.50.1") is None


def test_refusals_group_families_and_leave_other_platforms_out():
    refused, unknown = presets.refusals(["v4", "v6e", "v5e", "h100", "cpu"], "0.0.50.1")
    assert refused == {presets.KNOWN_REFUSALS["0.0.50.1"]["v4"]: ["v4", "v6e"]} and unknown == []
    assert presets.refusals(["v4", "h100"], "0.0.99") == ({}, ["v4"])


def test_a_presets_file_is_trusted_only_as_written(tmp_path):
    path = presets.presets_file(tmp_path, "v4-8", 1)
    assert presets.read_presets_file(path, "v4-8") == (None, None)  # None yet.
    presets._write_presets_file(path, presets.parse_topology("v4-8"), 1, [])
    assert presets.read_presets_file(path, "v4-8") == (frozenset(), None)
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "refused": sorted(presets.preset_options("v4-8"))[:1]}))
    assert presets.read_presets_file(path, "v4-8")[1] == "it was changed since aotcheck wrote it (its check does not match)"
    path.write_text(json.dumps({**document, "refused": ["xla_no_such_option"]}))
    assert "no preset of aotcheck's for v4" in presets.read_presets_file(path, "v4-8")[1]
