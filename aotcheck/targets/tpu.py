"""The TPU table: chip generations, their slice shapes, libtpu's deviceless devices.

A user names a TPU slice the way Cloud TPU does (``v4-8``, ``v5e-16``, ``v5p-128``, ``v6e-256``,
``7x-8``); libtpu wants a physical shape (``v5e:4x4``) plus a chip config. This module holds the
chips' datasheet figures (per JAX device), every slice shape by family and size, and the call that
asks libtpu for a slice's devices.

Example:
    >>> from aotcheck.targets.tpu import CHIPS, SHAPES
    >>> CHIPS["v5e"].device.memory_bytes, SHAPES["v5e"][16]
    (17179869184, (4, 4))
    >>> CHIPS["v4"].vmem_bytes
    16777216
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aotcheck import _runtime
from aotcheck.targets.platform import DeviceSpec

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
        scoped_vmem_bytes: The compiler's default scoped VMEM limit for one kernel (its
            ``xla_tpu_scoped_vmem_limit_kib`` unset), read from its overflow message with libtpu 0.0.50
            ("Scoped allocation with size ... and limit 16.00M"); v4 says none and stops at its VMEM.
        source: Where the datasheet figures come from.
        runtime_limit_bytes: What the runtime lets a process hold on one device, buffers and programs
            together (``memory_stats()["bytes_limit"]``): the start-up budget's limit.
        runtime_limit_evidence: ``"measured"``, ``"published"`` or ``"inferred"`` (see
            :class:`~aotcheck.targets.platform.DeviceSpec`).
        runtime_limit_source: Where that comes from, in words.
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
    scoped_vmem_bytes: int = 16 << 20
    source: str = _DATASHEETS
    runtime_limit_bytes: int | None = None
    runtime_limit_evidence: str = "inferred"
    runtime_limit_source: str = ""

    def __post_init__(self) -> None:
        if self.runtime_limit_bytes is None:  # The measured chip's gap: the runtime keeps 2 MiB of the compiler's.
            object.__setattr__(self, "runtime_limit_bytes", self.hbm_limit_bytes - _RUNTIME_KEEPS)
            object.__setattr__(self, "runtime_limit_source", self.runtime_limit_source or _INFERRED)

    @property
    def device(self) -> DeviceSpec:
        """One device's capacity and peak rates."""
        return DeviceSpec(self.hbm_bytes, self.hbm_limit_bytes, self.peak_bf16_flops, self.hbm_bandwidth, self.source,
                          self.runtime_limit_bytes, self.runtime_limit_evidence, self.runtime_limit_source,
                          self.scoped_vmem_bytes)

    @property
    def vmem_bytes(self) -> int | None:
        """One TensorCore's VMEM (no Pallas kernel's scoped VMEM limit goes past it), from jax's table of
        TPU cores (``pltpu.get_tpu_info_for_chip``); None where this jax has no table."""
        return self._jax_info("vmem_capacity_bytes")

    @property
    def smem_bytes(self) -> int | None:
        """One TensorCore's SMEM (a kernel's scalar operands and SMEM scratch), from jax's table; None
        where this jax has no table."""
        return self._jax_info("smem_capacity_bytes")

    def _jax_info(self, field: str) -> int | None:
        version = _JAX_CHIP_VERSIONS.get(self.family)
        if version is None:
            return None
        try:
            from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415  (asked only where a kernel is)

            return int(getattr(pltpu.get_tpu_info_for_chip(getattr(pltpu.ChipVersion, version), 1), field))
        except Exception:  # An older jax without the table, or without this chip in it.
            return None


# The runtime's limit (``bytes_limit``) against the compiler's, measured on one v5e chip (libtpu 0.0.42.1,
# 2026-12-07): 16,909,336,064 against int(15.75 GiB) = 16,911,433,728, 2,097,664 B (2 MiB + 512 B) less.
# Unmeasured chips take the same off their compiler's limit, and say whether public figures agree.
_RUNTIME_KEEPS = 2_097_664
_INFERRED = ("inferred: the compiler's limit less the 2 MiB the runtime kept on a measured v5e chip; "
             "no public bytes_limit for this chip")
V5E_BYTES_LIMIT = 16_909_336_064

CHIPS: dict[str, Chip] = {
    c.family: c
    for c in (
        Chip("v4", "v4", "megacore", 1, 2, 32 * GiB, int(30.75 * GiB), 275e12, 1200e9),
        # The datasheet says 95 GB, yet the compiler lets a device use 95.74 GiB: 96 GiB.
        Chip("v5p", "v5", "megacore", 1, 2, 96 * GiB, int(95.74 * GiB), 459e12, 2765e9),
        Chip("v5e", "v5e", "default", 1, 1, 16 * GiB, int(15.75 * GiB), 197e12, 819e9,
             runtime_limit_bytes=V5E_BYTES_LIMIT, runtime_limit_evidence="measured",
             runtime_limit_source="measured: memory_stats()['bytes_limit'] on one v5e chip, jax 0.10.2, "
                                  "libtpu 0.0.42.1 (2026-12-07); tpu-inference logs 15.75 GiB on v5e-1"),
        Chip("v6e", "v6e", "default", 1, 1, 32 * GiB, int(31.25 * GiB), 918e12, 1640e9, scoped_vmem_bytes=32 << 20,
             runtime_limit_evidence="published",
             runtime_limit_source="published: tpu-inference logs 31.24 GiB on v6e-1 and tpu-info shows 31.25 GiB, "
                                  "as the compiler's limit less 2 MiB reads; not measured here"),
        # Ironwood: 192 GiB, 4614 TFLOP/s (bf16: 2307) and 7.37 TB/s per chip, 2 devices.
        Chip("7x", "tpu7x", "default", 2, 2, 96 * GiB, int(94.75 * GiB), 1153.5e12, 3690e9, scoped_vmem_bytes=32 << 20,
             runtime_limit_evidence="published",
             runtime_limit_source="published: tpu-inference #903 (a 7x device's limit is 96 GB, not 192), a vLLM "
                                  "calibration on 94.75 GiB and #3408's 94.7 GiB; the 2 MiB less is v5e's, not measured"),
    )
}

# Physical shapes (chips) by family and N. Every row is checked against its own
# name by the tests, and a sample against libtpu's device count.
SHAPES: dict[str, dict[int, tuple[int, ...]]] = {
    "v4": {
        8: (2, 2, 1), 16: (2, 2, 2), 32: (2, 2, 4), 64: (2, 4, 4), 128: (4, 4, 4), 256: (4, 4, 8),
        384: (4, 4, 12), 512: (4, 8, 8), 1024: (8, 8, 8), 1536: (8, 8, 12), 2048: (8, 8, 16),
        4096: (8, 16, 16),
    },
    "v5p": {
        8: (2, 2, 1), 16: (2, 2, 2), 32: (2, 2, 4), 64: (2, 4, 4), 128: (4, 4, 4), 256: (4, 4, 8),
        384: (4, 4, 12), 512: (4, 8, 8), 640: (4, 4, 20), 768: (4, 8, 12), 896: (4, 4, 28), 1024: (8, 8, 8),
        1152: (4, 12, 12), 1280: (4, 8, 20), 1408: (4, 4, 44), 1536: (8, 8, 12), 1664: (4, 4, 52),
        1792: (4, 8, 28), 1920: (4, 12, 20), 2048: (8, 8, 16), 2176: (4, 4, 68), 2304: (8, 12, 12),
        2432: (4, 4, 76), 2560: (8, 8, 20), 2688: (4, 12, 28), 2816: (4, 8, 44), 2944: (4, 4, 92),
        3072: (8, 12, 16), 3200: (4, 20, 20), 3328: (4, 8, 52), 3456: (12, 12, 12), 3584: (8, 8, 28),
        3712: (4, 4, 116), 3840: (8, 12, 20), 3968: (4, 4, 124), 4096: (8, 16, 16), 4224: (4, 12, 44),
        4352: (4, 8, 68), 4480: (4, 20, 28), 4608: (12, 12, 16), 4736: (4, 4, 148), 4864: (4, 8, 76),
        4992: (4, 12, 52), 5120: (8, 16, 20), 5248: (4, 4, 164), 5376: (8, 12, 28), 5504: (4, 4, 172),
        5632: (8, 8, 44), 5760: (12, 12, 20), 5888: (4, 8, 92), 6016: (4, 4, 188), 6144: (12, 16, 16),
        6272: (4, 28, 28), 6400: (8, 20, 20), 6528: (4, 12, 68), 6656: (8, 8, 52), 6784: (4, 4, 212),
        6912: (12, 12, 24), 7040: (4, 20, 44), 7168: (8, 16, 28), 7296: (4, 12, 76), 7424: (4, 8, 116),
        7552: (4, 4, 236), 7680: (12, 16, 20), 7808: (4, 4, 244), 7936: (4, 8, 124), 8064: (12, 12, 28),
        8192: (16, 16, 16), 8320: (4, 20, 52), 8448: (8, 12, 44), 8704: (8, 8, 68), 8832: (4, 12, 92),
        8960: (8, 20, 28), 9216: (12, 16, 24), 9472: (4, 8, 148), 9600: (12, 20, 20), 9728: (8, 8, 76),
        9856: (4, 28, 44), 9984: (8, 12, 52), 10240: (16, 16, 20), 10368: (12, 12, 36), 10496: (4, 8, 164),
        10752: (12, 16, 28), 10880: (4, 20, 68), 11008: (4, 8, 172), 11136: (4, 12, 116), 11264: (8, 16, 44),
        11520: (12, 20, 24), 11648: (4, 28, 52), 11776: (8, 8, 92), 11904: (4, 12, 124), 12032: (4, 8, 188),
        12160: (4, 20, 76), 12288: (16, 16, 24), 13824: (12, 24, 24), 14336: (16, 16, 28),
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
        2: (1, 1, 1), 8: (2, 2, 1), 16: (2, 2, 2), 32: (2, 2, 4), 64: (2, 4, 4), 128: (4, 4, 4),
        256: (4, 4, 8), 384: (4, 4, 12), 512: (4, 8, 8), 640: (4, 4, 20), 768: (4, 8, 12), 896: (4, 4, 28),
        1024: (8, 8, 8), 1152: (4, 12, 12), 1280: (4, 8, 20), 1408: (4, 4, 44), 1536: (8, 8, 12),
        1664: (4, 4, 52), 1792: (4, 8, 28), 1920: (4, 12, 20), 2048: (8, 8, 16), 2176: (4, 4, 68),
        2304: (8, 12, 12), 2432: (4, 4, 76), 2560: (8, 8, 20), 2688: (4, 12, 28), 2816: (4, 8, 44),
        2944: (4, 4, 92), 3072: (8, 12, 16), 3200: (4, 20, 20), 3328: (4, 8, 52), 3456: (12, 12, 12),
        3584: (8, 8, 28), 3712: (4, 4, 116), 3840: (8, 12, 20), 3968: (4, 4, 124), 4096: (8, 16, 16),
        4224: (4, 12, 44), 4352: (4, 8, 68), 4480: (4, 20, 28), 4608: (12, 12, 16), 4736: (4, 4, 148),
        4864: (4, 8, 76), 4992: (4, 12, 52), 5120: (8, 16, 20), 5248: (4, 4, 164), 5376: (8, 12, 28),
        5504: (4, 4, 172), 5632: (8, 8, 44), 5760: (12, 12, 20), 5888: (4, 8, 92), 6016: (4, 4, 188),
        6144: (12, 16, 16), 6272: (4, 28, 28), 6400: (8, 20, 20), 6528: (4, 12, 68), 6656: (8, 8, 52),
        6784: (4, 4, 212), 6912: (12, 12, 24), 7040: (4, 20, 44), 7168: (8, 16, 28), 7296: (4, 12, 76),
        7424: (4, 8, 116), 7552: (4, 4, 236), 7680: (12, 16, 20), 7808: (4, 4, 244), 7936: (4, 8, 124),
        8064: (12, 12, 28), 8192: (16, 16, 16), 8320: (4, 20, 52), 8448: (8, 12, 44), 8704: (8, 8, 68),
        8832: (4, 12, 92), 8960: (8, 20, 28), 9216: (12, 16, 24), 9472: (4, 8, 148), 9600: (12, 20, 20),
        9728: (8, 8, 76), 9856: (4, 28, 44), 9984: (8, 12, 52), 10240: (16, 16, 20), 10368: (12, 12, 36),
        10496: (4, 8, 164), 10752: (12, 16, 28), 10880: (4, 20, 68), 11008: (4, 8, 172), 11136: (4, 12, 116),
        11264: (8, 16, 44), 11520: (12, 20, 24), 11648: (4, 28, 52), 11776: (8, 8, 92), 11904: (4, 12, 124),
        12032: (4, 8, 188), 12160: (4, 20, 76), 12288: (16, 16, 24), 13824: (12, 24, 24), 16384: (16, 16, 32),
        17920: (16, 20, 28), 18432: (16, 24, 24),
    },
}


# The torus: Cloud TPU closes a slice's axis into a ring (wraparound links) only where the axis spans
# whole building blocks: a 4x4x4 cube of v4/v5p/7x chips (every axis of a slice made of cubes), a
# full 16-chip row of a v5e/v6e pod. The compiler routes collectives over those links, so a slice
# compiled without them is another program (MaxText's v5p-128 step: temp 1.170x). The same rule as
# MaxText's and xpk's tables (accelerator_to_spec_map.py), checked row by row in the MaxText leg.
_CUBE = 4
_POD_ROW = 16


def wraparound(family: str, shape: tuple[int, ...]) -> tuple[bool, bool, bool]:
    """Which axes of a slice of ``shape`` (chips) close into a ring, as libtpu's ``wrap`` takes them.

    Example:
        >>> wraparound("v5p", (2, 4, 4)), wraparound("v5p", (4, 4, 4)), wraparound("7x", (4, 4, 12))
        ((False, False, False), (True, True, True), (True, True, True))
        >>> wraparound("v5e", (8, 16)), wraparound("v6e", (16, 16)), wraparound("v5e", (4, 4))
        ((False, True, False), (True, True, False), (False, False, False))
    """
    if len(shape) == 3:  # v4, v5p, 7x: a slice of whole cubes is a 3-D torus; anything smaller, a mesh.
        whole = all(n % _CUBE == 0 for n in shape)
        return (whole, whole, whole)
    return (*(n == _POD_ROW for n in shape), False)


# jax's names of the TPU chips (``pltpu.ChipVersion``), by family.
_JAX_CHIP_VERSIONS = {"v4": "TPU_V4", "v5e": "TPU_V5E", "v5p": "TPU_V5P", "v6e": "TPU_V6E", "7x": "TPU_7X"}


def tpu_devices(
    libtpu_name: str, chip_config: str, chips_per_host_bounds: tuple[int, ...], num_slices: int, *,
    wrap: tuple[bool, bool, bool] = (False, False, False),
) -> list[Any]:
    """libtpu's deviceless devices for ``num_slices`` slices of ``libtpu_name`` (``"v5e:4x4"``), each
    slice's axes closed into rings where ``wrap`` says (:func:`wraparound`). The devices are the same
    either way (ids, coordinates); the compiler they are compiled for is not."""
    from jax.experimental import topologies  # Deferred: loads jax's backends.

    try:
        with _runtime.quiet_compiler_stderr():
            desc = topologies.get_topology_desc(
                platform="tpu",
                topology_name=libtpu_name,
                chip_config_name=chip_config,
                chips_per_host_bounds=chips_per_host_bounds,
                num_slices=num_slices,
                wrap=tuple(wrap),
            )
    except Exception as e:
        if "Failed to open" in str(e) or "load_pjrt_plugin" in str(e):  # The library, not the topology.
            raise _runtime.HostError(libtpu_load_failure(str(e))) from None
        raise
    return list(desc.devices)


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
