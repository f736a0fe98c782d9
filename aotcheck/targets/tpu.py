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

    @property
    def device(self) -> DeviceSpec:
        """One device's capacity and peak rates."""
        return DeviceSpec(self.hbm_bytes, self.hbm_limit_bytes, self.peak_bf16_flops, self.hbm_bandwidth, self.source)

    @property
    def vmem_bytes(self) -> int | None:
        """One TensorCore's VMEM (no Pallas kernel's scoped VMEM limit goes past it), from jax's table of
        TPU cores (``pltpu.get_tpu_info_for_chip``); None where this jax has no table."""
        version = _JAX_CHIP_VERSIONS.get(self.family)
        if version is None:
            return None
        try:
            from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415  (asked only when a kernel overflows)

            return int(pltpu.get_tpu_info_for_chip(getattr(pltpu.ChipVersion, version), 1).vmem_capacity_bytes)
        except Exception:  # An older jax without the table, or without this chip in it.
            return None


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
ALIASES = {"v5litepod": "v5e", "tpu7x": "7x", "v5": "v5p"}

# Physical shapes (chips) by family and N. Every row is checked against its own
# name by the tests, and a sample against libtpu's device count.
SHAPES: dict[str, dict[int, tuple[int, ...]]] = {
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


# jax's names of the TPU chips (``pltpu.ChipVersion``), by family.
_JAX_CHIP_VERSIONS = {"v4": "TPU_V4", "v5e": "TPU_V5E", "v5p": "TPU_V5P", "v6e": "TPU_V6E", "7x": "TPU_7X"}


def tpu_devices(
    libtpu_name: str, chip_config: str, chips_per_host_bounds: tuple[int, ...], num_slices: int
) -> list[Any]:
    """libtpu's deviceless devices for ``num_slices`` slices of ``libtpu_name`` (``"v5e:4x4"``)."""
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
