"""Deviceless devices for a target: libtpu's for TPU slices, the CUDA plugin's for GPUs, this host's CPUs.

Example:
    >>> from aotcheck.targets.devices import get_devices_for_topology
    >>> devices, per_slice = get_devices_for_topology("cpu-4", num_slices=2)
    >>> len(devices), per_slice
    (8, 4)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from aotcheck import _runtime
from aotcheck.targets import gpu
from aotcheck.targets.platform import CPU, GPU
from aotcheck.targets.topology import MAX_CPU_DEVICES, Topology, TopologyError, check_num_slices, parse_topology, too_many_cpu_devices
from aotcheck.targets.tpu import tpu_devices


class TopologyDevices(NamedTuple):
    """What :func:`get_devices_for_topology` returns."""

    devices: list[Any]
    devices_per_slice: int


class NoChip(TopologyError):
    """This host has no TPU for what asks for one (``aotcheck calibrate``)."""


# jax's device_kind of each TPU family's chips (as libtpu's deviceless devices say them too).
DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v6 lite": "v6e",
                "TPU7x": "7x"}
_ON_THIS_HOST: list[bool] = []


def local_tpu_topology() -> Topology:
    """The topology of this host's own TPU chips (``v5e-1`` on one v5e chip), or :class:`NoChip`
    saying what jax sees instead. Starts jax's TPU backend: the process then holds the chips."""
    import jax  # noqa: PLC0415

    try:
        devices = jax.devices("tpu")
    except RuntimeError as e:
        seen = ", ".join(sorted({d.platform for d in jax.devices()})) or "no devices"
        raise NoChip(f"this host has no TPU: jax sees {seen} ({str(e).splitlines()[0]})") from None
    kind = devices[0].device_kind
    family = DEVICE_KINDS.get(kind)
    if family is None:
        raise NoChip(f"this host's TPU is a {kind!r}, which aotcheck's table does not name")
    units = {"v4": 2, "v5p": 2}.get(family, 1)  # v4-8 and v5p-8 count TensorCores: 2 per chip.
    return parse_topology(f"{family}-{len(devices) * units}")


@contextlib.contextmanager
def on_this_host() -> Iterator[None]:
    """While inside, a TPU target's devices are this host's own chips where they are that target
    (``aotcheck calibrate`` compiles and runs a case on the chip it is held against), not libtpu's
    deviceless ones."""
    _ON_THIS_HOST.append(True)
    try:
        yield
    finally:
        _ON_THIS_HOST.pop()


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
    if topo.platform is CPU:
        return TopologyDevices(_cpu_devices(topo.num_devices * num_slices), topo.num_devices)
    if topo.platform is GPU:
        return TopologyDevices(_gpu_devices(topo, num_slices), topo.num_devices)
    if _ON_THIS_HOST and num_slices == 1 and local_tpu_topology().name == topo.name:
        import jax  # noqa: PLC0415

        return TopologyDevices(list(jax.devices("tpu")), topo.num_devices)
    if not _runtime.libtpu_available():
        raise TopologyError(
            f"Compiling for {topo.name} needs XLA's TPU compiler, which comes with the "
            "'libtpu' package: pip install 'jax[tpu]' (at the version aotcheck pins). "
            "Without it, use a host topology such as cpu-8."
        )
    devices = tpu_devices(topo.libtpu_name, topo.hardware.chip_config, topo.chips_per_host_bounds, num_slices,
                          wrap=topo.wraparound)
    expected = topo.num_devices * num_slices
    if len(devices) != expected:  # The table and libtpu disagree: a bug in the table.
        raise TopologyError(
            f"libtpu gave {len(devices)} devices for {topo.name} x{num_slices} "
            f"({topo.libtpu_name}); the topology table expects {expected}."
        )
    return TopologyDevices(devices, topo.num_devices)


def _gpu_devices(topo: Topology, num_slices: int) -> list[Any]:
    hosts, per_host = topo.shape
    try:
        devices = gpu.gpu_devices(topo.hardware.device_name, partitions=num_slices, hosts=hosts, gpus_per_host=per_host)
    except gpu.GpuPluginError as e:
        raise _runtime.HostError(f"{topo.name}: {e}") from None
    expected = topo.num_devices * num_slices
    kinds = {d.device_kind for d in devices}
    if len(devices) != expected or kinds != {topo.hardware.device_name}:  # A bug in the table.
        raise TopologyError(f"The CUDA plugin gave {len(devices)} devices ({', '.join(sorted(kinds))}) for {topo.name} "
                            f"x{num_slices}; the topology table expects {expected} x {topo.hardware.device_name!r}.")
    return devices


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
        raise TopologyError(too_many_cpu_devices(f"cpu-{count}", count))
    reserve_cpu_devices(count)
    devices = jax.devices("cpu")
    if len(devices) < count:
        raise TopologyError(
            f"cpu-{count} needs {count} host CPU devices but JAX already started with "
            f"{len(devices)}. Set JAX_NUM_CPU_DEVICES={count} before JAX initializes."
        )
    return list(devices[:count])


def host_device() -> Any:
    """One of this host's CPU devices, whatever the targets: its client runs XLA's analyses that need a
    client but no accelerator (figures/program.py's cost model of a GPU executable)."""
    import jax

    return jax.devices(CPU.name)[0]


# What code asks jax about the devices it runs on, answered as the target while tracing as it.
_ASKED = ("devices", "local_devices", "device_count", "local_device_count", "default_backend")


@contextlib.contextmanager
def traced_as(devices: Sequence[Any], topology: Topology) -> Iterator[None]:
    """While inside, ``jax.devices()``, ``jax.local_devices()``, ``jax.device_count()``,
    ``jax.local_device_count()`` and ``jax.default_backend()`` answer with ``devices`` (a target's
    deviceless devices) and its platform, as they would on the target: code that asks what chip it
    runs on (jax's ragged paged attention reads ``jax.devices()[0].device_kind`` for its block sizes;
    a model takes its Pallas path on ``"tpu"``) traces as it would there. A call naming another
    backend (``jax.devices("cpu")``) still gets this host's. Nothing changes for a host target.

    Example:
        >>> import jax
        >>> target = parse_topology("v5e-8")
        >>> with traced_as(get_devices_for_topology(target).devices, target):
        ...     jax.default_backend(), jax.device_count(), jax.devices()[0].device_kind
        ('tpu', 8, 'TPU v5 lite')
        >>> jax.default_backend()
        'cpu'
    """
    platform = topology.platform
    if platform is CPU:
        yield
        return
    import jax  # noqa: PLC0415  (as the functions above: jax loaded when devices are asked for)

    original = {name: getattr(jax, name) for name in _ASKED}
    mine = list(devices)

    def ours(backend: Any) -> bool:
        return backend is None or backend == platform.name

    answers = {
        "devices": lambda backend=None: list(mine) if ours(backend) else original["devices"](backend),
        "local_devices": lambda process_index=None, backend=None, host_id=None: list(mine) if ours(backend)
        else original["local_devices"](process_index, backend, host_id),
        "device_count": lambda backend=None: len(mine) if ours(backend) else original["device_count"](backend),
        "local_device_count": lambda backend=None: len(mine) if ours(backend)
        else original["local_device_count"](backend),
        "default_backend": lambda: platform.name,
    }
    try:
        for name, answer in answers.items():
            setattr(jax, name, answer)
        yield
    finally:
        for name, fn in original.items():
            setattr(jax, name, fn)
