"""The ledger (aotcheck.figures.ledger): a rule for every opcode of the XLA in the lock, and the field's
collectives and rewritten dots counted, on real programs' HLO.

Independent truths: XLA's own opcode list (``HloOpcode`` of the jaxlib in the lock) and its own parse
of HLO text; the fixtures' programs (tests/fixtures/hlo/README.md says how each was compiled) against
what their arrays hold (the gathered weight's bytes, the ragged all-to-all's output buffer) and the
analytic count of decode attention, 4·B·S·D per device.
"""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.figures.hlo import parse_instruction
from aotcheck.figures.ledger import OPCODES, UNPRINTED, Rule, opcode_rule, rule_of
from aotcheck.figures.loops import analyze_hlo, top_collectives
from aotcheck.figures.program import Details

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hlo"

# XLA's enum names whose text is not their kebab-case (xla/hlo/ir/hlo_opcode.h).
_TEXT = {"kExp": "exponential", "kExpm1": "exponential-minus-one", "kLog1p": "log-plus-one", "kCos": "cosine",
         "kSin": "sine", "kClz": "count-leading-zeros", "kPopulationCount": "popcnt", "kTopK": "topk",
         "kOptimizationBarrier": "opt-barrier", "kAtan2": "atan2", "kExp2": "exp2", "kLog2": "log2",
         "kRoundNearestAfz": "round-nearest-afz"}


def text_of(enum_name: str) -> str:
    """HLO text of an ``HloOpcode`` member's name (``kAllGatherStart`` -> ``all-gather-start``)."""
    return _TEXT.get(enum_name) or re.sub(r"(?<!^)(?=[A-Z])", "-", enum_name[1:]).lower()


def _opcodes():
    from jaxlib import _hlo  # The opcode list of the XLA in the lock: only a test reads it.

    return list(_hlo.HloOpcode.__members__)


def test_every_opcode_of_the_xla_in_the_lock_has_a_rule():
    members = _opcodes()
    assert len(members) > 100
    missing = [m for m in members if m not in UNPRINTED and opcode_rule(text_of(m)) is Rule.UNKNOWN]
    assert not missing, f"opcodes without a rule in aotcheck/figures/ledger.py: {missing}"
    # The table names nothing XLA does not have (a typo would be a rule for nothing).
    texts = {text_of(m) for m in members}
    assert set(OPCODES) <= texts, sorted(set(OPCODES) - texts)


# (operands, type) each exception parses with; topk and opt-barrier take forms of their own.
_FORMS = {"kExp": (1, "f32"), "kExpm1": (1, "f32"), "kLog1p": (1, "f32"), "kCos": (1, "f32"), "kSin": (1, "f32"),
          "kClz": (1, "s32"), "kPopulationCount": (1, "s32"), "kAtan2": (2, "f32"), "kExp2": (1, "f32"),
          "kLog2": (1, "f32"), "kRoundNearestAfz": (1, "f32")}


def test_the_text_names_are_xlas_own():
    """Each exception to kebab-case is read back by XLA's own parser as the opcode the enum says (the
    kebab-case rest is checked on real programs by tests/unit/figures/test_hlo.py's parse against XLA's)."""
    from jaxlib import _hlo

    assert set(_FORMS) == set(_TEXT) - {"kTopK", "kOptimizationBarrier"}
    for member, (arity, dtype) in _FORMS.items():
        params = "".join(f"  p{i} = {dtype}[4] parameter({i})\n" for i in range(arity))
        args = ", ".join(f"p{i}" for i in range(arity))
        module = _hlo.hlo_module_from_text(f"HloModule m\nENTRY e {{\n{params}  ROOT r = {dtype}[4] "
                                           f"{text_of(member)}({args})\n}}")
        assert str(module.computations()[0].instructions()[-1].opcode) == f"HloOpcode.{member}"


def test_an_op_without_a_rule_is_named_and_marks_the_figures_incomplete():
    text = """HloModule m
ENTRY %e (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %n = f32[8]{0} brand-new-op(%a), metadata={op_name="jit(f)/new" source_file="model.py" source_line=7}
  ROOT %c = f32[8]{0} custom-call(%n), custom_call_target="SomeoneElsesTarget"
}"""
    analysis = analyze_hlo(text)
    assert [(u.kind, u.name, u.count) for u in analysis.uncounted()] == [
        ("op", "brand-new-op", 1), ("op", "custom-call SomeoneElsesTarget", 1)]
    assert Details(uncounted=analysis.uncounted()).incomplete() == {"flops", "comm_*"}
    assert "has no rule in aotcheck's ledger" in analysis.uncounted()[0].describe()


@pytest.mark.parametrize("line, rule", [
    ('%s = (f32[4]{0}, u32[], token[]) send(%a, %t), channel_id=1, is_host_transfer=true, '
     'frontend_attributes={_xla_host_transfer_handler_name="pjrt_rendezvous"}', Rule.FREE),
    ('%s = (f32[4]{0}, u32[], token[]) send(%a, %t), channel_id=1, is_host_transfer=true, '
     'frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime"}', Rule.COLLECTIVE),
    ('%s = (f32[4]{0}, u32[], token[]) send(%a, %t), channel_id=1', Rule.COLLECTIVE),
    ('%c = ((), ()) custom-call-start(), custom_call_target="TODO(b/1)", called_computations={%x}, '
     'backend_config={"sparse_core_config":{"offload":"OFFLOAD_COLLECTIVE"}}', Rule.FOLLOW),
    ('%c = ((), ()) custom-call-start(), custom_call_target="Unheard", called_computations={%x}', Rule.UNKNOWN),
    ('%d = f32[4]{0} custom-call-done(%c)', Rule.FREE),
])
def test_rules_of_the_forms_the_field_meets(line, rule):
    assert rule_of(parse_instruction(line)) is rule


def _fixture(name):
    return analyze_hlo((FIXTURES / f"{name}.hlo.txt").read_text())


def test_7x_sparsecore_all_gather_is_the_same_under_both_libtpus():
    """libtpu 0.0.50.1 reaches 7x's SparseCore all-gather through call-start(..., to_apply=), 0.0.51
    through custom-call-start(..., called_computations=) with a placeholder target: one all-gather of
    the bf16[2048,2048] weight (8 MiB) either way, named as SparseCore's."""
    old, new = _fixture("7x_fsdp_libtpu0.0.50.1"), _fixture("7x_fsdp_libtpu0.0.51")
    assert "custom-call-start" in (FIXTURES / "7x_fsdp_libtpu0.0.51.hlo.txt").read_text()
    for analysis in (old, new):
        assert (analysis.collectives["all-gather"].count, analysis.collectives["all-gather"].bytes) == (1, 2048 * 2048 * 2)
        assert [(op.kind, op.engine) for op in top_collectives(analysis)] == [("all-gather", "sparsecore")]
        assert analysis.uncounted() == []
    assert old.flops == new.flops == 2 * 8 * 2048 * 2048  # x [8, 2048] per device @ w [2048, 2048].
    for name in ("7x_rs_libtpu0.0.50.1", "7x_rs_libtpu0.0.51"):
        ops = {(op.kind, op.engine): op.bytes for op in top_collectives(_fixture(name))}
        assert ops == {("reduce-scatter", "sparsecore"): 8 * 2048 * 4 * 8, ("all-to-all", None): 8 * 2048 * 2}


@pytest.mark.parametrize("name, engine", [("ragged_all_to_all_v5p-8", None), ("ragged_all_to_all_7x-8", "sparsecore")])
def test_ragged_all_to_all_counts_its_output_buffer(name, engine):
    """Its bytes are its output buffer, the most it can receive: bf16[256,128] per device, which XLA
    pads to [256,2,128] (what moves at most)."""
    analysis = _fixture(name)
    stats = analysis.collectives["ragged-all-to-all"]
    assert (stats.count, stats.bytes) == (1, 256 * 2 * 128 * 2)
    assert [(op.kind, op.engine) for op in top_collectives(analysis)] == [("ragged-all-to-all", engine)]


def test_collective_broadcast_send_and_recv_are_collectives_and_a_callback_is_not():
    assert _fixture("pbroadcast_h100-8").collectives["collective-broadcast"].bytes == 8 * 128 * 4
    pairs = _fixture("send_recv_h100-8").collectives
    assert (pairs["send"].count, pairs["recv"].count, pairs["send"].bytes) == (1, 1, 8 * 128 * 4)
    printed = _fixture("debug_print_v5p-8")
    assert "send" not in printed.collectives and printed.uncounted() == []


@pytest.mark.parametrize("name", ["decode_h100-8", "decode_v5e-8"])
def test_decode_attention_dots_xla_rewrote_count_as_dots(name):
    """One query token: XLA's simplifier rewrites both einsums as multiply + reduce (on h100 the PV
    sum is split over two reduces). B=64, S=8192, D=128 over 8 devices: 4·B·S·D/8 per device."""
    truth = 4 * 64 * 8192 * 128 / 8
    text = (FIXTURES / f"{name}.hlo.txt").read_text()
    assert not re.search(r"\sdot\(", text)  # No dot is left: the count is the rewrite's.
    assert _fixture(name).flops == pytest.approx(truth, rel=0.03)


def test_decode_attention_compiled_now_on_v5e():
    """The same, compiled in this run (v5e-8, deviceless): the truth within 3%; a sum of squares and a
    product with a scalar beside it are not dots."""
    b, s, d = 64, 8192, 128
    mesh = jax.sharding.Mesh(np.array(aotcheck.get_devices_for_topology("v5e-8").devices), ("b",))
    q, k = (jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, P("b")))
            for shape in ((b, 1, d), (b, s, d)))

    def decode(q, k):
        p = jax.nn.softmax(jnp.einsum("bqd,bsd->bqs", q, k), axis=-1)
        return jnp.einsum("bqs,bsd->bqd", p, k), jnp.sum(k * k, axis=-1), jnp.sum(k * 2.0, axis=-1)

    compiled = aotcheck.compile_function(decode, q, k, topology="v5e-8")
    assert aotcheck.program_figures(compiled)["flops"] == pytest.approx(4 * b * s * d / 8, rel=0.03)
