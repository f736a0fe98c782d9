"""A knob: a size a fit search may move (its configured value, the config rebuilt at another, its
step), and the checks a config's knobs pass when it is built.

Example:
    >>> knob_problem(Knob(32, abs)), knob_problem(Knob(0, abs))
    (None, 'its size 0 is not a size >= 1')
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from aotcheck.errors import ConfigError


class Knob(NamedTuple):
    """A size a fit search may move: its configured value, the config rebuilt at another, its step.

    Example:
        >>> from aotcheck.models import lm
        >>> import dataclasses
        >>> seq = Knob(128, lambda n: lm.trainer_config(dataclasses.replace(lm.TINY, seq_len=n)), step=128)
        >>> seq.rebuild(256).batch_spec["tokens"].shape
        (32, 256)
    """

    size: int
    rebuild: Callable[[int], Any]
    step: int = 1
    step_on: Callable[[Any], int] | None = None  # target -> its step, where the mesh decides it (a batch's).

    def on(self, target: Any) -> "Knob":
        """The knob on ``target``: its step there, where ``step_on`` gives one."""
        return self if self.step_on is None else self._replace(step=self.step_on(target))


# The largest size a knob may take: an array dimension XLA's shapes hold (a larger one ends in an MLIR
# traceback when the program is built); no device memory holds an array of 2**31 elements on an axis anyway.
MAX_KNOB_SIZE = 2**31 - 1


def knob_problem(knob: Any) -> str | None:
    """What is wrong with ``knob`` as a :class:`Knob`, or None.

    Example:
        >>> knob_problem(Knob(32, abs)), knob_problem(Knob(0, abs))
        (None, 'its size 0 is not a size >= 1')
        >>> knob_problem(32)
        'it is int 32, not a Knob(size, rebuild, step)'
    """
    if not isinstance(knob, Knob):
        return f"it is {type(knob).__name__} {knob!r}, not a Knob(size, rebuild, step)"
    for field in ("size", "step"):
        value = getattr(knob, field)
        if isinstance(value, bool) or not isinstance(value, int):
            return f"its {field} {value!r} is not an int"
        if value < 1:
            return f"its {field} {value} is not a size >= 1"
        if value > MAX_KNOB_SIZE:
            return f"its {field} {value} is past {MAX_KNOB_SIZE:,} (2**31 - 1), more than an array dimension holds"
    if not callable(knob.rebuild):
        return f"its rebuild {knob.rebuild!r} is not callable (give size -> the config rebuilt at that size)"
    return None


def check_callable(field: str, fn: Any, *, forms: Sequence[tuple[str, ...]], gives: str) -> None:
    """ConfigError, when the config is built, for a function aotcheck cannot call in one of ``forms``
    (the positional parameters it passes): named with the forms allowed, not Python's TypeError from
    inside a lowering. A callable whose signature cannot be read is left to its call."""
    allowed = " or ".join(f"({', '.join(f)}) -> {gives}" for f in forms)
    if not callable(fn):
        raise ConfigError(f"{field}={fn!r} is not callable; give a function {allowed}.")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    for form in forms:
        try:
            signature.bind(*form)
            return
        except TypeError:
            continue
    raise ConfigError(f"{field} takes {signature}, which cannot be called as {allowed}; aotcheck calls it with "
                      f"{' or '.join(f'({len(f)} argument' + ('s)' if len(f) > 1 else ')') for f in forms)}.")


def check_knobs(knobs: Any, field: str) -> None:
    """ConfigError naming the knob and the fix for knobs a fit search would misread (checked when the
    config is built, not when it is lowered)."""
    if not isinstance(knobs, Mapping):
        raise ConfigError(f"{field}={knobs!r}: give the knobs by name, e.g. knobs={{'seq': Knob(2048, "
                          "lambda n: make(seq=n), step=128)}}.")
    for name, knob in knobs.items():
        problem = knob_problem(knob)
        if problem:
            raise ConfigError(f"{field}[{name!r}]: {problem}. Give Knob(size, rebuild, step): the configured size "
                              f"(an int >= 1), size -> the config rebuilt at it, and the search's step (an int >= 1), "
                              f"e.g. knobs={{{name!r}: Knob(32, lambda n: make({name}=n))}}.")


def settings_of(config: Any) -> dict[str, Any]:
    """What a golden records of how ``config`` (a FunctionConfig) was built: its knobs' sizes, then the settings it declares,
    as JSON values (a value JSON has no form for, as its repr).

    Example:
        >>> from aotcheck.programs.config import FunctionConfig
        >>> f = FunctionConfig(fn=abs, make_args=lambda mesh: (), settings={"remat": "full", "tile": (8, 128)},
        ...                    knobs={"seq": Knob(512, lambda n: None)})
        >>> settings_of(f)
        {'seq': 512, 'remat': 'full', 'tile': '(8, 128)'}
    """
    def plain(value: Any) -> Any:
        return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)

    knobs = {name: knob.size for name, knob in config.knobs.items() if isinstance(knob, Knob)}
    return {**knobs, **{name: plain(value) for name, value in config.settings.items()}}
