"""Deviceless GPU figures against a real GPU's: the same programs compiled both ways, side by side.

    python benchmarks/gpu_fidelity.py                    # on a host with one NVIDIA GPU (H100, H200, B200, ...)
    python benchmarks/gpu_fidelity.py --run              # and run each program once: the device's own peak
    python benchmarks/gpu_fidelity.py --configs lm-tiny  # seconds, not minutes

Needs, on the GPU host, jax with a working CUDA install (``pip install -r requirements.lock`` brings
the CUDA plugin; the CUDA libraries come with ``pip install "jax[cuda12]==<the lock's jax>"`` or the
host's own). For each program of the reference configs (conftest.py: lm-tiny's three, lm-1b's train
step and prefill), on one GPU:

- deviceless: a child process with ``JAX_PLATFORMS=cpu`` lowers the config for aotcheck's target
  ``<model>-1`` (the model read from the real GPU's device kind) and compiles it with XLA's GPU
  compiler from the CUDA plugin, the device spec it embeds, and no autotuning: what aotcheck gates;
- real: a child process on the GPU lowers the same config with the real device in the target's place
  and compiles it there (autotuned); ``--run`` then executes it once on zeros and reads the device's
  peak bytes in use (what the allocator saw, arguments included).

Prints, per program, the memory figures of ``memory_analysis()`` (argument, output, alias, temp,
peak) both ways with their ratio, and aotcheck's loop-aware FLOPs. A minute or two for lm-tiny and
lm-1b on one H200 (most of it the real compiles' autotuning). Also runs without a GPU with
``--real-platform cpu`` (the "real" side then compiles for this host's CPU: a check of the script,
not of the figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {"lm-tiny": ("train_step", "prefill", "sample_decode"), "lm-1b": ("train_step", "prefill")}
MEMORY = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes")


def child(mode: str, cases: list[str], family: str, run: bool, platform: str) -> None:
    """Compiles each case (``config/program``) one way and prints one JSON object per case."""
    sys.path.insert(0, str(ROOT))
    import jax
    import jax.numpy as jnp

    import conftest  # noqa: F401  (registers the reference configs)
    from aotcheck.figures.loops import analyze_hlo
    from aotcheck.figures.program import memory_figures
    from aotcheck.pipeline.case import Case
    from aotcheck.pipeline.stages import lower
    from aotcheck.programs import lowering
    from aotcheck.programs.registry import REGISTRY
    from aotcheck.targets.mesh import MeshSpec
    from aotcheck.targets.devices import TopologyDevices

    if mode == "real":
        device = jax.devices(platform)[0]
        # The target's one deviceless GPU replaced by the real one: the same lowering, mesh and shardings.
        lowering.get_devices_for_topology = lambda topology, num_slices=1: TopologyDevices([device], 1)
    for case in cases:
        name, program = case.split("/")
        config = REGISTRY.get(name).program(program)
        # One GPU: every mesh axis of size 1 (the partition rules stay; they shard nothing).
        config = dataclasses.replace(config, mesh=MeshSpec(config.mesh.axis_names, (1,) * len(config.mesh.axis_names)))
        lowered = lower(Case.of(name, program, f"{family}-1"), config, presets=False).lowered
        start = time.perf_counter()
        compiled = lowered.compile()
        row = {"case": f"{name}/{program}", "compile_seconds": round(time.perf_counter() - start, 1),
               **{k: v for k, v in memory_figures(compiled).items() if k in MEMORY},
               "flops": analyze_hlo(compiled.as_text()).flops}
        if mode == "real" and run:
            args, kwargs = jax.tree.map(lambda a: jax.device_put(jnp.zeros(a.shape, a.dtype), device),
                                        lowered.args_info)
            jax.block_until_ready(compiled(*args, **kwargs))
            stats = device.memory_stats() or {}
            row["device_peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
            row["device_bytes_limit"] = stats.get("bytes_limit")
            del args, kwargs
        print(json.dumps(row), flush=True)


def side(mode: str, args: argparse.Namespace, family: str, cases: list[str]) -> dict[str, dict]:
    env = dict(os.environ)
    if mode == "deviceless":
        env["JAX_PLATFORMS"] = "cpu"  # What aotcheck's workers do: the plugin's runtime stays off.
    # A device's peak in use is the process's running maximum: with --run, each case in a process of its own.
    batches = [[c] for c in cases] if mode == "real" and args.run else [cases]
    rows = []
    for batch in batches:
        command = [sys.executable, __file__, "--child", mode, "--cases", ",".join(batch), "--family", family,
                   "--real-platform", args.real_platform, *(["--run"] if args.run else [])]
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
        if out.returncode:
            sys.exit(f"the {mode} side failed on {', '.join(batch)}:\n{out.stderr[-4000:]}")
        rows += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["case"]: r for r in rows}


def gpu_family(platform: str) -> str:
    """aotcheck's GPU family for this host's first GPU (its device kind against the table)."""
    if platform != "gpu":
        return "h100"
    out = subprocess.run([sys.executable, "-c", "import jax; print(jax.devices('gpu')[0].device_kind)"],
                         capture_output=True, text=True)
    kind = out.stdout.strip()
    sys.path.insert(0, str(ROOT))
    from aotcheck.targets.gpu import GPUS

    family = next((f for f, g in GPUS.items() if g.device_name == kind), None)
    if family is None:
        sys.exit(f"this host's GPU is {kind or 'not visible to jax'} ({out.stderr.strip()[-500:]}); aotcheck's "
                 f"GPU table has {', '.join(g.device_name for g in GPUS.values())}")
    if 1 not in GPUS[family].domain_sizes:  # gb200-72: no one-GPU target to compare with.
        sys.exit(f"aotcheck has no one-GPU target for {kind} ({family}-{min(GPUS[family].domain_sizes)} is its "
                 "smallest); this script compares one GPU")
    return family


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="lm-tiny,lm-1b")
    parser.add_argument("--run", action="store_true", help="run each program once on the GPU (its own peak)")
    parser.add_argument("--real-platform", default="gpu", help="cpu: check the script on a host without a GPU")
    parser.add_argument("--child", choices=("deviceless", "real"), help=argparse.SUPPRESS)
    parser.add_argument("--cases", help=argparse.SUPPRESS)
    parser.add_argument("--family", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.cases.split(","), args.family, args.run, args.real_platform)
        return
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(configs) - set(PROGRAMS))
    if unknown:
        parser.error(f"--configs: {', '.join(unknown)} unknown here; this script compares {', '.join(PROGRAMS)}")
    cases = [f"{c}/{p}" for c in configs for p in PROGRAMS[c]]
    family = gpu_family(args.real_platform)
    start = time.perf_counter()
    deviceless, real = side("deviceless", args, family, cases), side("real", args, family, cases)
    print(f"{family}-1: deviceless (aotcheck: the CUDA plugin's {family} spec, no autotuning) against the real "
          f"{'GPU' if args.real_platform == 'gpu' else args.real_platform} (autotuned); "
          f"{time.perf_counter() - start:.0f} s in all\n")
    header = f"{'case':26} {'figure':24} {'deviceless':>16} {'real':>16} {'real/deviceless':>15}"
    print(header + "\n" + "-" * len(header))
    for case, d in deviceless.items():
        r = real.get(case, {})
        for figure in (*MEMORY, "flops", "device_peak_bytes_in_use", "device_bytes_limit", "compile_seconds"):
            if d.get(figure) is None and r.get(figure) is None:  # The device's own figures: --run on a GPU.
                continue
            a, b = d.get(figure), r.get(figure)
            ratio = f"{b / a:.3f}" if a and b is not None else "-"
            print(f"{case:26} {figure:24} {a if a is not None else '-':>16} {b if b is not None else '-':>16} {ratio:>15}")


if __name__ == "__main__":
    main()
