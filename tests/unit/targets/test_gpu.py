"""NVIDIA GPU targets, compiled on this CPU by XLA's GPU compiler from JAX's CUDA plugin (in the lock).

The table is checked against the device specs the installed plugin embeds (what aotcheck compiles
with); the compiles are real, through the CLI and through pytest.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aotcheck import _runtime
from aotcheck.figures.attribution import PEAK_FIGURES
from aotcheck.targets import gpu
from aotcheck.targets.mesh import MeshSpec, build_mesh
from aotcheck.targets.devices import get_devices_for_topology
from aotcheck.targets.gpu import GPUS
from aotcheck.targets.platform import GPU
from aotcheck.targets.topology import (
    Target,
    TopologyError,
    expand_targets,
    topologies,
    parse_topology,
    split_target,
)

ROOT = Path(__file__).resolve().parents[3]
needs_plugin = pytest.mark.skipif(gpu.plugin_version() is None, reason="JAX's CUDA plugin is not installed")


def spec_value(text: str, field: str) -> int:
    return int(re.search(rf"^  {field}: (\d+)$", text, re.M)[1])


@needs_plugin
@pytest.mark.parametrize("family", sorted(GPUS))
def test_the_table_agrees_with_the_plugins_device_specs(family):
    model = GPUS[family]
    spec = gpu.target_config(model.device_name)
    assert f'device_description_str: "{model.device_name}"' in spec
    assert spec_value(spec, "device_memory_size") == model.hbm_bytes
    assert spec_value(spec, "memory_bandwidth") == model.hbm_bandwidth
    for topology in (t for t in topologies(GPU) if t.hardware is model):
        devices, per_slice = get_devices_for_topology(topology, 2)
        assert per_slice == topology.num_devices and len(devices) == 2 * topology.num_devices
        assert {d.device_kind for d in devices} == {model.device_name}
        hosts = topology.shape[0]  # Each slice is its own host(s): the network is between slices.
        assert [d.process_index for d in devices] == sorted(d.process_index for d in devices)
        assert {d.process_index for d in devices[:per_slice]}.isdisjoint(d.process_index for d in devices[per_slice:])
        assert len({d.process_index for d in devices}) == 2 * hosts


def test_gpu_names_hosts_and_errors():
    h100 = parse_topology("H100-8")
    assert (h100.name, h100.platform.name, h100.num_devices, h100.shape) == ("h100-8", "gpu", 8, (1, 8))
    assert parse_topology("gb200-72").shape == (18, 4)  # An NVL72 rack: one NVLink domain of 18 hosts.
    assert split_target("h100-16") == (h100, 2) and split_target("h100-8x2") == (h100, 2)
    assert [t.name for t in expand_targets(["h100-8", "b200-32"], [1, 2])] == ["h100-8x1", "h100-8x2", "b200-8x4"]
    assert Target.parse("h200-8x2").num_devices == 16
    with pytest.raises(TopologyError, match=r"h100-16 is 2 x h100-8: name it as a target, h100-8x2"):
        parse_topology("h100-16")
    with pytest.raises(TopologyError, match=r"h100 targets are h100-1, h100-2, h100-4, h100-8 .* h100-8xK"):
        parse_topology("h100-12")
    with pytest.raises(TopologyError, match=r"h100-N"):
        parse_topology("h1000-8")
    assert MeshSpec(("data", "model"), (-1, 2), overrides={"h100-*": (-1, 8)}).shape_for("h100-8") == (-1, 8)


@needs_plugin
def test_a_gpu_mesh_lays_the_hosts_along_the_data_axis():
    devices, _ = get_devices_for_topology("h100-8", 2)
    mesh = build_mesh(MeshSpec(("data", "fsdp"), (-1, 8)), "h100-8", devices, num_slices=2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 8}
    assert [{d.process_index for d in row} for row in mesh.devices] == [{0}, {1}]  # fsdp within a host.


def test_a_missing_plugin_is_a_host_error_naming_the_extra(monkeypatch):
    # FAKE install state (pure logic): the plugin reported missing; nothing compiles.
    monkeypatch.setattr(gpu, "plugin_version", lambda: None)
    with pytest.raises(_runtime.HostError, match=r"h100-8: Compiling for NVIDIA GPUs needs .*pip install 'aotcheck\[cuda\]'"):
        get_devices_for_topology("h100-8")


def test_gpu_goldens_record_the_cuda_compiler():
    golden = json.loads((ROOT / "golden" / "lm-tiny" / "train_step@h100-8x1.json").read_text())
    lock = dict(line.split("==") for line in (ROOT / "requirements.lock").read_text().split() if "==" in line)
    assert golden["toolchain"] == {"jax": lock["jax"], "jaxlib": lock["jaxlib"],
                                   "jax-cuda12-pjrt": lock["jax-cuda12-pjrt"]}
    assert golden["compiler_options"] == {}  # No presets for GPUs: XLA's defaults, or the user's options.


@pytest.mark.heavy  # 10 s of H100 compiles: the default run keeps the quicker GPU cases.
@needs_plugin
def test_compile_on_h100_gives_every_figure_and_a_verdict():
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "lm-tiny", "--topology", "h100-8",
                          "--method", "prefill", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)["prefill"]
    figures = result["figures"]
    assert sum(figures[name] for name in PEAK_FIGURES) == figures["peak_bytes"] > 0  # Every class, adding up.
    # The prefill scans its layers: XLA's raw count has each loop body once, aotcheck's its trip count times.
    assert figures["flops"] > figures["flops_xla"] > 0
    assert figures["comm_all_gather_count"] > 0 and figures["comm_all_reduce_bytes"] > 0
    assert result["hbm_bytes_per_device"] == GPUS["h100"].hbm_bytes and result["hbm_verdict"] is None
    assert result["details"]["peak_buffers"] and result["details"]["collectives"][0]["source"].startswith("aotcheck/")
    # XLA's own warnings (the CUDA plugin logs them to stderr) stay off the terminal.
    assert "spmd_partitioner" not in out.stderr and not re.search(r"^[IWE]\d{4} ", out.stderr, re.M), out.stderr[-2000:]


OVER_HBM = '''
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck


def make_args(mesh):
    return (jax.ShapeDtypeStruct((24 * 2**30,), jnp.float32, sharding=NamedSharding(mesh, P())),)


def doubled(x):
    return x * 2  # 96 GiB in, 96 GiB out: more than an 80 GB H100 holds.


aotcheck.register("huge", aotcheck.FunctionConfig(fn=doubled, make_args=make_args))
'''


@needs_plugin
def test_an_over_hbm_gpu_program_fails_the_gate_with_its_buffers_named(pytester):
    # XLA's GPU compiler compiles it (it never refuses for size): aotcheck's own verdict fails it.
    pytester.makeconftest(OVER_HBM)
    pytester.makeini("[pytest]\naot_topologies = h100-1\naot_slices = 1\naot_golden_dir = golden\n")
    result = pytester.runpytest_subprocess("-p", "no:xdist", "--update-golden")
    text = result.stdout.str()
    assert result.ret == 1, text[-3000:]
    header = next(line for line in text.splitlines() if line.startswith("aotcheck: h100-1x1;"))
    assert "jax-cuda12-pjrt" in header and "libtpu" not in header  # The versions behind these figures.
    assert "huge/step@h100-1x1 does not fit: it needs 192.00 GiB of 79.11 GiB HBM per device on h100-1: 243%" \
        in text, text[-3000:]
    assert "The largest buffers at its peak:" in text
    assert re.search(r"96\.00 GiB\s+outputs\s+jit\(doubled\)/mul\s+f32\[25769803776\]\s+conftest\.py:13", text), text
    assert re.search(r"96\.00 GiB\s+batch\s+args\[0\]", text), text[-3000:]
    assert not re.search(r"^[EW]\d{4} ", text, re.M), text[-3000:]  # XLA's log lines stay off the terminal.
    assert "presets" not in text  # libtpu's presets are no GPU's business.
    assert not list(pytester.path.rglob("golden/**/*.json"))  # Nothing written for a program that does not fit.


SMALL = '''
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck


def make_args(mesh):
    return (jax.ShapeDtypeStruct((mesh.devices.size * 8, 128), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)


aotcheck.register("small", aotcheck.FunctionConfig(fn=lambda x: jnp.tanh(x) * 2, make_args=make_args))
'''


@needs_plugin
def test_compile_workers_keep_the_cuda_runtime_off_whatever_the_environment_says(pytester, monkeypatch):
    # JAX_PLATFORMS=cuda on a host without a GPU: the plugin's runtime would look for cuDNN and fail to
    # register. The GPU family's worker sets JAX_PLATFORMS=cpu for itself, so its deviceless compile works.
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    pytester.makeconftest(SMALL)
    pytester.makeini("[pytest]\naot_topologies = h100-2\naot_slices = 1 2\naot_golden_dir = golden\n")
    result = pytester.runpytest_subprocess("-p", "no:xdist", "--update-golden")
    assert result.ret == 0, result.stdout.str()[-3000:]
    for target in ("h100-2x1", "h100-2x2"):
        golden = json.loads((pytester.path / "golden" / "small" / f"step@{target}.json").read_text())
        assert golden["figures"]["argument_bytes"] == 8 * 128 * 4  # Each GPU's share of its rows.


@needs_plugin
@pytest.mark.heavy  # Six GPU compiles and their fit probes: about a minute on 2 cores.
def test_the_committed_two_host_goldens_pass_uncached(tmp_path):
    # The default run gates lm-tiny on one H100 host (tox.ini); its goldens on two, here.
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "aotcheck", "check", "--configs", "lm-tiny", "--topologies", "h100-8x2",
                          "--no-cache", f"--report={report}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    cases = json.loads(report.read_text())["cases"]
    assert {c["case"]: c["verdict"] for c in cases} == {f"lm-tiny/{p}@h100-8x2": "pass"
                                                       for p in ("train_step", "eval_step", "prefill", "sample_decode")}


def test_a_project_package_named_jax_plugins_is_named_as_what_shadows_the_installed_plugin(tmp_path, monkeypatch):
    """Hardening round 4 (from round 3): a shadowed jax_plugins was told to install the plugin the header
    shows installed."""
    import sys

    (tmp_path / "jax_plugins").mkdir()
    (tmp_path / "jax_plugins" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "jax_plugins" or m.startswith("jax_plugins.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(gpu.GpuPluginError) as e:
        gpu._library()
    assert str(e.value).startswith(f"jax-cuda12-pjrt {gpu.plugin_version()} is installed")
    assert f"`import jax_plugins` finds {tmp_path / 'jax_plugins'} first" in str(e.value)
    assert "pip install" not in str(e.value)
