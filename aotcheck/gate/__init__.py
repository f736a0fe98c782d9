"""Judging cases: measure (in a chip family's worker process, cached), compare with golden, decide, report."""
