"""What a kernel costs when it does not say: FLOPs of a custom kernel's call, by the kernel's name.

A Pallas/Mosaic (or Triton) kernel is opaque to XLA. It may declare its cost (``pl.CostEstimate``,
carried in the call's config); many of the field's do not (jax's splash attention, ragged paged
attention). A cost registered here by the kernel's name counts it from what it does: a function of the
call (:class:`KernelCall`: its operands' and results' shapes, its backend config) that returns its
FLOPs per run. aotcheck registers the kernels jax ships (:mod:`aotcheck.figures.known_kernels`); you
register your own the same way, in a module your configs import (so the compile workers, which import
it too, count it):

    >>> import aotcheck
    >>> @aotcheck.kernel_cost("my_matmul_kernel")
    ... def _(call):  # [M, K] x [K, N]: 2 per multiply-add.
    ...     (m, k), (_, n) = call.operands[0].dims, call.operands[1].dims
    ...     return 2 * m * k * n
    >>> from aotcheck.figures.hlo import Array

if TYPE_CHECKING:
    import numpy as np
    >>> lookup("my_matmul_kernel")(KernelCall("my_matmul_kernel", [Array("bf16", (64, 128)), Array("bf16", (128, 32))],
    ...                                       [Array("bf16", (64, 32))]))
    524288

A cost may return None where it cannot tell from the call: the kernel is then named as uncounted,
never counted as zero.

A kernel is named as JAX's name stack names it: the last name before ``pallas_call``
(``splash_mha_fwd_no_residuals``), with a trailing ``.N`` that XLA adds to repeated names dropped. A
registered name may be a glob (``splash_mha_fwd*``); an exact name wins over a glob.
A registered cost wins over a declared one (it is yours); the details say which count each kernel's
figure is (``declared``, ``registered``, or ``none``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable
from typing import TYPE_CHECKING

from aotcheck.errors import AotcheckError
from aotcheck.figures.hlo import Array

if TYPE_CHECKING:
    import numpy as np


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One call of a kernel, as the compiled program has it (per device)."""

    name: str  # The kernel's name (see the module's docstring).
    operands: list[Array]  # Each operand's array (a tuple operand's first), in order.
    results: list[Array]  # The call's result arrays, in order.
    attrs: str = ""  # The call's attributes as XLA prints them (backend_config, frontend_attributes, ...).
    # Each operand's value where the program holds it as a constant (a mask built when tracing), else None.
    values: tuple["np.ndarray | None", ...] = ()


KernelCostFn = Callable[[KernelCall], "float | None"]
_COSTS: dict[str, KernelCostFn] = {}


def kernel_cost(name: str) -> Callable[[KernelCostFn], KernelCostFn]:
    """Registers ``fn(call) -> FLOPs per run`` for the kernel named ``name`` (a decorator). A second
    registration of a name replaces the first (the last import wins, as with ``aotcheck.register``)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"kernel_cost takes the kernel's name (a non-empty string), not {name!r}")

    def register(fn: KernelCostFn) -> KernelCostFn:
        if not callable(fn):
            raise TypeError(f"kernel_cost({name!r}) decorates a function of the kernel's call, not {fn!r}")
        _COSTS[name] = fn
        return fn

    return register


def lookup(name: str) -> KernelCostFn | None:
    """The cost registered for a kernel's name (exactly, else by the first glob that matches), or None."""
    if name in _COSTS:
        return _COSTS[name]
    return next((fn for pattern, fn in _COSTS.items() if fnmatch.fnmatchcase(name, pattern)), None)


def registered() -> tuple[str, ...]:
    """The names of every kernel with a registered cost, sorted."""
    return tuple(sorted(_COSTS))


class KernelCostError(AotcheckError, ValueError):
    """A cost registered for a kernel (:func:`kernel_cost`) raised: the message names the kernel, the
    call's operands and the fix."""
