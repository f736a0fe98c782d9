"""aotcheck.gate.boot and the bill's boot record: whether a server starts on a target, from its
buckets' figures. FAKE figures for the arithmetic (its truth is the sum by hand); the reference
server's committed goldens for a real one."""

import json
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from aotcheck.gate.bill import Bill, startup_bills
from aotcheck.gate.boot import Boot, Usable, boot_budget, engine_base, load_order, usable_memory
from aotcheck.gate.golden import Golden
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.serving import boot_line, usable_words
from aotcheck.targets.topology import parse_topology

GiB, MiB = 2**30, 2**20
ROOT = Path(__file__).resolve().parents[3]


def figures(weights=10 * GiB, kv=4 * GiB, code=256 * MiB, temp=512 * MiB):
    return {"peak_params_bytes": weights, "peak_kv_cache_bytes": kv, "generated_code_bytes": code, "temp_bytes": temp}


@given(st.lists(st.tuples(st.integers(0, GiB), st.integers(0, 4 * GiB)), min_size=1, max_size=8),
       st.integers(0, 12 * GiB), st.integers(0, 8 * GiB))
def test_the_budget_is_weights_pool_and_every_loaded_programs_code_and_temporaries(programs, weights, kv):
    buckets = [(f"step[tokens={16 << i}]", figures(weights, kv, code, temp)) for i, (code, temp) in enumerate(programs)]
    boot = boot_budget(buckets, parse_topology("v5e-1"))
    loaded = sum(code + temp for code, temp in programs)
    assert boot.total_bytes == weights + kv + loaded and boot.usable_bytes == 16911433728  # 15.75 GiB: libtpu's limit.
    assert boot.boots == (boot.total_bytes <= boot.usable_bytes)
    assert boot.kv_max_bytes == max(0, boot.usable_bytes - weights - loaded)
    # What tips it is the first part whose loading crosses the limit, in the order a server warms up
    # (one program here: its buckets ascending, 16 tokens first).
    held, tips = 0, None
    for part, size in [("weights", weights), ("kv", kv), *((b, c + t) for (b, _), (c, t) in zip(buckets, programs))]:
        held += size
        if tips is None and held > boot.usable_bytes:
            tips = part
    assert boot.tips == tips and Boot.from_json(json.loads(json.dumps(boot.to_json()))) == boot


def test_on_a_gpu_only_the_largest_buckets_temporaries_count_and_what_tips_it_is_said_so():
    h100 = parse_topology("h100-1")
    usable = int(h100.device.memory_bytes * 0.75)
    big = figures(weights=usable - 10 * GiB, kv=4 * GiB, code=0, temp=5 * GiB)
    boot = boot_budget([("step[tokens=16]", {**big, "temp_bytes": 3 * GiB}), ("step[tokens=64]", big)], h100, environ={})
    assert boot.temp_bytes == 5 * GiB and boot.total_bytes == usable - 10 * GiB + 9 * GiB and boot.boots
    tight = boot_budget([("step[tokens=16]", {**big, "temp_bytes": 3 * GiB}), ("step[tokens=64]", {**big, "temp_bytes": 7 * GiB})],
                        h100, environ={})
    # 3 GiB with the first bucket, then only 4 more with the second (the pool gives the first's back).
    assert not tight.boots and tight.tips == "step[tokens=64]" and tight.temp_bytes == 7 * GiB


def test_a_gpu_process_gets_its_memory_fraction_said_with_where_it_comes_from():
    h100 = parse_topology("h100-8")
    default = usable_memory(h100, {})
    assert default == Usable(int(h100.device.memory_bytes * 0.75), 0.75, "XLA_PYTHON_CLIENT_MEM_FRACTION")
    assert usable_words(default) == "0.75 of memory (JAX's default; XLA_PYTHON_CLIENT_MEM_FRACTION sets another)"
    given = usable_memory(h100, {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"})
    assert given.bytes == int(h100.device.memory_bytes * 0.9)
    assert usable_words(given) == "0.9 of memory (XLA_PYTHON_CLIENT_MEM_FRACTION)"
    # Not a share (junk, 0, more than the memory): JAX's default, said as such.
    assert all(usable_memory(h100, {"XLA_PYTHON_CLIENT_MEM_FRACTION": v}) == default for v in ("lots", "0", "1.5"))
    assert usable_words(usable_memory(parse_topology("v5e-1"), {})) == "the compiler's limit"
    assert usable_memory(parse_topology("cpu-4"), {}) is None  # A host's CPU: no budget of its own.


def test_a_servers_memory_fraction_comes_from_its_config_then_the_ini_then_the_environment(tmp_path, monkeypatch):
    from aotcheck import FunctionConfig, Registry
    from aotcheck.session import GateSession
    from aotcheck.settings import GateSettings

    registry = Registry()
    for name, fraction in (("own", 0.95), ("plain", None)):
        registry.register(name, FunctionConfig(fn=abs, make_args=abs, program="step", bucket={"tokens": 16},
                                               memory_fraction=fraction))
    outcomes = [Outcome(case, Verdict.PASS, measured=Measurement(case, figures(), {}, 1.0))
                for case in (Case.of(name, "step[tokens=16]", "h100-1") for name in ("own", "plain"))]
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.8")

    def said(**ini):
        settings = GateSettings.parse(rootdir=tmp_path, topologies=["h100-1"], cache_dir=None, from_ini=list(ini), **ini)
        with GateSession(settings, registry=registry, measure=lambda case: None) as gate:
            return {config: usable_words(u) for (config, _), u in gate.usable(outcomes).items()}

    assert said(memory_fraction="0.9") == {"own": "0.95 of memory (own's memory_fraction)",
                                           "plain": "0.9 of memory (aot_memory_fraction)"}
    assert said() == {"own": "0.95 of memory (own's memory_fraction)",
                      "plain": "0.8 of memory (XLA_PYTHON_CLIENT_MEM_FRACTION)"}
    h100 = parse_topology("h100-1")
    assert usable_memory(h100, {}, fraction=(0.95, "x")).bytes == int(h100.device.memory_bytes * 0.95)


def test_a_servers_load_order_and_configured_pages_come_from_its_config_and_ride_on_its_bill(tmp_path):
    from aotcheck import FunctionConfig, Registry
    from aotcheck.programs.knob import Knob
    from aotcheck.session import GateSession
    from aotcheck.settings import GateSettings

    def bucket(program, **point):
        return FunctionConfig(fn=abs, make_args=abs, program=program, bucket=point, knobs={"pages": Knob(64, abs)})

    registry = Registry()
    registry.register("srv", lambda: [bucket("step", tokens=16), bucket("sample", tokens=16, seqs=8)])
    outcomes = [Outcome(case, Verdict.PASS, measured=Measurement(case, figures(), {}, 1.0)) for case in
                (Case.of("srv", p, "v5e-1") for p in ("sample[tokens=16,seqs=8]", "step[tokens=16]"))]
    with GateSession(GateSettings.parse(rootdir=tmp_path, topologies=["v5e-1"], cache_dir=None), registry=registry,
                     measure=lambda case: None) as gate:
        order, pages = gate.servers(outcomes)
    assert order == {"srv": ("step", "sample")} and pages == {"srv": 64}
    (bill,) = startup_bills(outcomes, order=order, pages=pages)
    assert bill.boot.bytes_per_page == 4 * GiB / 64 and Bill.from_json(json.loads(json.dumps(bill.to_json()))) == bill


def test_an_engines_utilization_is_a_share_of_the_compilers_limit_on_a_tpu_and_of_memory_on_a_gpu():
    """tpu-inference sizes its pool as utilization x bytes_limit (94.75 GiB on 7x: #3408's "94.7 GiB")."""
    assert engine_base(parse_topology("7x-8")) == 101737037824 == int(94.75 * GiB)
    assert engine_base(parse_topology("v5e-1")) == int(15.75 * GiB)
    assert engine_base(parse_topology("h100-8")) == parse_topology("h100-8").device.memory_bytes
    boot = boot_budget([("step[tokens=16]", figures(weights=8 * GiB, kv=GiB, code=0, temp=0))], parse_topology("7x-8"))
    assert boot.kv_max_bytes == int(94.75 * GiB) - 8 * GiB and boot.kv_max_fraction == 1.0


def test_a_server_loads_its_programs_in_the_order_it_declares_them_each_buckets_ascending():
    """tpu-inference warms up the backbone, then sampling, then structured decoding; within each, its
    buckets ascending (numerically: 1024 after 512). What tips it is named in that order."""
    assert load_order(["step[tokens=1024]", "sample[tokens=512,seqs=512]", "step[tokens=512]",
                       "sample[tokens=512,seqs=256]", "structured_decode[seqs=256]"], ["step", "sample"]) == [
        "step[tokens=512]", "step[tokens=1024]", "sample[tokens=512,seqs=256]", "sample[tokens=512,seqs=512]",
        "structured_decode[seqs=256]"]
    small, big = figures(weights=8 * GiB, kv=7 * GiB, code=0, temp=3 * GiB // 8), figures(weights=8 * GiB, kv=7 * GiB, code=0,
                                                                                        temp=GiB // 2)
    buckets = [("step[tokens=16]", big), ("sample[tokens=16,seqs=8]", small)]
    v5e = parse_topology("v5e-1")  # 15.75 GiB: weights and pool leave 0.75 GiB; the two need 0.875.
    assert boot_budget(buckets, v5e, programs=("step", "sample")).tips == "sample[tokens=16,seqs=8]"
    assert boot_budget(buckets, v5e, programs=("sample", "step")).tips == "step[tokens=16]"


def test_a_bucket_without_the_figures_the_budget_needs_leaves_it_unknown():
    partial = {k: v for k, v in figures().items() if k != "temp_bytes"}
    assert boot_budget([("step[tokens=16]", partial)], parse_topology("v5e-1")) is None


def small(temp):
    return figures(weights=8 * GiB, kv=2 * GiB, temp=temp)


def served(tokens, now, before):
    case = Case.of("srv", f"step[tokens={tokens}]", "v5e-1")
    return Outcome(case, Verdict.PASS, measured=Measurement(case, now, {}, 1.0),
                   golden=Golden(before, {}, {}, Path(case.golden_relpath)))


def test_a_server_that_started_and_no_longer_does_fails_the_run_and_says_what_tips_it():
    before = [served(16, small(GiB), small(GiB)), served(64, small(2 * GiB), small(GiB))]  # 13.50 of 15.75 GiB.
    (bill,) = startup_bills(before)
    assert bill.boot.boots and bill.booted and not bill.failed
    grown = [served(16, small(GiB), small(GiB)), served(64, small(6 * GiB), small(GiB))]  # 17.50 GiB.
    (bill,) = startup_bills(grown)
    assert not bill.boot.boots and bill.booted and bill.boot_lost and bill.failed and not bill.grew
    assert bill.boot.tips == "step[tokens=64]"
    line = boot_line(bill)
    assert line.startswith("  REGRESSION: it started by its goldens' figures and WILL NOT START: weights 8.00 GiB + "
                           "KV pool 2.00 GiB + 2 programs loaded"), line
    assert "loading step[tokens=64] tips it (programs load in the order the server warms them up)" in line
    assert Bill.from_json(json.loads(json.dumps(bill.to_json()))) == bill
    (never,) = startup_bills([served(64, small(6 * GiB), small(6 * GiB))])
    assert not never.boot.boots and never.booted is False and not never.failed  # Never started: said, not failed.


@pytest.mark.parametrize("target", ["v4-8x1", "v5e-16x1", "h100-8x1"])
def test_the_reference_servers_boot_from_its_goldens_adds_up(target):
    """The reference server (aotcheck.models.serve) on each gated target, from its committed goldens: the
    budget is their figures summed by hand, and the pool that still starts fills what is left."""
    docs = [json.loads(p.read_text()) for p in sorted((ROOT / "golden/llm").glob(f"*@{target}.json"))]
    cases = [Case.parse(d["case"]) for d in docs]
    boot = boot_budget([(c.program_id, d["figures"]) for c, d in zip(cases, docs)], cases[0].topology)
    code = sum(d["figures"]["generated_code_bytes"] for d in docs)
    temps = [d["figures"]["temp_bytes"] for d in docs]
    # A loaded TPU program keeps its temporaries; XLA's GPU client takes a run's from its pool.
    temp = sum(temps) if cases[0].topology.platform.programs_keep_temporaries else max(temps)
    # Every bucket holds the server's weights, those its program does not read too: the same in each.
    (weights,) = {d["figures"]["peak_params_bytes"] for d in docs}
    assert boot.programs == len(docs) == 9 and (boot.code_bytes, boot.temp_bytes) == (code, temp)
    assert boot.boots and boot.kv_max_bytes == boot.usable_bytes - weights - code - temp


def test_a_merge_of_shards_judges_a_gpu_servers_boot_by_the_memory_the_gate_ran_with(tmp_path, monkeypatch):
    """Found by review: `aotcheck report` recomputed a GPU budget with its own process's memory fraction."""
    from aotcheck.gate.report import Report, merge_reports, write_report

    def gpu_bucket(tokens):
        case = Case.of("srv", f"step[tokens={tokens}]", "h100-1")
        return Outcome(case, Verdict.PASS, measured=Measurement(case, figures(weights=60 * GiB, kv=8 * GiB), {}, 1.0))

    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")  # The gate's shards ran with 0.95 of memory...
    shards = [[gpu_bucket(16)], [gpu_bucket(64)]]
    for k, outcomes in enumerate(shards, 1):
        (bill,) = startup_bills(outcomes, partial={("srv", "h100-1x1")})
        assert bill.boot is None and (bill.usable.fraction, bill.usable.source) == (0.95, "XLA_PYTHON_CLIENT_MEM_FRACTION")
        write_report(tmp_path / f"{k}.json", Report(outcomes, shard=(k, 2), bills=[bill]))
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION")  # ...the merge job with JAX's default, 0.75.
    (bill,) = merge_reports([tmp_path / "1.json", tmp_path / "2.json"]).report.bills
    h100 = parse_topology("h100-1").device.memory_bytes
    assert bill.boot.usable_bytes == int(h100 * 0.95) and bill.boot.boots  # 69.00 GiB of 75.15 (0.75: 59.33, too few).


def _committed_boot(config: str, target: str) -> Boot:
    """A server's boot budget from its committed goldens, its programs in the order it declares them."""
    from aotcheck.models import serve

    docs = [json.loads(p.read_text()) for p in sorted((ROOT / "golden" / config).glob(f"*@{target}.json"))]
    cases = [Case.parse(d["case"]) for d in docs]
    cfg = {"llm-256k": serve.LLM_256K, "llm-31b": serve.LLM_31B}[config]
    return boot_budget([(c.program_id, d["figures"]) for c, d in zip(cases, docs)], cases[0].topology,
                       pages=cfg.pages, programs=list(serve.serving_config(cfg).bucketed))


def test_tpu_inference_3360_does_not_start_on_v5e_1_and_the_512_request_sampler_tips_it():
    """llm-256k (a 256K vocabulary, 2B-class dims, max_num_seqs 512, its pool what an engine at 0.90
    allocates) from its committed goldens. Analytic: the weights are 2,558,601,216 bf16 parameters on
    one device; a page is 18 layers x 16 tokens x 32 heads' keys and values x 128 x 2 bytes."""
    from aotcheck.models import serve

    boot = _committed_boot("llm-256k", "v5e-1x1")
    assert boot.weights_bytes == 2 * serve.LLM_256K.model.num_params() == 5_117_202_432  # Ratio 1.000.
    assert boot.bytes_per_page == 18 * 16 * 32 * 128 * 2 and boot.kv_bytes == serve.LLM_256K.pages * boot.bytes_per_page
    assert (boot.weights_bytes + boot.kv_bytes) / boot.memory_bytes == pytest.approx(0.90, abs=2e-4)
    assert not boot.boots and "seqs=512" in boot.tips
    # What starts: the pool that leaves room for every program, as a utilization well below vLLM's 0.90.
    room = boot.usable_bytes - boot.weights_bytes - boot.code_bytes - boot.temp_bytes
    assert boot.kv_max_bytes == room and boot.kv_max_fraction < 0.85


def test_tpu_inference_3408_does_not_start_on_7x_8_at_098_and_says_the_fraction_that_does():
    """llm-31b (30.07B dense parameters, TP=8 on tpu7x-8, its pool at 0.98 of the 94.75 GiB limit).
    Analytic weights per device: 64 layers' 27.92B split 8 ways, the unembedding split 8 ways, the
    embedding (1.07B) on every device, as bf16: 9,396,297,728 bytes."""
    from aotcheck.models import serve

    boot = _committed_boot("llm-31b", "7x-8x1")
    assert boot.weights_bytes == 9_396_297_728 and boot.bytes_per_page == 64 * 64 * 8 * 128 * 2
    assert (boot.weights_bytes + boot.kv_bytes) / boot.memory_bytes == pytest.approx(0.98, abs=1e-4)
    assert not boot.boots and boot.tips != "weights" and boot.tips != "kv"
    assert 0.9 < boot.kv_max_fraction < 0.98
    # At that fraction an engine's pool (engine_pages) leaves room for every program: it starts.
    pages = serve.engine_pages(weights_bytes=boot.weights_bytes, page_bytes=boot.bytes_per_page,
                               limit_bytes=boot.memory_bytes, utilization=boot.kv_max_fraction)
    assert pages * boot.bytes_per_page <= boot.kv_max_bytes
