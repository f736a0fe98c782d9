"""A case: one (config, program, target), a serving bucket's program with its bucket as a value,
with a readable, parseable id (the one place it is made: :attr:`Case.id`, :meth:`Case.parse`).

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> case = Case.of("lm-tiny", "train_step", "v5litepod-16", 2)
    >>> case.id, case.golden_relpath
    ('lm-tiny/train_step@v5e-16x2', 'lm-tiny/train_step@v5e-16x2.json')
    >>> Case.parse(case.id) == case
    True
    >>> case.topology.family, case.num_slices
    ('v5e', 2)
    >>> bucket = Case.parse("llm/sample[tokens=64,seqs=8]@v5e-8x1")
    >>> bucket.program, dict(bucket.bucket), bucket.golden_relpath
    ('sample', {'tokens': 64, 'seqs': 8}, 'llm/sample[tokens=64,seqs=8]@v5e-8x1.json')
"""

from __future__ import annotations

import dataclasses

from aotcheck import records
from aotcheck.programs.config import FunctionConfig
from aotcheck.programs.names import Bucket, parse_program_id, program_id, split_case_id
from aotcheck.targets.topology import Target, Topology


@dataclasses.dataclass(frozen=True)
class Case:
    """What one test item compiles and checks."""

    config: str
    program: str
    target: Target
    bucket: Bucket = Bucket()

    @classmethod
    def of(cls, config: str, program: str, topology: str | Topology, num_slices: int = 1) -> "Case":
        """A case from its parts, the program by its id (``step[tokens=64]``: a bucket's)."""
        name, bucket = parse_program_id(program)
        return cls(config, name, Target.of(topology, num_slices), bucket)

    @classmethod
    def for_config(cls, config: str, function: FunctionConfig, target: Target) -> "Case":
        """The case of a registered function config (its program and bucket) on ``target``."""
        return cls(config, function.program, target, function.bucket)

    @property
    def program_id(self) -> str:
        """The program with its bucket, as the id says it (``step[tokens=64]``): what a config's
        program is looked up by."""
        return program_id(self.program, self.bucket)

    @property
    def topology(self) -> Topology:
        return self.target.topology

    @property
    def num_slices(self) -> int:
        return self.target.num_slices

    @property
    def id(self) -> str:
        return f"{self.config}/{self.program_id}@{self.target.name}"

    @property
    def golden_relpath(self) -> str:
        """Where its golden file lives under the golden directory."""
        return f"{self.id}.json"

    @classmethod
    def parse(cls, text: str) -> "Case":
        """Parses an id; ValueError (TopologyError for a bad target) if it is not one."""
        config, program, target = split_case_id(text)
        name, bucket = parse_program_id(program)
        return cls(config, name, Target.parse(target), bucket)

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"Case.parse({self.id!r})"


records.leaf(Case, lambda case: case.id, Case.parse)  # A case's JSON is its id.
