"""aotcheck.figures.scoped: each Pallas TPU kernel's scoped VMEM (the compiler's record) and SMEM (its
Mosaic body's declarations), against their limits.

Independent truths: a tiled matmul's own block arithmetic (Pallas double-buffers each BlockSpec'd
operand: 2 x each input block + 2 x the output block + the f32 accumulator), which the compiler's
record equals for f32 blocks (no spills: a helper's sweep found 1.000 on three shapes, v5e); a
kernel's scalar-prefetch operand and SMEM scratch counted by hand in SMEM's layout (rows of 128
words; the reference server's 10,240 bytes are what libtpu's LLO allocation list sums to).
"""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import aotcheck
from aotcheck.errors import OutOfMemorySpace
from aotcheck.figures.hlo import parse_module
from aotcheck.figures.program import Details
from aotcheck.figures.scoped import Limit, ScopedUse, default_limit, kernel_memory, smem_layout_bytes, space_figures
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measure import measure

SIZE = 1024


def _kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...]


def tiled_matmul(x, y, *, bm, bk, bn, vmem_limit_bytes=None):
    params = pltpu.CompilerParams(vmem_limit_bytes=vmem_limit_bytes) if vmem_limit_bytes else None
    return pl.pallas_call(
        _kernel, grid=(SIZE // bm, SIZE // bn, SIZE // bk), name="tiled_matmul",
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)), scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        out_shape=jax.ShapeDtypeStruct((SIZE, SIZE), jnp.float32), compiler_params=params)(x, y)


def matmul_config(libtpu_init_args="", **blocks):
    args = lambda mesh: tuple(jax.ShapeDtypeStruct((SIZE, SIZE), jnp.float32,  # noqa: E731
                                                   sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
                              for _ in range(2))
    return aotcheck.FunctionConfig(fn=jax.jit(functools.partial(tiled_matmul, **blocks)), make_args=args,
                                   libtpu_init_args=libtpu_init_args)


def by_hand(bm, bk, bn):
    """Pallas's double buffers of each block, and the accumulator: f32 blocks, none padded."""
    return 4 * (2 * bm * bk + 2 * bk * bn + 2 * bm * bn + bm * bn)


@pytest.mark.parametrize("blocks", [(256, 512, 256), (128, 256, 384)])
def test_a_kernels_scoped_vmem_is_its_block_arithmetic_against_the_chips_default_limit(blocks):
    bm, bk, bn = blocks
    m = measure(Case.of("mm", "step", "v5e-1"), config=matmul_config(bm=bm, bk=bk, bn=bn))
    assert m.figures["vmem_scoped_bytes"] == by_hand(bm, bk, bn)  # 2,883,584 and 1,638,400: ratio 1.000.
    assert m.figures["vmem_limit_bytes"] == 16 * 2**20  # v5e's default, as its overflow message says it.
    (use,) = [u for u in m.details.scoped if u.space == "vmem"]
    assert (use.kernel, use.limit.source, use.near) == ("tiled_matmul", "v5e's default", False)
    assert (m.figures["smem_bytes"], m.figures["smem_limit_bytes"]) == (0, 2**20)  # No SMEM buffer; v5e's 1 MiB.
    assert not [line for line in m.details.doubts() if "scoped VMEM" in line]


def test_a_case_is_checked_under_a_given_limit_and_near_it_says_which_kernel_and_flag():
    """--xla_tpu_scoped_vmem_limit_kib in a config's (or the run's) libtpu_init_args is the limit the
    compile holds the kernel to: under its use, the case is refused for VMEM; just above, it compiles
    with a note naming the kernel and the flag."""
    used = by_hand(256, 512, 256)  # 2.75 MiB
    close = measure(Case.of("mm", "step", "v5e-1"),
                    config=matmul_config("--xla_tpu_scoped_vmem_limit_kib=2880", bm=256, bk=512, bn=256))
    assert (close.figures["vmem_scoped_bytes"], close.figures["vmem_limit_bytes"]) == (used, 2880 * 1024)
    (line,) = [line for line in close.details.doubts() if "of scoped VMEM" in line]
    assert line.startswith("tiled_matmul (") and "uses 2.75 MiB of its 2.81 MiB of scoped VMEM (97.8%; the limit: " \
        "--xla_tpu_scoped_vmem_limit_kib=2880)" in line and "--xla_tpu_scoped_vmem_limit_kib raises the limit" in line
    with pytest.raises(OutOfMemorySpace) as refused:
        measure(Case.of("mm", "step", "v5e-1"),
                config=matmul_config("--xla_tpu_scoped_vmem_limit_kib=2048", bm=256, bk=512, bn=256))
    assert refused.value.overflow.space == "vmem" and refused.value.overflow.limit_bytes == 2048 * 1024


def test_a_kernels_own_limit_is_its_limit():
    m = measure(Case.of("mm", "step", "v5e-1"), config=matmul_config(bm=256, bk=512, bn=256, vmem_limit_bytes=3 << 20))
    (use,) = [u for u in m.details.scoped if u.space == "vmem"]
    assert m.figures["vmem_limit_bytes"] == 3 << 20 and use.limit.source == "the kernel's vmem_limit_bytes"
    assert use.near is False  # 2.75 of 3 MiB: 91.7%.


def test_the_nearest_kernel_gives_the_figures_and_the_details_round_trip():
    """FAKE records: the choice among kernels is pure logic."""
    wide = ScopedUse("vmem", "a", "a.1", 10 << 20, Limit(96 << 20, "--xla_tpu_scoped_vmem_limit_kib=98304"))
    tight = ScopedUse("vmem", "b", "b.3", 3 << 20, Limit(4 << 20, "the kernel's vmem_limit_bytes"))
    scalars = ScopedUse("smem", "a", "a.1", 10240, Limit(2**20, "v5e's SMEM"))
    assert space_figures([wide, tight, scalars]) == {"vmem_scoped_bytes": 3 << 20, "vmem_limit_bytes": 4 << 20,
                                                     "smem_bytes": 10240, "smem_limit_bytes": 2**20}
    assert space_figures([]) == {}
    details = Details(scoped=[tight, wide, scalars])
    assert Details.from_json(details.to_json()) == details
    assert default_limit({}, "7x-8").bytes == 32 << 20 and default_limit({}, "v4-8").bytes == 16 << 20


def test_a_program_without_a_tpu_kernel_has_no_vmem_figures():
    config = aotcheck.FunctionConfig(fn=jax.jit(lambda x, y: x @ y), make_args=matmul_config().make_args)
    m = measure(Case.of("mm", "step", "v5e-1"), config=config)
    assert m.details.scoped == [] and not {"vmem_scoped_bytes", "vmem_limit_bytes", "smem_bytes"} & set(m.figures)
    text = 'HloModule m\n\nENTRY %main (p: f32[8]) -> f32[8] {\n  ROOT %p = f32[8]{0} parameter(0)\n}\n'
    assert kernel_memory(parse_module(text), vmem=default_limit({}, "v5e-1")) == []


def _gather_kernel(table_ref, x_ref, o_ref, scratch_ref):
    scratch_ref[0, 0] = table_ref[pl.program_id(0)]
    o_ref[...] = x_ref[...] + scratch_ref[0, 0].astype(jnp.float32)


def gather_config(words):
    """A kernel with a scalar-prefetch table of ``words`` int32 in SMEM and a 16 x 16 SMEM scratch."""
    def fn(table, x):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(8,), in_specs=[pl.BlockSpec((8, 128), lambda i, t: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, t: (i, 0)), scratch_shapes=[pltpu.SMEM((16, 16), jnp.int32)])
        return pl.pallas_call(_gather_kernel, grid_spec=spec, name="gather",
                              out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32))(table, x)

    def args(mesh):
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        return (jax.ShapeDtypeStruct((words,), jnp.int32, sharding=replicated),
                jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=replicated))

    return aotcheck.FunctionConfig(fn=jax.jit(fn), make_args=args)


def test_a_kernels_smem_is_what_its_body_declares_in_smems_layout_and_near_its_limit_is_said():
    m = measure(Case.of("g", "step", "v5e-1"), config=gather_config(300))
    # 300 words: 3 rows of 128 (1,536 bytes); the scratch: 16 rows in 2 tiles of 8, 128 words wide (8,192).
    assert m.figures["smem_bytes"] == smem_layout_bytes((300,), 4) + smem_layout_bytes((16, 16), 4) == 1536 + 8192
    near = measure(Case.of("g", "step", "v5e-1"), config=gather_config(248_000))  # 1,938 rows: 95.4% of 1 MiB.
    assert near.figures["smem_bytes"] == 992_256 + 8192 and near.figures["smem_limit_bytes"] == 2**20
    (line,) = [line for line in near.details.doubts() if "of SMEM" in line]
    assert line.startswith("gather (") and "uses 0.95 MiB of its 1.00 MiB of SMEM (95.4%; the limit: v5e's SMEM)" in line
    assert "nothing raises SMEM: shrink the kernel's scalar operands" in line
