"""The GPU table and XLA's GPU compiler without a GPU: the CUDA plugin, its target configs, deviceless GPUs.

JAX's CUDA plugin (``pip install 'aotcheck[cuda]'``: ``jax-cuda12-plugin`` and
``jax-cuda12-pjrt``) carries XLA's whole GPU compiler and, embedded in its shared
library, XLA's device specs (``xla/backends/gpu/target_config/specs/*.txtpb``: one
``GpuTargetConfigProto`` per GPU model, written by the same XLA, so the proto
always matches). Given one of them and a shape, ``jax.experimental.topologies``
hands back deviceless devices whose programs compile exactly as for the real GPU,
except that nothing is autotuned (no device to time kernels on).

The plugin must not start its runtime: with no GPU and no driver it fails ("Unable
to load cuDNN"). ``JAX_PLATFORMS=cpu`` keeps it from starting (aotcheck sets that in
its own processes where no accelerator is attached).

Example:
    >>> from aotcheck.targets import gpu
    >>> print(gpu.missing_plugin())  # doctest: +ELLIPSIS
    Compiling for NVIDIA GPUs needs XLA's GPU compiler, which comes with JAX's CUDA plugin: pip install 'aotcheck[cuda]' ...

(tests/unit/targets/test_gpu.py reads every spec of the topology table from the installed plugin.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import importlib.metadata
import importlib.util
import mmap
import os
from typing import Any

from aotcheck import _runtime
from aotcheck.errors import AotcheckError
from aotcheck.targets.platform import DeviceSpec


_GPU_DATASHEETS = (
    "HBM capacity and bandwidth per GPU: XLA's device specs (xla/backends/gpu/target_config/specs, the "
    "target config aotcheck compiles with); peak dense bf16 FLOP/s per GPU: NVIDIA's datasheets (A100, "
    "H100 SXM, H200 SXM, HGX B200, GB200 NVL72; the sparse figures halved)"
)


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU model, with figures per GPU (a JAX device).

    Attributes:
        family: User-facing prefix, e.g. ``"h100"``.
        device_name: The name XLA's device spec (its GPU target config) carries, e.g.
            ``"NVIDIA H100 80GB HBM3"``: the CUDA plugin embeds one spec per name.
        gpus_per_host: GPUs on one host (8 on an HGX board, 4 on a GB200 tray).
        domain_sizes: The NVLink domains a target may name (``h100-8``: 1, 2, 4 or 8
            GPUs of one host; ``gb200-72``: one NVL72 rack of 18 hosts).
        hbm_bytes: Memory per GPU (the spec's ``device_memory_size``).
        peak_bf16_flops: Peak dense bf16 FLOP/s per GPU (datasheet).
        hbm_bandwidth: Memory bytes/s per GPU (the spec's ``memory_bandwidth``).
        source: Where the figures come from.
    """

    family: str
    device_name: str
    gpus_per_host: int
    domain_sizes: tuple[int, ...]
    hbm_bytes: int
    peak_bf16_flops: float
    hbm_bandwidth: float
    source: str = _GPU_DATASHEETS

    @property
    def device(self) -> DeviceSpec:
        """One GPU's capacity and peak rates: XLA's GPU compiler never refuses a program for its size, so
        the limit is the memory itself."""
        return DeviceSpec(self.hbm_bytes, self.hbm_bytes, self.peak_bf16_flops, self.hbm_bandwidth, self.source)


GPUS: dict[str, Gpu] = {
    g.family: g
    for g in (
        Gpu("a100", "NVIDIA A100-SXM4-80GB", 8, (1, 2, 4, 8), 85_100_068_864, 312e12, 2039.04e9),
        Gpu("h100", "NVIDIA H100 80GB HBM3", 8, (1, 2, 4, 8), 84_942_979_072, 989.4e12, 3352.32e9),
        Gpu("h200", "NVIDIA H200 141GB HBM3e", 8, (1, 2, 4, 8), 151_397_597_184, 989.4e12, 4800e9),
        Gpu("b200", "NVIDIA B200", 8, (1, 2, 4, 8), 191_514_411_008, 2250e12, 7672.32e9),
        Gpu("gb200", "NVIDIA GB200", 4, (72,), 197_897_748_480, 2500e12, 7928.064e9),
    )
}


class GpuPluginError(AotcheckError, RuntimeError):
    """The CUDA plugin is missing, or does not have what a target needs; the message says what to install."""


def plugin_version() -> str | None:
    """The installed CUDA plugin's version (its compiler is in ``jax-cuda12-pjrt``), or None."""
    try:
        return importlib.metadata.version(_runtime.CUDA_COMPILER)
    except importlib.metadata.PackageNotFoundError:
        return None


def _library() -> str:
    try:
        spec = importlib.util.find_spec("jax_plugins.xla_cuda12")
    except ImportError:  # A module named jax_plugins that is not a package.
        spec = None
    path = os.path.join(os.path.dirname(spec.origin), "xla_cuda_plugin.so") if spec and spec.origin else None
    if plugin_version() is None:
        raise GpuPluginError(missing_plugin())
    if path is None or not os.path.isfile(path):
        raise GpuPluginError(shadowed_plugin() or missing_plugin())
    return path


def shadowed_plugin() -> str | None:
    """When the CUDA plugin is installed but ``import jax_plugins`` finds something else first (a directory
    or module of the project's own named ``jax_plugins``, earlier on ``sys.path``): what shadows it and the
    fix. None when nothing does (the install itself is broken: reinstalling fixes it)."""
    installed = next((f.locate() for f in importlib.metadata.files(_runtime.CUDA_COMPILER) or []
                      if f.as_posix() == "jax_plugins/xla_cuda12/__init__.py"), None)
    if installed is None:
        return None
    try:
        found = importlib.util.find_spec("jax_plugins")
    except (ImportError, ValueError):
        found = None
    where = ([*found.submodule_search_locations] if found and found.submodule_search_locations
             else [found.origin] if found and found.origin else [])
    home = os.path.dirname(os.path.dirname(os.path.dirname(str(installed))))  # .../site-packages
    package = os.path.join(home, "jax_plugins")
    if not where or any(os.path.exists(w) and os.path.exists(package) and os.path.samefile(w, package) for w in where):
        return None
    return (f"{_runtime.CUDA_COMPILER} {plugin_version()} is installed (its compiler in {home}/jax_plugins), but "
            f"`import jax_plugins` finds {', '.join(map(str, where))} first: a directory or module of that name "
            "earlier on sys.path shadows the plugin's package. Rename it, or take its parent off sys.path "
            "(PYTHONPATH, the project root pytest puts first); nothing needs installing.")


def missing_plugin() -> str:
    """What to install to compile for GPUs."""
    jax = _runtime.toolchain()["jax"]
    return (f"Compiling for NVIDIA GPUs needs XLA's GPU compiler, which comes with JAX's CUDA plugin: "
            f"pip install 'aotcheck[cuda]' (or jax-cuda12-plugin=={jax} "
            f"jax-cuda12-pjrt=={jax}, the version of the jax in use; no GPU or CUDA toolkit needed).")


@functools.cache
def target_config(device_name: str) -> str:
    """XLA's ``GpuTargetConfigProto`` text for ``device_name``, as the installed plugin embeds it.

    Each embedded spec is a NUL-terminated text proto ending in ``device_description_str: "<name>"``;
    reading it from the library that compiles guarantees the two agree.
    """
    with open(_library(), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        end = data.find(f'device_description_str: "{device_name}"\n'.encode())
        if end < 0:
            raise GpuPluginError(f"The CUDA plugin {plugin_version()} has no device spec for {device_name!r}; "
                                 "a newer plugin (and jax) may: pip install -U 'aotcheck[cuda]'.")
        start = data.rfind(b"\0", 0, end) + 1
        stop = data.find(b"\0", end)
        return data[start:stop].decode()


def gpu_devices(device_name: str, *, partitions: int, hosts: int, gpus_per_host: int) -> list[Any]:
    """Deviceless GPUs of model ``device_name``: ``partitions`` NVLink domains (joined by the network)
    of ``hosts`` hosts of ``gpus_per_host`` each, ordered domain by domain, host by host."""
    if plugin_version() is None:  # Before the cached spec: a plugin uninstalled since is said to be missing.
        raise GpuPluginError(missing_plugin())
    import jax  # noqa: PLC0415
    from jax.experimental import topologies  # noqa: PLC0415  (loads jax's backends)

    config = target_config(device_name)
    if not jax.config.jax_platforms and not glob.glob("/dev/nvidia[0-9]*"):
        # jax read JAX_PLATFORMS when it was imported, maybe before aotcheck set it: without "cpu" there, the
        # plugin checks for a CUDA runtime when it registers, finds none, and registers nothing.
        with contextlib.suppress(RuntimeError):
            jax.config.update("jax_platforms", "cpu")
    try:
        # XLA's shape: partitions (fast-interconnect domains) x hosts per partition x devices per host.
        desc = topologies.get_topology_desc(platform="cuda", topology=f"{partitions}x{hosts}x{gpus_per_host}",
                                            target_config=config)
    except NotImplementedError:  # jax found no CUDA topology factory: the plugin did not register.
        raise GpuPluginError(
            f"{missing_plugin()} If it is installed, it did not register with jax (JAX_PLATFORMS is "
            f"{os.environ.get('JAX_PLATFORMS', '')!r}, jax's platforms {jax.config.jax_platforms!r}): on a host "
            "without a GPU it registers only when jax starts with JAX_PLATFORMS=cpu, so set that, or import aotcheck "
            "before anything asks jax for devices."
        ) from None
    # Slices (hosts) must lie along the mesh's outermost axis: order by host, then by id.
    return sorted(desc.devices, key=lambda d: (d.process_index, d.id))
