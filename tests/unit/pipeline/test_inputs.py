"""A case's inputs digest: equal for equal inputs, and different for a change in any of them (the
config as built, its options, the flags JAX and XLA read, JAX's configuration, the target); a log
directory changes nothing. Real configs on host devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from aotcheck import FunctionConfig
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.inputs import inputs, inputs_key


def _config(width: int = 8) -> FunctionConfig:
    return FunctionConfig(fn=jnp.tanh, make_args=lambda mesh: (jax.ShapeDtypeStruct((width,), jnp.float32),))


CASE = Case.of("t", "step", "cpu-2")


def test_equal_inputs_digest_alike_and_a_log_directory_changes_nothing(monkeypatch):
    key = inputs_key(CASE, _config(), options={})
    monkeypatch.setenv("TPU_LOG_DIR", "/tmp/another-process-logs")
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "16")  # A run that also selects cpu-16 lowers this case alike.
    assert inputs_key(CASE, _config(), options={}) == key


@pytest.mark.parametrize("change", ["build", "options", "xla_flags", "jax_env", "jax_config", "target"])
def test_a_change_in_any_input_is_another_digest(change, monkeypatch):
    key = inputs_key(CASE, _config(), options={})
    config, case, options = _config(), CASE, {}
    if change == "build":
        config = _config(width=16)  # The closure's cell: the config as built.
    elif change == "options":
        options = {"xla_cpu_enable_fast_math": "true"}
    elif change == "xla_flags":
        monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=false")
    elif change == "jax_env":
        monkeypatch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "highest")
    elif change == "jax_config":
        before = jax.config.values["jax_numpy_rank_promotion"]
        jax.config.update("jax_numpy_rank_promotion", "warn" if before != "warn" else "raise")
        try:
            assert inputs_key(case, config, options=options) != key
        finally:
            jax.config.update("jax_numpy_rank_promotion", before)
        return
    else:
        case = Case.of("t", "step", "cpu-4")
    assert inputs_key(case, config, options=options) != key


def test_the_record_names_the_code_it_digests():
    record = inputs(CASE, _config(), options={})
    assert record["code"]["jax"].startswith("jax ")  # Installed: by version.
    assert record["code"][__name__].startswith("sha256 ")  # This file defines the config's function.
    assert record["toolchain"]["jax"] == jax.__version__


def test_the_inputs_name_project_files_as_the_reports_lines_do(tmp_path, monkeypatch):
    """Source lines are named relative to the working directory: a run from elsewhere names them
    otherwise, so its inputs differ."""
    here = inputs(CASE, _config(), options={})["paths"][__name__]
    monkeypatch.chdir(tmp_path)
    assert inputs(CASE, _config(), options={})["paths"][__name__] != here


def test_aotchecks_own_lowering_code_is_an_input():
    assert "aotcheck.pipeline.stages" in inputs(CASE, _config(), options={})["code"]
