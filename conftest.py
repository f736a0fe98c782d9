"""The repository's own reference configs, registered for aotcheck's plugin and CLI.

- ``lm-tiny``: a 2-layer LM that compiles in seconds; the test suite and the
  default gate use it.
- ``lm-1b``: a 1.04B-parameter LM (18 layers, d_model 2048) for the main job;
  its cases compile in minutes, so only the main job asks for it
  (``--aot-configs=lm-1b``, see README).
"""

import aotcheck
from aotcheck.models import lm


@aotcheck.register("lm-tiny", description=f"tiny decoder LM, {lm.TINY.num_params():,} params")
def lm_tiny():
    return [lm.trainer_config(lm.TINY), lm.inference_config(lm.TINY)]


@aotcheck.register("lm-1b", description=f"decoder LM, {lm.ONE_B.num_params():,} params (main job)")
def lm_1b():
    return [lm.trainer_config(lm.ONE_B), lm.inference_config(lm.ONE_B)]
