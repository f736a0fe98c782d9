"""libtpu's state across chip families, as a script shows it (tests/unit/gate/test_isolation.py on the locked
libtpu, tests/e2e/test_toolchains.py on the oldest)."""

import os
import subprocess
from pathlib import Path

WIDE = """
import dataclasses
import aotcheck
from aotcheck.models import lm

# lm-1b's widths, 2 layers: big enough for libtpu's cross-family state to show.
WIDE = dataclasses.replace(lm.ONE_B, n_layers=2)
aotcheck.register("wide", lambda: lm.inference_config(WIDE, methods={"prefill": lambda p, b: lm.prefill(WIDE, p, b)}))
"""

QUIRK = WIDE + """
import sys
if sys.argv[1] == "after-v5e":
    aotcheck.compile_inference_programs(lm.inference_config(lm.TINY), input_batch_spec=None, topology="v5e-4",
                                        method="prefill")
out = aotcheck.compile_inference_programs(lm.inference_config(WIDE), input_batch_spec=None, topology="v4-8",
                                          topology_num_slices=2, method="prefill")
print(aotcheck.program_figures(out["prefill"])["comm_all_gather_count"])
"""


def quirk_counts(python: str, tmp_path: Path) -> dict[str, int]:
    """All-gathers of the same v4 x2 program compiled in a fresh process, and after a v5e compile."""
    script = tmp_path / "quirk.py"
    script.write_text(QUIRK)
    counts = {}
    for mode in ("fresh", "after-v5e"):
        env = {k: v for k, v in os.environ.items() if k != "TPU_LIBRARY_PATH"}  # The child's own libtpu.
        out = subprocess.run([python, "-W", "ignore", str(script), mode], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        counts[mode] = int(out.stdout.split()[-1])
    return counts
