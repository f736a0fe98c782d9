"""Every memory space: a Pallas kernel that overflows VMEM or SMEM is told so, never that it does not
fit HBM. Real kernels (``pl.pallas_call``) compiled deviceless for v5e-1 through XLA's TPU compiler;
each compile is refused or done in about a second."""

import dataclasses
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.errors import Overflow, error_from_json, error_to_json
from aotcheck.figures.fit import Fit, Probe, search
from aotcheck.figures.hbm import locate
from aotcheck.render.memory import explain_overflow
from aotcheck.gate.check import check_case
from aotcheck.gate.golden import GoldenStore
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measure import measure
from aotcheck.render.text import fit_lines, outcome_message
from aotcheck.targets.devices import get_devices_for_topology

MiB = 2**20
ROWS = 32768  # f32[32768,128] in and out: 32 MiB of kernel blocks in VMEM, over v5e's 16 MiB scoped limit.


def _vmem_body(x_ref, o_ref, s_ref):
    s_ref[:8, :] = x_ref[:8, :] * 2
    o_ref[...] = x_ref[...] + 1
    o_ref[:8, :] = s_ref[:8, :]


def _smem_body(x_ref, o_ref, s_ref):
    s_ref[0] = 3.0
    o_ref[...] = x_ref[...] + s_ref[0]


def kernel(x, scratch, body=_vmem_body, **params):
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), scratch_shapes=[scratch], **params)(x)  # THE KERNEL


KERNEL_LINE = next(i for i, line in enumerate(inspect.getsource(sys.modules[__name__]).splitlines(), 1)
                   if line.endswith("# THE KERNEL"))


def vmem_blocks(x):
    return kernel(x, pltpu.VMEM((8, 128), jnp.float32))


def v5e_1_args(rows=ROWS, mesh=None):
    if mesh is None:
        devices, _ = get_devices_for_topology("v5e-1")
        mesh = jax.sharding.Mesh(np.array(devices).reshape(1), ("data",))
    return (jax.ShapeDtypeStruct((rows, 128), jnp.float32, sharding=NamedSharding(mesh, P())),)


def test_vmem_over_the_scoped_limit_is_vmem_with_its_size_limit_op_line_and_flag():
    x, = v5e_1_args()
    with pytest.raises(aotcheck.OutOfMemorySpace) as raised:
        aotcheck.compile_function(vmem_blocks, x, topology="v5e-1")
    error = raised.value
    assert isinstance(error, aotcheck.OutOfMemory)  # The gate's out-of-memory verdict, the fit search's "too large".
    o = error.overflow
    assert (o.space, o.size_bytes, o.limit_bytes, o.excess_bytes, o.limit) == ("vmem", 32 * MiB, 16 * MiB, 16 * MiB, "scoped")
    assert (o.kernel, o.op_name, o.op_shape) == (True, "jit(vmem_blocks)/pallas_call", "f32[32768,128]")
    # One JSON form across the worker's pipe: the same class, the same record.
    again = error_from_json(json.loads(json.dumps(error_to_json(error))))
    assert type(again) is aotcheck.OutOfMemorySpace and again.overflow == o and str(again) == str(error)
    # XLA names the op by a stack frame of a program it did not finish: the lowered program has the line.
    lowered = jax.jit(vmem_blocks).lower(x).as_text(dialect="hlo", debug_info=True)
    located = error.located(locate(o, lowered)).overflow
    assert located.source == f"tests/unit/figures/test_hbm.py:{KERNEL_LINE}"
    text = explain_overflow(located, "v5e-1")
    assert text.startswith("does not fit in VMEM on v5e-1: the Pallas kernel jit(vmem_blocks)/pallas_call at "
                           f"tests/unit/figures/test_hbm.py:{KERNEL_LINE} (XLA's %"), text
    assert ("needs a scoped VMEM allocation of 32.00 MiB; the scoped VMEM limit is 16.00 MiB (over by 16.00 MiB)"
            in text), text
    assert "--xla_tpu_scoped_vmem_limit_kib=32768" in text and "aot_libtpu_init_args" in text, text
    assert "pltpu.CompilerParams(vmem_limit_bytes=33554432)" in text, text
    assert "A core of v5e-1 has 128.00 MiB of VMEM" in text, text
    assert "HBM on" not in text and "buffers" not in text, text


@pytest.mark.heavy
def test_the_flag_it_names_lets_the_same_kernel_compile():
    """libtpu takes the scoped limit as a compiler option deviceless: the value the verdict names is
    the least that compiles (one KiB less is refused again), and the kernel's own limit works too."""
    x, = v5e_1_args()
    compiled = aotcheck.compile_function(vmem_blocks, x, topology="v5e-1",
                                         compiler_options={"xla_tpu_scoped_vmem_limit_kib": "32768"})
    assert aotcheck.program_figures(compiled)["argument_bytes"] == 16 * MiB
    with pytest.raises(aotcheck.OutOfMemorySpace, match="exceeded scoped vmem limit by 1.0K"):
        aotcheck.compile_function(vmem_blocks, x, topology="v5e-1",
                                  compiler_options={"xla_tpu_scoped_vmem_limit_kib": "32767"})

    def own_limit(x, limit=32 * MiB):
        return kernel(x, pltpu.VMEM((8, 128), jnp.float32), compiler_params=pltpu.CompilerParams(vmem_limit_bytes=limit))

    aotcheck.compile_function(own_limit, x, topology="v5e-1")
    # A kernel's own limit wins over the flag (the verdict says the flag is for kernels that set none).
    with pytest.raises(aotcheck.OutOfMemorySpace, match="limit 16.00M exceeded"):
        aotcheck.compile_function(lambda x: own_limit(x, 16 * MiB), x, topology="v5e-1",
                                  compiler_options={"xla_tpu_scoped_vmem_limit_kib": "65536"})


def function_config(**fields):
    return aotcheck.FunctionConfig(fn=vmem_blocks, make_args=lambda mesh: v5e_1_args(mesh=mesh), **fields)


@pytest.mark.heavy
def test_the_gate_says_vmem_with_the_line_and_never_an_hbm_table(tmp_path):
    case = Case.of("kernel", "step", "v5e-1")
    store = GoldenStore(str(tmp_path))
    outcome = check_case(case, measure=lambda c: measure(c, config=function_config()), store=store)
    assert outcome.verdict is Verdict.OUT_OF_MEMORY and outcome.failed
    assert outcome.error.overflow.source == f"tests/unit/figures/test_hbm.py:{KERNEL_LINE}"
    assert outcome.details is None  # XLA's HBM dump is not what overflowed: none is read.
    assert Outcome.from_json(json.loads(json.dumps(outcome.to_json()))) == outcome  # The report and xdist keep it.
    message = outcome_message(dataclasses.replace(outcome, golden_file="golden/kernel/step@v5e-1x1.json"))
    assert message.startswith("kernel/step@v5e-1x1 does not fit in VMEM on v5e-1: the Pallas kernel "
                              f"jit(vmem_blocks)/pallas_call at tests/unit/figures/test_hbm.py:{KERNEL_LINE}"), message
    assert "32.00 MiB" in message and "16.00 MiB" in message and "--xla_tpu_scoped_vmem_limit_kib=32768" in message
    assert "HBM on" not in message and "largest buffers" not in message, message
    # The launch flags the verdict names, as a config (or aot_libtpu_init_args) gives them: it compiles.
    raised = function_config(libtpu_init_args="--xla_tpu_scoped_vmem_limit_kib=32768")
    outcome = check_case(case, measure=lambda c: measure(c, config=raised), store=store)
    assert outcome.verdict is Verdict.MISSING_GOLDEN, outcome.error
    assert outcome.measured.compiler_options["xla_tpu_scoped_vmem_limit_kib"] == "32768"


@pytest.mark.parametrize("scratch, space, size, limit, words", [
    # SMEM over the chip's 1 MiB: XLA lists the largest allocations in SMEM (sizes rounded, the excess exact).
    (pltpu.SMEM((262144,), jnp.float32), "smem", MiB + 136, MiB, "needs 1.00 MiB of SMEM (its scratch operand f32[262144]); "
     "the chip's SMEM holds 1.00 MiB (over by 136 B)"),
    # One allocation larger than the memory: SMEM, then VMEM scratch over v5e's 128 MiB (no scoped limit here).
    (pltpu.SMEM((2**20,), jnp.float32), "smem", 4 * MiB, MiB, "needs 4.00 MiB of SMEM (its scratch operand f32[1048576])"),
    (pltpu.VMEM((524288, 128), jnp.float32), "vmem", 256 * MiB, 128 * MiB, "needs 256.00 MiB of VMEM (its scratch "
     "operand f32[524288,128]); the chip's VMEM holds 128.00 MiB (over by 128.00 MiB)"),
], ids=["smem-listed", "smem-allocation", "vmem-scratch"])
@pytest.mark.heavy
def test_scratch_over_the_chip_is_said_in_its_space_with_no_flag(scratch, space, size, limit, words):
    x, = v5e_1_args(rows=8)

    def scratch_kernel(x):
        return kernel(x, scratch, body=_smem_body if space == "smem" else _vmem_body)

    with pytest.raises(aotcheck.OutOfMemorySpace) as raised:
        aotcheck.compile_function(scratch_kernel, x, topology="v5e-1")
    o = raised.value.overflow
    assert (o.space, o.size_bytes, o.limit_bytes, o.limit, o.kernel, o.tag) == (space, size, limit, "capacity", True,
                                                                                 "scratch operand"), o
    lowered = jax.jit(scratch_kernel).lower(x).as_text(dialect="hlo", debug_info=True)
    text = explain_overflow(raised.value.located(locate(o, lowered)).overflow, "v5e-1")
    assert text.startswith(f"does not fit in {space.upper()} on v5e-1: the Pallas kernel "), text
    assert f"tests/unit/figures/test_hbm.py:{KERNEL_LINE}" in text and words in text, text
    assert "No flag raises it" in text and "--xla_tpu" not in text and "HBM on" not in text, text


def serving_config():
    """A model whose method runs the 32 MiB-of-blocks kernel on its parameters (XLA refuses it where
    the kernel reads a parameter and writes an output), whatever the batch."""
    return aotcheck.InferenceConfig(
        init_fn=lambda key: {"w": jnp.zeros((ROWS, 128), jnp.float32)},
        partition_rules=((".*", P()),),
        methods={"serve": lambda params, batch: {"y": vmem_blocks(params["w"]), "s": batch["x"].sum()}},
        input_batch_spec={"x": jax.ShapeDtypeStruct((8, 128), jnp.float32)},
    )


@pytest.mark.heavy
def test_an_overflow_that_does_not_depend_on_the_batch_ends_the_fit_search_with_it(tmp_path):
    case = Case.of("served", "serve", "v5e-1")
    outcome = check_case(case, measure=lambda c: measure(c, config=serving_config(), fit="batch"),
                         store=GoldenStore(str(tmp_path)))
    assert outcome.verdict is Verdict.OUT_OF_MEMORY
    fit = outcome.details.fit
    assert (fit.max_size, fit.probes, fit.refused.space) == (0, 2, "vmem")  # The configured batch, then the smallest.
    message = outcome_message(dataclasses.replace(outcome, golden_file="g.json"))
    assert message.startswith("served/serve@v5e-1x1 does not fit in VMEM on v5e-1: the Pallas kernel"), message
    assert "It does not depend on the batch: the smallest batch (1) is refused for VMEM too (2 compiles)." in message
    assert "HBM on" not in message, message


def test_a_search_stopped_by_a_kernel_says_so_and_an_hbm_search_is_written_as_before():
    vmem = Overflow("vmem", 20 * MiB, 16 * MiB, "scoped", 4 * MiB, op_name="jit(step)/pallas_call", kernel=True,
                    source="model.py:12")

    def probe(size):  # A kernel's blocks grow with the batch: over 40 rows its VMEM is refused; HBM is far.
        return Probe(size, 2**30 + size * MiB, True) if size <= 40 else Probe(size, None, False, refused=vmem)

    found = search(probe, configured=8, step=1, limit=16 * 2**30)
    assert found.max_size == 40 and found.refused == vmem
    assert Fit.from_json(json.loads(json.dumps(found.to_json()))) == found
    from aotcheck.targets.topology import parse_topology

    lines = "\n".join(fit_lines("m/step@v5e-1x1", found, parse_topology("v5e-1")))
    assert ("41 does not fit: not for HBM, the Pallas kernel jit(step)/pallas_call at model.py:12 needs 20.00 MiB "
            "of VMEM, over its scoped limit of 16.00 MiB") in lines, lines
    hbm = search(lambda s: Probe(s, 2**30 + s * MiB, 2**30 + s * MiB <= 2**31), configured=8, step=1, limit=2**31)
    assert hbm.refused is None and "refused" not in hbm.to_json()
    assert dataclasses.replace(found, refused=None).to_json().keys() == hbm.to_json().keys()


KERNELS = f'''
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck


def body(x_ref, o_ref, s_ref):
    s_ref[:8, :] = x_ref[:8, :] * 2
    o_ref[...] = x_ref[...] + 1


def step(x):
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])(x)


def make_args(mesh):
    return (jax.ShapeDtypeStruct(({ROWS}, 128), jnp.float32, sharding=NamedSharding(mesh, P())),)


aotcheck.register("kernel", aotcheck.FunctionConfig(fn=step, make_args=make_args))
'''


@pytest.mark.heavy
def test_aotcheck_check_says_vmem_end_to_end(tmp_path):
    """One real run of the gate's command line: worker process, pipe, check, words."""
    (tmp_path / "kernels.py").write_text(textwrap.dedent(KERNELS))
    line = next(i for i, text in enumerate(textwrap.dedent(KERNELS).splitlines(), 1) if "pl.pallas_call" in text)
    out = subprocess.run([sys.executable, "-m", "aotcheck", "check", "--module", "kernels.py", "--topologies", "v5e-1",
                          "--golden-dir=golden", "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert (f"kernel/step@v5e-1x1 does not fit in VMEM on v5e-1: the Pallas kernel jit(step)/pallas_call at "
            f"kernels.py:{line}") in text, text
    assert "scoped VMEM limit is 16.00 MiB" in text and "--xla_tpu_scoped_vmem_limit_kib=32768" in text, text
    assert "does not fit in HBM" not in text and "largest buffers" not in text, text
    # `aotcheck compile` says the same, not XLA's raw text.
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "kernel", "--module", "kernels.py", "--topology",
                          "v5e-1"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"does not fit in VMEM on v5e-1: the Pallas kernel jit(step)/pallas_call at kernels.py:{line}" in out.stderr
    assert "RESOURCE_EXHAUSTED" not in out.stderr, out.stderr
