"""What kind of compiler builds a target's programs, and what one of its devices holds and does.

A :class:`Platform` is one of three frozen values (:data:`TPU`, :data:`GPU`, :data:`CPU`), each
saying what code past ``targets/`` would otherwise ask by comparing strings: the compiler's name in
words, the packages that pin its figures, a compile worker's environment, the other platform's flag
prefix, whether its compiler carries state from one chip family to the next, and which families want
a fresh worker per case. A :class:`DeviceSpec` is one device's capacity and peak rates (None on host
CPU devices: no memory to fit, no peak to bound a step).

Example:
    >>> from aotcheck.targets.platform import GPU, TPU, platform_named
    >>> platform_named("tpu") is TPU, str(GPU), GPU.compiler, TPU.foreign_flag_prefix
    (True, 'gpu', "the CUDA plugin's XLA", 'xla_gpu_')
    >>> sorted(GPU.toolchain())
    ['jax', 'jax-cuda12-pjrt', 'jaxlib']
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

from aotcheck import _runtime
from aotcheck.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One device (a JAX device: a TPU core or chip, a GPU) as the verdicts see it.

    Attributes:
        memory_bytes: Its HBM capacity (the HBM verdict's denominator).
        memory_limit_bytes: What the compiler lets a program use (a little below the capacity on TPUs;
            the capacity itself on GPUs, whose compiler never refuses for size).
        peak_flops: Peak bf16 FLOP/s (dense).
        bandwidth: HBM bytes/s.
        source: Where the figures come from.
        runtime_limit_bytes: What the runtime lets a process hold on the device, its buffers and programs
            together (a TPU's ``memory_stats()["bytes_limit"]``, 2 MiB below the compiler's limit on v5e);
            None: the compiler's limit.
        runtime_limit_evidence: How that was found: ``"measured"`` (read on a chip), ``"published"``
            (public logs and tools agree with it), ``"inferred"`` (the measured chip's rule applied).
        runtime_limit_source: Where, in words.
        scoped_vmem_bytes: The compiler's default scoped VMEM limit of one kernel (its
            ``xla_tpu_scoped_vmem_limit_kib`` unset); None off TPUs.
    """

    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    peak_flops: float | None = None
    bandwidth: float | None = None
    source: str = ""
    runtime_limit_bytes: int | None = None
    runtime_limit_evidence: str = ""
    runtime_limit_source: str = ""
    scoped_vmem_bytes: int | None = None

    @property
    def runtime_bytes(self) -> int | None:
        """What a process may hold on the device at run time (the runtime's limit, else the compiler's)."""
        return self.runtime_limit_bytes if self.runtime_limit_bytes is not None else self.memory_limit_bytes


HOST_DEVICE = DeviceSpec(source="this host's CPU devices: no HBM to fit, no peak rate to bound a step")


def _empty() -> Mapping[str, Any]:
    # A read-only empty mapping per field: Python 3.11's dataclasses refuse an unhashable default.
    return MappingProxyType({})


@dataclasses.dataclass(frozen=True, eq=False)  # One value per platform: equal only to itself, hashed so.
class Platform:
    """One compiler's kind of target.

    Attributes:
        name: ``"tpu"``, ``"gpu"`` or ``"cpu"``: its JSON form (``platforms=`` of a config, ``--json``).
        compiler: The compiler in words, for a refusal (``"this libtpu"``).
        upgrade: What a user upgrades when that compiler crashes (``"libtpu"``).
        compiler_package: The package whose version pins its figures beside jax and jaxlib.
        foreign_flag_prefix: The *other* platform's compiler flags (never sent to this one).
        state_crosses_families: Whether its compiler carries state from one chip family's compiles to
            the next family's in one process (libtpu: hence one worker process per family).
        fresh_worker_families: Families whose compiles depend on what their process compiled before
            within the family (libtpu 0.0.42.1's 7x): each case gets a fresh worker.
        worker_env: What a compile worker sets over its parent's environment (``environment`` as a dict).
        extra: The extra of aotcheck's that installs its compiler (``aotcheck[cuda]``), if any.
        logs_warnings: Whether its compiler's warnings are read per compile (libtpu logs them to its own
            files; the CUDA plugin prints them to stderr, where aotcheck cannot tell one compile's apart).
        host_devices: Whether its devices are this host's own (their count is fixed by the environment a
            process starts with, so its worker starts once that is set, and has no compiler to warm up).
        presets: aotcheck's compiler-option presets for every family, ``family_presets`` a family's own
            over them, ``multi_slice_presets`` over both on a target of several slices (none: no presets).
        aliases: Other names of its families a user may write (``v5litepod`` for ``v5e``).
        spellings: How another tool spells a family in a topology's name (MaxText's ``tpu7x``).
        toolchain_last: Whether its compiler's version comes after the others' where versions are listed.
        memory_fraction: The share of a device's memory a process gets where none is set, and the
            environment variable that sets it (JAX on GPUs: 0.75, ``XLA_PYTHON_CLIENT_MEM_FRACTION``); None:
            the compiler's limit is what a process may use (TPU).
        runtime_reserves_temporaries: Whether its runtime holds temporaries as one reservation sized to the
            program running, beside that program's live inputs and outputs, and evicts idle programs' code
            when memory runs short (libtpu, measured on a v5e chip with libtpu 0.0.42.1); else a pool the
            largest program's temporaries come from, every program's code resident (XLA's GPU client).
    """

    name: str
    compiler: str
    upgrade: str
    compiler_package: str
    foreign_flag_prefix: str | None = None
    state_crosses_families: bool = False
    fresh_worker_families: frozenset[str] = frozenset()
    worker_env: tuple[tuple[str, str], ...] = (("JAX_PLATFORMS", "cpu"),)
    extra: str | None = None
    host_devices: bool = False
    logs_warnings: bool = False
    presets: Mapping[str, str] = dataclasses.field(default_factory=_empty)
    family_presets: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=_empty)
    multi_slice_presets: Mapping[str, str] = dataclasses.field(default_factory=_empty)
    aliases: Mapping[str, str] = dataclasses.field(default_factory=_empty)
    spellings: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=_empty)
    toolchain_last: bool = False
    memory_fraction: tuple[float, str] | None = None
    runtime_reserves_temporaries: bool = False

    @property
    def option_presets(self) -> bool:
        """Whether aotcheck keeps compiler-option presets for it (libtpu's)."""
        return bool(self.presets)

    def preset_options(self, family: str, num_slices: int = 1) -> dict[str, str]:
        """Every preset for a target of ``family`` over ``num_slices`` slices (before asking what the
        running compiler accepts).

        Example:
            >>> TPU.preset_options("v6e")["xla_tpu_scoped_vmem_limit_kib"], GPU.preset_options("h100")
            ('98304', {})
        """
        if not self.presets:
            return {}
        return {**self.presets, **self.family_presets.get(family, {}),
                **(self.multi_slice_presets if num_slices > 1 else {})}

    def spelled(self, family: str, tool: str) -> str:
        """``family`` as ``tool`` spells it in a topology's name (itself where the tool agrees).

        Example:
            >>> TPU.spelled("7x", "maxtext"), TPU.spelled("v5e", "maxtext")
            ('tpu7x', 'v5e')
        """
        return self.spellings.get(tool, {}).get(family, family)

    @property
    def environment(self) -> dict[str, str]:
        """What a compile worker sets over its parent's environment."""
        return dict(self.worker_env)

    def toolchain(self) -> dict[str, str | None]:
        """The versions its goldens record: jax, jaxlib and its compiler's package."""
        return _runtime.toolchain(self.compiler_package)

    def __str__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # One value per platform: a copy, or one unpickled in another process, is the same object (`is TPU`).
        return (platform_named, (self.name,))


# Every worker compiles for deviceless targets only, which need no runtime: JAX_PLATFORMS=cpu, whatever
# the user's says. The CUDA plugin compiles without a GPU only with its runtime off (it would look for a
# driver and cuDNN); a TPU worker under a user's JAX_PLATFORMS=cuda on a host without CUDA would start
# that runtime and print the plugin's cuDNN tracebacks on every run.
# Production presets for TPU training (from MaxText's and axlearn's launch flags).
_TPU_PRESETS = MappingProxyType({
    "xla_tpu_enable_latency_hiding_scheduler": "true",
    "xla_tpu_spmd_rng_bit_generator_unsafe": "true",
    "xla_tpu_enable_async_collective_fusion": "true",
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": "true",
    "xla_tpu_enable_async_collective_fusion_multiple_steps": "true",
    "xla_tpu_overlap_compute_collective_tc": "true",
    "xla_enable_async_all_gather": "true",
})
_TPU_MULTI_SLICE_PRESETS = MappingProxyType({
    # Overlaps the cross-slice (DCN) gradient all-reduce with compute.
    "xla_tpu_enable_data_parallel_all_reduce_opt": "true",
    "xla_tpu_data_parallel_opt_different_sized_ops": "true",
})

TPU = Platform(
    "tpu", compiler="this libtpu", upgrade="libtpu", compiler_package=_runtime.LIBTPU,
    foreign_flag_prefix="xla_gpu_", state_crosses_families=True,
    presets=_TPU_PRESETS, multi_slice_presets=_TPU_MULTI_SLICE_PRESETS,
    family_presets=MappingProxyType({"v6e": {"xla_tpu_scoped_vmem_limit_kib": "98304"}}),  # As axlearn ships for v6e.
    # Cloud TPU's accelerator types and MaxText's names: v5litepod-16, tpu7x-8 (v5 for v5p, as gcloud once had it).
    aliases=MappingProxyType({"v5litepod": "v5e", "tpu7x": "7x", "v5": "v5p"}),
    spellings=MappingProxyType({"maxtext": {"7x": "tpu7x"}}),
    # With libtpu 0.0.42.1, whether a 7x program crashes the compiler depends on what its process compiled
    # before (lm-tiny prefill@7x-8x2 compiles alone, and crashes after prefill@7x-8x1). A worker start
    # is a few seconds against 7x compiles of tens of seconds.
    fresh_worker_families=frozenset({"7x"}),
    logs_warnings=True,
    runtime_reserves_temporaries=True,
)
GPU = Platform("gpu", compiler="the CUDA plugin's XLA", upgrade="jax and its CUDA plugin",
               compiler_package=_runtime.CUDA_COMPILER, foreign_flag_prefix="xla_tpu_", extra="cuda",
               toolchain_last=True,  # The CUDA plugin's version last, as the header has always said it.
               memory_fraction=(0.75, "XLA_PYTHON_CLIENT_MEM_FRACTION"))
# Host CPU devices: compiled by XLA's CPU backend, which comes with jaxlib; goldens record libtpu too,
# as they always have.
CPU = Platform("cpu", compiler="XLA", upgrade="jax", compiler_package=_runtime.LIBTPU, host_devices=True)

PLATFORMS: Mapping[str, Platform] = MappingProxyType({p.name: p for p in (TPU, GPU, CPU)})


def platform_named(name: str | Platform) -> Platform:
    """The platform of a name (``"tpu"``), checked.

    Example:
        >>> platform_named("npu")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        aotcheck.errors.ConfigError: Unknown platform 'npu': the platforms are tpu, gpu, cpu.
    """
    if isinstance(name, Platform):
        return name
    if name not in PLATFORMS:
        raise ConfigError(f"Unknown platform {name!r}: the platforms are {', '.join(PLATFORMS)}.")
    return PLATFORMS[name]
