"""gate/worker.py: the request a compile worker reads and the reply it writes are typed records, each with
one JSON form (aotcheck.records): a case crosses as a Case, the cache as the session's CacheSpec."""

import json
from pathlib import Path

from hypothesis import given, strategies as st

from aotcheck.errors import error_to_json
from aotcheck.gate.worker import WorkerReply, WorkerRequest
from aotcheck.pipeline.cache import CacheSpec
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
ids = st.sampled_from(["lm/prefill@v4-8x1", "llm/step[tokens=16]@v5e-16x2", "m/sample[tokens=8,seqs=4]@h100-8x1"])
caches = st.none() | st.builds(CacheSpec, st.builds(Path, st.sampled_from(["c", "/tmp/c d"])), st.booleans(),
                               st.none() | st.sampled_from(["s3://b/aot", "file:///x"]), st.booleans())


@given(case=ids, sources=st.lists(st.tuples(names, names), max_size=3),
       registry=st.none() | st.tuples(names, names), fit=st.none() | names, cache=caches,
       headroom=st.floats(0.01, 1.0), options=st.dictionaries(names, names, max_size=3), presets=st.booleans(),
       build=st.none() | st.fixed_dictionaries({"digest": names, "unstable": st.none() | names}),
       fraction=st.none() | st.tuples(st.none() | st.floats(0.1, 1.0), names))
def test_a_request_survives_its_json_form(case, sources, registry, fit, cache, headroom, options, presets, build,
                                          fraction):
    request = WorkerRequest(case=Case.parse(case), sources=tuple(sources), registry=registry, fit=fit, cache=cache,
                            hbm_headroom=headroom, compiler_options=options, presets=presets, build=build,
                            memory_fraction=fraction)
    line = json.dumps(request.to_json())  # What crosses the pipe: one line of JSON.
    assert "\n" not in line
    back = WorkerRequest.from_json(json.loads(line))
    assert back == request and isinstance(back.case, Case) and back.case.bucket == request.case.bucket


def test_a_reply_carries_a_measurement_or_an_error_and_the_notes():
    measured = Measurement(Case.parse("llm/step[tokens=16]@v5e-16x1"), {"peak_bytes": 8}, {}, 1.5)
    for reply in (WorkerReply(measured, notes=["aotcheck: a note"]),
                  WorkerReply(error=error_to_json(KeyError("vocab")))):
        assert WorkerReply.from_json(json.loads(json.dumps(reply.to_json()))) == reply
    assert set(WorkerReply(measured).to_json()) == {"measurement", "notes"}
