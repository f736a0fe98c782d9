"""A program on this host's chip: compiled there, run on zeros, the runtime's memory read around it.

``aotcheck calibrate`` holds aotcheck's deviceless figures against a real TPU. What it reads comes from a
:class:`Runtime`: :class:`JaxChip` on a TPU host (``device.memory_stats()``: ``bytes_in_use``,
``bytes_reserved``, ``bytes_limit``), or a stand-in with the chip's rules where none is lent (the tests').
Three procedures, each a record's section (:mod:`aotcheck.gate.calibration`):

- :func:`run_step`: a program compiled there (:func:`compile_on`), run: the code the runtime loads at a program's first run (the ``bytes_in_use`` step less
  the outputs it made and the donated inputs it freed), the temporaries it reserves (``bytes_reserved``),
  what the run held and the step's seconds;
- :func:`try_size`: whether a size compiles and runs, and where it was refused (``compile`` or ``run``);
- :func:`start_server`: a server's weights and KV pool allocated, then each bucket run once in load
  order beside them: whether it started, or
  libtpu's E0101 parsed (:func:`parse_e0101`: the program, the bytes it asked, the bytes free).

Example (libtpu's E0101, as the chip printed it):
    >>> parse_e0101("E0101: RuntimeProgramAllocationFailure: Error loading program 'jit_f': Attempting to "
    ...             "reserve 1.00G at the bottom of memory. That was not possible. There are 971.52M free, 0B "
    ...             "reserved, and 971.52M reservable.")
    {'program': 'jit_f', 'asked_bytes': 1073741824, 'free_bytes': 1018712555}
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from aotcheck.errors import AotcheckError
from aotcheck.records import Record
from aotcheck.targets.platform import TPU

_E0101 = re.compile(r"Error loading program '(?P<program>[^']+)'(?:.*?reserve (?P<asked>[\d.]+[KMGT]?i?B?) at the bottom"
                    r".*?There are (?P<free>[\d.]+[KMGT]?i?B?) free)?", re.S)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _size(text: str | None) -> int | None:
    """libtpu's sizes (``1.00G``, ``971.52M``, ``0B``) in bytes: binary units, as its messages mean them."""
    if not text:
        return None
    m = re.fullmatch(r"([\d.]+)([KMGT]?)i?B?", text)
    return int(float(m[1]) * _UNITS[m[2]]) if m else None


def parse_e0101(message: str) -> dict[str, Any] | None:
    """The program a load failed for, the bytes it asked and those free, from libtpu's E0101 (None:
    not one; a size the message leaves out is None)."""
    if "E0101" not in message and "Error loading program" not in message:
        return None
    m = _E0101.search(message)
    if m is None:
        return {"program": None, "asked_bytes": None, "free_bytes": None}
    return {"program": m["program"], "asked_bytes": _size(m["asked"]), "free_bytes": _size(m["free"])}


@dataclasses.dataclass(frozen=True)
class Memory:
    """The runtime's memory of one device, as ``memory_stats()`` says it."""

    in_use: int
    reserved: int
    limit: int


# A config's ``run_inputs``: the arguments as host zeros -> those to run on.
Fill = Callable[[tuple[Any, ...]], Sequence[Any]]


class Runtime(Protocol):
    """What calibrating asks of a chip: its memory, a program compiled and run on arrays it makes."""

    def memory(self) -> Memory: ...
    def compile(self, lowered: Any) -> Any: ...
    def figures(self, program: Any) -> dict[str, Any]: ...
    def zeros(self, program: Any, keep: Mapping[int, Any] = ..., fill: Fill | None = None) -> tuple[Any, ...]: ...
    def run(self, program: Any, args: Sequence[Any]) -> tuple[Any, ...]: ...
    def nbytes(self, tree: Any) -> int: ...
    def freed(self, tree: Any) -> int: ...
    def release(self) -> None: ...


class RuntimeRefused(AotcheckError, RuntimeError):
    """The runtime refused to compile or run a program: its message, and where (``compile``, ``run``)."""

    @dataclasses.dataclass(frozen=True)
    class FIELDS(Record):
        where: str = "run"

    def __init__(self, message: str, *, where: str = "run") -> None:
        super().__init__(message)
        self.where, self.message = where, message


@dataclasses.dataclass(frozen=True)
class StepRun:
    """One program run on the chip.

    Attributes:
        code_bytes: What entered ``bytes_in_use`` at its first run beyond its outputs (less the donated
            inputs it freed): its generated code.
        reserved_bytes: ``bytes_reserved`` after the run: its temporaries.
        footprint_bytes: What the run held: ``bytes_in_use`` after it, plus the reservation, less what
            was in use before its arguments were made.
        seconds: The median of its later runs.
    """

    code_bytes: int
    reserved_bytes: int
    footprint_bytes: int
    seconds: float


def compile_on(runtime: Runtime, lowered: Any) -> Any:
    """``lowered`` compiled on the chip (its figures: ``runtime.figures``); a refusal is RuntimeRefused."""
    return _compile(runtime, lowered)


def run_step(runtime: Runtime, program: Any, *, fill: Fill | None = None, repeat: int = 3) -> StepRun:
    """A program compiled on the chip (:func:`compile_on`), run on zeros of its arguments (``fill``: the
    config's ``run_inputs``, which makes valid what a kernel must not see as zeros): once to load it,
    ``repeat`` times timed (arguments it donated made again, untimed). Its code is what stays in use
    once its arguments and outputs are gone (to the byte, on a v5e chip: outputs' allocations are
    padded, so ``nbytes`` would miss a few hundred bytes)."""
    base = runtime.memory()
    args = _zeros(runtime, program, fill=fill)
    outputs = _run(runtime, program, args)
    after = runtime.memory()
    footprint = after.in_use + after.reserved - base.in_use
    del outputs, args
    code = runtime.memory().in_use - base.in_use
    seconds = []
    args = _zeros(runtime, program, fill=fill)
    for _ in range(repeat):
        if runtime.freed(args):
            args = None  # Gone before they are made again: a server's weights twice would not fit the chip.
            args = _zeros(runtime, program, fill=fill)
        start = time.perf_counter()
        outputs = _run(runtime, program, args)
        seconds.append(time.perf_counter() - start)
        del outputs
    del args
    runtime.release()
    return StepRun(code, after.reserved, footprint, statistics.median(seconds) if seconds else 0.0)


def try_size(runtime: Runtime, lower: Callable[[], Any], *, fill: Fill | None = None) -> dict[str, Any]:
    """Whether a size compiles and runs on the chip: ``{"ran": True, "footprint_bytes": N}``, or
    ``{"ran": False, "refused": "compile" | "run", "message": ...}``. ``lower``: the size's program
    lowered (its own refusal, the deviceless compiler's kind, is ``"compile"``)."""
    base = runtime.memory()
    try:
        try:
            lowered = lower()
        except Exception as e:  # noqa: BLE001  (whatever refused it: its message is the record)
            raise RuntimeRefused(str(e), where="compile") from None
        program = _compile(runtime, lowered)
        outputs = _run(runtime, program, _zeros(runtime, program, fill=fill))
        after = runtime.memory()
        del outputs
        return {"ran": True, "footprint_bytes": after.in_use + after.reserved - base.in_use}
    except RuntimeRefused as e:
        return {"ran": False, "refused": e.where, "message": e.message.strip().splitlines()[0][:400]}
    finally:
        runtime.release()


# The arguments a server holds across its buckets: made once, passed to each bucket that reads them.
HELD_KINDS = ("params", "kv_cache")


def start_server(runtime: Runtime, buckets: Sequence[tuple[str, Any, Sequence[str], Fill | None]]) -> dict[str, Any]:
    """A server started on the chip: each bucket ``(program id, lowered, its arguments' kinds, its fill)`` compiled
    and run once in the order given, its weights and KV pool (:data:`HELD_KINDS`) made at the first
    bucket that reads them and held by every later one (a pool the step donates, taken back from its
    outputs), each bucket's other outputs dropped before the next runs (the boot budget counts one
    bucket's I/O at a time). ``{"started": True, "spare_bytes": N}``,
    or ``{"started": False, "at": program id, "refused": where, "error": {program (the bucket's id), jit
    (the runtime's name for it), asked_bytes, free_bytes, message}}``."""
    held: dict[str, Any] = {}
    loaded: list[Any] = []  # Every executable stays loaded, as a server's do: its code stays in memory.
    try:
        for program_id, lowered, kinds, fill in buckets:
            try:
                program = _compile(runtime, lowered)
                loaded.append(program)
                keep = {i: held[k] for i, k in enumerate(kinds) if k in held}
                args = _zeros(runtime, program, keep, fill=fill)
                held.update({k: args[i] for i, k in enumerate(kinds) if k in HELD_KINDS and k not in held})
                outputs = _run(runtime, program, args)
            except RuntimeRefused as e:
                error = parse_e0101(e.message) or {"program": None, "asked_bytes": None, "free_bytes": None}
                # The bucket by its id; jax's name for its program (``jit_step``) as the runtime said it.
                return {"started": False, "at": program_id, "refused": e.where,
                        "error": {**error, "program": program_id, "jit": error["program"],
                                  "message": e.message.strip().splitlines()[0][:400]}}
            for kind in HELD_KINDS:  # A donated pool lives on in the output that aliases it.
                if kind in held and runtime.freed(held[kind]):
                    held[kind] = next(o for o in outputs if runtime.nbytes(o) == runtime.freed(held[kind]))
            del args, outputs
        after = runtime.memory()
        return {"started": True, "spare_bytes": after.limit - after.in_use - after.reserved}
    finally:
        held.clear()
        loaded.clear()
        runtime.release()


def _compile(runtime: Runtime, lowered: Any) -> Any:
    try:
        return runtime.compile(lowered)
    except RuntimeRefused:
        raise
    except Exception as e:  # XLA's refusal on the chip: its message is the record.
        raise RuntimeRefused(str(e), where="compile") from None


def _zeros(runtime: Runtime, program: Any, keep: Mapping[int, Any] | None = None, *,
           fill: Fill | None = None) -> tuple[Any, ...]:
    try:
        return runtime.zeros(program, keep or {}, fill)
    except Exception as e:  # An argument the chip has no room for: refused at run time, by the allocator.
        raise RuntimeRefused(str(e), where="run") from None


def _run(runtime: Runtime, program: Any, args: Sequence[Any]) -> list[Any]:
    try:
        return runtime.run(program, args)
    except RuntimeRefused:
        raise
    except Exception as e:  # The runtime's refusal (E0101, RESOURCE_EXHAUSTED): its message is the record.
        raise RuntimeRefused(str(e), where="run") from None


class JaxChip:
    """This host's first TPU chip through jax: ``memory_stats()`` around compiles and runs."""

    def __init__(self) -> None:
        import jax  # noqa: PLC0415

        self._jax = jax
        self.device = jax.devices(TPU.name)[0]

    def memory(self) -> Memory:
        stats: Mapping[str, int] = self.device.memory_stats() or {}
        return Memory(int(stats.get("bytes_in_use", 0)), int(stats.get("bytes_reserved", 0)),
                      int(stats.get("bytes_limit", 0)))

    def compile(self, lowered: Any) -> Any:
        return lowered.compile()

    def figures(self, program: Any) -> dict[str, Any]:
        from aotcheck.figures.program import program_figures  # noqa: PLC0415

        return program_figures(program)

    def zeros(self, program: Any, keep: Mapping[int, Any] = {}, fill: Fill | None = None) -> tuple[Any, ...]:  # noqa: B006
        """Zeros of each argument not in ``keep`` (held arrays passed as they are), made on the chip in
        their shardings (a pool of GiBs never crosses from the host); ``fill`` then replaces what must not
        be zeros, and what it gives as host arrays is put on the chip."""
        jax = self._jax
        (infos, _), (shardings, _) = program.args_info, program.input_shardings

        def made(info: Any, sharding: Any) -> Any:
            return jax.jit(lambda: jax.numpy.zeros(info.shape, info.dtype), out_shardings=sharding)()

        args = tuple(keep[i] if i in keep else jax.tree_util.tree_map(made, info, sharding)
                     for i, (info, sharding) in enumerate(zip(infos, shardings)))
        if fill is None:
            return args
        return tuple(a if i in keep else jax.tree_util.tree_map(
            lambda v, s: v if isinstance(v, jax.Array) else jax.device_put(v, s), a, shardings[i])
            for i, a in enumerate(fill(args)))

    def run(self, program: Any, args: Sequence[Any]) -> tuple[Any, ...]:
        out = program(*args)
        self._jax.block_until_ready(out)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def nbytes(self, tree: Any) -> int:
        return sum(int(a.nbytes) for a in self._jax.tree_util.tree_leaves(tree) if not a.is_deleted())

    def freed(self, tree: Any) -> int:
        return sum(int(a.nbytes) for a in self._jax.tree_util.tree_leaves(tree) if a.is_deleted())

    def release(self) -> None:
        import gc  # noqa: PLC0415

        gc.collect()
        self._jax.clear_caches()  # Executables dropped: their code and their reservation with them.
