"""What a device of a target may hold: the runtime's limit on a TPU, a GPU process's share of its memory
(``XLA_PYTHON_CLIENT_MEM_FRACTION``, JAX's default 0.75), given by a config, the ini or the environment.

A server's boot budget (:mod:`aotcheck.gate.boot`) and a GPU fit search (:mod:`aotcheck.pipeline.measure`)
both hold a program against it.

Example:
    >>> from aotcheck.targets.topology import parse_topology
    >>> usable_memory(parse_topology("h100-8"), {}).bytes == int(parse_topology("h100-8").device.memory_bytes * 0.75)
    True
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from aotcheck.records import Record
from aotcheck.targets.topology import Topology


@dataclasses.dataclass(frozen=True)
class Usable(Record):
    """What a device may hold, and where that comes from.

    Attributes:
        bytes: The bytes.
        fraction: The share of the device's memory the process runs with (None: the runtime's limit).
        variable: The environment variable that sets the share in the served process (a GPU's
            ``XLA_PYTHON_CLIENT_MEM_FRACTION``).
        source: Where the share was given: the config (``"llm's memory_fraction"``), the ini
            (``"aot_memory_fraction"``) or the environment (the variable); None: the platform's default.
    """

    bytes: int
    fraction: float | None = None
    variable: str | None = None
    source: str | None = None

    @classmethod
    def __json_read__(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        # Reports before the source was recorded said only whether the variable gave it.
        if "source" in data or not isinstance(data, Mapping):
            return data
        return {**data, "source": data.get("variable") if data.get("given") else None}


def first_share(*shares: tuple[float | None, str]) -> tuple[float, str] | None:
    """The first share given, with where it was given: a config's over the ini's (None: neither).

    Example:
        >>> first_share((None, "llm's memory_fraction"), (0.9, "aot_memory_fraction"))
        (0.9, 'aot_memory_fraction')
    """
    return next(((share, source) for share, source in shares if share is not None), None)


def usable_memory(topology: Topology, environ: Mapping[str, str] | None = None, *,
                  fraction: tuple[float, str] | None = None) -> Usable | None:
    """What a device of ``topology`` may hold (None: a host's CPU, which has no budget of its own).
    ``fraction``: the share of memory the served process runs with and where it was given (the config or
    the ini), over the environment's variable; else the variable, else the platform's default.

    Example:
        >>> from aotcheck.targets.topology import parse_topology
        >>> h100 = parse_topology("h100-8")
        >>> usable_memory(h100, {}).fraction, usable_memory(h100, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}).source
        (0.75, 'XLA_PYTHON_CLIENT_MEM_FRACTION')
        >>> usable_memory(h100, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}, fraction=(0.95, "aot_memory_fraction")).fraction
        0.95
    """
    device, platform = topology.device, topology.platform
    if not device.memory_limit_bytes:
        return None
    if platform.memory_fraction is None:  # The runtime's limit: no share of it is the process's to set.
        return Usable(int(device.runtime_bytes or 0))
    default, variable = platform.memory_fraction
    share, source = fraction if fraction is not None else (None, None)
    if share is None:
        given = (os.environ if environ is None else environ).get(variable)
        try:
            share = float(given) if given else None
            if share is not None and not 0 < share <= 1:
                raise ValueError(given)
            source = variable if share is not None else None
        except ValueError:  # Not a share: the process would not run with it either; the default is said.
            share = None
    return Usable(int(int(device.memory_bytes or 0) * (share or default)), share or default, variable, source)
