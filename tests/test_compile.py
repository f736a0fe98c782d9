"""The seed API against XLA's real TPU compiler (tiny programs, seconds each)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.programs.compile import CompileError
from aotcheck.programs.lowering import LoweringError
from aotcheck.programs.options import resolve_compiler_options
from aotcheck.models import lm
from aotcheck.targets.topology import get_devices_for_topology


@pytest.fixture(scope="module")
def v4_train():
    return aotcheck.compile_trainer_programs(lm.trainer_config(lm.TINY), topology="v4-8")


def test_trainer_returns_train_step_with_donated_sharded_state(v4_train):
    assert list(v4_train) == ["train_step"]
    compiled = v4_train["train_step"]
    assert isinstance(compiled, jax.stages.Compiled)
    figures = aotcheck.program_figures(compiled)
    # The state is donated: its buffers alias the outputs.
    assert figures["alias_bytes"] > 0.9 * figures["argument_bytes"] - 64 * 1024
    state_shardings, batch_shardings = compiled.input_shardings[0]
    wq = state_shardings["params"]["layers"]["attn"]["wq"]
    assert wq.spec == P(None, "data", "model")
    assert state_shardings["opt_state"][1][0].mu["layers"]["attn"]["wq"].spec == P(None, "data", "model")
    assert batch_shardings["tokens"].spec == P("data")


def test_trainer_multi_slice():
    compiled = aotcheck.compile_trainer_programs(
        lm.trainer_config(lm.TINY), topology="v5e-16", topology_num_slices=2
    )["train_step"]
    shardings = compiled.input_shardings[0][0]["params"]["embed"]
    assert shardings.mesh.devices.shape == (16, 2)


def test_inference_is_keyed_by_the_method_compiled():
    cfg = lm.inference_config(lm.TINY)
    out = aotcheck.compile_inference_programs(cfg, input_batch_spec=None, topology="v4-8")
    assert list(out) == ["sample_decode"]
    out = aotcheck.compile_inference_programs(cfg, input_batch_spec=None, topology="v4-8", method="prefill")
    assert list(out) == ["prefill"]
    with pytest.raises(LoweringError, match="'generate' is not defined.*prefill, sample_decode"):
        aotcheck.compile_inference_programs(cfg, input_batch_spec=None, topology="v4-8", method="generate")


def test_input_batch_spec_overrides_the_config():
    cfg = lm.inference_config(lm.TINY)
    small = {"prompt": jax.ShapeDtypeStruct((8, 16), jnp.int32)}
    big = {"prompt": jax.ShapeDtypeStruct((64, 16), jnp.int32)}
    a = aotcheck.compile_inference_programs(cfg, input_batch_spec=small, topology="v4-8", method="prefill")
    b = aotcheck.compile_inference_programs(cfg, input_batch_spec=big, topology="v4-8", method="prefill")
    assert aotcheck.program_figures(b["prefill"])["flops_xla"] > 4 * aotcheck.program_figures(a["prefill"])["flops_xla"]


def test_batch_that_does_not_divide_the_data_axis():
    odd = jax.ShapeDtypeStruct((5, 8), jnp.int32)
    cfg = dataclasses.replace(lm.trainer_config(lm.TINY), batch_spec={"tokens": odd, "targets": odd})
    with pytest.raises(aotcheck.PartitionError, match=r"batch/tokens \(shape \(5, 8\)"):
        aotcheck.compile_trainer_programs(cfg, topology="v4-8")


def test_compile_function_escape_hatch():
    devices, _ = get_devices_for_topology("v6e-4")
    mesh = jax.sharding.Mesh(np.array(devices).reshape(4), ("d",))
    x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P("d")))
    compiled = aotcheck.compile_function(lambda a: a @ a.T, x, topology="v6e-4")
    # A sharded matmul: exactly 2·n³ FLOPs split over 4 devices.
    assert aotcheck.program_figures(compiled)["flops_xla"] == 2 * 512**3 / 4


@pytest.mark.parametrize("topology,slices", [("v4-8", 1), ("v5p-8", 2), ("v5e-4", 1), ("v6e-4", 2), ("7x-8", 1)])
def test_default_options_are_accepted_by_each_family(topology, slices):
    options = resolve_compiler_options(topology, slices)
    assert options["xla_tpu_enable_latency_hiding_scheduler"] == "true"
    devices, _ = get_devices_for_topology(topology, slices)
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    x = jax.ShapeDtypeStruct((len(devices) * 8, 128), jnp.float32, sharding=NamedSharding(mesh, P("d")))
    aotcheck.compile_function(lambda a: a.sum(), x, topology=topology, topology_num_slices=slices)


def test_option_layers_merge_strip_and_remove():
    options = resolve_compiler_options(
        "v5e-16", 2,
        {"xla_tpu_enable_latency_hiding_scheduler": False, "megascale_grpc_premap_memory_bytes": 1 << 34},
        {"--xla_tpu_overlap_compute_collective_tc": None, "xla_dump_to": "/tmp/x"},
    )
    assert options["xla_tpu_enable_latency_hiding_scheduler"] == "false"
    assert "megascale_grpc_premap_memory_bytes" not in options and "xla_dump_to" not in options
    assert "xla_tpu_overlap_compute_collective_tc" not in options
    assert options["xla_tpu_enable_data_parallel_all_reduce_opt"] == "true"  # multi-slice default
    assert resolve_compiler_options("cpu-4", 1) == {}


def test_rejected_option_is_named():
    with pytest.raises(CompileError, match="'xla_no_such_flag'.*Remove it"):
        aotcheck.compile_trainer_programs(
            lm.trainer_config(lm.TINY), topology="v4-8", compiler_options={"xla_no_such_flag": True}
        )


def test_cpu_topology_needs_no_libtpu():
    out = aotcheck.compile_trainer_programs(lm.trainer_config(lm.TINY), topology="cpu-4")
    assert aotcheck.program_figures(out["train_step"])["flops_xla"] > 0
