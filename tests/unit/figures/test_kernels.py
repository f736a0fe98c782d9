"""Kernels counted from what they do (aotcheck.figures.kernels, aotcheck.figures.known_kernels): a user's cost registered
by name, jax's splash attention over its mask's blocks, ragged paged attention's bound; real Pallas
kernels compiled deviceless for TPU.

Independent truths: the block grid a causal mask visits, counted here by hand from the mask; the
matmul a user's kernel does, 2·M·K·N.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.figures import kernels
from aotcheck.figures.loops import analyze_hlo
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.stages import lower

M, K, N = 256, 512, 128


def _matmul_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _compiled_kernel():
    def my_matmul(x, w):
        return pl.pallas_call(_matmul_kernel, out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
                              name="my_matmul")(x, w)

    mesh = jax.sharding.Mesh(np.array(aotcheck.get_devices_for_topology("v5e-1").devices), ("d",))
    x, w = (jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, P())) for s in ((M, K), (3, K, N)))
    step = lambda x, w: jax.lax.scan(lambda acc, wl: (acc + my_matmul(x, wl), None), jnp.zeros((M, N)), w)[0]  # noqa: E731
    return aotcheck.compile_function(step, x, w, topology="v5e-1").as_text()


@pytest.fixture
def registry():
    saved, bounds = dict(kernels._COSTS), dict(kernels._BOUNDS)
    yield
    kernels._COSTS.clear()
    kernels._COSTS.update(saved)
    kernels._BOUNDS.clear()
    kernels._BOUNDS.update(bounds)


def test_a_kernel_without_a_cost_is_named_until_its_user_registers_one(registry):
    text = _compiled_kernel()
    before = analyze_hlo(text)
    assert [(u.kind, u.name, u.count) for u in before.uncounted()] == [("kernel", "my_matmul", 3)]
    assert before.flops == 0

    @aotcheck.kernel_cost("my_matmul")
    def _(call):
        (m, k), (_, n) = call.operands[0].dims, call.operands[1].dims
        return 2 * m * k * n

    after = analyze_hlo(text)
    assert after.flops == 3 * 2 * M * K * N and after.uncounted() == []
    [run] = after.kernel_runs()
    assert (run.name, run.count, run.flops, run.basis) == ("my_matmul", 3, 3 * 2 * M * K * N, "registered")


def test_a_cost_that_cannot_tell_leaves_the_kernel_named_and_one_that_raises_says_which(registry):
    text = _compiled_kernel()
    kernels.kernel_cost("my_*")(lambda call: None)
    assert [u.name for u in analyze_hlo(text).uncounted()] == ["my_matmul"]
    kernels.kernel_cost("my_matmul")(lambda call: call.operands[7].dims)  # An exact name wins over the glob.
    with pytest.raises(aotcheck.KernelCostError, match=r"kernel 'my_matmul' raised IndexError.*f32\[256, 512\].*"
                                                      r"aotcheck.kernel_cost\('my_matmul'\)"):
        analyze_hlo(text)


@pytest.mark.parametrize("bad", ["", None, 3])
def test_kernel_cost_refuses_a_name_that_is_not_one(bad):
    with pytest.raises(TypeError, match="kernel's name"):
        aotcheck.kernel_cost(bad)


def test_splash_attention_counts_the_blocks_its_mask_visits():
    """A causal 4 x 4 block grid (S 512, blocks 128) visits 10 pairs per head and batch row; forward 2,
    dq 3, dkv 4 block matmuls of 2·128·128·D each, per layer of the scan."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    b, h, s, d, layers = 2, 2, 512, 128, 3
    kernel = splash.make_splash_mha(masks.MultiHeadMask([masks.CausalMask((s, s))] * h), head_shards=1,
                                    q_seq_shards=1)

    def loss(x, w):
        def body(y, wl):
            q = jnp.einsum("bhsd,de->bhse", y, wl)
            return y + jax.vmap(kernel)(q, q, q), None
        return jax.lax.scan(body, x, w)[0].sum()

    def make_args(mesh):
        return [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, P()))
                for shape in ((b, h, s, d), (layers, d, d))]

    config = aotcheck.FunctionConfig(fn=jax.grad(loss, argnums=(0, 1)), make_args=make_args)
    # The mask is a constant the program's text elides: the pipeline reads it from XLA's dump.
    with lower(Case.of("splash", "step", "v5e-1"), config).compile() as compiled:
        assert "constant({...})" in compiled.compiled.as_text()
        measured = compiled.measure()
    block = 2 * 128 * 128 * d
    visits = 10 * b * h
    runs = {k.name: (k.count, k.flops, k.basis) for k in measured.details.kernels}
    assert runs == {"splash_mha_fwd_residuals": (layers, layers * visits * 2 * block, "registered"),
                    "splash_mha_dq_no_residuals": (layers, layers * visits * 3 * block, "registered"),
                    "splash_mha_dkv_no_residuals": (layers, layers * visits * 4 * block, "registered")}
    einsums = layers * 3 * 2 * b * h * s * d * d  # Forward, and the gradients of both its operands.
    assert measured.figures["flops"] == layers * visits * 9 * block + einsums
    assert measured.details.uncounted == []


def test_ragged_paged_attention_counts_every_query_against_the_longest_sequence():
    """The reference server's kernel (T 64 tokens, its heads per device, pages of 16 tokens, 16 per
    sequence): 4·T·Hq·D·L per layer, what XLA's dense attention over the same pages does."""
    from aotcheck.models import serve

    config = serve.serving_config(serve.TINY)
    step = next(c for c in config.expand() if c.programs[0] == "step[tokens=64]")
    with lower(Case.of("llm", "step[tokens=64]", "v5e-16"), step).compile() as compiled:
        measured = compiled.measure()
    [run] = measured.details.kernels
    model = serve.TINY.model
    heads = model.n_heads // 8  # Tensor parallel over the mesh's model axis (8 on v5e-16).
    per_layer = 4 * 64 * heads * model.head_dim * serve.TINY.pages_per_seq * serve.TINY.page_size
    assert (run.name, run.count, run.basis) == ("ragged_paged_attention_kernel", model.n_layers, "registered")
    assert run.flops == model.n_layers * per_layer == 16_777_216
    assert run.bound and any("ragged_paged_attention_kernel" in line and "upper bound" in line
                             for line in measured.details.doubts())


def test_megablox_declares_its_whole_buffer_and_is_marked_as_a_bound():
    """jax's megablox ``gmm`` over a static buffer of 512 rows in 4 groups: its declared cost is
    2·M·K·N over every row (whatever the group sizes say at run time), kept, and marked as a bound."""
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    m, k, n, groups = 512, 256, 384, 4
    mesh = jax.sharding.Mesh(np.array(aotcheck.get_devices_for_topology("v5e-1").devices), ("d",))
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))
            for shape, dtype in (((m, k), jnp.bfloat16), ((groups, k, n), jnp.bfloat16), ((groups,), jnp.int32))]
    text = aotcheck.compile_function(lambda x, w, sizes: gmm(x, w, sizes), *args, topology="v5e-1").as_text()
    [run] = analyze_hlo(text).kernel_runs()
    assert (run.name, run.basis, run.flops, run.bound) == ("gmm", "declared", 2 * m * k * n, True)
    assert "counts its whole static buffer (declared)" in run.describe()


def test_a_users_cost_may_say_it_counts_a_buffer(registry):
    text = _compiled_kernel()
    aotcheck.kernel_cost("my_matmul", bound=True)(lambda call: 1.0)
    [run] = analyze_hlo(text).kernel_runs()
    assert run.bound and run.flops == 3.0
    aotcheck.kernel_cost("my_matmul")(lambda call: 1.0)  # Registered again without: the bound goes with it.
    assert not analyze_hlo(text).kernel_runs()[0].bound
    with pytest.raises(TypeError, match="kernel's name"):
        kernels.declared_bound("")


# Hand-written, modelled on MaxText's Mixtral step on v5e-16 (the shapes of its compiled scan): the TPU
# compiler keeps a loop-invariant block mask in two elements of the loop's tuple, one per memory space,
# and each trip copies element 2 into element 1 (copy-start/copy-done) for the kernel to read. A unit
# test of the walk only (the compiled program that showed it is MaxText's, in the toolchain leg).
CARRIED = """HloModule carried, entry_computation_layout={(f32[8,128]{1,0})->f32[8,128]{1,0}}

%body (p: (s32[], s8[1,2,2], s8[1,2,2], f32[8,128])) -> (s32[], s8[1,2,2], s8[1,2,2], f32[8,128]) {
  %p = (s32[], s8[1,2,2]{2,1,0}, s8[1,2,2]{2,1,0}, f32[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %mask = s8[1,2,2]{2,1,0:S(1)} get-tuple-element(%p), index=1
  %spare = s8[1,2,2]{2,1,0} get-tuple-element(%p), index=2
  %x = f32[8,128]{1,0} get-tuple-element(%p), index=3
  %k = f32[8,128]{1,0} custom-call(%mask, %x), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/while/body/my_masked/pallas_call"}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %cs = (s8[1,2,2]{2,1,0:S(1)}, s8[1,2,2]{2,1,0}, u32[]) copy-start(%spare)
  %cd = s8[1,2,2]{2,1,0:S(1)} copy-done(%cs)
  ROOT %t = (s32[], s8[1,2,2]{2,1,0}, s8[1,2,2]{2,1,0}, f32[8,128]{1,0}) tuple(%next, %cd, %spare, %k)
}

%cond (c: (s32[], s8[1,2,2], s8[1,2,2], f32[8,128])) -> pred[] {
  %c = (s32[], s8[1,2,2]{2,1,0}, s8[1,2,2]{2,1,0}, f32[8,128]{1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}

ENTRY %main (x: f32[8,128]) -> f32[8,128] {
  %x0 = f32[8,128]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %m = s8[1,2,2]{2,1,0} constant({ { {1, 0}, {1, 1} } })
  %other = s8[1,2,2]{2,1,0} constant({ { {1, 1}, {1, 1} } })
  %m0s = (s8[1,2,2]{2,1,0:S(1)}, s8[1,2,2]{2,1,0}, u32[]) copy-start(%m)
  %m0 = s8[1,2,2]{2,1,0:S(1)} copy-done(%m0s)
  %init = (s32[], s8[1,2,2]{2,1,0}, s8[1,2,2]{2,1,0}, f32[8,128]{1,0}) tuple(%zero, %m0, %SPARE, %x0)
  %w = (s32[], s8[1,2,2]{2,1,0}, s8[1,2,2]{2,1,0}, f32[8,128]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,128]{1,0} get-tuple-element(%w), index=3
}
"""


@pytest.mark.parametrize("spare, readable", [("%m", True), ("%other", False)])
def test_a_mask_the_loop_keeps_in_another_element_is_read_only_when_both_start_equal(registry, spare, readable):
    """Element 1 holds the mask on the first trip and a copy of element 2 after: one value only
    where both start from the same constant."""
    seen = []
    aotcheck.kernel_cost("my_masked")(lambda call: seen.append(call.values[0]) or 1.0)
    analysis = analyze_hlo(CARRIED.replace("%SPARE", spare))
    assert analysis.flops == 4.0  # 4 trips of the kernel.
    if readable:
        assert seen[0].tolist() == [[[1, 0], [1, 1]]]
    else:
        assert seen[0] is None  # Two different masks: not one value, so the cost cannot tell.
