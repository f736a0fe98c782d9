"""A stand-in for a TPU chip's runtime, for the tests of ``aotcheck calibrate`` where no chip is lent.

A FAKE runtime: nothing runs. Programs are real deviceless compiles (their memory analysis says their
code, temporaries and outputs); the memory is bookkeeping by the rules a v5e chip showed (libtpu
0.0.42.1, 2026-12-07; docs/calibration.md): compiling takes nothing; a program's code enters
``bytes_in_use`` at its first run; temporaries are one reservation (``bytes_reserved``) sized to the
program running (its peak less its arguments and outputs, at most its temporaries), beside its outputs; idle programs' code is evicted when a run finds no room; a run
that still finds none fails as E0101 says it.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from aotcheck.pipeline.chip import Memory

V5E_BYTES_LIMIT = 16_909_336_064


class Array:
    """A fake array: its bytes, and whether a donation freed it."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes, self.deleted = int(nbytes), False


class Program:
    def __init__(self, name: str, compiled: Any) -> None:
        m = compiled.memory_analysis()
        self.name, self.code, self.alias = name, int(m.generated_code_size_in_bytes), int(m.alias_size_in_bytes)
        # The chip reserves the program's peak less its arguments and outputs, at most its temporaries.
        peak = getattr(m, "peak_memory_in_bytes", 0) or 0
        beside = peak - m.argument_size_in_bytes - m.output_size_in_bytes + m.alias_size_in_bytes
        self.temp = int(min(m.temp_size_in_bytes, max(0, beside))) if peak else int(m.temp_size_in_bytes)
        import jax

        self.outputs = [math.prod(o.shape) * o.dtype.itemsize for o in _leaves(compiled.out_info)]
        self.out_tree = jax.tree_util.tree_structure(compiled.out_info)
        self.donated = [bool(i.donated) for i in _leaves(compiled.args_info)]
        self.args_info = compiled.args_info
        self.compiled = compiled


def _leaves(tree: Any) -> list[Any]:
    import jax

    return jax.tree_util.tree_leaves(tree)


class StandInChip:
    """The chip's rules over fake arrays (see the module's docstring); ``limit``: its bytes_limit."""

    def __init__(self, limit: int = V5E_BYTES_LIMIT) -> None:
        self.limit = limit
        self.arrays: weakref.WeakSet[Array] = weakref.WeakSet()  # Live while the caller holds them, as jax's.
        self.loaded: dict[int, Program] = {}  # Programs whose code is in memory, by id.
        self.programs: list[Program] = []
        self.reserved = 0
        self.runs: list[str] = []

    def memory(self) -> Memory:
        return Memory(self._in_use(), self.reserved, self.limit)

    def _in_use(self) -> int:
        return sum(a.nbytes for a in self.arrays if not a.deleted) + sum(p.code for p in self.loaded.values())

    def compile(self, lowered: Any) -> Program:
        program = Program(lowered.as_text().split("module @", 1)[-1].split(" ", 1)[0], lowered.compile())
        self.programs.append(program)
        return program

    def figures(self, program: Program) -> dict[str, Any]:
        from aotcheck.figures.program import program_figures

        return program_figures(program.compiled)

    def _alloc(self, nbytes: int) -> Array:
        # Buffers win over programs: an allocation drops the reservation, then idle code if it must.
        if self._in_use() + nbytes > self.limit:
            self.reserved = 0
            self.loaded.clear()
        if self._in_use() + nbytes > self.limit:
            raise RuntimeError(f"RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate {nbytes}B.")
        array = Array(nbytes)
        self.arrays.add(array)
        return array

    def zeros(self, program: Program, keep: Mapping[int, Any] = {}, fill: Any = None) -> tuple[Any, ...]:  # noqa: B006
        """Fake arrays of each argument's bytes (``fill`` changes values, not sizes: nothing to fake)."""
        import jax

        args, _ = program.args_info
        return tuple(keep[i] if i in keep else jax.tree_util.tree_map(
            lambda info: self._alloc(math.prod(info.shape) * info.dtype.itemsize), arg)
            for i, arg in enumerate(args))

    def run(self, program: Program, args: Sequence[Any]) -> tuple[Any, ...]:
        code = 0 if id(program) in self.loaded else program.code
        outputs = sum(program.outputs) - program.alias  # An output that aliases a donated input takes its place.
        if self._in_use() + code + outputs + program.temp > self.limit:  # Idle programs' code evicted.
            self.loaded = {k: p for k, p in self.loaded.items() if p is program}
        free = self.limit - self._in_use() - code - outputs
        if free < program.temp:
            raise RuntimeError(f"RESOURCE_EXHAUSTED: E0101: RuntimeProgramAllocationFailure: Error loading program "
                               f"'{program.name}': Attempting to reserve {program.temp / 2**20:.2f}M at the bottom of "
                               f"memory. That was not possible. There are {max(free, 0) / 2**20:.2f}M free, 0B reserved, "
                               f"and {max(free, 0) / 2**20:.2f}M reservable.")
        self.loaded[id(program)] = program
        self.reserved = max(self.reserved, program.temp)
        self.runs.append(program.name)
        for leaf, donated in zip(_leaves(args), program.donated):
            if donated:
                leaf.deleted = True
        import jax

        made = [Array(n) for n in program.outputs]  # (Those aliased: made as the donated ones are freed.)
        self.arrays.update(made)
        out = jax.tree_util.tree_unflatten(program.out_tree, made)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def nbytes(self, tree: Any) -> int:
        return sum(a.nbytes for a in _leaves(tree) if not a.deleted)

    def freed(self, tree: Any) -> int:
        return sum(a.nbytes for a in _leaves(tree) if a.deleted)

    def release(self) -> None:
        import gc

        gc.collect()  # Arrays a refusal's traceback held are freed, as JaxChip.release frees them.
        self.loaded, self.reserved = {}, 0
