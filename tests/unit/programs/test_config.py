"""A step that owns its mesh: ``FunctionConfig.make_program(mesh, target)``, ``make_args(mesh, target)``,
knobs a fit search moves on a function, the context-mesh clash, and JAX's persistent compilation cache.

What each test shows, on real lowerings and (where said) real TPU compiles of tiny programs:
- a program made per target: its batch sized from the target, its own jit's donation and shardings
  kept, its own mesh (other axis names than aotcheck's) traced under its own context;
- ``make_args`` told the target when it takes two arguments;
- a config given both ways, neither way, or a ``make_program`` returning something else: a
  ConfigError or LoweringError naming the field and the fix;
- a step naming a mesh axis aotcheck's context mesh lacks: an error naming ``trace_in_mesh=False``;
- a knob on a FunctionConfig: ``aotcheck fit``'s default knob, and a real search whose answer
  matches the analytic limit of the chip's HBM;
- no compile of aotcheck's writes JAX's persistent compilation cache, whatever turned it on.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_programs import per_target, rows_program
from jax.experimental.compilation_cache import compilation_cache
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import aotcheck
from aotcheck.errors import ConfigError
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measure import measure
from aotcheck.programs.compile import compile_lowered
from aotcheck.programs.lowering import LoweringError, lower_config
from aotcheck.targets.topology import Target



def test_a_program_is_made_per_target_with_its_own_jit():
    config = aotcheck.FunctionConfig(make_program=per_target, program="double")
    for name, devices in (("cpu-4", 4), ("cpu-8", 8)):
        lowered = lower_config(config, Target.of(name))["double"]
        (x,), _ = lowered.args_info
        assert x.shape == (2 * devices, 128) and x.donated  # The step's own donation, not aotcheck's.


def test_a_step_traces_under_its_own_mesh_with_other_axis_names():
    """MaxText's way: a mesh of its own axes over aotcheck's devices, entered by the step's own lower()."""

    class OwnMesh:
        def __init__(self, mesh):
            devices = np.asarray(sorted(mesh.devices.flat, key=lambda d: d.id)).reshape(2, -1)
            self.mesh = Mesh(devices, ("fsdp", "tensor"))

        def lower(self, x):
            with jax.set_mesh(self.mesh):
                return jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, P("fsdp", "tensor"))).lower(x)

    def make_program(mesh, target):
        own = OwnMesh(mesh)
        return own, (jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(own.mesh, P("fsdp"))),)

    lowered = lower_config(aotcheck.FunctionConfig(make_program=make_program, trace_in_mesh=False),
                           Target.of("cpu-4"))["step"]
    text = lowered.as_text()
    assert 'sdy.mesh @mesh = <["fsdp"=2, "tensor"=2]>' in text and '<@mesh, [{"fsdp"}, {"tensor"}]>' in text


def test_make_args_is_told_the_target_when_it_takes_it():
    seen = []

    def make_args(mesh, target):
        seen.append(target.name)
        return (jax.ShapeDtypeStruct((target.num_devices, 4), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)

    lowered = lower_config(aotcheck.FunctionConfig(fn=lambda x: x + 1, make_args=make_args), Target.of("cpu-2"))
    assert seen == ["cpu-2x1"] and lowered["step"].args_info[0][0].shape == (2, 4)


def test_a_defaulted_second_parameter_of_make_args_is_left_alone():
    def make_args(mesh, dtype=jnp.bfloat16):  # Written before make_args could take the target.
        return (jax.ShapeDtypeStruct((4, 4), dtype, sharding=NamedSharding(mesh, P("data"))),)

    lowered = lower_config(aotcheck.FunctionConfig(fn=lambda x: x + 1, make_args=make_args), Target.of("cpu-4"))
    assert lowered["step"].args_info[0][0].dtype == jnp.bfloat16


@pytest.mark.parametrize("fields, words", [
    (dict(fn=abs, make_args=abs, make_program=per_target), "got make_program and fn and make_args"),
    (dict(), "got neither fn nor make_program"),
    (dict(fn=abs), "got fn:"),
])
def test_a_program_given_both_ways_or_neither_is_refused(fields, words):
    with pytest.raises(ConfigError, match=words) as e:
        aotcheck.FunctionConfig(**fields)
    assert "make_program=<(mesh, target) -> (fn, args)>" in str(e.value)


@pytest.mark.parametrize("made, said", [
    (lambda: jnp.zeros(3), "a ArrayImpl"),
    (lambda: (jnp.sin, (), {}), "a tuple of 3 items"),  # Hardening round 5, U28: was "returned a tuple".
    (lambda: {"fn": jnp.sin, "args": ()}, "a dict (keys fn, args)"),
    (lambda: (jnp.sin, "x"), "a tuple whose second item, a str, is not a sequence of arguments"),
])
def test_make_program_must_return_a_function_and_its_arguments(made, said):
    config = aotcheck.FunctionConfig(make_program=lambda mesh, target: made())
    with pytest.raises(LoweringError) as raised:
        lower_config(config, Target.of("cpu-4"))
    assert f"make_program returned {said} for cpu-4x1; it must return (fn, args)" in str(raised.value)


def test_a_step_naming_an_axis_of_its_own_mesh_names_the_cure():
    def make_args(mesh):
        return (jax.ShapeDtypeStruct((8, 8), jnp.float32),)

    step = aotcheck.FunctionConfig(fn=lambda x: jax.lax.with_sharding_constraint(x, P("tensor")), make_args=make_args)
    with pytest.raises(LoweringError) as e:
        lower_config(step, Target.of("cpu-4"))
    message = str(e.value)
    assert "Resource axis: tensor" in message and "trace_in_mesh=False" in message and "axes data" in message



def test_a_search_on_a_functions_knob_finds_the_chips_limit():
    """Real v5e compiles of a tiny program (about 15, 3 s). Analytic truth: input and output of ``rows`` MiB each must fit the 15.75 GiB v5e lets a device use,
    so the largest ``rows`` is just under 16128 / 2 = 8064 (a little less for XLA's own buffers)."""
    result = measure(Case("rows", "double", Target.of("v5e-1")), config=rows_program(1024), fit="rows",
                     memory_fraction=(0.1, "ini"))  # A GPU process's share: no TPU is held to it.
    found = result.figures["fit_max_rows"]
    assert 8000 <= found <= 8064, found
    assert result.details.fit.max_size == found and result.details.fit.usable is None


def test_a_gpu_search_holds_a_device_to_the_processs_share_of_its_memory(monkeypatch):
    """Hardening round 5, V54: the GPU fit search filled the whole memory while the boot budget read the
    process's share. Real h100 compiles (4 a search, about 1 s). Analytic truth: 2 MiB a row must fit the
    share of 84,942,979,072 B: 0.1 of it is 8,494,297,907 B, 4,050 rows; 0.2 is 8,100. The config's share
    wins over the ini's, which wins over the environment's variable."""
    from aotcheck.render.text import fit_lines

    case = Case("rows", "double", Target.of("h100-1"))
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.1")
    by_variable = measure(case, config=rows_program(1024), fit="rows")
    assert by_variable.figures["fit_max_rows"] == 4050
    by_ini = measure(case, config=rows_program(1024), fit="rows", memory_fraction=(0.2, "aot_memory_fraction"))
    assert by_ini.figures["fit_max_rows"] == 8100
    assert "  searched within what the process holds of a device, 15.82 GiB: 0.2 of memory (aot_memory_fraction)" \
        in fit_lines(case.id, by_ini.details.fit, case.topology)
    own = dataclasses.replace(rows_program(1024), memory_fraction=0.1)
    assert measure(case, config=own, fit="rows", memory_fraction=(0.2, "ini")).figures["fit_max_rows"] == 4050


def test_no_compile_of_aotchecks_writes_the_persistent_cache(tmp_path):
    """A library turned JAX's persistent compilation cache on (MaxText's config setup does): aotcheck's
    deviceless compile leaves the directory empty, and the setting as it found it."""
    lowered = lower_config(aotcheck.FunctionConfig(make_program=per_target), Target.of("v5e-1"))["step"]
    was = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    compilation_cache.reset_cache()  # As a fresh process: whatever this one compiled before does not decide.
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    try:
        compile_lowered(lowered, {}, what="step", topology="v5e-1")
        assert jax.config.jax_enable_compilation_cache  # Put back as it was.
    finally:
        jax.config.update("jax_compilation_cache_dir", was[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", was[1])
        compilation_cache.reset_cache()
    assert os.listdir(tmp_path) == []


KNOB_CASES = [  # Hardening round 4: each was accepted when built, then misread by a search or failed at lowering.
    (aotcheck.Knob(0, abs), "knobs['rows']: its size 0 is not a size >= 1"),
    (aotcheck.Knob(-1, abs), "knobs['rows']: its size -1 is not a size >= 1"),
    (aotcheck.Knob(10**18, abs), "knobs['rows']: its size 1000000000000000000 is past 2,147,483,647"),
    (aotcheck.Knob(32, abs, step=0), "knobs['rows']: its step 0 is not a size >= 1"),
    (aotcheck.Knob("32", abs), "knobs['rows']: its size '32' is not an int"),
    (aotcheck.Knob(True, abs), "knobs['rows']: its size True is not an int"),
    (aotcheck.Knob(32, 32), "knobs['rows']: its rebuild 32 is not callable"),
    (32, "knobs['rows']: it is int 32, not a Knob(size, rebuild, step)"),
]


@pytest.mark.parametrize("knob, words", KNOB_CASES)
def test_a_knob_a_search_would_misread_is_refused_when_the_config_is_built(knob, words):
    with pytest.raises(ConfigError) as e:
        aotcheck.FunctionConfig(fn=abs, make_args=abs, knobs={"rows": knob})
    assert str(e.value).startswith(f"FunctionConfig.{words}"), str(e.value)
    assert "Give Knob(size, rebuild, step)" in str(e.value)


def test_knobs_not_given_by_name_are_refused():
    with pytest.raises(ConfigError, match=r"FunctionConfig.knobs=\[32\]: give the knobs by name"):
        aotcheck.FunctionConfig(fn=abs, make_args=abs, knobs=[32])


@pytest.mark.parametrize("field", ["trace_as_target", "trace_in_mesh"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_a_trace_switch_given_as_anything_but_a_bool_is_refused(field, value):
    """``trace_as_target="no"`` was read as on."""
    with pytest.raises(ConfigError, match=rf"FunctionConfig.{field}={value!r} is not a bool; give {field}=True or "
                                          rf"{field}=False"):
        aotcheck.FunctionConfig(fn=abs, make_args=abs, **{field: value})


@pytest.mark.parametrize("fields, words", [
    ({"make_program": lambda mesh: None},
     "FunctionConfig.make_program takes (mesh), which cannot be called as (mesh, target) -> (fn, args)"),
    ({"fn": abs, "make_args": lambda mesh, target, extra: ()},
     "FunctionConfig.make_args takes (mesh, target, extra), which cannot be called as (mesh) -> its abstract "
     "arguments or (mesh, target) -> its abstract arguments"),
    ({"fn": abs, "make_args": lambda: ()}, "FunctionConfig.make_args takes ()"),
    ({"fn": abs, "make_args": 3}, "FunctionConfig.make_args=3 is not callable"),
])
def test_a_program_maker_aotcheck_cannot_call_is_refused_when_built(fields, words):
    """Hardening round 4: these were Python's TypeError from inside a lowering, the signatures allowed not named."""
    with pytest.raises(ConfigError) as e:
        aotcheck.FunctionConfig(**fields)
    assert str(e.value).startswith(words), str(e.value)


@pytest.mark.parametrize("made", [lambda x: (jnp.sin, (x,), 3), lambda x: {"fn": jnp.sin, "args": (x,)}])
def test_make_program_returning_other_than_fn_and_args_names_the_form(made):
    def make_program(mesh, target):
        return made(jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh, P())))

    with pytest.raises(LoweringError, match=r"it must return \(fn, args\)"):
        lower_config(aotcheck.FunctionConfig(make_program=make_program), Target.of("cpu-4"))
