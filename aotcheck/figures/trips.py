"""A while loop's trip count, read from the compiled program: the loop condition's compare, the
loop's initial tuple and the body's counter update (``i < N`` from ``i = 0`` by ``i += 1``: N trips).
None where the program does not say (a data-dependent loop): the walk weighs its body once and names it.

Example (a loop of 4 matmuls, compiled for host CPU devices):
    >>> import jax, jax.numpy as jnp
    >>> from aotcheck import compile_function
    >>> from aotcheck.figures.hlo import parse_module
    >>> x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    >>> text = compile_function(lambda x, w: jax.lax.fori_loop(1, 5, lambda i, y: y @ w, x), x, x,
    ...                         topology="cpu-1").as_text()
    >>> module = parse_module(text)
    >>> [trip_count(inst, comp, module) for comp in module.values() for inst in comp.instructions.values()
    ...  if inst.opcode == "while"]
    [4]
"""

from __future__ import annotations

import re

from aotcheck.figures.hlo import Computation, Instruction

_PASS_THROUGH = {"copy", "bitcast", "convert", "reshape"}


def _resolve(comp: Computation, name: str, module: dict[str, Computation], depth: int = 0) -> tuple[str, int] | None:
    """What a scalar value is: ("gte", tuple index of the parameter), ("const", n), or None."""
    inst = comp.instructions.get(name)
    if inst is None or depth > 8:
        return None
    if inst.opcode == "constant":
        return ("const", inst.int_arg) if inst.int_arg is not None else None
    if inst.opcode == "get-tuple-element" and inst.operands:
        source = comp.instructions.get(inst.operands[0])
        if source is not None and source.opcode == "parameter":
            return ("gte", int(inst.attr("index") or 0))
        return None
    if inst.opcode in _PASS_THROUGH and inst.operands:
        return _resolve(comp, inst.operands[0], module, depth + 1)
    return None


def _compare_in(comp: Computation, module: dict[str, Computation]) -> tuple[Computation, Instruction, list] | None:
    """The loop condition's compare, following a fused root into its computation.

    Returns (computation holding it, compare, operand bindings): for a fused
    compare, each fused parameter is bound to the outer operand's resolution.
    """
    root = comp.root
    if root is None:
        return None
    if root.opcode == "compare":
        return comp, root, [_resolve(comp, o, module) for o in root.operands]
    if root.opcode == "fusion":
        inner = module.get((root.called("calls") or [""])[0])
        if inner is None or inner.root is None or inner.root.opcode != "compare":
            return None
        outer = [_resolve(comp, o, module) for o in root.operands]
        bindings = []
        for operand in inner.root.operands:
            inst = inner.instructions.get(operand)
            if inst is not None and inst.opcode == "parameter":
                index = inst.int_arg
                bindings.append(outer[index] if index is not None and index < len(outer) else None)
            else:
                bindings.append(_resolve(inner, operand, module))
        return inner, inner.root, bindings
    return None


def trip_count(loop: Instruction, caller: Computation, module: dict[str, Computation]) -> int | None:
    """A while loop's trip count, or None when it cannot be read off the HLO."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attrs)
    if known:
        return int(known[1])
    cond = module.get((loop.called("condition") or [""])[0])
    body = module.get((loop.called("body") or [""])[0])
    if cond is None or body is None:
        return None
    found = _compare_in(cond, module)
    if found is None:
        return None
    _, compare, bindings = found
    direction = compare.attr("direction")
    if len(bindings) != 2 or None in bindings:
        return None
    (kind_a, a), (kind_b, b) = bindings
    if kind_a == "gte" and kind_b == "const":
        index, limit = a, b
    elif kind_a == "const" and kind_b == "gte":
        index, limit = b, a
        direction = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, direction)
    else:
        return None
    start = _initial_value(loop, caller, index, module)
    step = _step(body, index, module)
    if start is None or step is None or step == 0:
        return None
    if direction == "LT" and step > 0:
        return max(0, -(-(limit - start) // step))
    if direction == "LE" and step > 0:
        return max(0, (limit - start) // step + 1)
    if direction == "GT" and step < 0:
        return max(0, -(-(start - limit) // -step))
    if direction == "GE" and step < 0:
        return max(0, (start - limit) // -step + 1)
    return None


def _initial_value(loop: Instruction, caller: Computation, index: int, module: dict[str, Computation]) -> int | None:
    init = caller.instructions.get(loop.operands[0]) if loop.operands else None
    if init is None or init.opcode != "tuple" or index >= len(init.operands):
        return None
    value = _resolve(caller, init.operands[index], module)
    return value[1] if value and value[0] == "const" else None


def _step(body: Computation, index: int, module: dict[str, Computation]) -> int | None:
    root = body.root
    if root is None or root.opcode != "tuple" or index >= len(root.operands):
        return None
    update = body.instructions.get(root.operands[index])
    if update is None or update.opcode not in ("add", "subtract") or len(update.operands) != 2:
        return None
    a, b = (_resolve(body, o, module) for o in update.operands)
    if a == ("gte", index) and b and b[0] == "const":
        return b[1] if update.opcode == "add" else -b[1]
    if b == ("gte", index) and a and a[0] == "const" and update.opcode == "add":
        return a[1]
    return None
