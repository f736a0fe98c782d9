"""The topology table: user-facing names of TPU slices and NVIDIA GPU hosts, chip figures, devices.

A user names a TPU slice the way Cloud TPU does (``v4-8``, ``v5e-16``, ``v5p-128``,
``v6e-256``, ``7x-8``); libtpu wants a physical shape (``v5e:4x4``) plus a chip
config. A GPU target is named by its model and its NVLink domain (``h100-8``: one
host of 8; ``gb200-72``: one NVL72 rack); several hosts are several "slices"
(``h100-8x2``, also written ``h100-16``): the network between them plays DCN's part.
This module holds that mapping, the per-device datasheet figures used to judge a
compiled program against its chip, and :func:`get_devices_for_topology`, which
hands back deviceless TPU or GPU devices to compile for.

Example:
    >>> from aotcheck.targets.topology import parse_topology, split_target
    >>> t = parse_topology("v5litepod-16")
    >>> t.name, t.libtpu_name, t.num_devices
    ('v5e-16', 'v5e:4x4', 16)
    >>> h100 = parse_topology("h100-8")
    >>> h100.platform, h100.num_devices, h100.hbm_bytes
    ('gpu', 8, 84942979072)
    >>> topology, hosts = split_target("h100-16")
    >>> topology.name, hosts
    ('h100-8', 2)
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from aotcheck.errors import ConfigError
from aotcheck import _runtime

GiB = 1 << 30
_DATASHEETS = (
    "Cloud TPU system architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p, "
    "/v6e, /tpu7x): HBM capacity, HBM bandwidth and peak bf16 FLOP/s per chip"
)


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation, with figures per JAX device (not per chip).

    A v4 or v5p device is a whole (megacore) chip; a 7x device is half a chip.

    Attributes:
        family: User-facing prefix, e.g. ``"v5e"``.
        libtpu_prefix: What libtpu calls it in a topology name, e.g. ``"v5"`` for v5p.
        chip_config: libtpu's ``chip_config_name``.
        devices_per_chip: JAX devices on one chip.
        name_units_per_chip: How much one chip adds to the N of ``family-N``
            (TensorCores for v4/v5p/7x, chips for v5e/v6e).
        hbm_bytes: HBM capacity per device (datasheet).
        hbm_limit_bytes: What XLA's TPU compiler lets one device use (measured
            with this libtpu; a little below the capacity).
        peak_bf16_flops: Peak bf16 FLOP/s per device (datasheet).
        hbm_bandwidth: HBM bytes/s per device (datasheet).
        source: Where the datasheet figures come from.
    """

    family: str
    libtpu_prefix: str
    chip_config: str
    devices_per_chip: int
    name_units_per_chip: int
    hbm_bytes: int
    hbm_limit_bytes: int
    peak_bf16_flops: float
    hbm_bandwidth: float
    source: str = _DATASHEETS


CHIPS: dict[str, Chip] = {
    c.family: c
    for c in (
        Chip("v4", "v4", "megacore", 1, 2, 32 * GiB, int(30.75 * GiB), 275e12, 1200e9),
        # The datasheet says 95 GB, yet the compiler lets a device use 95.74 GiB: 96 GiB.
        Chip("v5p", "v5", "megacore", 1, 2, 96 * GiB, int(95.74 * GiB), 459e12, 2765e9),
        Chip("v5e", "v5e", "default", 1, 1, 16 * GiB, int(15.75 * GiB), 197e12, 819e9),
        Chip("v6e", "v6e", "default", 1, 1, 32 * GiB, int(31.25 * GiB), 918e12, 1640e9),
        # Ironwood: 192 GiB, 4614 TFLOP/s (bf16: 2307) and 7.37 TB/s per chip, 2 devices.
        Chip("7x", "tpu7x", "default", 2, 2, 96 * GiB, int(94.75 * GiB), 1153.5e12, 3690e9),
    )
}

# User-facing aliases of a family prefix.
_ALIASES = {"v5litepod": "v5e", "tpu7x": "7x", "v5": "v5p"}

# Physical shapes (chips) by family and N. Every row is checked against its own
# name by the tests, and a sample against libtpu's device count.
_SHAPES: dict[str, dict[int, tuple[int, ...]]] = {
    "v4": {
        8: (2, 2, 1), 16: (2, 2, 2), 32: (2, 2, 4), 64: (2, 4, 4), 128: (4, 4, 4),
        256: (4, 4, 8), 512: (4, 8, 8), 1024: (8, 8, 8), 1536: (8, 8, 12),
        2048: (8, 8, 16), 4096: (8, 16, 16),
    },
    "v5p": {
        8: (2, 2, 1), 16: (2, 2, 2), 32: (2, 2, 4), 64: (2, 4, 4), 128: (4, 4, 4),
        256: (4, 4, 8), 384: (4, 4, 12), 512: (4, 8, 8), 640: (4, 4, 20),
        768: (4, 8, 12), 896: (4, 4, 28), 1024: (8, 8, 8), 1152: (4, 12, 12),
        1280: (4, 8, 20), 1536: (8, 8, 12), 1792: (4, 8, 28), 2048: (8, 8, 16),
        2560: (8, 8, 20), 3072: (8, 12, 16), 3584: (8, 8, 28), 4096: (8, 16, 16),
        5120: (8, 16, 20), 6144: (12, 16, 16), 7168: (8, 16, 28), 8192: (16, 16, 16),
        10240: (16, 16, 20), 12288: (16, 16, 24), 14336: (16, 16, 28),
        17920: (16, 20, 28),
    },
    "v5e": {
        1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
        128: (8, 16), 256: (16, 16),
    },
    "v6e": {
        1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
        128: (8, 16), 256: (16, 16),
    },
    "7x": {
        2: (1, 1, 1), 8: (2, 2, 1), 16: (2, 2, 2), 32: (2, 2, 4), 64: (2, 4, 4),
        128: (4, 4, 4), 256: (4, 4, 8), 512: (4, 8, 8), 1024: (8, 8, 8),
        2048: (8, 8, 16), 4096: (8, 16, 16),
    },
}


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
    def hbm_limit_bytes(self) -> int:
        """XLA's GPU compiler never refuses a program for its size: the limit is the memory itself."""
        return self.hbm_bytes


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


class TopologyError(ConfigError):
    """A topology name or slice count that aotcheck cannot use."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """One slice of TPU devices, one NVLink domain of GPUs, or host CPU devices, as a user names it.

    Attributes:
        name: Canonical user-facing name, e.g. ``"v5e-16"``, ``"h100-8"`` or ``"cpu-8"``.
        chip: The TPU generation or GPU model; None for ``cpu-N``.
        shape: Physical shape in chips (TPU), ``(hosts, GPUs per host)`` (GPU) or ``(N,)`` (CPU).
        num_devices: JAX devices in one slice.
    """

    name: str
    chip: Chip | Gpu | None
    shape: tuple[int, ...]
    num_devices: int

    @property
    def platform(self) -> str:
        """The compiler that builds its programs: ``"tpu"`` (libtpu), ``"gpu"`` (XLA's CUDA compiler,
        from the CUDA plugin) or ``"cpu"`` (this host's devices).

        Example:
            >>> [parse_topology(n).platform for n in ("v5e-16", "h100-8", "cpu-4")]
            ['tpu', 'gpu', 'cpu']
        """
        if self.chip is None:
            return "cpu"
        return "gpu" if isinstance(self.chip, Gpu) else "tpu"

    # Per device, from the chip's datasheet (None for host devices: they have no HBM to fit, no peak to
    # bound a step). Code downstream asks these, never which platform it is.

    @property
    def hbm_bytes(self) -> int | None:
        """A device's memory capacity (the HBM verdict's denominator)."""
        return self.chip.hbm_bytes if self.chip else None

    @property
    def memory_limit_bytes(self) -> int | None:
        """What the compiler lets one device use (a little below the capacity on TPUs)."""
        return self.chip.hbm_limit_bytes if self.chip else None

    @property
    def peak_flops(self) -> float | None:
        """A device's peak bf16 FLOP/s."""
        return self.chip.peak_bf16_flops if self.chip else None

    @property
    def hbm_bandwidth(self) -> float | None:
        """A device's HBM bytes/s."""
        return self.chip.hbm_bandwidth if self.chip else None

    @property
    def vmem_bytes(self) -> int | None:
        """One TensorCore's VMEM (no Pallas kernel's scoped VMEM limit goes past it), from jax's table of
        TPU cores (``pltpu.get_tpu_info_for_chip``); None off TPUs or where this jax has no table.

        Example:
            >>> [parse_topology(n).vmem_bytes for n in ("v5e-1", "v4-8", "h100-8")]
            [134217728, 16777216, None]
        """
        version = _JAX_CHIP_VERSIONS.get(self.chip.family) if isinstance(self.chip, Chip) else None
        if version is None:
            return None
        try:
            from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415  (asked only when a kernel overflows)

            return int(pltpu.get_tpu_info_for_chip(getattr(pltpu.ChipVersion, version), 1).vmem_capacity_bytes)
        except Exception:  # An older jax without the table, or without this chip in it.
            return None

    @property
    def num_chips(self) -> int:
        return math.prod(self.shape)

    @property
    def libtpu_name(self) -> str:
        """The ``topology_name`` libtpu takes, e.g. ``"v5e:4x4"``."""
        if not isinstance(self.chip, Chip):
            raise TopologyError(f"{self.name} is not a TPU topology; it has no libtpu name")
        return f"{self.chip.libtpu_prefix}:{'x'.join(map(str, self.shape))}"

    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int]:
        """Chips per host: 2x2x1 except on single-chip slices."""
        return (1, 1, 1) if self.num_chips == 1 else (2, 2, 1)


# jax's names of the TPU chips (``pltpu.ChipVersion``), by family.
_JAX_CHIP_VERSIONS = {"v4": "TPU_V4", "v5e": "TPU_V5E", "v5p": "TPU_V5P", "v6e": "TPU_V6E", "7x": "TPU_7X"}


def _tpu_topology(family: str, n: int) -> Topology:
    chip = CHIPS[family]
    shape = _SHAPES[family][n]
    return Topology(f"{family}-{n}", chip, shape, math.prod(shape) * chip.devices_per_chip)


def _gpu_topology(family: str, n: int) -> Topology:
    gpu = GPUS[family]
    hosts = max(1, n // gpu.gpus_per_host)
    return Topology(f"{family}-{n}", gpu, (hosts, n // hosts), n)


def all_topologies() -> list[Topology]:
    """Every TPU topology in the table, by family then size."""
    return [_tpu_topology(f, n) for f in _SHAPES for n in sorted(_SHAPES[f])]


def gpu_topologies() -> list[Topology]:
    """Every GPU topology (one NVLink domain) in the table, by model then size."""
    return [_gpu_topology(f, n) for f, gpu in GPUS.items() for n in gpu.domain_sizes]


def topology_names() -> list[str]:
    """Every valid TPU topology name (``cpu-N`` for 1 <= N <= :data:`MAX_CPU_DEVICES` is valid too)."""
    return [t.name for t in all_topologies()]


_NAME_RE = re.compile(r"^(?P<family>[a-z0-9]+?)-(?P<n>\d+)$")


def parse_topology(name: str | Topology) -> Topology:
    """Parses a user-facing topology name.

    Args:
        name: ``v4-8``, ``v5p-128``, ``v5e-16`` (or ``v5litepod-16``), ``v6e-8``,
            ``7x-8`` (or ``tpu7x-8``), a GPU host or NVLink domain (``h100-8``,
            ``b200-4``, ``gb200-72``), or ``cpu-N`` for N host CPU devices.

    Returns:
        The :class:`Topology`.

    Raises:
        TopologyError: The name is not in the table; the message lists the
            closest valid names.
    """
    if isinstance(name, Topology):
        return name
    text = str(name).strip().lower()
    match = _NAME_RE.match(text)
    if match:
        family = _ALIASES.get(match["family"], match["family"])
        n = int(match["n"])
        if family == "cpu" and n >= 1:
            if n > MAX_CPU_DEVICES:
                raise TopologyError(_too_many_cpu_devices(f"cpu-{n}", n))
            return Topology(f"cpu-{n}", None, (n,), n)
        if family in _SHAPES and n in _SHAPES[family]:
            return _tpu_topology(family, n)
        if family in GPUS:
            return _parse_gpu(str(name), family, n)
        if family in _SHAPES:
            sizes = sorted(_SHAPES[family])
            nearest = sorted(sizes, key=lambda s: (abs(math.log(s / max(n, 1))), s))[:3]
            raise TopologyError(
                f"Unknown topology {name!r}. Closest valid names: "
                f"{', '.join(f'{family}-{s}' for s in sorted(nearest))}. "
                f"{family} slices come in sizes {', '.join(map(str, sizes))}."
            )
    close = difflib.get_close_matches(text, [*topology_names(), *(t.name for t in gpu_topologies())], n=5, cutoff=0.5)
    best = closest_name(text)  # The closest family at the closest size first (v9-8: v5p-8).
    close = ([best] if best else []) + [c for c in close if c != best][:5 - bool(best)]
    hint = f" Closest valid names: {', '.join(close)}." if close else ""
    families = ", ".join(f"{f}-N" for f in [*_SHAPES, *GPUS])
    raise TopologyError(
        f"Unknown topology {name!r}.{hint} Valid families: {families} "
        f"(aliases v5litepod-N, tpu7x-N) and cpu-N for host CPU devices; "
        f"`python -m aotcheck topologies` lists every name."
    )


def _gpu_target_text(family: str, n: int) -> str | None:
    """What ``{family}-{n}`` GPUs beyond one NVLink domain mean as a target (``h100-16``: ``h100-8x2``), or None.

    Example:
        >>> _gpu_target_text("h100", 16), _gpu_target_text("gb200", 144), _gpu_target_text("h100", 12)
        ('h100-8x2', 'gb200-72x2', None)
    """
    domain = max(GPUS[family].domain_sizes)
    return f"{family}-{domain}x{n // domain}" if n > domain and n % domain == 0 else None


def _parse_gpu(name: str, family: str, n: int) -> Topology:
    gpu = GPUS[family]
    if n in gpu.domain_sizes:
        return _gpu_topology(family, n)
    domain = max(gpu.domain_sizes)
    target = _gpu_target_text(family, n)
    if target:
        raise TopologyError(f"{name} is {n // domain} x {family}-{domain}: name it as a target, "
                            f"{_spell_target(family, domain, n // domain, lead='')} Its {n // domain} "
                            f"{'hosts' if domain == gpu.gpus_per_host else 'domains'} are joined by the network, "
                            "as slices are.")
    sizes = ", ".join(f"{family}-{s}" for s in gpu.domain_sizes)
    raise TopologyError(f"Unknown topology {name!r}: {family} targets are {sizes} (one NVLink domain), or "
                        f"several of the largest, written {family}-{domain}xK for K of them.")


def _spell_target(family: str, domain: int, k: int, *, lead: str = "write ") -> str:
    """How each front end names ``k`` x ``{family}-{domain}``, for a message.

    Example:
        >>> _spell_target("a100", 8, 4)  # doctest: +ELLIPSIS
        'write a100-8x4 wherever a topology is named (--aot-topologies=a100-8x4, ini aot_topologies = a100-8x4, ...'
    """
    t, one = f"{family}-{domain}x{k}", f"{family}-{domain}"
    return (f"{lead}{t} wherever a topology is named (--aot-topologies={t}, ini aot_topologies = {t}, "
            f"python -m aotcheck check --topologies {t}, compile or fit --topology {t}), or {one} with {k} slices "
            f"(--aot-slices={k}, ini aot_slices = {k}, --slices {k}; in the library topology=\"{one}\", "
            f"topology_num_slices={k}).")


def closest_name(text: str) -> str | None:
    """The valid target name closest to ``text`` (a topology, with its ``xK`` if it had one), for a
    message; None when nothing is close.

    Example:
        >>> closest_name("h100-3"), closest_name("v5e-17x2"), closest_name("cpu-4096"), closest_name("v9-8")
        ('h100-4', 'v5e-16x2', 'cpu-2048', 'v5p-8')
    """
    text = str(text).strip().lower()
    suffix = ""
    sliced = re.match(r"^(?P<topo>.+?\d)(?P<slices>x\d+)$", text)
    if sliced:
        text, suffix = sliced["topo"], sliced["slices"]
    match = _NAME_RE.match(text)
    if match:
        family, n = _ALIASES.get(match["family"], match["family"]), max(int(match["n"]), 1)
        if family not in (*_SHAPES, *GPUS, "cpu"):  # v9-8: the closest family, at the closest size.
            family = next(iter(difflib.get_close_matches(family, [*_SHAPES, *GPUS, *_ALIASES], n=1, cutoff=0.4)), "")
            family = _ALIASES.get(family, family)
        sizes = sorted(_SHAPES[family]) if family in _SHAPES else list(GPUS[family].domain_sizes) \
            if family in GPUS else [1, MAX_CPU_DEVICES] if family == "cpu" else []
        if family == "cpu":
            return f"cpu-{min(n, MAX_CPU_DEVICES)}{suffix}"
        if sizes:
            return f"{family}-{min(sizes, key=lambda s: (abs(math.log(s / n)), s))}{suffix}"
    names = [*topology_names(), *(t.name for t in gpu_topologies())]
    close = difflib.get_close_matches(text, names, n=1, cutoff=0.5)
    return f"{close[0]}{suffix}" if close else None


# Bounds on what a target may ask for: libtpu builds every device of a target in host memory (a
# million slices of v4-8 took a worker past 13 GB and the machine with it). The largest multislice
# jobs run a few hundred slices and tens of thousands of chips.
MAX_SLICES = 1024
MAX_DEVICES = 65536
# Host CPU devices (cpu-N, over all slices): XLA's CPU backend compiles a program over at most 2048 of
# them in one process (jax 0.12, measured: 2048 compile; 2049 and 4096 are refused as "Multiprocess
# computations aren't implemented on the CPU backend", after minutes of setting up the devices).
MAX_CPU_DEVICES = 2048


def _too_many_cpu_devices(name: str, n: int) -> str:
    return (f"{name} asks for {n} host CPU devices; aotcheck compiles for at most {MAX_CPU_DEVICES} "
            f"(cpu-{MAX_CPU_DEVICES}, over all slices): XLA's CPU backend refuses a program over more devices "
            f"than that as a multiprocess one. Use cpu-{MAX_CPU_DEVICES} or fewer, or the TPU or GPU topology "
            "you mean (python -m aotcheck topologies lists them).")


def check_num_slices(num_slices: Any) -> int:
    """Returns ``num_slices`` as an int, or raises a clear error.

    Example:
        >>> check_num_slices(2)
        2
        >>> check_num_slices(10**20)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        aotcheck.targets.topology.TopologyError: 100000000000000000000 slices is more than aotcheck compiles for (at most 1024...
    """
    if isinstance(num_slices, bool) or not isinstance(num_slices, int):
        raise TopologyError(
            f"The number of slices must be an integer >= 1, got {num_slices!r} "
            f"({type(num_slices).__name__})."
        )
    if num_slices < 1:
        raise TopologyError(f"The number of slices must be >= 1, got {num_slices}.")
    if num_slices > MAX_SLICES:
        raise TopologyError(f"{num_slices} slices is more than aotcheck compiles for (at most {MAX_SLICES}; libtpu "
                            "holds every device of a target in host memory). Check the slice count.")
    return num_slices


class TopologyDevices(NamedTuple):
    """What :func:`get_devices_for_topology` returns."""

    devices: list[Any]
    devices_per_slice: int


def get_devices_for_topology(topology: str | Topology, num_slices: int = 1) -> TopologyDevices:
    """Returns compile-only devices for ``num_slices`` slices of ``topology``.

    TPU devices come from libtpu's deviceless topologies and need no TPU; with
    more than one slice each carries ``slice_index``. GPU devices come from the CUDA
    plugin's deviceless topologies (no GPU, no driver), one slice per host or NVLink
    domain, ordered slice by slice. ``cpu-N`` uses this host's CPU devices (no libtpu
    needed), N per slice.

    Args:
        topology: A name accepted by :func:`parse_topology`.
        num_slices: Slices connected over the data-center network (DCN).

    Returns:
        ``(devices, devices_per_slice)``.

    Raises:
        TopologyError: Unknown topology, a bad slice count, or libtpu missing.
        HostError: The CUDA plugin is missing (the message names the extra to install).
    """
    topo = parse_topology(topology)
    num_slices = check_num_slices(num_slices)
    if topo.platform == "cpu":
        return TopologyDevices(_cpu_devices(topo.num_devices * num_slices), topo.num_devices)
    if topo.platform == "gpu":
        return TopologyDevices(_gpu_devices(topo, num_slices), topo.num_devices)
    if not _runtime.libtpu_available():
        raise TopologyError(
            f"Compiling for {topo.name} needs XLA's TPU compiler, which comes with the "
            "'libtpu' package: pip install 'jax[tpu]' (at the version aotcheck pins). "
            "Without it, use a host topology such as cpu-8."
        )
    devices = _tpu_devices(topo.libtpu_name, topo.chip.chip_config, topo.chips_per_host_bounds, num_slices)
    expected = topo.num_devices * num_slices
    if len(devices) != expected:  # The table and libtpu disagree: a bug in the table.
        raise TopologyError(
            f"libtpu gave {len(devices)} devices for {topo.name} x{num_slices} "
            f"({topo.libtpu_name}); the topology table expects {expected}."
        )
    return TopologyDevices(devices, topo.num_devices)


def _tpu_devices(
    libtpu_name: str, chip_config: str, chips_per_host_bounds: tuple[int, ...], num_slices: int
) -> list[Any]:
    from jax.experimental import topologies  # Deferred: loads jax's backends.

    try:
        with _runtime.quiet_compiler_stderr():
            desc = topologies.get_topology_desc(
                platform="tpu",
                topology_name=libtpu_name,
                chip_config_name=chip_config,
                chips_per_host_bounds=chips_per_host_bounds,
                num_slices=num_slices,
            )
    except Exception as e:
        if "Failed to open" in str(e) or "load_pjrt_plugin" in str(e):  # The library, not the topology.
            raise _runtime.HostError(libtpu_load_failure(str(e))) from None
        raise
    return list(desc.devices)


def _gpu_devices(topo: Topology, num_slices: int) -> list[Any]:
    from aotcheck.targets import gpu  # noqa: PLC0415  (the CUDA plugin, only for GPU targets)

    hosts, per_host = topo.shape
    try:
        devices = gpu.gpu_devices(topo.chip.device_name, partitions=num_slices, hosts=hosts, gpus_per_host=per_host)
    except gpu.GpuPluginError as e:
        raise _runtime.HostError(f"{topo.name}: {e}") from None
    expected = topo.num_devices * num_slices
    kinds = {d.device_kind for d in devices}
    if len(devices) != expected or kinds != {topo.chip.device_name}:  # A bug in the table.
        raise TopologyError(f"The CUDA plugin gave {len(devices)} devices ({', '.join(sorted(kinds))}) for {topo.name} "
                            f"x{num_slices}; the topology table expects {expected} x {topo.chip.device_name!r}.")
    return devices


def libtpu_load_failure(error: str) -> str:
    """Words for a libtpu that could not be loaded: the host's install, never the config.

    Example:
        >>> print(libtpu_load_failure("INTERNAL: Failed to open /x/libtpu.so: file too short"))  # doctest: +ELLIPSIS
        libtpu could not be loaded (INTERNAL: Failed to open /x/libtpu.so: file too short); this host's libtpu, ...
    """
    where = _runtime.libtpu_override()
    fix = (f"TPU_LIBRARY_PATH={where} points at it: unset it, or point it at a libtpu.so" if where else
           "reinstall it: pip install -r requirements.lock (or jax[tpu] at the version your lock pins)")
    return f"libtpu could not be loaded ({error.strip().splitlines()[-1]}); this host's libtpu, not the config: {fix}"


def reserve_cpu_devices(count: int) -> None:
    """Asks JAX for at least ``count`` host CPU devices (and 8), if its CPU backend has not started.

    The count is fixed when the backend starts, so later cpu-N requests in the
    same process cannot grow it: ask early, with room to spare.
    """
    import jax

    # jax refuses a new count once its backends started (a RuntimeError): then the count stays as it is.
    with contextlib.suppress(RuntimeError):
        jax.config.update("jax_num_cpu_devices", max(count, 8, jax.config.jax_num_cpu_devices))


def _cpu_devices(count: int) -> list[Any]:
    import jax

    if count > MAX_CPU_DEVICES:
        raise TopologyError(_too_many_cpu_devices(f"cpu-{count}", count))
    reserve_cpu_devices(count)
    devices = jax.devices("cpu")
    if len(devices) < count:
        raise TopologyError(
            f"cpu-{count} needs {count} host CPU devices but JAX already started with "
            f"{len(devices)}. Set JAX_NUM_CPU_DEVICES={count} before JAX initializes."
        )
    return list(devices[:count])


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a program compiles: ``num_slices`` slices of one topology.

    Its text form, ``TOPOLOGYxSLICES``, names golden files and case ids; this
    class is the one place that writes and reads it.

    Example:
        >>> from aotcheck.targets.topology import Target
        >>> target = Target.parse("v5litepod-16x2")
        >>> target.name, target.num_devices
        ('v5e-16x2', 32)
        >>> Target.parse(target.name) == target
        True
    """

    topology: Topology
    num_slices: int = 1

    def __post_init__(self) -> None:
        if self.topology.platform == "cpu" and self.num_devices > MAX_CPU_DEVICES:
            raise TopologyError(_too_many_cpu_devices(self.name, self.num_devices))
        if self.num_devices > MAX_DEVICES:
            raise TopologyError(f"{self.name} has {self.num_devices} devices, more than aotcheck compiles for (at most "
                                f"{MAX_DEVICES} over all slices; libtpu holds every device in host memory). "
                                "Check the slice count.")

    @classmethod
    def of(cls, topology: str | Topology, num_slices: int = 1) -> "Target":
        """A target from a topology (name) and a slice count, both checked."""
        return cls(parse_topology(topology), check_num_slices(num_slices))

    @property
    def name(self) -> str:
        return f"{self.topology.name}x{self.num_slices}"

    @property
    def num_devices(self) -> int:
        """Devices over all slices."""
        return self.topology.num_devices * self.num_slices

    @classmethod
    def parse(cls, text: str) -> "Target":
        """Parses ``TOPOLOGYxSLICES`` (``"v5e-16x2"``); the slice count is required."""
        topology, slices = split_target(text)
        if slices is None:
            raise TopologyError(f"{text!r} names no slice count; write TOPOLOGYxSLICES, e.g. {text}x1.")
        return cls(topology, slices)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Target.parse({self.name!r})"


def split_target(text: str) -> tuple[Topology, int | None]:
    """Parses ``"v5e-16"`` or ``"v5e-16x2"`` (2 slices) into (topology, slices or None).

    Example:
        >>> topology, slices = split_target("v4-8x2")
        >>> topology.name, slices
        ('v4-8', 2)
        >>> split_target("v4-8")[1] is None
        True
    """
    match = re.match(r"^(?P<topo>.+?)x(?P<slices>\d+)$", text.strip())
    if match and match["topo"][-1].isdigit():
        slices = check_num_slices(int(match["slices"]))
        gpus = _NAME_RE.match(match["topo"].lower())
        if gpus and gpus["family"] in GPUS and _gpu_target_text(gpus["family"], int(gpus["n"])):
            # a100-16x2: 2 x a100-16, and a100-16 is already 2 hosts of a100-8: said in the one spelling.
            family, n = gpus["family"], int(gpus["n"])
            domain = max(GPUS[family].domain_sizes)
            unit = "hosts" if domain == GPUS[family].gpus_per_host else "domains"
            raise TopologyError(
                f"{text.strip()} asks for {slices} x {family}-{n}, and {family}-{n} is already {n // domain} x "
                f"{family}-{domain} ({unit} joined by the network, as slices are): that is {n // domain * slices} "
                f"x {family}-{domain}; {_spell_target(family, domain, n // domain * slices)}")
        return parse_topology(match["topo"]), slices
    gpus = _NAME_RE.match(text.strip().lower())
    target = _gpu_target_text(gpus["family"], int(gpus["n"])) if gpus and gpus["family"] in GPUS else None
    if target:  # h100-16: two hosts of h100-8.
        return split_target(target)
    return parse_topology(text), None


def expand_targets(texts: Sequence[str], slices: Sequence[int] = (1,)) -> list[Target]:
    """Targets for topology texts: ``v5e-16`` takes every count in ``slices``, ``v5e-16x2`` just 2.

    Example:
        >>> [t.name for t in expand_targets(["v4-8", "v5e-16x2", "v4-8x2"], [1, 2])]
        ['v4-8x1', 'v4-8x2', 'v5e-16x2']
    """
    out: list[Target] = []
    for text in texts:
        topology, fixed = split_target(text)
        for n in [fixed] if fixed else slices:
            target = Target(topology, check_num_slices(n))
            if target not in out:
                out.append(target)
    return out
