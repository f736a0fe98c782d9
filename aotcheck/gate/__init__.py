"""Judging cases: measure (here or in a family's process, cached), compare with golden, decide, report."""
