"""The costs of the Pallas kernels jax ships that declare none, registered by name
(:mod:`aotcheck.figures.kernels`)."""

from __future__ import annotations
