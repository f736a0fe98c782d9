"""Models as users write them: Flax Linen, Flax NNX and Equinox, read into aotcheck's configs.

Each adapter is its own module and imports its library only when used
(``pip install 'aotcheck[flax]'`` or ``'aotcheck[equinox]'``)::

    from aotcheck.adapters import flax_linen, flax_nnx, equinox

    config = flax_linen.adapt(module, example, logical_axis_rules=RULES).trainer(
        batch_spec=..., loss_fn=lambda model, batch: ..., optimizer=optax.adamw(3e-4))

See :mod:`aotcheck.adapters.base` for what they share.
"""
