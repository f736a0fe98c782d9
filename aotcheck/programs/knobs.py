"""The sizes a fit search moves: a config's batch, or a knob it names, rebuilt at another size.

Example:
    >>> from aotcheck.models import lm
    >>> knob = knob_of(lm.trainer_config(lm.TINY), "batch", Target.of("v5e-16", 2))
    >>> knob.size, knob.step  # 32 sequences, sharded over the data axis (16 of the 32 devices)
    (32, 16)
    >>> knob.rebuild(64).batch_spec["tokens"].shape
    (64, 128)
"""

from __future__ import annotations

import dataclasses
import math

import jax

from aotcheck.errors import ConfigError
from aotcheck.programs.config import Config, InferenceConfig, Knob, TrainerConfig
from aotcheck.programs.lowering import place
from aotcheck.targets.topology import Target


class KnobError(ConfigError):
    """A knob the config does not offer, or a batch a fit search cannot move; the message lists what it offers."""


def knobs_offered(config: Config) -> list[str]:
    """The knob names ``config`` offers a fit search: ``batch`` for models, then its own."""
    if isinstance(config, (TrainerConfig, InferenceConfig)):
        return ["batch", *config.knobs]
    return list(config.knobs)  # A function's batch is its own: only the knobs it gives.


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
                        "(a FunctionConfig has no batch aotcheck can move: give it a Knob in knobs=, e.g. "
                        "knobs={'batch': Knob(size, rebuild=lambda n: <the config at n>)}).")


def knob_of(config: Config, name: str, target: Target) -> Knob:
    """The knob ``name`` of ``config`` on ``target``: its size, how to rebuild the config, its step."""
    check_knob(config, name)
    if name != "batch" or not isinstance(config, (TrainerConfig, InferenceConfig)):
        return config.knobs[name]
    field = "batch_spec" if isinstance(config, TrainerConfig) else "input_batch_spec"
    spec = getattr(config, field)
    sizes = {leaf.shape[0] for leaf in spec.values() if leaf.shape}
    if len(sizes) != 1:
        raise KnobError(f"The batch inputs ({', '.join(spec)}) do not share one leading size ({sorted(sizes)}); "
                        "name the size to search with a Knob in knobs=.")
    mesh = place(config, target).mesh
    partition = config.batch_partition
    first = partition[0] if partition is not None and len(partition) else mesh.axis_names[0]
    axes = first if isinstance(first, tuple) else (first,) if first is not None else ()
    step = math.prod(dict(zip(mesh.axis_names, mesh.devices.shape))[a] for a in axes)

    def rebuild(size: int) -> Config:
        return dataclasses.replace(config, **{field: {
            k: jax.ShapeDtypeStruct((size, *leaf.shape[1:]), leaf.dtype) for k, leaf in spec.items()}})

    return Knob(sizes.pop(), rebuild, step)
