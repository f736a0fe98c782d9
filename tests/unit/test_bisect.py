"""aotcheck.bisect's search (pure logic, no compile): the first bad commit of any history whose badness, once
it starts, stays, found in ceil(log2(N)) visits, never visiting --bad itself. tests/e2e/test_bisect.py runs
the command over a real git history with real compiles."""

import math

from hypothesis import given, strategies as st

from aotcheck.bisect import search


@given(st.integers(1, 5000), st.data())
def test_the_first_bad_commit_is_found_in_ceil_log2_n_visits(n, data):
    first = data.draw(st.integers(0, n - 1))
    found, visited = search(n, lambda i: i >= first)
    assert found == first and len(visited) <= math.ceil(math.log2(n)) if n > 1 else visited == []
    assert n - 1 not in visited and len(set(visited)) == len(visited)


def test_64_commits_take_at_most_7_compiles():
    assert max(len(search(63, lambda i, k=k: i >= k)[1]) for k in range(63)) == 6
