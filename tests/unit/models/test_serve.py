"""The reference server (aotcheck.models.serve), compiled for real: jax's ragged paged attention on a TPU
target only when aotcheck traces as the target, XLA's attention on a GPU target, a bucket whose
kernel overflows VMEM, and its KV budget against an analytic count.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import pytest

from aotcheck.errors import OutOfMemorySpace
from aotcheck.models import serve
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measure import measure
from aotcheck.pipeline.stages import lower
from aotcheck.programs.lowering import lower_config
from aotcheck.targets.usable import usable_memory
from aotcheck.programs.serving import Bucketed, ServingConfig
from aotcheck.targets.topology import Target

ROOT = Path(__file__).resolve().parents[3]


def bucket(program: str, **changes):
    return {c.programs[0]: c for c in serve.serving_config(serve.TINY, **changes).expand()}[program]


def kernels(program: str, topology: str, **changes) -> int:
    """How many Pallas TPU kernels the compiled program calls."""
    config = dataclasses.replace(bucket(program), **changes)
    with lower(Case.of("llm", program, topology), config).compile() as compiled:
        return compiled.compiled.as_text().count("custom_call_target=\"tpu_custom_call\"")


def test_the_server_takes_its_kernel_path_on_a_tpu_only_when_traced_as_the_target():
    assert kernels("step[tokens=16]", "v5e-8") == serve.TINY.model.n_layers  # One ragged paged attention per layer.
    # Traced as this host (a CPU backend), the same code takes its XLA path: not the program the TPU runs.
    assert kernels("step[tokens=16]", "v5e-8", trace_as_target=False) == 0


def test_the_kernel_alone_asks_the_host_what_chip_it_runs_on():
    """jax's ragged paged attention picks its block sizes from jax.devices()[0].device_kind: traced as this
    host it refuses; traced as the target it compiles deviceless."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    tokens, seqs, heads, dim = 16, 4, 1, 128

    def attend(params, kv, batch):
        out = ragged_paged_attention(batch["q"], kv, batch["kv_lens"], batch["page_indices"], batch["cu_q_lens"],
                                     batch["num_seqs"])
        return out, kv

    i32 = lambda *s: jax.ShapeDtypeStruct(s, "int32")  # noqa: E731
    config = ServingConfig(
        init_fn=lambda rng: {}, partition_rules=(), pages=64, mesh=serve.TINY.mesh.__class__(("x",), (-1,)),
        kv=lambda pages: jax.ShapeDtypeStruct((pages, 16, 2 * heads, dim), "bfloat16"),
        bucketed={"attend": Bucketed(fn=attend, axes={"tokens": (tokens,)}, inputs=lambda point: {
            "q": jax.ShapeDtypeStruct((point["tokens"], heads, dim), "bfloat16"), "kv_lens": i32(seqs),
            "page_indices": i32(seqs, 4), "cu_q_lens": i32(seqs + 1), "num_seqs": i32(1)})})
    step, = config.expand()
    with pytest.raises(NotImplementedError, match="TPU version must be 4 or higher"):
        lower_config(dataclasses.replace(step, trace_as_target=False), Target.of("v5e-1"))
    assert "attend[tokens=16]" in lower_config(step, Target.of("v5e-1"))


def test_on_a_gpu_target_the_server_attends_by_xla():
    figures = measure(Case.of("llm", "step[tokens=16]", "h100-8"), config=bucket("step[tokens=16]", kv_budget=False))
    assert figures.figures["peak_bytes"] > 0


def test_a_bucket_whose_kernel_overflows_vmem_is_named_with_its_kernel():
    """The kernel's VMEM grows with its query block, min(tokens, 32) here: under a 330 KiB limit the
    16-token bucket fits (323,584 bytes) and the 32-token one does not (348,160)."""
    tight = dataclasses.replace(serve.TINY, vmem_limit_bytes=330 * 1024)
    configs = {c.programs[0]: c for c in serve.serving_config(tight, kv_budget=False).expand()}
    assert measure(Case.of("llm", "step[tokens=16]", "v5e-8"), config=configs["step[tokens=16]"]).figures["peak_bytes"]
    with pytest.raises(OutOfMemorySpace) as raised:
        measure(Case.of("llm", "step[tokens=32]", "v5e-8"), config=configs["step[tokens=32]"])
    overflow = raised.value.overflow
    assert (overflow.space, overflow.size_bytes, overflow.limit_bytes, overflow.kernel) == ("vmem", 348160, 337920, True)
    assert "ragged_paged_attention" in overflow.op_name


@pytest.mark.parametrize("target, tensor_parallel", [("v4-8x1", 4), ("v5e-16x1", 8), ("h100-8x1", 8)])
def test_the_committed_kv_budget_matches_an_analytic_count(target, tensor_parallel):
    """fit_max_pages in the goldens (checked uncached by tests/e2e/test_server.py) against (the compiler's
    limit - what the program holds besides the pool) / a page's bytes per device; the pool is donated
    and updated in place, so it is held once."""
    golden = json.loads((ROOT / "golden" / "llm" / f"step[tokens=64]@{target}.json").read_text())["figures"]
    model = serve.TINY.model
    page = model.n_layers * serve.TINY.page_size * (2 * model.n_heads // tensor_parallel) * model.head_dim * 2  # bf16
    besides_pool = golden["peak_bytes"] - serve.TINY.pages * page
    topology = Case.parse(f"llm/step@{target}").topology
    # A GPU process holds its share of memory (JAX's 0.75 by default: hardening round 5, V54), a TPU its limit.
    share = usable_memory(topology, {})
    limit = min(topology.device.memory_limit_bytes, share.bytes) if share.fraction is not None else \
        topology.device.memory_limit_bytes
    analytic = (limit - besides_pool) // page
    assert golden["fit_max_pages"] == pytest.approx(analytic, rel=1e-3), (golden, analytic)


@pytest.mark.heavy  # About 10 compiles of the 64-token step on h100-8.
def test_the_kv_budget_matches_a_bisection_by_compiles():
    """On h100-8 the search confirms its affine prediction in a few compiles; compiled on each side of its
    answer, the pool fits the process's share of the GPU at the answer and not one page past it."""
    from aotcheck.figures.hbm import hbm_verdict

    case = Case.of("llm", "step[tokens=64]", "h100-8")
    config = bucket("step[tokens=64]")
    found = measure(case, config=config).details.fit
    assert not found.bisected and found.probes <= 8

    share = usable_memory(case.topology).bytes  # The process's share of the GPU: what the search holds it to.

    def fits(pages: int) -> bool:
        figures = measure(case, config=dataclasses.replace(config.knobs["pages"].rebuild(pages), fit=None)).figures
        return hbm_verdict(int(figures["peak_bytes"]), case.topology) is None and figures["peak_bytes"] <= share

    # The boundary, each side compiled (a GPU compile never refuses: its peak says); memory grows with the
    # pool, so these two compiles say what a bisection's 23 did (185 s of the heavy leg, cut to 2 compiles).
    assert fits(serve.TINY.pages) and fits(found.max_size) and not fits(found.max_size + found.step)
