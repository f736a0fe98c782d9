"""`aotcheck calibrate`: on this CPU host it exits 2 naming the TPU it needs; end to end against a
stand-in runtime (tests/chip_standin.py: a FAKE chip with a v5e's rules) over real deviceless v5e-1
compiles: every record written, whole, and agreeing with the model."""

import contextlib
import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from aotcheck import FunctionConfig, Registry
from aotcheck.calibrate import calibrate
from aotcheck.gate.calibration import agreements, read_records
from aotcheck.models import serve
from aotcheck.pipeline.measure import measure
from aotcheck.programs.knob import Knob
from aotcheck.programs.serving import Limits
from aotcheck.settings import GateSettings
from aotcheck.targets.mesh import MeshSpec
from chip_standin import StandInChip

GiB = 2**30


def test_on_a_host_with_no_tpu_it_exits_2_naming_the_tpu_and_prints_nothing_of_libtpus(tmp_path):
    run = subprocess.run([sys.executable, "-m", "aotcheck", "calibrate"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith("aotcheck: error: aotcheck calibrate runs on a host with a TPU")
    assert len(run.stderr.splitlines()) == 1 and "TPU_WORKER_HOSTNAMES" not in run.stderr


def wide(batch):
    """A batch of rows of 2**20 floats, squared and summed: 4 MiB a row, in and out."""
    x = jax.ShapeDtypeStruct((batch, 2**20), jnp.float32)
    return FunctionConfig(fn=lambda x: jnp.tanh(x) * x, make_args=lambda mesh: (jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),),),
        mesh=MeshSpec(("data",)), program="square", fit="batch", knobs={"batch": Knob(batch, wide, step=1)})


@pytest.mark.heavy
def test_calibrate_holds_each_case_and_a_server_against_the_chip_and_the_model_agrees(tmp_path):
    registry = Registry()
    registry.register("wide", lambda: wide(64))
    small = dataclasses.replace(serve.TINY, limits=Limits(max_num_seqs=8, max_num_batched_tokens=16, max_model_len=256))
    registry.register("srv", lambda: serve.serving_config(small))
    settings = GateSettings.parse(rootdir=tmp_path, topologies="v5e-1", slices="1", cache_dir=None, front_end="cli")
    chip = StandInChip(limit=GiB)
    records = calibrate(settings, registry, runtime=chip, out=tmp_path / "calibration", on_chip=contextlib.nullcontext,
                        measure=lambda case: measure(case, registry=registry))
    assert sorted(read_records(tmp_path / "calibration"), key=lambda r: r.case) == sorted(records, key=lambda r: r.case)
    by_case = {r.case: r for r in records}
    assert set(by_case) == {"wide/square@v5e-1x1", "srv/step[tokens=16]@v5e-1x1",
                            "srv/sample[tokens=16,seqs=8]@v5e-1x1", "srv/*@v5e-1x1"}
    for record in records:
        assert record.source == "aotcheck calibrate" and record.bytes_limit == GiB
        assert record.figures_equal is (None if record.boot else True)  # One compile, on the "chip", as deviceless.
        assert all(a.agrees for a in agreements(record)), (record.case, agreements(record))
    step = by_case["wide/square@v5e-1x1"].step
    assert step["code_bytes"] > 0 and step["reserved_bytes"] >= 0 and step["footprint_bytes"] >= 2 * 64 * 4 * 2**20
    fit = by_case["wide/square@v5e-1x1"].fit
    # The compiler's limit (15.75 GiB) decides the fit, not the stand-in's 1 GiB: its runtime refuses above.
    assert fit["answer"] > 64 and fit["above"]["refused"] in ("compile", "run")
    boot = by_case["srv/*@v5e-1x1"].boot
    started, failed = boot["trials"]
    assert started["started"] and not failed["started"] and failed["pages"] > started["pages"]
    assert failed["error"]["program"] and failed["at"] in ("step[tokens=16]", "sample[tokens=16,seqs=8]")
    assert boot["largest_started"] == started["pages"] and boot["programs"] == ["step", "sample"]
