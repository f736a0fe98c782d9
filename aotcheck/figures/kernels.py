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

Some kernels' work depends on data the compiler never sees: a grouped matmul runs the rows routing
sends it, an attention kernel the keys each sequence holds. Their count is then an upper bound, over
the kernel's whole static buffer; :func:`counts_buffer` names them (``kernel_cost(..., bound=True)``
for a registered cost, :func:`declared_bound` for a kernel whose declared cost is such), and the
details and notes say so:

    >>> @aotcheck.kernel_cost("my_grouped_matmul", bound=True)
    ... def _(call):  # Every row of the static buffer: [M, K] x [G, K, N].
    ...     (m, k), (_, _, n) = call.operands[0].dims, call.operands[1].dims
    ...     return 2 * m * k * n
    >>> counts_buffer("my_grouped_matmul"), counts_buffer("my_matmul_kernel")
    (True, False)
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
_BOUNDS: dict[str, bool] = {}  # Name or glob -> whether its count (registered or declared) is over its buffer.


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{what} takes the kernel's name (a non-empty string), not {name!r}")


def kernel_cost(name: str, *, bound: bool = False) -> Callable[[KernelCostFn], KernelCostFn]:
    """Registers ``fn(call) -> FLOPs per run`` for the kernel named ``name`` (a decorator). A second
    registration of a name replaces the first (the last import wins, as with ``aotcheck.register``).
    ``bound``: the cost counts the kernel's whole static buffer, the most it can do, not what it
    does at run time (see :func:`counts_buffer`)."""
    _check_name(name, "kernel_cost")

    def register(fn: KernelCostFn) -> KernelCostFn:
        if not callable(fn):
            raise TypeError(f"kernel_cost({name!r}) decorates a function of the kernel's call, not {fn!r}")
        _COSTS[name] = fn
        _BOUNDS[name] = bool(bound)
        return fn

    return register


def declared_bound(name: str) -> None:
    """Says that the kernel ``name`` (or glob) declares its cost over its whole static buffer
    (megablox's ``gmm``: every row of its left operand, whatever routing sends it)."""
    _check_name(name, "declared_bound")
    _BOUNDS[name] = True


def counts_buffer(name: str) -> bool:
    """Whether the kernel's count is an upper bound over its static buffer (exact name first, then
    the first glob that matches)."""
    if name in _BOUNDS:
        return _BOUNDS[name]
    return next((b for pattern, b in _BOUNDS.items() if fnmatch.fnmatchcase(name, pattern)), False)


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
