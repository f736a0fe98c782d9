"""aotcheck.gate.boot and the bill's boot record: whether a server starts on a target, from its
buckets' figures. FAKE figures for the arithmetic (its truth is the sum by hand); the reference
server's committed goldens for a real one."""

import json
from pathlib import Path

import pytest
from hypothesis import example, given, strategies as st

from aotcheck.gate.bill import Bill, startup_bills
from aotcheck.gate.boot import Boot, Start, boot_budget, bucket_io, engine_base, load_order
from aotcheck.targets.usable import Usable, usable_memory
from aotcheck.gate.golden import Golden
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.serving import boot_line, usable_words
from aotcheck.programs.names import Bucket, parse_program_id, program_id
from aotcheck.targets.topology import parse_topology

GiB, MiB = 2**30, 2**20
ROOT = Path(__file__).resolve().parents[3]


def figures(weights=10 * GiB, kv=4 * GiB, code=256 * MiB, temp=512 * MiB, io=0):
    return {"peak_params_bytes": weights, "peak_kv_cache_bytes": kv, "generated_code_bytes": code, "temp_bytes": temp,
            "argument_bytes": weights + kv + io, "output_bytes": kv, "alias_bytes": kv}


V5E_BYTES_LIMIT = 16_909_336_064  # memory_stats()["bytes_limit"] on a v5e chip (libtpu 0.0.42.1).


@given(st.lists(st.tuples(st.integers(0, GiB), st.integers(0, 4 * GiB), st.integers(0, GiB)), min_size=1, max_size=8),
       st.integers(0, 12 * GiB), st.integers(0, 8 * GiB))
@example(programs=[(0, 0, 1)], weights=8_319_401_472, kv=8_589_934_592)  # CI's: a bucket's I/O alone tips it.
def test_a_tpu_server_holds_every_code_and_the_largest_run_of_temporaries_and_io(programs, weights, kv):
    """The chip's rules (libtpu 0.0.42.1 on v5e): code enters at a program's first run and stays unless
    memory runs short; temporaries are one reservation sized to the program running, beside its I/O."""
    buckets = [(("step", Bucket(tokens=16 << i)), figures(weights, kv, code, temp, io)) for i, (code, temp, io) in enumerate(programs)]
    boot = boot_budget(buckets, parse_topology("v5e-1"))
    limit, code = V5E_BYTES_LIMIT, sum(c for c, _, _ in programs)
    run = max(t + i for _, t, i in programs)
    assert boot.usable_bytes == limit and boot.total_bytes == weights + kv + code + run
    assert boot.temp_bytes + boot.io_bytes == run and boot.code_bytes == code
    assert boot.kv_max_bytes == max(0, limit - weights - code - run)
    assert boot.kv_evict_max_bytes == max(0, limit - weights - max(c + t + i for c, t, i in programs))
    # Each run in load order (its buckets ascending) finds room with idle code evicted, or tips it.
    tips = ("weights" if weights > limit else "kv" if weights + kv > limit else
            next((program_id(*b) for (b, _), (c, t, i) in zip(buckets, programs) if weights + kv + c + t + i > limit),
                 None))  # The record names the program that tips it by its id.
    assert boot.tips == tips
    expected = Start.STARTS if boot.total_bytes <= limit else Start.RELOADS if tips is None else Start.FAILS
    assert boot.start is expected and boot.boots == (expected is not Start.FAILS)
    if expected is Start.FAILS and tips not in ("weights", "kv"):
        c, t, i = programs[[program_id(*b) for b, _ in buckets].index(tips)]
        assert boot.asked_bytes == t and boot.free_bytes == max(0, limit - weights - kv - c - i)
        # Its temporaries do not fit in what is free, or its I/O alone did not (then nothing is free).
        assert boot.free_bytes < t or limit - weights - kv - c - i <= 0
    assert Boot.from_json(json.loads(json.dumps(boot.to_json()))) == boot


def test_a_buckets_io_is_what_it_holds_beyond_weights_and_pool():
    """The pool a step donates (aliased) and the weights every bucket holds are not its I/O."""
    step = {"argument_bytes": 10 + 100 + 7, "output_bytes": 100 + 3, "alias_bytes": 100,
            "peak_params_bytes": 10, "peak_kv_cache_bytes": 100}
    assert bucket_io(step) == 7 + 3


def test_on_a_gpu_only_the_largest_buckets_temporaries_count_and_what_tips_it_is_said_so():
    h100 = parse_topology("h100-1")
    usable = int(h100.device.memory_bytes * 0.75)
    big = figures(weights=usable - 10 * GiB, kv=4 * GiB, code=0, temp=5 * GiB)
    boot = boot_budget([(parse_program_id("step[tokens=16]"), {**big, "temp_bytes": 3 * GiB}), (parse_program_id("step[tokens=64]"), big)], h100, environ={})
    assert boot.temp_bytes == 5 * GiB and boot.total_bytes == usable - 10 * GiB + 9 * GiB and boot.boots
    tight = boot_budget([(parse_program_id("step[tokens=16]"), {**big, "temp_bytes": 3 * GiB}), (parse_program_id("step[tokens=64]"), {**big, "temp_bytes": 7 * GiB})],
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
    assert usable_words(usable_memory(parse_topology("v5e-1"), {})) == "the runtime's bytes_limit, 16,909,336,064 B"
    assert usable_memory(parse_topology("cpu-4"), {}) is None  # A host's CPU: no budget of its own.


def test_a_servers_memory_fraction_comes_from_its_config_then_the_ini_then_the_environment(tmp_path, monkeypatch):
    from aotcheck import FunctionConfig, Registry
    from aotcheck.gate.analysis import analyse
    from aotcheck.gate.golden import GoldenStore
    from aotcheck.plan import make_plan
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
        servers = make_plan(settings, registry, GoldenStore(settings.golden_dir)).servers  # The plan's, once.
        share = (settings.memory_fraction, settings.said.get("memory_fraction", "aot_memory_fraction"))
        bills = analyse(outcomes, servers, toolchain={}, memory_fraction=share).bills
        return {bill.config: usable_words(bill.usable) for bill in bills}

    assert said(memory_fraction="0.9") == {"own": "0.95 of memory (own's memory_fraction)",
                                           "plain": "0.9 of memory (aot_memory_fraction)"}
    assert said() == {"own": "0.95 of memory (own's memory_fraction)",
                      "plain": "0.8 of memory (XLA_PYTHON_CLIENT_MEM_FRACTION)"}
    h100 = parse_topology("h100-1")
    assert usable_memory(h100, {}, fraction=(0.95, "x")).bytes == int(h100.device.memory_bytes * 0.95)


def test_a_servers_load_order_and_configured_pages_come_from_its_config_through_the_plan(tmp_path):
    from aotcheck import FunctionConfig, Registry
    from aotcheck.gate.analysis import analyse
    from aotcheck.gate.golden import GoldenStore
    from aotcheck.plan import make_plan
    from aotcheck.programs.knob import Knob
    from aotcheck.programs.serving import Server
    from aotcheck.settings import GateSettings

    def bucket(program, **point):
        return FunctionConfig(fn=abs, make_args=abs, program=program, bucket=point, knobs={"pages": Knob(64, abs)})

    registry = Registry()
    registry.register("srv", lambda: [bucket("step", tokens=16), bucket("sample", tokens=16, seqs=8)])
    outcomes = [Outcome(case, Verdict.PASS, measured=Measurement(case, figures(), {}, 1.0)) for case in
                (Case.of("srv", p, "v5e-1") for p in ("sample[tokens=16,seqs=8]", "step[tokens=16]"))]
    settings = GateSettings.parse(rootdir=tmp_path, topologies=["v5e-1"], cache_dir=None)
    servers = make_plan(settings, registry, GoldenStore(settings.golden_dir)).servers
    assert servers == {"srv": Server("srv", ("step", "sample"), "pages", 64)}
    (bill,) = analyse(outcomes, servers, toolchain={}).bills
    assert bill.boot.bytes_per_page == 4 * GiB / 64 and Bill.from_json(json.loads(json.dumps(bill.to_json()))) == bill
    # By name where the server is not known: sample, then step; with it, step (declared first) runs first.
    (unknown,) = analyse(outcomes, {}, toolchain={}).bills
    assert unknown.boot.bytes_per_page is None and bill.boot.programs == unknown.boot.programs == 2


def test_an_engines_utilization_is_a_share_of_the_runtimes_limit_on_a_tpu_and_of_memory_on_a_gpu():
    """tpu-inference sizes its pool as utilization x bytes_limit: measured on v5e (2 MiB below the
    compiler's 15.75 GiB), the compiler's 94.75 GiB less the same 2 MiB on 7x (#3408's "94.7 GiB")."""
    assert engine_base(parse_topology("v5e-1")) == V5E_BYTES_LIMIT == int(15.75 * GiB) - 2 * MiB - 512
    assert engine_base(parse_topology("7x-8")) == int(94.75 * GiB) - 2 * MiB - 512
    assert engine_base(parse_topology("h100-8")) == parse_topology("h100-8").device.memory_bytes
    boot = boot_budget([(parse_program_id("step[tokens=16]"), figures(weights=8 * GiB, kv=GiB, code=0, temp=0))], parse_topology("7x-8"))
    assert boot.kv_max_bytes == int(94.75 * GiB) - 2 * MiB - 512 - 8 * GiB and boot.kv_max_fraction == 1.0


def test_each_tpu_rows_runtime_limit_says_whether_it_was_measured_or_published():
    from aotcheck.targets.tpu import CHIPS

    evidence = {family: chip.device.runtime_limit_evidence for family, chip in CHIPS.items()}
    assert evidence == {"v4": "inferred", "v5p": "inferred", "v5e": "measured", "v6e": "published", "7x": "published"}
    for chip in CHIPS.values():
        assert chip.device.runtime_limit_source.startswith(chip.device.runtime_limit_evidence + ":")
        assert chip.device.runtime_bytes == chip.hbm_limit_bytes - 2 * MiB - 512  # v5e's measured gap, said where inferred.


def test_a_server_loads_its_programs_in_the_order_it_declares_them_each_buckets_ascending():
    """tpu-inference warms up the backbone, then sampling, then structured decoding; within each, its
    buckets ascending (numerically: 1024 after 512). What tips it is named in that order."""
    ids = ["step[tokens=1024]", "sample[tokens=512,seqs=512]", "step[tokens=512]", "sample[tokens=512,seqs=256]",
           "structured_decode[seqs=256]"]
    assert [program_id(*p) for p in load_order([parse_program_id(i) for i in ids], ["step", "sample"])] == [
        "step[tokens=512]", "step[tokens=1024]", "sample[tokens=512,seqs=256]", "sample[tokens=512,seqs=512]",
        "structured_decode[seqs=256]"]
    # Weights and pool leave 0.748 GiB of the chip's bytes_limit; each bucket's run alone asks 0.875 GiB.
    small, big = figures(weights=8 * GiB, kv=7 * GiB, code=0, temp=7 * GiB // 8), figures(weights=8 * GiB, kv=7 * GiB, code=0,
                                                                                        temp=7 * GiB // 8)
    buckets = [(parse_program_id("step[tokens=16]"), big), (parse_program_id("sample[tokens=16,seqs=8]"), small)]
    v5e = parse_topology("v5e-1")
    assert boot_budget(buckets, v5e, programs=("step", "sample")).tips == "step[tokens=16]"
    assert boot_budget(buckets, v5e, programs=("sample", "step")).tips == "sample[tokens=16,seqs=8]"


def test_a_bucket_without_the_figures_the_budget_needs_leaves_it_unknown():
    partial = {k: v for k, v in figures().items() if k != "temp_bytes"}
    assert boot_budget([(parse_program_id("step[tokens=16]"), partial)], parse_topology("v5e-1")) is None


def small(temp):
    return figures(weights=8 * GiB, kv=2 * GiB, temp=temp)


def served(tokens, now, before):
    case = Case.of("srv", f"step[tokens={tokens}]", "v5e-1")
    return Outcome(case, Verdict.PASS, measured=Measurement(case, now, {}, 1.0),
                   golden=Golden(before, {}, {}, Path(case.golden_relpath)))


def test_a_server_that_started_and_no_longer_does_fails_the_run_and_says_what_tips_it():
    before = [served(16, small(GiB), small(GiB)), served(64, small(2 * GiB), small(GiB))]  # 12.50 GiB at its largest run.
    (bill,) = startup_bills(before)
    assert bill.boot.start is Start.STARTS and bill.booted is Start.STARTS and not bill.failed
    grown = [served(16, small(GiB), small(GiB)), served(64, small(6 * GiB), small(GiB))]  # 16.25 GiB, code evicted.
    (bill,) = startup_bills(grown)
    assert bill.boot.start is Start.FAILS and bill.boot_lost and bill.failed and not bill.grew
    assert bill.boot.tips == "step[tokens=64]" and bill.boot.asked_bytes == 6 * GiB
    assert bill.boot.free_bytes == V5E_BYTES_LIMIT - 8 * GiB - 2 * GiB - 256 * MiB  # Its own code resident.
    line = boot_line(bill)
    assert line.startswith("  REGRESSION: it started better by its goldens' figures and WILL NOT START: weights 8.00 GiB + "
                           "KV pool 2.00 GiB + code of 2 programs 512.00 MiB + step[tokens=64]'s temporaries 6.00 GiB"), line
    assert "running step[tokens=64] asks 6.00 GiB of temporaries with 5.50 GiB free" in line and "E0101" in line
    assert Bill.from_json(json.loads(json.dumps(bill.to_json()))) == bill
    (never,) = startup_bills([served(64, small(6 * GiB), small(6 * GiB))])
    assert not never.boot.boots and never.booted is Start.FAILS and not never.failed  # Never started: said, not failed.


def test_a_server_whose_goldens_started_with_more_memory_than_it_has_now_fails():
    """Hardening round 5, V49: a memory fraction lowered until the server will not start passed, its
    goldens re-judged under the new fraction ("never started"). Goldens record what a device held then."""
    def at(fraction_bytes, golden_bytes):
        case = Case.of("srv", "step[tokens=64]", "v5e-1")
        golden = Golden(small(2 * GiB), {}, {}, Path(case.golden_relpath),
                        usable=Usable(golden_bytes).to_json() if golden_bytes else None)
        (bill,) = startup_bills([Outcome(case, Verdict.PASS, measured=Measurement(case, small(2 * GiB), {}, 1.0),
                                         golden=golden)], usable={("srv", "v5e-1x1"): Usable(fraction_bytes)})
        return bill

    lowered = at(12 * GiB, V5E_BYTES_LIMIT)  # Made with the whole chip; now 12 GiB, short of 12.5.
    assert lowered.booted is Start.STARTS and lowered.boot.start is Start.FAILS and lowered.failed
    assert not at(12 * GiB, 12 * GiB).failed  # Made and judged at 12 GiB: never started, said, not failed.
    assert not at(12 * GiB, None).failed  # A golden from before it was recorded: judged as now.
    assert Golden.from_json({"figures": {}, "usable": {"bytes": 1}}, path=Path("x")).usable == {"bytes": 1}


def test_a_server_that_newly_starts_only_by_reloading_programs_fails_the_run():
    """Weights + pool + one bucket's code and temporaries fit; with every program's code resident they
    do not: the runtime evicts idle code to run each, and reloads it at the next switch."""
    reloads = small(5 * GiB + 400 * MiB)  # 8 + 2 + 0.25 + 5.39 GiB for one run; 0.25 GiB more with both codes.
    (bill,) = startup_bills([served(16, small(GiB), small(GiB)), served(64, reloads, small(GiB))])
    assert bill.boot.start is Start.RELOADS and bill.boot.tips is None and bill.boot.boots and bill.boot_lost
    assert bill.boot.kv_max_bytes < bill.boot.kv_bytes <= bill.boot.kv_evict_max_bytes
    assert boot_line(bill).startswith("  REGRESSION: it started better by its goldens' figures and starts, but programs "
                                      "reload on every switch: ")
    (same,) = startup_bills([served(16, small(GiB), small(GiB)), served(64, reloads, reloads)])
    assert same.booted is Start.RELOADS and not same.failed  # As its goldens: said, not failed.


def test_a_bill_from_a_report_before_the_chips_rules_reads_back():
    (bill,) = startup_bills([served(16, small(GiB), small(GiB))])
    old = {**bill.to_json(), "booted": True, "boot": None}
    assert Bill.from_json(old).booted is Start.STARTS and Bill.from_json({**old, "booted": False}).booted is Start.FAILS


@pytest.mark.parametrize("target", ["v4-8x1", "v5e-16x1", "h100-8x1"])
def test_the_reference_servers_boot_from_its_goldens_adds_up(target):
    """The reference server (aotcheck.models.serve) on each gated target, from its committed goldens: the
    budget is their figures summed by hand, and the pool that still starts fills what is left."""
    docs = [json.loads(p.read_text()) for p in sorted((ROOT / "golden/llm").glob(f"*@{target}.json"))]
    cases = [Case.parse(d["case"]) for d in docs]
    boot = boot_budget([((c.program, c.bucket), d["figures"]) for c, d in zip(cases, docs)], cases[0].topology)
    code = sum(d["figures"]["generated_code_bytes"] for d in docs)
    # A TPU holds one reservation for the program running, beside its I/O; XLA's GPU client takes a
    # run's temporaries from its pool, the largest's at most.
    tpu = cases[0].topology.platform.runtime_reserves_temporaries
    run = max(d["figures"]["temp_bytes"] + (bucket_io(d["figures"]) if tpu else 0) for d in docs)
    # Every bucket holds the server's weights, those its program does not read too: the same in each.
    (weights,) = {d["figures"]["peak_params_bytes"] for d in docs}
    assert boot.programs == len(docs) == 9 and (boot.code_bytes, boot.temp_bytes + boot.io_bytes) == (code, run)
    assert boot.start is Start.STARTS and boot.kv_max_bytes == boot.usable_bytes - weights - code - run


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
    return boot_budget([((c.program, c.bucket), d["figures"]) for c, d in zip(cases, docs)], cases[0].topology,
                       pages=cfg.pages, programs=list(serve.serving_config(cfg).bucketed))


def test_tpu_inference_3360s_shape_starts_on_v5e_1_under_the_chips_rules():
    """llm-256k (a 256K vocabulary, 2B-class dims, max_num_seqs 512, its pool what an engine at 0.90
    allocates) from its committed goldens (jax 0.12): it starts, as its shape did on a v5e chip under
    jax 0.10.2 (the calibration record). It no longer reproduces #3360 as built: the field's server held
    more at its warm-up than one bucket's I/O (docs/calibration.md). Analytic: the weights are
    2,558,601,216 bf16 parameters on one device; a page is 18 layers x 16 tokens x 32 heads' keys and
    values x 128 x 2 bytes."""
    from aotcheck.models import serve

    boot = _committed_boot("llm-256k", "v5e-1x1")
    assert boot.weights_bytes == 2 * serve.LLM_256K.model.num_params() == 5_117_202_432  # Ratio 1.000.
    assert boot.bytes_per_page == 18 * 16 * 32 * 128 * 2 and boot.kv_bytes == serve.LLM_256K.pages * boot.bytes_per_page
    assert (boot.weights_bytes + boot.kv_bytes) / boot.memory_bytes == pytest.approx(0.90, abs=2e-4)
    # The run that asks the most: structured decoding for 512 requests, its logits in and out and bitmask live.
    assert boot.start is Start.STARTS and boot.running == "structured_decode[seqs=512]"
    analytic = 2 * 512 * 256000 * 2 + 512 * 8000 * 4 + 512 + 32 * 4  # Logits in and out, bitmask, flags, arange.
    assert boot.io_bytes == 540_723_712 and boot.io_bytes / analytic == pytest.approx(1.0, abs=1e-4)  # Tiles' padding.
    assert boot.kv_max_pages == 4617 and boot.kv_evict_max_pages == 4657


def test_tpu_inference_3408s_shape_starts_on_7x_8_at_098_under_the_chips_rules():
    """llm-31b (30.07B dense parameters, TP=8 on tpu7x-8, its pool at 0.98 of the 94.75 GiB limit) from
    its committed goldens: with one reservation for the program running it starts, 141 MiB to spare
    (7x's bytes_limit is published, not measured). #3408's server (torchax's programs, ~6 GiB at load)
    is not what this config compiles. Analytic weights per device: 64 layers' 27.92B split 8 ways, the
    unembedding split 8 ways, the embedding (1.07B) on every device, as bf16: 9,396,297,728 bytes."""
    boot = _committed_boot("llm-31b", "7x-8x1")
    assert boot.weights_bytes == 9_396_297_728 and boot.bytes_per_page == 64 * 64 * 8 * 128 * 2
    assert (boot.weights_bytes + boot.kv_bytes) / (int(94.75 * GiB)) == pytest.approx(0.98, abs=1e-4)
    assert boot.start is Start.STARTS and boot.running == "structured_decode[seqs=1024]"
    assert 0 < boot.usable_bytes - boot.total_bytes < 150 * MiB and boot.kv_max_pages == 10782
