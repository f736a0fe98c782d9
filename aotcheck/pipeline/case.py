"""A case: one (config, program, target), with a readable, parseable id.

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> case = Case.of("lm-tiny", "train_step", "v5litepod-16", 2)
    >>> case.id, case.golden_relpath
    ('lm-tiny/train_step@v5e-16x2', 'lm-tiny/train_step@v5e-16x2.json')
    >>> Case.parse(case.id) == case
    True
    >>> case.topology.family, case.num_slices
    ('v5e', 2)
"""

from __future__ import annotations

import dataclasses
import re

from aotcheck.targets.topology import Target, Topology

_ID = re.compile(r"^(?P<config>[^/@\s]+)/(?P<program>[^/@\s]+)@(?P<target>[^/@\s]+)$")


@dataclasses.dataclass(frozen=True)
class Case:
    """What one test item compiles and checks."""

    config: str
    program: str
    target: Target

    @classmethod
    def of(cls, config: str, program: str, topology: str | Topology, num_slices: int = 1) -> "Case":
        return cls(config, program, Target.of(topology, num_slices))

    @property
    def topology(self) -> Topology:
        return self.target.topology

    @property
    def num_slices(self) -> int:
        return self.target.num_slices

    @property
    def id(self) -> str:
        return f"{self.config}/{self.program}@{self.target.name}"

    @property
    def golden_relpath(self) -> str:
        """Where its golden file lives under the golden directory."""
        return f"{self.id}.json"

    @classmethod
    def parse(cls, text: str) -> "Case":
        """Parses an id; ValueError (TopologyError for a bad target) if it is not one."""
        match = _ID.match(text)
        if not match:
            raise ValueError(f"Not a case id: {text!r} (expected CONFIG/PROGRAM@TOPOLOGYxSLICES).")
        return cls(match["config"], match["program"], Target.parse(match["target"]))

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"Case.parse({self.id!r})"
