"""aotcheck.programs.registry: configs registered by name, built once into the one compiled kind,
selected by glob; each way a registration or a build goes wrong named with its fix."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.models import lm
from aotcheck.programs.registry import (ConfigNotFound, ProgramNotFound, Registry, RegistryError, home_of,
                                        registrations)


def make_args(mesh):
    return (jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh, P())),)


def double(program="step", **fields):
    return aotcheck.FunctionConfig(fn=lambda x: x * 2, make_args=make_args, program=program, **fields)


def test_a_model_builds_into_one_function_per_program_and_is_found_by_glob():
    registry = Registry()
    before = registrations()

    @registry.register("lm-tiny")
    def tiny():
        """The tiny LM."""
        return [lm.trainer_config(lm.TINY), lm.inference_config(lm.TINY)]

    registry.register("other", double())
    assert registrations() == before + 2 and registry.names() == ["lm-tiny", "other"]
    entry = registry.get("lm-tiny")
    assert sorted(entry.programs()) == ["eval_step", "prefill", "sample_decode", "train_step"]
    assert all(type(c) is aotcheck.FunctionConfig for c in entry.configs())  # The one compiled kind.
    assert entry.description == "The tiny LM." and home_of(tiny)[0] == __name__
    assert [e.name for e in registry.select(["lm-*"])] == ["lm-tiny"] and len(registry) == 2
    assert entry.unstable() is None  # Built twice, alike.


@pytest.mark.parametrize("build, words", [
    (lambda: [], "built no config (its builder returned an empty list)"),
    (lambda: 42, "built a int; expected a TrainerConfig, InferenceConfig, FunctionConfig or ServingConfig"),
    (lambda: [double(), double()], "defines program 'step' twice"),
    (lambda: [double("Step"), double("step")], "differ only in letter case"),
    (lambda: lm.inference_config(lm.TINY, methods={}), "defines no program"),
    (lambda: 1 / 0, "Building config 'bad' failed: ZeroDivisionError: division by zero"),
])
def test_a_build_that_goes_wrong_is_named_when_the_config_is_used(build, words):
    registry = Registry()
    registry.register("bad", build)  # Registering builds nothing: a broken config fails only its own cases.
    with pytest.raises(RegistryError, match=words.replace("(", r"\(").replace(")", r"\)")):
        registry.get("bad").configs()


def test_names_twice_unknown_configs_and_programs_are_named_with_what_there_is():
    registry = Registry()
    registry.register("a", double())
    with pytest.raises(RegistryError, match="'a' is already registered"):
        registry.register("a", double())
    with pytest.raises(ConfigNotFound, match="No config named 'b'; registered: a"):
        registry.get("b")
    with pytest.raises(ProgramNotFound, match="Config 'a' has no program 'train_step'; it has step"):
        registry.get("a").program("train_step")
    registry.register("A", double())
    assert set(registry.case_twins()) == {"a", "A"}


def test_a_builder_that_returns_another_config_each_time_is_unstable_and_says_where():
    registry = Registry()
    sizes = iter([128, 256])
    registry.register("moving", lambda: double(knobs={"batch": aotcheck.Knob(next(sizes), lambda n: double())}))
    assert "128 vs 256" in registry.get("moving").unstable()


def test_a_registry_that_is_a_module_level_name_of_another_module_is_found_there(tmp_path, monkeypatch):
    """Hardening round 5, T72: a Registry defined in registries.py, configs registered into it from configs.py,
    was told "make it a module-level name"."""
    import importlib
    import sys

    (tmp_path / "t72_registries.py").write_text("import aotcheck\nMINE = aotcheck.Registry()\n")
    (tmp_path / "t72_configs.py").write_text("from t72_registries import MINE\n\n\ndef build():\n    return None\n\n\n"
                                             "MINE.register('x', build)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("t72_registries", "t72_configs"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    configs = importlib.import_module("t72_configs")
    registry = configs.MINE
    assert registry.locate() == ("t72_configs", "MINE")  # The registering module names it too.
    del configs.MINE  # Only registries.py names it now.
    assert registry.locate() == ("t72_registries", "MINE")
