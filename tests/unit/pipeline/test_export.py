"""Exported executables: the manifest's JSON form, what a process that differs is told, and what the chip
said of exports built on this host (committed data, checked here: CI has no chip)."""

import json
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, strategies as st

from aotcheck.pipeline.case import Case
from aotcheck.pipeline.export import (ExportError, ExportMismatch, Manifest, discard, export_compiled, load,
                                      mismatches, publish, read_manifests, write_exported)

CHIP = Path(__file__).resolve().parents[3] / "calibration" / "exports" / "v5e-1.json"


def exported_double(tmp_path):
    case = Case.of("double", "step", f"cpu-{len(jax.devices('cpu'))}")
    compiled = jax.jit(lambda x: x * 2, donate_argnums=0).lower(jax.ShapeDtypeStruct((4,), jnp.float32)).compile()
    return case, export_compiled(case, compiled, compiler_options={"xla_a": "1"}, figures={"flops": 4.0},
                                 launch_flags={})


def test_a_manifest_round_trips_and_names_the_donated_argument(tmp_path):
    case, exported = exported_double(tmp_path)
    manifest = exported.manifest
    assert Manifest.from_json(json.loads(json.dumps(manifest.to_json()))) == manifest
    assert manifest.inputs[0].donated and manifest.inputs[0].shape == (4,) and manifest.outputs[0].dtype == "float32"
    assert manifest.payload_bytes == len(exported.payload)


def test_a_staged_export_ships_with_its_golden_or_is_discarded(tmp_path):
    case, exported = exported_double(tmp_path)
    write_exported(tmp_path / "staging", exported)
    where, size = publish(tmp_path / "staging", tmp_path / "out", case.id, golden_digest="abc")
    assert size == len(exported.payload) and where.endswith(f"{case.id}.manifest.json") and not list((tmp_path / "staging").rglob("*.json"))
    [shipped] = read_manifests(tmp_path / "out")
    assert shipped.golden_digest == "abc" and load(tmp_path / "out", case.id)(jnp.ones(4)).tolist() == [2.0] * 4
    write_exported(tmp_path / "staging", exported)
    discard(tmp_path / "staging", case.id)
    assert not list((tmp_path / "staging").rglob("*.executable"))
    with pytest.raises(ExportError, match="does not exist: export the case first"):
        load(tmp_path / "staging", case.id)
    with pytest.raises(ExportError, match="is no directory of exports: export the cases first"):
        read_manifests(tmp_path / "nowhere")


def test_a_store_url_is_written_and_read_and_credentials_are_refused_unechoed(tmp_path):
    case, exported = exported_double(tmp_path)
    url = f"file://{tmp_path / 'store'}"
    assert write_exported(url, exported) == case.id
    assert [m.case for m in read_manifests(url)] == [case] and load(url, case.id)(jnp.ones(4)).tolist() == [2.0] * 4
    with pytest.raises(Exception, match="credentials") as refused:
        write_exported("s3://KEY:hunter2@bucket/aot", exported)
    assert "hunter2" not in str(refused.value)


def test_an_export_setting_that_is_a_file_or_holds_credentials_is_a_clear_error(tmp_path):
    from aotcheck.readers import SettingsError
    from aotcheck.settings import GateSettings

    (tmp_path / "out.txt").write_text("mine")
    with pytest.raises(SettingsError, match="--aot-export: out.txt is a file; give a directory"):
        GateSettings.parse(rootdir=tmp_path, topologies="cpu-4", export="out.txt")
    with pytest.raises(SettingsError, match="--aot-export: .*credentials") as refused:
        GateSettings.parse(rootdir=tmp_path, topologies="cpu-4", export="s3://KEY:hunter2@bucket/x")
    assert "hunter2" not in str(refused.value) and (tmp_path / "out.txt").read_text() == "mine"


def test_a_payload_that_is_not_the_manifests_is_refused(tmp_path):
    case, exported = exported_double(tmp_path)
    write_exported(tmp_path, exported)
    (tmp_path / f"{case.id}.executable").write_bytes(exported.payload[:-1])
    with pytest.raises(ExportMismatch, match="is not the payload its manifest names"):
        load(tmp_path, case.id)


@given(st.sampled_from(["jax", "jaxlib"]), st.text("0123456789.", min_size=1, max_size=8))
def test_any_toolchain_field_that_differs_is_named_with_both_values(field, version):
    """Property: a manifest whose toolchain differs from this process's in one package is refused for
    exactly that package (FAKE devices: a namespace with a platform, a kind and an id; pure logic)."""
    here = {"jax": "1.0", "jaxlib": "1.0"}
    manifest = SimpleNamespace(format=1, toolchain={**here, field: version}, launch_flags={}, platform="cpu",
                               device_kind="cpu", devices=(0,), topology="cpu-1")
    found = mismatches(manifest, [SimpleNamespace(platform="cpu", device_kind="cpu", id=0)], launch_flags={},
                       toolchain=here)
    assert [(m.field, m.exported, m.here) for m in found] == ([] if version == "1.0" else [(field, version, "1.0")])


def test_launch_flags_devices_and_platform_that_differ_are_refused():
    manifest = SimpleNamespace(format=1, toolchain={}, launch_flags={"xla_x": "1"}, platform="tpu",
                               device_kind="TPU v5 lite", devices=(0, 1), topology="v5e-1")
    chip = [SimpleNamespace(platform="tpu", device_kind="TPU v5 lite", id=0)]
    assert [m.field for m in mismatches(manifest, chip, launch_flags={}, toolchain={})] == ["LIBTPU_INIT_ARGS", "devices"]
    cpu = [SimpleNamespace(platform="cpu", device_kind="cpu", id=0)]
    assert [m.field for m in mismatches(manifest, cpu, launch_flags={"xla_x": "1"}, toolchain={})] == ["platform"]


def test_what_the_chip_said_of_exports_built_on_this_host():
    """Committed from a real v5e chip (issue 53): exports built here under requirements-oldest.lock loaded there
    with no compile, in under a second each, equal to the chip's own JIT bit for bit, and faster than compiling."""
    chip = json.loads(CHIP.read_text())
    checks = chip["checks"]
    assert len(checks) == 10 and all(c["equal"] for c in checks)
    assert all(c["load_seconds"] < 1.0 and c["load_seconds"] < c["compile_seconds"] / 5 for c in checks)
    assert chip["load_order"]["backend_compiles"] == 0 and len(chip["load_order"]["seconds"]) == 10
    assert chip["toolchain"] == {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
