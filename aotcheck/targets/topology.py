"""Targets by name: ``Topology`` (one slice, one NVLink domain, or host devices) and ``Target`` (slices of it).

A user names a TPU slice the way Cloud TPU does (``v4-8``, ``v5e-16``, ``v5p-128``,
``v6e-256``, ``7x-8``; the table is :mod:`aotcheck.targets.tpu`). A GPU target is named
by its model and its NVLink domain (``h100-8``: one host of 8; ``gb200-72``: one NVL72 rack; the
table is :mod:`aotcheck.targets.gpu`); several hosts are several "slices" (``h100-8x2``, also written
``h100-16``): the network between them plays DCN's part. This module reads those names (with the
closest valid one when a name is wrong), checks slice counts and the bounds on a target, and writes
and reads a target's text form (its JSON too).

Example:
    >>> from aotcheck.targets.topology import parse_topology, split_target
    >>> t = parse_topology("v5litepod-16")
    >>> t.name, t.libtpu_name, t.num_devices
    ('v5e-16', 'v5e:4x4', 16)
    >>> h100 = parse_topology("h100-8")
    >>> h100.platform.name, h100.family, h100.num_devices, h100.device.memory_bytes
    ('gpu', 'h100', 8, 84942979072)
    >>> [(t.name, hosts) for t, hosts in [split_target("h100-16")]]
    [('h100-8', 2)]
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Sequence
from typing import Any

from aotcheck import records
from aotcheck.errors import ConfigError
from aotcheck.units import fmt_bytes, fmt_count, read_count
from aotcheck.targets.gpu import GPUS, Gpu
from aotcheck.targets.platform import CPU, GPU, HOST_DEVICE, TPU, DeviceSpec, Platform
from aotcheck.targets.tpu import CHIPS, SHAPES, Chip, wraparound

ALIASES = {**TPU.aliases, **GPU.aliases}  # Every platform's other names of its families.


class TopologyError(ConfigError):
    """A topology name or slice count that aotcheck cannot use."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """One slice of TPU devices, one NVLink domain of GPUs, or host CPU devices, as a user names it.

    Code past ``targets/`` asks a topology what it needs (its platform, its device's capacity and
    rates), never which platform or chip it is.

    Attributes:
        name: Canonical user-facing name, e.g. ``"v5e-16"``, ``"h100-8"`` or ``"cpu-8"``.
        platform: The kind of compiler that builds its programs (:mod:`aotcheck.targets.platform`).
        family: The chip family or GPU model (``"v5e"``, ``"h100"``), or ``"cpu"``: what a compile
            worker is kept per.
        shape: Physical shape in chips (TPU), ``(hosts, GPUs per host)`` (GPU) or ``(N,)`` (CPU).
        num_devices: JAX devices in one slice.
        device: One device's capacity and peak rates.
        hardware: The TPU generation or GPU model's table row (None for ``cpu-N``); read only in ``targets/``.
    """

    name: str
    platform: Platform
    family: str
    shape: tuple[int, ...]
    num_devices: int
    device: DeviceSpec = HOST_DEVICE
    hardware: Chip | Gpu | None = None

    @property
    def vmem_bytes(self) -> int | None:
        """One TensorCore's VMEM (no Pallas kernel's scoped VMEM limit goes past it); None off TPUs.

        Example:
            >>> [parse_topology(n).vmem_bytes for n in ("v5e-1", "v4-8", "h100-8")]
            [134217728, 16777216, None]
        """
        return self.hardware.vmem_bytes if isinstance(self.hardware, Chip) else None

    @property
    def smem_bytes(self) -> int | None:
        """One TensorCore's SMEM, from jax's table when asked (it imports Pallas); None off TPUs or without one."""
        return self.hardware.smem_bytes if isinstance(self.hardware, Chip) else None

    @property
    def num_chips(self) -> int:
        return math.prod(self.shape)

    @property
    def libtpu_name(self) -> str:
        """The ``topology_name`` libtpu takes, e.g. ``"v5e:4x4"``."""
        if not isinstance(self.hardware, Chip):
            raise TopologyError(f"{self.name} is not a TPU topology; it has no libtpu name")
        return f"{self.hardware.libtpu_prefix}:{'x'.join(map(str, self.shape))}"

    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int]:
        """Chips per host: 2x2x1 except on single-chip slices."""
        return (1, 1, 1) if self.num_chips == 1 else (2, 2, 1)

    @property
    def wraparound(self) -> tuple[bool, bool, bool]:
        """Which axes of the slice close into a ring (:func:`aotcheck.targets.tpu.wraparound`); none off TPUs.

        Example:
            >>> [parse_topology(n).wraparound for n in ("v5p-64", "v5p-128", "v5e-128", "h100-8")]
            [(False, False, False), (True, True, True), (False, True, False), (False, False, False)]
        """
        if not isinstance(self.hardware, Chip):
            return (False, False, False)
        return wraparound(self.family, self.shape)

    def spelled(self, tool: str) -> str:
        """Its name as ``tool`` spells it (its platform's spellings: MaxText's ``tpu7x-8`` for ``7x-8``).

        Example:
            >>> parse_topology("7x-8").spelled("maxtext"), parse_topology("v5e-16").spelled("maxtext")
            ('tpu7x-8', 'v5e-16')
        """
        return self.platform.spelled(self.family, tool) + self.name[len(self.family):]

    def listing(self) -> dict[str, Any]:
        """Its row of ``aotcheck topologies --json``: the compiler's name for it, the chip config or GPU,
        and one device's figures in words.

        Example:
            >>> row = parse_topology("h100-8").listing()
            >>> row["cuda_topology"], row["device_kind"], row["hbm_per_device"], row["platform"]
            ('1x1x8', 'NVIDIA H100 80GB HBM3', '79.11 GiB', 'gpu')
        """
        row: dict[str, Any] = {"name": self.name, "libtpu_name": None, "chip_config": None}
        if isinstance(self.hardware, Chip):
            row.update(libtpu_name=self.libtpu_name, chip_config=self.hardware.chip_config,
                       chips_per_host="x".join(map(str, self.chips_per_host_bounds)),
                       wraparound="".join(axis for axis, w in zip("xyz", self.wraparound) if w) or "none")
        elif isinstance(self.hardware, Gpu):
            row["chips_per_host"] = self.shape[1]
        row.update(chips=self.num_chips, devices=self.num_devices, hbm_per_device=fmt_bytes(self.device.memory_bytes),
                   peak_bf16_flops_per_device=fmt_count(self.device.peak_flops),
                   hbm_bandwidth_per_device=fmt_bytes(self.device.bandwidth) + "/s", platform=self.platform.name)
        if isinstance(self.hardware, Gpu):  # XLA's CUDA topology (partitions x hosts x GPUs) and the device's name.
            row.update(cuda_topology=f"1x{self.shape[0]}x{self.shape[1]}", device_kind=self.hardware.device_name)
        return row


def _tpu_topology(family: str, n: int) -> Topology:
    chip = CHIPS[family]
    shape = SHAPES[family][n]
    return Topology(f"{family}-{n}", TPU, family, shape, math.prod(shape) * chip.devices_per_chip, chip.device, chip)


def _gpu_topology(family: str, n: int) -> Topology:
    gpu = GPUS[family]
    hosts = max(1, n // gpu.gpus_per_host)
    return Topology(f"{family}-{n}", GPU, family, (hosts, n // hosts), n, gpu.device, gpu)


def _cpu_topology(n: int) -> Topology:
    return Topology(f"cpu-{n}", CPU, "cpu", (n,), n)


def topologies(platform: Platform | None = None) -> list[Topology]:
    """Every topology in the tables (``platform``'s only, when given): TPU slices by family then size,
    then GPU NVLink domains by model then size (``cpu-N`` for 1 <= N <= :data:`MAX_CPU_DEVICES` is valid too).

    Example:
        >>> [t.name for t in topologies()][:2], [t.name for t in topologies(GPU)][:2]
        (['v4-8', 'v4-16'], ['a100-1', 'a100-2'])
    """
    every = [*(_tpu_topology(f, n) for f in SHAPES for n in sorted(SHAPES[f])),
             *(_gpu_topology(f, n) for f, gpu in GPUS.items() for n in gpu.domain_sizes)]
    return [t for t in every if platform is None or t.platform == platform]


def topology_names(platform: Platform | None = None) -> list[str]:
    """Every valid topology name (``platform``'s only, when given)."""
    return [t.name for t in topologies(platform)]


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
        family = ALIASES.get(match["family"], match["family"])
        n = read_count(match["n"])
        if family == "cpu" and n >= 1:
            if n > MAX_CPU_DEVICES:
                raise TopologyError(too_many_cpu_devices(f"cpu-{n}", n))
            return _cpu_topology(n)
        if family in SHAPES and n in SHAPES[family]:
            return _tpu_topology(family, n)
        if family in GPUS:
            return _parse_gpu(str(name), family, n)
        if family in SHAPES:
            sizes = sorted(SHAPES[family])
            nearest = sorted(sizes, key=lambda s: (abs(math.log(s) - math.log(max(n, 1))), s))[:3]
            raise TopologyError(
                f"Unknown topology {name!r}. Closest valid names: "
                f"{', '.join(f'{family}-{s}' for s in sorted(nearest))}. "
                f"{family} slices come in sizes {', '.join(map(str, sizes))}."
            )
    close = difflib.get_close_matches(text, topology_names(), n=5, cutoff=0.5)
    best = closest_name(text)  # The closest family at the closest size first (v9-8: v5p-8).
    close = ([best] if best else []) + [c for c in close if c != best][:5 - bool(best)]
    hint = f" Closest valid names: {', '.join(close)}." if close else ""
    families = ", ".join(f"{f}-N" for f in [*SHAPES, *GPUS])
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
        family, n = ALIASES.get(match["family"], match["family"]), max(read_count(match["n"]), 1)
        if family not in (*SHAPES, *GPUS, "cpu"):  # v9-8: the closest family, at the closest size.
            family = next(iter(difflib.get_close_matches(family, [*SHAPES, *GPUS, *ALIASES], n=1, cutoff=0.4)), "")
            family = ALIASES.get(family, family)
        sizes = sorted(SHAPES[family]) if family in SHAPES else list(GPUS[family].domain_sizes) \
            if family in GPUS else [1, MAX_CPU_DEVICES] if family == "cpu" else []
        if family == "cpu":
            return f"cpu-{min(n, MAX_CPU_DEVICES)}{suffix}"
        if sizes:
            return f"{family}-{min(sizes, key=lambda s: (abs(math.log(s / n)), s))}{suffix}"
    names = topology_names()
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


def too_many_cpu_devices(name: str, n: int) -> str:
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
        if self.topology.platform is CPU and self.num_devices > MAX_CPU_DEVICES:
            raise TopologyError(too_many_cpu_devices(self.name, self.num_devices))
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
        slices = check_num_slices(read_count(match["slices"]))
        gpus = _NAME_RE.match(match["topo"].lower())
        if gpus and gpus["family"] in GPUS and _gpu_target_text(gpus["family"], read_count(gpus["n"])):
            # a100-16x2: 2 x a100-16, and a100-16 is already 2 hosts of a100-8: said in the one spelling.
            family, n = gpus["family"], read_count(gpus["n"])
            domain = max(GPUS[family].domain_sizes)
            unit = "hosts" if domain == GPUS[family].gpus_per_host else "domains"
            raise TopologyError(f"{text.strip()} asks for {slices} x {family}-{n}, and {family}-{n} is already "
                                f"{n // domain} x {family}-{domain} ({unit} joined by the network, as slices are): that "
                                f"is {n // domain * slices} x {family}-{domain}; "
                                f"{_spell_target(family, domain, n // domain * slices)}")
        return parse_topology(match["topo"]), slices
    gpus = _NAME_RE.match(text.strip().lower())
    target = _gpu_target_text(gpus["family"], read_count(gpus["n"])) if gpus and gpus["family"] in GPUS else None
    if target:  # h100-16: two hosts of h100-8.
        return split_target(target)
    return parse_topology(text), None


def expand_targets(texts: Sequence[str], slices: Sequence[int] = (1,)) -> list[Target]:
    """Targets for topology texts: ``v5e-16`` takes every count in ``slices``, ``v5e-16x2`` just 2.

    Example:
        >>> [t.name for t in expand_targets(["v4-8", "v5e-16x2", "v4-8x2"], [1, 2])]
        ['v4-8x1', 'v4-8x2', 'v5e-16x2']
    """
    pairs = [split_target(text) for text in texts]
    return list(dict.fromkeys(Target(topology, check_num_slices(n)) for topology, fixed in pairs
                              for n in ([fixed] if fixed else slices)))


records.leaf(Target, lambda target: target.name, Target.parse)  # A target's JSON is its name (v5e-16x2).
