"""gate/worker.py: the request a compile worker reads is one typed record with one JSON form."""

import json

from hypothesis import given, strategies as st

from aotcheck.gate.worker import WorkerRequest

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@given(case=names, sources=st.lists(st.tuples(names, names), max_size=3),
       registry=st.none() | st.tuples(names, names), fit=st.none() | names, cache_dir=st.none() | names,
       headroom=st.floats(0.01, 1.0), options=st.dictionaries(names, names, max_size=3), presets=st.booleans(),
       build=st.none() | st.fixed_dictionaries({"digest": names, "unstable": st.none() | names}))
def test_a_request_survives_its_json_form(case, sources, registry, fit, cache_dir, headroom, options, presets, build):
    request = WorkerRequest(case=case, sources=tuple(sources), registry=registry, fit=fit, cache_dir=cache_dir,
                            hbm_headroom=headroom, compiler_options=options, presets=presets, build=build)
    line = json.dumps(request.to_json())  # What crosses the pipe: one line of JSON.
    assert "\n" not in line
    assert WorkerRequest.from_json(json.loads(line)) == request
