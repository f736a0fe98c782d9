"""Trainer and inference configs as the one compiled kind (aotcheck.programs.model): each program a
FunctionConfig with its argument kinds and names, its batch knob and the fit search's fields."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import aotcheck
from aotcheck.errors import ConfigError
from aotcheck.models import lm
from aotcheck.programs.lowering import arguments, lower_function
from aotcheck.programs.model import as_functions, function_for
from aotcheck.programs.registry import Registry
from aotcheck.targets.topology import Target


def test_a_trainer_is_one_function_whose_arguments_keep_their_names_and_kinds():
    step, _ = as_functions(lm.trainer_config(lm.TINY))
    assert isinstance(step, aotcheck.FunctionConfig) and step.programs == ("train_step",)
    found = arguments(lower_function(step, Target.of("cpu-4"))["train_step"], step)
    kinds = {a.path.split("/")[0]: a.kind for a in found}
    assert kinds == {"params": "params", "opt_state": "opt_state", "step": "opt_state", "batch": "batch"}
    # Params and their Adam moments have the same shapes; the state is donated, the batch is not.
    params = sorted(a.shape for a in found if a.kind == "params")
    assert params and params == sorted(a.shape for a in found if "/mu/" in a.path)


def test_an_inference_config_is_one_function_per_method_at_the_inputs_asked():
    config = lm.inference_config(lm.TINY)
    functions = as_functions(config)
    assert [f.programs[0] for f in functions] == list(config.methods)
    wide = {name: jax.ShapeDtypeStruct((64, *leaf.shape[1:]), leaf.dtype) for name, leaf in config.input_batch_spec.items()}
    prefill = function_for(dataclasses.replace(config, input_batch_spec=wide), "prefill")
    lowered = lower_function(prefill, Target.of("cpu-4"))["prefill"]
    assert {a.path: a.shape[0] for a in arguments(lowered, prefill) if a.kind == "batch"} == {"batch/prompt": 64}
    with pytest.raises(ConfigError, match="Program 'decode' is not defined; this config offers prefill, sample_decode"):
        function_for(config, "decode")


def test_the_batch_knob_steps_by_the_devices_the_batch_is_split_over_and_rebuilds_the_function():
    step, _ = as_functions(lm.trainer_config(lm.TINY))
    knob = step.knobs["batch"]
    assert knob.size == 32 and knob.on(Target.of("v5e-16", 2)).step == 16  # The data axis: 16 of 32 devices.
    wider = knob.rebuild(64)
    assert isinstance(wider, aotcheck.FunctionConfig) and wider.knobs["batch"].size == 64
    lowered = lower_function(wider, Target.of("cpu-4"))["train_step"]
    assert lowered.args_info[0][1]["tokens"].shape[0] == 64


def test_a_model_whose_batch_inputs_share_no_leading_size_offers_no_batch_knob():
    spec = {"tokens": jax.ShapeDtypeStruct((32, 128), jnp.int32), "mask": jax.ShapeDtypeStruct((16, 128), jnp.int32)}
    step, evaluate = as_functions(dataclasses.replace(lm.trainer_config(lm.TINY), batch_spec=spec))
    assert "batch" not in step.knobs and "batch" not in evaluate.knobs


def test_the_fit_searchs_fields_and_where_it_compiles_carry_over():
    config = dataclasses.replace(lm.trainer_config(lm.TINY), fit="batch", fit_upper=256, fit_targets=("v5e-*",),
                                 min_devices=4, trace_in_mesh=False)
    step, evaluate = as_functions(config)
    assert (step.fit, step.fit_upper, step.fit_targets, step.min_devices, step.trace_in_mesh) == (
        "batch", 256, ("v5e-*",), 4, False)
    # The eval step is gated, not searched; where it compiles carries over.
    assert (evaluate.fit, evaluate.fit_upper, evaluate.min_devices, evaluate.trace_in_mesh) == (None, None, 4, False)


def test_the_registry_holds_only_the_one_compiled_kind():
    registry = Registry()
    registry.register("lm", lambda: [lm.trainer_config(lm.TINY), lm.inference_config(lm.TINY)])
    entry = registry.get("lm")
    assert all(type(c) is aotcheck.FunctionConfig for c in entry.configs())
    assert list(entry.programs()) == ["train_step", "eval_step", "prefill", "sample_decode"]


def test_the_eval_step_is_the_loss_forward_or_the_jobs_own_at_its_eval_batch_and_none_turns_it_off():
    """No gradients and no optimizer state in the eval step: the parameters and the eval batch alone,
    nothing donated; an eval batch of its own moves its batch knob, not the train step's."""
    evals = {"tokens": jax.ShapeDtypeStruct((8, 128), jnp.int32), "targets": jax.ShapeDtypeStruct((8, 128), jnp.int32)}
    step, evaluate = as_functions(lm.trainer_config(lm.TINY, eval_batch_spec=evals))
    lowered = lower_function(evaluate, Target.of("cpu-4"))["eval_step"]
    kinds = {a.path.split("/")[0]: a.kind for a in arguments(lowered, evaluate)}
    assert kinds == {"params": "params", "batch": "batch"} and lowered.args_info[0][1]["tokens"].shape == (8, 128)
    assert evaluate.knobs["batch"].size == 8 and step.knobs["batch"].size == 32
    assert evaluate.knobs["batch"].rebuild(16).program == "eval_step"
    assert "transpose(jvp" not in lowered.as_text(debug_info=True)  # No backward pass.
    own = lm.trainer_config(lm.TINY, eval_step=lambda params, batch: {"norm": params["final_ln"].sum()})
    lowered = lower_function(as_functions(own)[1], Target.of("cpu-4"))["eval_step"]
    assert lowered.out_info["norm"].shape == ()
    assert [f.program for f in as_functions(lm.trainer_config(lm.TINY, eval_step=None))] == ["train_step"]
    with pytest.raises(ConfigError, match=r"TrainerConfig.eval_step='los' is not callable; give a function "
                                          r"\(params, batch\) -> metrics \(or 'loss'"):
        lm.trainer_config(lm.TINY, eval_step="los")
    with pytest.raises(ConfigError, match=r"TrainerConfig.eval_step takes \(params\), which cannot be called"):
        lm.trainer_config(lm.TINY, eval_step=lambda params: params)


def test_an_eval_batch_or_settings_of_the_wrong_form_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"TrainerConfig.eval_batch_spec=\(8, 128\): give the eval batch's "
                                          r"ShapeDtypeStructs by input name"):
        lm.trainer_config(lm.TINY, eval_batch_spec=(8, 128))
    with pytest.raises(ConfigError, match=r"settings=\['full'\]: give what the config was built with by name"):
        lm.trainer_config(lm.TINY, settings=["full"])
