"""What can go wrong while measuring a case, as a small hierarchy of typed errors with one JSON form.

Every error crosses the compile worker's pipe as :func:`error_to_json` and comes back as
:func:`error_from_json`: the same class with the same fields (aotcheck's own errors, Python's
built-in ones), or a :class:`UserCodeError` naming the class user code raised. Nothing is
attached to an exception after it is made, and nothing downstream matches its message: an
out-of-memory compile is an :class:`OutOfMemory` from the moment XLA says so.

=========================  ==============================================================
class                      what went wrong
=========================  ==============================================================
:class:`ConfigError`       the config, mesh, rules, topology or a name in it (a ValueError)
:class:`UserCodeError`     code of the user's raised while building or lowering (its class named)
:class:`CompileError`      XLA refused the program
:class:`OutOfMemory`       ... because it does not fit HBM (a GPU's memory too): what XLA said in an
                           :class:`Overflow` (needed, available, XLA's breakdown, its largest
                           allocations), what filled the memory in ``details``
:class:`OutOfMemorySpace`  ... because an op overflows another memory space (a Pallas kernel's VMEM
                           or SMEM): which, how much, the limit and the op, in the same :class:`Overflow`
:class:`WorkerCrashed`     the compile process died (a signal, the host's OOM killer)
=========================  ==============================================================

Example:
    >>> error = OutOfMemory("RESOURCE_EXHAUSTED: Ran out of memory", details={"peak_buffers": []})
    >>> again = error_from_json(error_to_json(error))
    >>> type(again).__name__, str(again), again.details
    ('OutOfMemory', 'RESOURCE_EXHAUSTED: Ran out of memory', {'peak_buffers': []})
    >>> error_from_json(error_to_json(KeyError("no such key")))
    KeyError('no such key')
    >>> vmem = Overflow("vmem", 2**27, 2**24, "scoped", op_name="jit(f)/pallas_call", kernel=True)
    >>> again = error_from_json(error_to_json(OutOfMemorySpace("E1001: CompileTimeScopedVmemOom", overflow=vmem)))
    >>> type(again).__name__, again.overflow == vmem, isinstance(again, OutOfMemory)
    ('OutOfMemorySpace', True, True)
    >>> hbm = Overflow("hbm", 20 * 2**30, 15 * 2**30, breakdown={"program": 20 * 2**30},
    ...                allocations=(Allocation(4 * 2**30, "bf16[16,2048,8192]", kind="HLO temp"),))
    >>> again = error_from_json(error_to_json(OutOfMemory("Ran out of memory in memory space hbm", overflow=hbm)))
    >>> type(again).__name__, again.overflow == hbm, again.overflow.hbm
    ('OutOfMemory', True, True)
    >>> error = error_from_json({"type": "somewhere.Else", "message": "boom"})
    >>> error, error_type(error)
    (UserCodeError('somewhere.Else: boom'), 'Else')
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any, ClassVar

from aotcheck.records import Record, field


class AotcheckError(Exception):
    """aotcheck's errors; one that carries fields beyond its message declares them as a record
    (``FIELDS``: a dataclass over :mod:`aotcheck.records` whose fields are the error's attributes and its
    constructor's keywords), which is how it crosses as JSON."""

    FIELDS: ClassVar[type[Record] | None] = None

    def fields(self) -> dict[str, Any]:
        """What the error carries besides its message, as JSON (none by default)."""
        if self.FIELDS is None:
            return {}
        return self.FIELDS(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self.FIELDS)}).to_json()

    @classmethod
    def from_fields(cls, message: str, fields: Mapping[str, Any]) -> "AotcheckError":
        if cls.FIELDS is None:
            return cls(message)
        record = cls.FIELDS.from_json(fields)
        return cls(message, **{f.name: getattr(record, f.name) for f in dataclasses.fields(record)})


class ConfigError(AotcheckError, ValueError):
    """The config is wrong: a name, a mesh, partition rules, a topology. The message names the fix."""


class UserCodeError(AotcheckError, RuntimeError):
    """An error of a class not rebuilt on this side of the worker's pipe (user code's, a library's):
    ``type_name`` names it."""

    @dataclasses.dataclass(frozen=True)
    class FIELDS(Record):
        type_name: str = "UserCodeError"

    def __init__(self, message: str, *, type_name: str = "UserCodeError") -> None:
        super().__init__(message)
        self.type_name = type_name


class CompileError(AotcheckError, RuntimeError):
    """XLA refused to compile a program; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Allocation(Record):
    """One of the largest allocations XLA names when it runs out of memory, as its message lists them.

    Attributes:
        size_bytes: Its size (XLA rounds it to 0.01 of its unit).
        shape: Its shape, without XLA's layout (``bf16[16,2048,8192]``).
        op_name: JAX's name of the op that made it, from XLA's ``Operator:`` line.
        source: The Python line XLA's ``Operator:`` line names (``model.py:88``), where it names one.
        instruction: XLA's name of the instruction (its ``XLA label``).
        kind: What it is for, as XLA says (``HLO temp``, ``scratch operand``, ``parameter``).
    """

    size_bytes: int | None
    shape: str | None = field(default=None, omit="none")
    op_name: str | None = field(default=None, omit="none")
    source: str | None = field(default=None, omit="none")
    instruction: str | None = field(default=None, omit="none")
    kind: str | None = field(default=None, omit="none")


@dataclasses.dataclass(frozen=True)
class Overflow(Record):
    """What XLA's out-of-memory refusal says, in any memory space (HBM, a GPU's memory, VMEM, SMEM), in
    bytes: read once, where XLA says it (:mod:`aotcheck.programs.oom`), and worded by :mod:`aotcheck.render`.

    Attributes:
        space: The memory space as XLA names it: ``hbm`` (a GPU's memory too), ``vmem``, ``smem``, ...
        size_bytes: What the op (or the program, in that space) needs; XLA rounds it to 0.01 of its unit.
            None where XLA does not say.
        limit_bytes: What it may use there (None where XLA does not say: a GPU's allocator).
        limit: ``"scoped"``: XLA's scoped limit for one op, which launch flags (and a Pallas kernel's
            ``vmem_limit_bytes``) set; ``"capacity"``: the memory itself, which nothing raises.
        excess_bytes: By how much it is over, as XLA says (exact where the sizes are rounded).
        instruction: The op's name in the compiled program (``f.1``).
        op_name: JAX's name of the op (``jit(step)/pallas_call``), from its metadata.
        op_shape: The op's result shape, where XLA prints the op (``f32[4096,4096]``).
        allocation_shape: The allocation's shape, where XLA names it (``f32[262144]``).
        tag: What the allocation is for (``scratch operand``).
        kernel: The op is a Pallas (Mosaic) kernel: ``custom_call_target="tpu_custom_call"``.
        source: The Python line that made the op (``model.py:88``; several, when the program has
            several ops XLA's words fit), from its metadata or the lowered program; None when unknown.
        breakdown: XLA's own split of what it needed, category by category in its words and order
            (``reserved``, ``program``, ``arguments``, ``HLO temp``; a GPU's ``parameter allocation``, ...).
        allocations: The largest allocations XLA names, largest first.
    """

    space: str
    size_bytes: int | None
    limit_bytes: int | None
    limit: str = "capacity"
    excess_bytes: int | None = None
    instruction: str | None = None
    op_name: str | None = None
    op_shape: str | None = None
    allocation_shape: str | None = None
    tag: str | None = None
    kernel: bool = False
    source: str | None = None
    # Written only when XLA said them: a record written before they were read stays byte for byte.
    breakdown: dict[str, int] = field(default_factory=dict, omit="empty")
    allocations: tuple[Allocation, ...] = field(default=(), omit="empty")

    @property
    def hbm(self) -> bool:
        """Whether the space is the device's memory (a TPU's HBM, a GPU's), not an op's on-chip space."""
        return self.space.lower() == "hbm"

class OutOfMemory(CompileError):
    """XLA refused the program because it does not fit a memory space: ``overflow`` is what XLA said
    (None where its words were not read); this class itself is HBM's (a GPU's memory too). ``details``:
    what filled the memory (the JSON form of :class:`aotcheck.figures.program.Details`), when XLA's
    dump said; after a fit search, the search too."""

    @dataclasses.dataclass(frozen=True)
    class FIELDS(Record):
        details: dict[str, Any] | None = field(default=None, omit="none")
        overflow: Overflow | None = field(default=None, omit="none")

    def __init__(self, message: str, *, details: Mapping[str, Any] | None = None,
                 overflow: Overflow | None = None) -> None:
        super().__init__(message)
        self.details = dict(details) if details is not None else None
        self.overflow = overflow

    def with_details(self, details: Mapping[str, Any]) -> "OutOfMemory":
        """The same error (its class and every field), saying what filled the memory."""
        return type(self).from_fields(str(self), {**self.fields(), "details": dict(details)})

    def located(self, source: str | None) -> "OutOfMemory":
        """The same error, naming the Python line that made the op (unchanged when ``source`` is None)."""
        if source is None or self.overflow is None:
            return self
        return type(self).from_fields(str(self), {**self.fields(), "overflow": dataclasses.replace(
            self.overflow, source=source).to_json()})



class OutOfMemorySpace(OutOfMemory):
    """XLA refused the program because an op overflows a memory space other than HBM: a Pallas
    kernel's VMEM scratch over the scoped VMEM limit, SMEM over the chip's. ``overflow`` says which
    space, how much, the limit and the op. No HBM figure explains it: ``details`` holds at most a fit search."""

    overflow: Overflow

    def __init__(self, message: str, *, overflow: Overflow | None, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, details=details, overflow=overflow or Overflow("unknown", None, None))


def out_of_memory(message: str) -> bool:
    """Whether XLA's error message says the program ran out of memory (read once, where XLA raises).

    Example:
        >>> out_of_memory("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm."), out_of_memory("bad shape")
        (True, False)
    """
    return "RESOURCE_EXHAUSTED" in message or "Ran out of memory" in message


class WorkerCrashed(AotcheckError, RuntimeError):
    """A compile process died (a signal, an abort, the host's OOM killer) while measuring a case."""

    @dataclasses.dataclass(frozen=True)
    class FIELDS(Record):
        signal_name: str | None = None
        tail: tuple[str, ...] = ()
        log: tuple[str, ...] = ()
        small_vmem_limit: dict[str, int] | None = field(default=None, omit="empty")

    def __init__(self, message: str, *, signal_name: str | None = None, tail: tuple[str, ...] = (),
                 log: tuple[str, ...] = (), small_vmem_limit: Mapping[str, int] | None = None) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.tail = tuple(tail)
        self.log = tuple(log)  # Everything the worker printed while on the case (a crash handler's stack too).
        # The compile's scoped VMEM limit where it was below the chip's default ({"kib", "default_kib"}):
        # libtpu dies compiling collectives under a limit of about 1 MiB, so that is the cause to name.
        self.small_vmem_limit = dict(small_vmem_limit) if small_vmem_limit else None



def error_type(error: BaseException) -> str:
    """The name of an error's class as the user's code raised it, even across a worker."""
    return error.type_name if isinstance(error, UserCodeError) else type(error).__name__


def error_to_json(error: BaseException) -> dict[str, Any]:
    """An exception as JSON: its class's import path, its message, and its fields if it is aotcheck's."""
    cls = type(error)
    message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    out: dict[str, Any] = {"type": f"{cls.__module__}.{cls.__qualname__}", "message": message}
    if isinstance(error, AotcheckError) and error.fields():
        out["fields"] = error.fields()
    return out


def error_from_json(data: Mapping[str, Any]) -> Exception:
    """The exception :func:`error_to_json` described: the same class when it is importable
    (aotcheck's own, Python's built-in ones), else a :class:`UserCodeError` naming it."""
    module_name, _, name = data["type"].rpartition(".")
    cls: Any = None
    if module_name == "builtins":
        cls = getattr(builtins, name, None)
    elif module_name == "aotcheck" or module_name.startswith("aotcheck."):  # Not jax's: some take a tracer.
        try:
            cls = importlib.import_module(module_name)
            for part in name.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError):
            cls = None
    if isinstance(cls, type) and issubclass(cls, AotcheckError):
        return cls.from_fields(data["message"], data.get("fields") or {})
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(data["message"])
        except Exception:  # A class whose constructor wants more than a message.
            pass
    return UserCodeError(f"{data['type']}: {data['message']}", type_name=name)
