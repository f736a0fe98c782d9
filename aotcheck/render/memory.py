"""Out of memory, in any space, in words: from the :class:`aotcheck.errors.Overflow` the compile read
from XLA's refusal (never XLA's text again): HBM (a GPU's memory too) with XLA's breakdown and its
largest allocations, or an op's VMEM or SMEM with its line and how the limit is raised where it can be.

Example (XLA's short HBM form, libtpu 0.0.50.1, as :func:`aotcheck.programs.oom.overflow_of` reads it):
    >>> hbm = Overflow("hbm", 20 * 2**30, int(15.75 * 2**30), breakdown={"HLO temporaries": 20 * 2**30})
    >>> print(oom_words(hbm, "v5e-1"))
    does not fit: XLA needs 20.00 GiB for HLO temporaries of the 15.75 GiB HBM a device can use on v5e-1: 127%
"""

from __future__ import annotations

import math

from aotcheck.errors import Allocation, Overflow
from aotcheck.figures.fit import Fit
from aotcheck.targets.topology import Topology, parse_topology
from aotcheck.units import fmt_bytes

# How the spaces read, and which scoped limits a launch flag raises (libtpu's flag, in KiB).
_SPACE_NAMES = {"vmem": "VMEM", "smem": "SMEM", "cmem": "CMEM", "sflag": "sync flags"}
_SCOPED_FLAG = {"vmem": "xla_tpu_scoped_vmem_limit_kib"}
_ROOM = 4 * 2**20  # A scoped limit advised is a multiple of this (see explain_overflow).


def space_name(space: str) -> str:
    """``vmem`` -> ``VMEM``: a memory space as TPU documentation writes it."""
    return _SPACE_NAMES.get(space.lower(), space.upper())


def _op(overflow: Overflow) -> str:
    """``the Pallas kernel jit(f)/pallas_call at model.py:12 (XLA's %f.1)``."""
    who = "the Pallas kernel" if overflow.kernel else "the op"
    name = overflow.op_name or (f"XLA calls %{overflow.instruction}" if overflow.instruction else "XLA does not name")
    where = f" at {overflow.source}" if overflow.source else " (XLA names no source line)"
    xla = f" (XLA's %{overflow.instruction})" if overflow.op_name and overflow.instruction else ""
    return f"{who} {name}{where}{xla}"


def overflow_phrase(overflow: Overflow) -> str:
    """What overflowed, in a few words, for a line that is about something else (a fit search's).

    Example:
        >>> overflow_phrase(Overflow("vmem", 2**27, 2**24, "scoped", op_name="jit(f)/pallas_call", kernel=True))
        'the Pallas kernel jit(f)/pallas_call (XLA names no source line) needs 128.00 MiB of VMEM, over its scoped limit of 16.00 MiB'
    """
    space = space_name(overflow.space)
    limit = "its scoped limit" if overflow.limit == "scoped" else f"the {space} there is"
    return (f"{_op(overflow)} needs {fmt_bytes(overflow.size_bytes)} of {space}, "
            f"over {limit} of {fmt_bytes(overflow.limit_bytes)}")


def explain_overflow(overflow: Overflow, topology: str | Topology, *, fit: Fit | None = None) -> str:
    """XLA's refusal of an op for a memory space other than HBM, in words: the space, the size, the
    limit, the op and its line, and how the limit is raised where it can be (never an HBM table: HBM
    is not what overflowed). With ``fit`` (a fit search that ran after it), whether it depends on the size.

    Example (the refusal the E1001 example of :func:`aotcheck.programs.oom.overflow_of` reads):
        >>> vmem = Overflow("vmem", 2**27, 2**24, "scoped", 2**27 - 2**24, instruction="f.1",
        ...                 op_name="jit(f)/pallas_call", op_shape="f32[4096,4096]", kernel=True, source="kernels.py:30")
        >>> print(explain_overflow(vmem, "v5e-1"))  # doctest: +NORMALIZE_WHITESPACE
        does not fit in VMEM on v5e-1: the Pallas kernel jit(f)/pallas_call at kernels.py:30 (XLA's %f.1)
        needs a scoped VMEM allocation of 128.00 MiB; the scoped VMEM limit is 16.00 MiB (over by 112.00 MiB).
        This is the kernel's on-chip memory, not HBM.
        To raise the limit to 128.00 MiB: for this kernel alone, pl.pallas_call(...,
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=134217728)); for every kernel that sets no limit of
        its own, --xla_tpu_scoped_vmem_limit_kib=131072 in the job's launch flags (LIBTPU_INIT_ARGS; aotcheck reads them
        from aot_libtpu_init_args, --aot-libtpu-init-args or a config's libtpu_init_args). A core of v5e-1 has
        128.00 MiB of VMEM: no limit goes past that. Or give the kernel smaller blocks or scratch.
    """
    topo = parse_topology(topology)
    space = space_name(overflow.space)
    size = fmt_bytes(overflow.size_bytes) if overflow.size_bytes is not None else "?"
    limit = fmt_bytes(overflow.limit_bytes) if overflow.limit_bytes is not None else "?"
    over = f" (over by {fmt_bytes(overflow.excess_bytes)})" if overflow.excess_bytes else ""
    if overflow.size_bytes is None or overflow.limit_bytes is None:  # XLA's words were not read in full.
        what = "does not fit (aotcheck could not read the sizes from XLA's message)"
    elif overflow.limit == "scoped":
        what = f"needs a scoped {space} allocation of {size}; the scoped {space} limit is {limit}{over}"
    else:
        allocation = " ".join(x for x in (overflow.tag, overflow.allocation_shape) if x)
        what = (f"needs {size} of {space}" + (f" (its {allocation})" if allocation else "")
                + f"; the chip's {space} holds {limit}{over}")
    owner = "the kernel's" if overflow.kernel else "the op's"
    lines = [f"does not fit in {space} on {topo.name}: {_op(overflow)} {what}.",
             f"This is {owner} on-chip memory, not HBM."]
    flag = _SCOPED_FLAG.get(overflow.space.lower())
    noun = "kernel" if overflow.kernel else "op"
    smaller = (f"Give the {noun} less SMEM (smaller SMEM scratch, fewer scalar-prefetch operands)."
               if overflow.space.lower() == "smem" else
               f"Give the {noun} " + ("smaller blocks or scratch." if overflow.kernel else f"less {space}."))
    if overflow.limit == "scoped" and flag and overflow.size_bytes:
        # XLA's size is what it had placed when it stopped: at a limit of exactly that, a kernel may place
        # more (megablox's gmm: 22.00 MiB at a 16 MiB limit, 22.82 MiB at a 22 MiB one; libtpu 0.0.50.1).
        # So the limit advised is rounded up to 4 MiB.
        kib = math.ceil(overflow.size_bytes / _ROOM) * _ROOM // 1024
        capacity = topo.vmem_bytes if overflow.space.lower() == "vmem" else None
        chip = f"A core of {topo.name} has {fmt_bytes(capacity)} of {space}" if capacity else ""
        if capacity and overflow.size_bytes > capacity:
            lines.append(f"{chip}: no limit holds {size}. {smaller}")
        else:
            kernel = "" if not overflow.kernel else (
                f"for this kernel alone, pl.pallas_call(..., compiler_params=pltpu.CompilerParams("
                f"vmem_limit_bytes={kib * 1024})); for every kernel that sets no limit of its own, ")
            room = "" if kib * 1024 == overflow.size_bytes else \
                " (XLA's figure rounded up to 4 MiB: at a limit of exactly that, a kernel may place more)"
            lines.append(
                f"To raise the limit to {fmt_bytes(kib * 1024)}{room}: {kernel}--{flag}={kib} in the job's launch flags "
                "(LIBTPU_INIT_ARGS; aotcheck reads them from aot_libtpu_init_args, --aot-libtpu-init-args or a "
                "config's libtpu_init_args)." + (f" {chip}: no limit goes past that." if chip else "")
                + f" Or g{smaller[1:]}")
    elif overflow.limit == "scoped":
        lines.append(f"aotcheck knows no launch flag that raises the scoped {space} limit. {smaller}")
    else:
        lines.append(f"No flag raises it: the chip has no more {space}. {smaller}")
    if fit is not None and fit.max_size == 0 and fit.refused is not None and fit.refused.space == overflow.space:
        lines.append(f"It does not depend on the {fit.knob}: the smallest {fit.knob} ({fit.step}) is refused for "
                     f"{space} too ({fit.probes} compiles).")
    return "\n".join(lines)


def _allocation_line(a: Allocation) -> str:
    what = a.op_name or (f"XLA's %{a.instruction}" if a.instruction else "")
    where = f" at {a.source.rpartition('/')[2]}" if a.source else ""
    kind = f" ({a.kind})" if a.kind else ""
    return f"  {fmt_bytes(a.size_bytes):>10}  {a.shape or '?'}{kind}  {what[:120]}{where}".rstrip()


def hbm_words(overflow: Overflow, topology: str | Topology) -> str:
    """XLA's refusal of a program for HBM (a GPU's memory), in words: what it needs of what a device
    may use, XLA's breakdown and the largest allocations it names.

    Example (XLA's long form, as a v4 job's log shows it):
        >>> over = Overflow("hbm", 35723390484, 33017561088, breakdown={"reserved": 270532608, "program": 35036195717},
        ...                 allocations=(Allocation(4 * 2**30, "bf16[16,2048,8192]", "jit(step)/mlp/dot_general",
        ...                                         "/src/mlp.py:12", kind="HLO temp"),))
        >>> print(hbm_words(over, "v4-8"))
        does not fit: XLA needs 33.27 GiB of the 30.75 GiB HBM a device can use on v4-8: 108%
        XLA's figures per device: reserved 258.00 MiB, program 32.63 GiB
        Largest allocations XLA names:
            4.00 GiB  bf16[16,2048,8192] (HLO temp)  jit(step)/mlp/dot_general at mlp.py:12
    """
    name = parse_topology(topology).name
    need, have = overflow.size_bytes, overflow.limit_bytes
    (only, only_bytes), = overflow.breakdown.items() if len(overflow.breakdown) == 1 else ((None, None),)
    what = f" for {only}" if only is not None and only_bytes == need else ""
    if need is not None and have:
        lines = [f"does not fit: XLA needs {fmt_bytes(need)}{what} of the {fmt_bytes(have)} HBM a device can use "
                 f"on {name}: {need / have:.0%}"]
    elif need is not None:  # A GPU's allocator says what it could not get, not what it had.
        lines = [f"does not fit in HBM on {name}: XLA could not allocate {fmt_bytes(need)}{what}"]
    else:
        lines = [f"does not fit in HBM on {name}"]
    if overflow.breakdown and not what:
        lines.append("XLA's figures per device: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in overflow.breakdown.items()))
    if overflow.allocations:
        lines += ["Largest allocations XLA names:", *map(_allocation_line, overflow.allocations[:5])]
    return "\n".join(lines)


def oom_words(overflow: Overflow | None, topology: str | Topology, *, fit: Fit | None = None, text: str = "") -> str:
    """Out of memory in any space, in words, from the record (``text``: XLA's own message, shown
    verbatim only where no record was read: words the reader did not know, a report written before)."""
    if overflow is None:
        first = [line for line in text.splitlines() if line.strip()][:12]
        return "\n".join([f"does not fit in HBM on {parse_topology(topology).name}; XLA says:", *first])
    if overflow.hbm:
        return hbm_words(overflow, topology)
    return explain_overflow(overflow, topology, fit=fit)
