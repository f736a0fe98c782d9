"""targets/platform.py: what each platform says, so nothing past targets/ asks which platform it is."""

import pytest

from aotcheck import _runtime
from aotcheck.programs.options import resolve_compiler_options
from aotcheck.targets.platform import CPU, GPU, HOST_DEVICE, PLATFORMS, TPU, DeviceSpec, platform_named
from aotcheck.targets.topology import parse_topology, topologies


def test_every_topology_has_its_platform_and_its_device():
    assert {t.platform for t in topologies(TPU)} == {TPU} and {t.platform for t in topologies(GPU)} == {GPU}
    assert all(t.device.memory_bytes and t.device.peak_flops and t.device.bandwidth
               for t in topologies())
    tpu, gpu, cpu = parse_topology("v5e-16"), parse_topology("h100-8"), parse_topology("cpu-4")
    assert (tpu.platform, gpu.platform, cpu.platform) == (TPU, GPU, CPU)
    assert tpu.device == DeviceSpec(16 * 2**30, int(15.75 * 2**30), 197e12, 819e9, tpu.device.source,
                                    16_909_336_064, "measured", tpu.device.runtime_limit_source, 16 << 20)
    assert gpu.device.scoped_vmem_bytes is None and cpu.device.scoped_vmem_bytes is None  # No scoped VMEM off TPUs.
    assert gpu.device.memory_limit_bytes == gpu.device.memory_bytes  # XLA's GPU compiler never refuses for size.
    assert cpu.device is HOST_DEVICE and cpu.device.memory_bytes is None and cpu.device.memory_bytes is None


def test_each_platform_records_its_own_compiler():
    assert list(TPU.toolchain()) == ["jax", "jaxlib", "libtpu"]
    assert list(GPU.toolchain()) == ["jax", "jaxlib", _runtime.CUDA_COMPILER]
    assert CPU.toolchain() == TPU.toolchain()  # Host goldens have always recorded libtpu beside jax.


def test_the_other_platforms_flags_are_not_sent():
    flags = {"xla_tpu_scoped_vmem_limit_kib": 98304, "xla_gpu_enable_triton_gemm": False}
    assert resolve_compiler_options("h100-8", 1, flags, presets=False) == {"xla_gpu_enable_triton_gemm": "false"}
    assert resolve_compiler_options("v5e-4", 1, flags, presets=False) == {"xla_tpu_scoped_vmem_limit_kib": "98304"}
    assert CPU.foreign_flag_prefix is None
    assert resolve_compiler_options("cpu-2", 1, flags, presets=False) == {
        "xla_gpu_enable_triton_gemm": "false", "xla_tpu_scoped_vmem_limit_kib": "98304"}


def test_only_libtpu_carries_state_and_wants_presets():
    assert TPU.state_crosses_families and TPU.option_presets and "7x" in TPU.fresh_worker_families
    assert not any(p.state_crosses_families or p.option_presets or p.fresh_worker_families for p in (GPU, CPU))
    assert [p.name for p in PLATFORMS.values() if p.host_devices] == ["cpu"]
    assert GPU.extra == "cuda" and TPU.extra is None  # What `aotcheck init` puts in a GPU matrix's workflow.


def test_a_platform_is_a_frozen_value_named_by_its_json_form():
    assert platform_named("gpu") is GPU and platform_named(GPU) is GPU and str(TPU) == "tpu"
    with pytest.raises(AttributeError):
        TPU.name = "npu"  # type: ignore[misc]
    assert {TPU: 1}[platform_named("tpu")] == 1  # Hashable: platforms key sets and dicts.
    with pytest.raises(Exception, match="Unknown platform 'npu': the platforms are tpu, gpu, cpu"):
        platform_named("npu")


def test_a_copied_or_unpickled_platform_is_the_same_value():
    # Code past targets/ may ask `platform is GPU`: a topology deep-copied or sent through pickle keeps that true.
    import copy
    import pickle

    topology = parse_topology("h100-8")
    assert pickle.loads(pickle.dumps(topology)).platform is GPU and copy.deepcopy(topology).platform is GPU
    assert pickle.loads(pickle.dumps(topology)) == topology
