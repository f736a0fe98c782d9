"""The pipeline: a case lowered, compiled and measured, each stage an object that hands the next what it needs.

    case + config --lower()--> LoweredCase --compile()--> CompiledCase --measure()--> Measurement

(:mod:`aotcheck.pipeline.stages`, after ``jax.stages``' ``Traced -> Lowered -> Compiled``). A
:class:`~aotcheck.pipeline.measurement.Measurement` is the one record of what a case costs, with one
JSON form; the worker reply, the figures cache entry, the golden body and ``compile --json`` are
views of it. :func:`~aotcheck.pipeline.measure.measure` composes the stages with the figures cache
and the fit search, which composes the same stages at other sizes.
"""
