"""The sizes a fit search moves: a config's batch, or a knob it names, rebuilt at another size.

Example:
    >>> from aotcheck.models import lm
    >>> knob = knob_of(lm.trainer_config(lm.TINY), "batch", Target.of("v5e-16", 2))
    >>> knob.size, knob.step  # 32 sequences, sharded over the data axis (16 of the 32 devices)
    (32, 16)
    >>> knob.rebuild(64).knobs["batch"].size
    64
"""

from __future__ import annotations

from aotcheck.errors import ConfigError
from aotcheck.programs.config import Config
from aotcheck.programs.knob import Knob
from aotcheck.programs.model import as_functions
from aotcheck.targets.topology import Target


class KnobError(ConfigError):
    """A knob the config does not offer, or a batch a fit search cannot move; the message lists what it offers."""


def knobs_offered(config: Config) -> list[str]:
    """The knob names ``config`` offers a fit search: a model's ``batch`` first, then its own."""
    return list(as_functions(config)[0].knobs)


def default_knob(config: Config) -> str:
    """The knob a search moves when none is named: the config's own ``fit``, else ``batch`` where it
    offers one, else its only knob (``batch`` when it has none or several, for :func:`check_knob` to name).

    Example:
        >>> from aotcheck.models import lm
        >>> default_knob(lm.trainer_config(lm.TINY))
        'batch'
    """
    offered = knobs_offered(config)
    if config.fit is not None:
        return config.fit
    return "batch" if "batch" in offered or len(offered) != 1 else offered[0]


def check_knob(config: Config, name: str) -> None:
    """KnobError unless ``config`` offers the knob ``name`` (no devices, no mesh: safe anywhere)."""
    offered = knobs_offered(config)
    if name not in offered:
        if offered:
            raise KnobError(f"This config offers no knob {name!r}; it offers: {', '.join(offered)} (name one with "
                            "--knob, or a config's fit=).")
        raise KnobError(f"This config offers no knob {name!r}; it offers none "
                        "(a function's batch is its own, and a model's batch inputs that share no leading size are "
                        "no one size: give it a Knob in knobs=, e.g. "
                        "knobs={'batch': Knob(size, rebuild=lambda n: <the config at n>)}).")


def knob_of(config: Config, name: str, target: Target) -> Knob:
    """The knob ``name`` of ``config`` on ``target``: its size, how to rebuild the config (as the one
    compiled kind), its step there."""
    check_knob(config, name)
    return as_functions(config)[0].knobs[name].on(target)
