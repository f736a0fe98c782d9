"""The repository's own reference configs, registered for aotcheck's plugin and CLI.

- ``lm-tiny``: a 2-layer LM that compiles in seconds; the test suite and the
  default gate use it.
- ``lm-1b``: a ~1.04B-parameter LM (18 layers, d_model 2048) for the main job;
  its cases compile in minutes, so only the main job asks for it
  (``--aot-configs=lm-1b``).
"""

import aotcheck
from aotcheck.mesh import MeshSpec
from aotcheck.models import lm

LM_TINY = lm.LMConfig(
    vocab=1024, d_model=128, n_layers=2, n_heads=4, d_ff=512,
    seq_len=128, batch=32, prompt_len=32, decode_len=16, decode_batch=32,
    mesh=MeshSpec(("data", "model"), (-1, 2)),
)
LM_1B = lm.LMConfig(
    vocab=32_000, d_model=2048, n_layers=18, n_heads=16, d_ff=8192,
    seq_len=1024, batch=64, prompt_len=128, decode_len=128, decode_batch=32,
    # Pure FSDP by default; tensor parallel on the 16-GiB v5e chips.
    mesh=MeshSpec(("data", "model"), (-1, 1), overrides={"v5e-*": (-1, 2)}),
)


@aotcheck.register("lm-tiny", description=f"tiny decoder LM, {LM_TINY.num_params():,} params")
def lm_tiny():
    return [lm.trainer_config(LM_TINY), lm.inference_config(LM_TINY)]


@aotcheck.register("lm-1b", description=f"decoder LM, {LM_1B.num_params():,} params (main job)")
def lm_1b():
    return [lm.trainer_config(LM_1B), lm.inference_config(LM_1B)]
