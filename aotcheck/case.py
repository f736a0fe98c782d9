"""A case: one (config, program, topology, slice count), with a readable, parseable id.

Example:
    >>> from aotcheck.case import Case
    >>> case = Case("lm-tiny", "train_step", "v5e-16", 2)
    >>> case.id
    'lm-tiny/train_step@v5e-16x2'
    >>> Case.parse(case.id) == case
    True
"""

from __future__ import annotations

import dataclasses
import re

_ID = re.compile(r"^(?P<config>[^/@\s]+)/(?P<program>[^/@\s]+)@(?P<topology>[^/@\s]+?)x(?P<slices>\d+)$")


@dataclasses.dataclass(frozen=True, order=True)
class Case:
    """What one test item compiles and checks."""

    config: str
    program: str
    topology: str
    num_slices: int = 1

    @property
    def id(self) -> str:
        return f"{self.config}/{self.program}@{self.topology}x{self.num_slices}"

    @property
    def golden_relpath(self) -> str:
        """Where its golden file lives under the golden directory."""
        return f"{self.config}/{self.program}@{self.topology}x{self.num_slices}.json"

    @classmethod
    def parse(cls, text: str) -> "Case":
        match = _ID.match(text)
        if not match:
            raise ValueError(f"Not a case id: {text!r} (expected CONFIG/PROGRAM@TOPOLOGYxSLICES).")
        return cls(match["config"], match["program"], match["topology"], int(match["slices"]))
