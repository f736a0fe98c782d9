"""The seed API against XLA's real TPU compiler (tiny programs, seconds each)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.programs.compile import CompileError
from aotcheck.programs.lowering import LoweringError
from aotcheck.targets import presets
from aotcheck.programs.options import OptionsError, parse_libtpu_init_args, resolve_compiler_options
from aotcheck.models import lm
from aotcheck._runtime import toolchain
from aotcheck.targets.devices import get_devices_for_topology
from aotcheck.targets.topology import Target


@pytest.fixture(scope="module")
def v4_train():
    return aotcheck.compile_trainer_programs(lm.trainer_config(lm.TINY), topology="v4-8")


def test_trainer_returns_train_step_with_donated_sharded_state(v4_train):
    assert list(v4_train) == ["train_step", "eval_step"]
    # The eval step keeps the parameters (nothing donated) and takes them as the train state holds them.
    evaluated = v4_train["eval_step"]
    assert aotcheck.program_figures(evaluated)["alias_bytes"] == 0
    assert evaluated.input_shardings[0][0]["layers"]["attn"]["wq"].spec == P(None, "data", "model")
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


FAMILIES = [("v4-8", 1), ("v5p-8", 2), ("v5e-4", 1), ("v6e-4", 2), ("7x-8", 1)]


@pytest.mark.parametrize("topology,slices", FAMILIES)
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


@pytest.mark.parametrize("topology,slices", FAMILIES)
def test_the_preset_table_agrees_with_a_probe_of_this_libtpu(topology, slices):
    # KNOWN_REFUSALS says, per libtpu, which presets a chip refuses; a probe asks the running libtpu.
    family = Target.of(topology, slices).topology.family
    known = presets.known_refusal(family)
    assert known is not None, f"libtpu {toolchain()['libtpu']} (the lock's) is not in KNOWN_REFUSALS"
    assert presets.probe_refused_presets(topology, slices) == known


def test_an_unknown_libtpu_is_probed_once_and_remembered(monkeypatch, tmp_path):
    expected = presets.known_refusal("v4")
    monkeypatch.setattr(presets, "KNOWN_REFUSALS", {})
    monkeypatch.setattr(presets, "_probed", {})
    monkeypatch.setattr(presets, "_notes", [])
    first = presets.refused_presets("v4-8", 1, store=tmp_path)
    assert first == (expected, "probe")
    [remembered] = (tmp_path / "presets").iterdir()
    assert remembered.name.startswith(f"libtpu-{toolchain()['libtpu']}-v4-one-")  # + a digest of the presets.
    monkeypatch.setattr(presets, "_probed", {})  # A new process: a file that refuses none answers, no compile;
    # one that refuses some is confirmed by a probe (an edited refusal would change the options sent).
    assert presets.refused_presets("v4-8", 1, store=tmp_path) == (expected, "probe" if expected else "remembered")
    options = resolve_compiler_options("v4-8", 1, store=tmp_path)
    assert not set(options) & expected and options["xla_tpu_enable_latency_hiding_scheduler"] == "true"
    assert bool(presets.probe_notes()) == bool(expected)


def test_a_refused_preset_is_not_sent_but_a_users_refused_option_is_an_error():
    refused = presets.known_refusal("v4")
    if not refused:
        pytest.skip(f"libtpu {toolchain()['libtpu']} refuses no preset on v4")
    assert not set(resolve_compiler_options("v4-8", 1)) & refused  # Not sent: the compile works.
    aotcheck.compile_trainer_programs(lm.trainer_config(lm.TINY), topology="v4-8")
    theirs = {name: True for name in refused}
    with pytest.raises(CompileError, match=r"refuses compiler option 'xla_tpu_enable_async_collective_fusion"
                                           r".*Remove it from the config's compiler_options or your launch flags"):
        aotcheck.compile_trainer_programs(lm.trainer_config(lm.TINY), topology="v4-8", compiler_options=theirs)


def test_launch_flags_as_libtpu_reads_them_and_presets_off():
    flags = parse_libtpu_init_args("--xla_tpu_enable_latency_hiding_scheduler=false  --xla_enable_async_all_gather\n"
                                   "--noxla_tpu_spmd_rng_bit_generator_unsafe --megascale_port=8080 "
                                   "--xla_tpu_scoped_vmem_limit_kib=98304")
    assert flags == {"xla_tpu_enable_latency_hiding_scheduler": "false", "xla_enable_async_all_gather": "true",
                     "xla_tpu_spmd_rng_bit_generator_unsafe": "false", "megascale_port": "8080",
                     "xla_tpu_scoped_vmem_limit_kib": "98304"}
    sent = resolve_compiler_options("v5e-4", 1, flags, presets=False)
    assert sent == {k: v for k, v in flags.items() if k != "megascale_port"}  # Runtime-only: dropped.
    config = lm.trainer_config(lm.TINY)
    config = dataclasses.replace(config, libtpu_init_args="--xla_tpu_scoped_vmem_limit_kib=65536",
                                 compiler_options={"xla_enable_async_all_gather": False})
    assert config.options == {"xla_tpu_scoped_vmem_limit_kib": "65536", "xla_enable_async_all_gather": False}


@pytest.mark.parametrize("text,message", [
    ("xla_foo=1", "'xla_foo=1' is not a flag; write it as libtpu reads flags, --xla_foo=1"),
    ("--xla_a=1 -xla_b=2", "'-xla_b=2' is not a flag; write it as libtpu reads flags, --xla_b=2"),
    ("--=3", "'--=3' is not a flag; each flag is --name=value"),
    ('--xla_a="1"', "keeps its quotes; libtpu does not remove quotes, so give the value without them (--xla_a=1)"),
])
def test_bad_launch_flags_name_the_token(text, message):
    with pytest.raises(OptionsError, match=re.escape(message)):
        parse_libtpu_init_args(text)
    with pytest.raises(OptionsError, match="libtpu_init_args: "):  # A config's bad flags fail when it is built.
        dataclasses.replace(lm.trainer_config(lm.TINY), libtpu_init_args=text)


def test_a_libtpu_loaded_from_elsewhere_is_named_in_the_toolchain(tmp_path):
    # jax loads the libtpu.so TPU_LIBRARY_PATH names (a parent's jax sets it to the one it loaded):
    # goldens must not then claim the libtpu package's version.
    import os
    import subprocess
    import sys

    code = "from aotcheck._runtime import toolchain; print(toolchain()['libtpu'])"
    other = str(tmp_path / "libtpu.so")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TPU_LIBRARY_PATH": other})
    assert out.stdout.strip() == f"{other} (TPU_LIBRARY_PATH; the libtpu package here is {toolchain()['libtpu']})"
    assert presets.known_refusal("v4", out.stdout.strip()) is None  # Then its presets are probed, not assumed.
