"""The reference configs as the benchmark measures them (loaded with ``-o aot_config_modules=...``):
``bench-<name>`` is the config without a fit search, so the gate does exactly the work of a bare
lower+compile of each program (plus what the gate adds: its dump, attribution and bookkeeping);
``bench-<name>-fit`` the same with the gate's fit search of the batch, for its own row.
"""

import dataclasses

import aotcheck
from aotcheck.models import lm

for name, cfg in (("lm-tiny", lm.TINY), ("lm-1b", lm.ONE_B)):
    def plain(cfg=cfg):
        return [dataclasses.replace(c, fit=None) for c in lm.gate_configs(cfg)]

    def searched(cfg=cfg):
        return lm.gate_configs(cfg, fit_upper=8)

    aotcheck.register(f"bench-{name}", plain)
    aotcheck.register(f"bench-{name}-fit", searched)
