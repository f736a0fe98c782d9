"""The repository's own reference configs, registered for aotcheck's plugin and CLI.

- ``lm-tiny``: a 2-layer LM that compiles in seconds; the test suite and the
  default gate use it.
- ``lm-1b``: a 1.04B-parameter LM (18 layers, d_model 2048) for the main job;
  its cases compile in minutes, so only the main job asks for it
  (``--aot-configs=lm-1b``, see docs/reference-configs.md).
- ``lm-flash``, ``lm-splash``: attention by jax's own Pallas TPU kernels inside the
  layer scan (flash declares its cost, splash none); ``lm-moe``: routed experts through
  ``jax.lax.ragged_dot``. The field's program shapes, for the main job.
- ``llm``: the reference server (``aotcheck.models.serve``): a scheduler step over token buckets
  and sampling over token x request buckets, its paged KV cache read by jax's ragged paged
  attention kernel on TPU targets, its KV budget (``fit_max_pages``) searched on the largest step.
- ``llm-256k``, ``llm-31b``: two of the field's servers' shapes (tpu-inference #3360's on v5e-1,
  #3408's on 7x-8); under the start-up rules a v5e chip showed, both start, so neither reproduces its
  issue's failure (docs/calibration.md). Each names its own slice (``targets=``), so the main job
  (``--aot-configs='*'``) compiles it there whatever ``--aot-topologies`` lists, and skips it elsewhere.
"""

import aotcheck
from aotcheck.models import lm, serve


@aotcheck.register("lm-tiny", description=f"tiny decoder LM, {lm.TINY.num_params():,} params")
def lm_tiny():
    # Its real limit is ~10^5 sequences away, where one compile takes minutes on 2 cores: the fit
    # search stops at 8x the configured batch (fit_max_batch is then that bound, said as such).
    return lm.gate_configs(lm.TINY, fit_upper=8)


@aotcheck.register("lm-1b", description=f"decoder LM, {lm.ONE_B.num_params():,} params (main job)")
def lm_1b():
    # The train step's headroom is gated (fit_max_batch) on one slice of each chip: a search is 3
    # compiles more, a minute or two each cold, and on every target it took the main job past 15 minutes.
    return [lm.trainer_config(lm.ONE_B, fit="batch", fit_targets=("*x1",)), lm.inference_config(lm.ONE_B)]


@aotcheck.register("lm-flash", description="LM whose attention is jax's Pallas flash_attention in the layer scan")
def lm_flash():
    return [lm.trainer_config(lm.FLASH), lm.inference_config(lm.FLASH, methods=_only(lm.FLASH, "prefill"))]


@aotcheck.register("lm-splash", description="LM whose attention is jax's Pallas splash_attention (no declared cost)")
def lm_splash():
    return [lm.trainer_config(lm.SPLASH)]


@aotcheck.register("lm-moe", description=f"MoE LM, {lm.MOE.experts} experts top-{lm.MOE.top_k} via ragged_dot")
def lm_moe():
    return [lm.trainer_config(lm.MOE), lm.inference_config(lm.MOE)]


@aotcheck.register("llm", description="reference server: paged KV cache, ragged paged attention, buckets")
def llm():
    return serve.serving_config(serve.TINY)


@aotcheck.register("llm-256k", description="tpu-inference #3360's shape: a 256K vocabulary at 512 requests on v5e-1 (starts)")
def llm_256k():
    # No KV search (fit_max_pages): the boot budget answers the pool that starts, and a search is 3
    # compiles more of the step (40 s each here; 4 minutes each for llm-31b's).
    return serve.serving_config(serve.LLM_256K, targets=("v5e-1x1",), kv_budget=False)


@aotcheck.register("llm-31b", description="tpu-inference #3408's shape: a 30B dense server on 7x-8, its pool at 0.98 (starts)")
def llm_31b():
    return serve.serving_config(serve.LLM_31B, targets=("7x-8x1",), kv_budget=False)


def _only(cfg, name):
    return {name: lm.inference_config(cfg).methods[name]}
