"""A server's buckets (aotcheck.programs.serving): generated as the engines generate them, checked
against the scheduler's limits when the config is built, expanded into one config per bucket.

Pure logic: no compile here (the reference server compiles in tests/unit/models/test_serve.py).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, strategies as st

from aotcheck import REGISTRY
from aotcheck.errors import ConfigError
from aotcheck.models import serve
from aotcheck.programs.registry import Registry, RegistryError
from aotcheck.programs.serving import (
    BucketError, Bucketed, Limits, bucket_problems, doubling, padded,
)


@given(minimum=st.integers(1, 512), maximum=st.integers(1, 1 << 16))
def test_doubling_covers_the_maximum_with_its_last_bucket_only(minimum, maximum):
    if maximum < minimum:
        with pytest.raises(BucketError, match="below the smallest"):
            doubling(minimum, maximum)
        return
    sizes = doubling(minimum, maximum)
    assert sizes[0] == minimum and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert sizes[-1] >= maximum and (len(sizes) == 1 or sizes[-2] < maximum)  # The one bucket that covers it.


@given(minimum=st.integers(1, 64), gap=st.integers(64, 4096), maximum=st.integers(64, 1 << 15))
def test_padded_doubles_to_the_gap_then_steps_by_it(minimum, gap, maximum):
    sizes = padded(minimum, maximum, gap=gap)
    assert sizes == tuple(sorted(set(sizes))) and sizes[-1] >= maximum and (len(sizes) == 1 or sizes[-2] < maximum)
    small = [s for s in sizes if s <= gap]
    assert small == [s for s in doubling(minimum, min(gap, maximum)) if s <= gap]
    large = sizes[len(small):]
    assert all(b - a == gap for a, b in zip((small[-1], *large), large))


def test_a_gap_below_the_smallest_bucket_is_refused_naming_it():
    with pytest.raises(BucketError, match=r"padded\(gap=8\): the gap is a size >= the minimum \(16\)"):
        padded(16, 1024, gap=8)


LIMITS = Limits(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=256)


def step(*tokens: int) -> Bucketed:
    return Bucketed(fn=None, inputs=None, axes={"tokens": tokens}, covers={"tokens": "max_num_batched_tokens"})


def test_a_shape_the_scheduler_can_send_without_a_bucket_is_named_with_the_fix():
    assert bucket_problems({"step": step(16, 32)}, LIMITS) == [
        "step: a step of 64 tokens (max_num_batched_tokens=64) has no bucket, the largest is tokens=32: add 64 "
        "to its tokens buckets, or lower max_num_batched_tokens to 32"]


def test_a_bucket_over_the_token_budget_is_named_with_the_fix():
    problems = bucket_problems({"step": step(16, 32, 64, 128, 256)}, LIMITS)
    assert len(problems) == 1
    assert problems[0].startswith("step: buckets tokens=128, tokens=256 over the budget (max_num_batched_tokens=64): "
                                  "the scheduler never sends more than 64 tokens, so they are compiled at start-up "
                                  "for nothing; make the largest bucket 64")


def test_the_smallest_bucket_that_holds_the_budget_is_used_and_only_those_above_it_are_waste():
    # 48 tokens: doubling(16, 48) ends at 64, the bucket steps of 33-48 tokens run in: nothing is wasted.
    assert bucket_problems({"step": step(*doubling(16, 48))}, dataclasses.replace(LIMITS, max_num_batched_tokens=48)) == []
    problems = bucket_problems({"step": step(16, 32, 64, 128)}, dataclasses.replace(LIMITS, max_num_batched_tokens=48))
    assert [p.split(":")[1].strip() for p in problems] == ["bucket tokens=128 over the budget (max_num_batched_tokens=48)"]
    assert problems[0].endswith("make the largest bucket 64 (the smallest that holds 48 tokens)")


@pytest.mark.parametrize("axis", ["tok,ens", "tok=ens", "to]k", "1st", ""])
def test_an_axis_that_is_not_a_name_is_refused(axis):
    """Bucket names carry their axes (step[tokens=64]): 'tok,ens' buckets left the start-up bill."""
    program = Bucketed(fn=None, inputs=None, axes={axis: (16, 32)})
    [problem] = bucket_problems({"step": program}, None)
    assert problem.startswith(f"step: axis {axis!r} is not a name (letters, digits and _, not starting with a digit)")


def test_covers_must_name_an_axis_and_a_limit():
    bad = Bucketed(fn=None, inputs=None, axes={"tokens": (16,)}, covers={"seqs": "max_num_seqs",
                                                                        "tokens": "max_tokens"})
    assert bucket_problems({"step": bad}, LIMITS) == [
        "step: covers names axis 'seqs', which it does not have (tokens)",
        "step: covers 'tokens' by 'max_tokens', not a limit (max_num_seqs, max_num_batched_tokens, max_model_len)"]


@pytest.mark.parametrize("sizes", [(), "16,32", (16, 0), (16.0,)])
def test_an_axis_that_is_not_a_list_of_sizes_is_named(sizes):
    problems = bucket_problems({"step": step(*sizes) if isinstance(sizes, tuple) else
                                dataclasses.replace(step(), axes={"tokens": sizes})}, LIMITS)
    assert problems[0].startswith("step: axis 'tokens' is ") and "give its sizes" in problems[0]


def test_a_server_whose_buckets_miss_its_limits_fails_to_build_naming_every_problem():
    registry = Registry()
    limits = Limits(max_num_seqs=32, max_num_batched_tokens=32, max_model_len=256)
    registry.register("llm", lambda: serve.serving_config(dataclasses.replace(serve.TINY, limits=limits),
                                                          limits=dataclasses.replace(limits, max_num_seqs=64)))
    with pytest.raises(RegistryError) as raised:
        registry.get("llm").programs()
    message = str(raised.value)
    assert message.startswith("Building config 'llm' failed: BucketError: The buckets do not match the scheduler's "
                              "limits:\n  sample: a step of 64 requests (max_num_seqs=64) has no bucket")


def test_limits_and_pages_are_checked_when_built():
    with pytest.raises(BucketError, match=r"Limits.max_num_seqs=0: give the engine's setting, an int >= 1"):
        Limits(max_num_seqs=0, max_num_batched_tokens=64, max_model_len=256)
    with pytest.raises(BucketError, match=r"ServingConfig.pages=0: give the KV pool's size in pages"):
        serve.serving_config(serve.TINY, pages=0)


@pytest.mark.parametrize("upper, words", [
    (100, "ServingConfig.fit_upper=100 is below the configured pages (256)"),
    (0, "ServingConfig.fit_upper=0: the fit search's cap must be a size >= 1"),
    ("lots", "ServingConfig.fit_upper='lots' is not a size; give the largest pages the fit search may try"),
])
def test_a_servers_fit_upper_is_worded_as_its_pages(upper, words):
    """Hardening round 4: a ServingConfig's bad fit_upper was worded as a FunctionConfig's batch."""
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(serve.serving_config(serve.TINY), fit_upper=upper)
    assert str(e.value).startswith(words) and "batch" not in str(e.value), str(e.value)


def test_a_server_expands_to_a_config_per_bucket_its_largest_step_searching_the_kv_pool():
    configs = serve.serving_config(serve.TINY).expand()
    names = [c.programs[0] for c in configs]
    assert names == ["step[tokens=16]", "step[tokens=32]", "step[tokens=64]",
                     *(f"sample[tokens={t},seqs={s}]" for t in (16, 32, 64) for s in (8, 16))]
    searched = {c.programs[0]: (c.fit, c.fit_upper) for c in configs if c.fit}
    assert searched == {"step[tokens=64]": ("pages", 2**23)}
    step64 = configs[2]
    assert step64.knobs["pages"].size == 256 and step64.arg_kinds == ("params", "kv_cache", "batch")
    assert step64.knobs["pages"].rebuild(1024).knobs["pages"].size == 1024
    assert not configs[-1].knobs and configs[-1].arg_kinds == ("params", "batch")  # Sampling holds no pool.


def test_the_repository_registers_the_reference_server():
    # The rootdir conftest.py, which pytest loads before any test, registers the repository's configs.
    assert "step[tokens=64]" in REGISTRY.get("llm").programs()


@pytest.mark.parametrize("changes, words", [
    (dict(bucketed={}), "ServingConfig.bucketed={}: give the server's programs by name, each a Bucketed"),
    (dict(bucketed={"step": lambda: None}), "(not one: 'step')"),
    (dict(bucketed=[step(16)]), "ServingConfig.bucketed=[Bucketed("),
    (dict(kv=256), "ServingConfig.kv=256: give a function of the pool's size in pages"),
])
def test_a_server_that_is_not_one_is_refused_naming_the_field(changes, words):
    with pytest.raises(BucketError) as raised:
        serve.serving_config(serve.TINY, **changes)
    assert words in str(raised.value)


def test_a_program_that_compiles_no_bucket_is_named():
    none = dataclasses.replace(step(16, 32), when=lambda point: False)
    assert bucket_problems({"step": none}, None) == [
        "step: no bucket is compiled (its axes are {'tokens': (16, 32)}, and when= keeps none of their product); "
        "give it at least one axis with sizes, and a when= that keeps some of them"]
    assert bucket_problems({"step": dataclasses.replace(step(), axes={})}, None)[0].startswith(
        "step: no bucket is compiled (its axes are {})")


def test_a_when_that_raises_is_named_with_its_point():
    """Hardening round 4: ``when=lambda p: p["nope"]`` was ``KeyError: 'nope'`` with nothing named."""
    program = Bucketed(fn=lambda *a: a, inputs=lambda p: {}, axes={"tokens": [16, 32]}, when=lambda p: p["nope"])
    with pytest.raises(BucketError) as e:
        program.points()
    assert str(e.value) == ("Bucketed.when raised KeyError: 'nope' at the point {'tokens': 16}; when is given each "
                            "point as a dict of axis -> size (axes: tokens), e.g. when=lambda p: p['tokens'] >= 16.")


def test_a_server_is_its_programs_in_declared_order_its_pool_and_its_memory_fraction():
    from aotcheck.programs.serving import Server, server_of
    from aotcheck.targets.topology import parse_topology

    config = serve.serving_config(serve.TINY, memory_fraction=0.9)
    server = server_of("llm", config.expand())
    assert server == Server("llm", tuple(config.bucketed), "pages", serve.TINY.pages, 0.9)
    assert server.programs == ("step", "sample")
    h100 = parse_topology("h100-8")
    assert server.usable(h100, (0.5, "aot_memory_fraction")).source == "llm's memory_fraction"  # Its own first,
    plain = Server("plain", ("step",))
    assert plain.usable(h100, (0.5, "aot_memory_fraction")).fraction == 0.5  # then the run's.
    from aotcheck import FunctionConfig

    assert server_of("lm", [FunctionConfig(fn=abs, make_args=abs)]) is None  # No bucket: no server.
