"""The fingerprint of a build (aotcheck.programs.fingerprint): equal builds agree, in this process and
another; the first leaf that differs is named."""

import dataclasses
import functools
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, strategies as st

from aotcheck.models import lm
from aotcheck.programs.fingerprint import fingerprint
from aotcheck.programs.model import as_functions

VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.floats(allow_nan=False),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                      max_leaves=12)


@given(VALUES)
def test_equal_values_agree_and_a_changed_leaf_is_named(value):
    assert fingerprint(value) == fingerprint(value) and fingerprint(value).difference(fingerprint(value)) is None
    changed = fingerprint([value, 1]).difference(fingerprint([value, 2]))
    assert changed == "[1]: 1 vs 2"


def test_functions_are_told_apart_by_code_closures_and_defaults_not_by_address():
    def make(width, scale=1.0):
        return lambda x: x * width * scale
    assert fingerprint(make(2)).digest == fingerprint(make(2)).digest  # Two closures, two addresses, one build.
    assert fingerprint(make(2)).difference(fingerprint(make(3))) == ".<width>: 2 vs 3"
    assert fingerprint(functools.partial(max, 1)).difference(fingerprint(functools.partial(max, 2))) == ".args[0]: 1 vs 2"


def test_arrays_by_dtype_shape_and_bytes_and_a_cycle_by_where_it_was_met():
    a, b = np.zeros((4, 4), np.float32), np.ones((4, 4), np.float32)
    assert fingerprint(a).difference(fingerprint(b)).startswith("(the config): array float32(4, 4) sha ")
    assert "ShapeDtypeStruct" in fingerprint(jax.ShapeDtypeStruct((2,), jnp.int32)).leaves[""]
    loop: list = []
    loop.append(loop)
    assert fingerprint(loop).leaves["[0]"] == "(as the config)"


@dataclasses.dataclass
class Slotted:
    __slots__ = ("width",)
    width: int


def test_a_build_in_another_process_has_the_same_fingerprint(tmp_path):
    """The session and each compile worker build the config: their fingerprints must agree (no address,
    no hash seed, no id in it). lm-tiny's trainer, expanded to its train step, built in a fresh process."""
    here = fingerprint(as_functions(lm.trainer_config(lm.TINY))).digest
    code = textwrap.dedent("""
        from aotcheck.models import lm
        from aotcheck.programs.fingerprint import fingerprint
        from aotcheck.programs.model import as_functions
        print(fingerprint(as_functions(lm.trainer_config(lm.TINY))).digest)
    """)
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "7", "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}).stdout.strip()
    assert there == here
    assert fingerprint(Slotted(1)).difference(fingerprint(Slotted(2))) == ".width: 1 vs 2"
