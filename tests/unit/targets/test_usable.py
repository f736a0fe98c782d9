"""What a device of a target may hold: a TPU's runtime limit, a GPU process's share, from where it is given."""

from hypothesis import given, strategies as st

from aotcheck.targets.topology import parse_topology
from aotcheck.targets.usable import Usable, usable_memory

H100 = parse_topology("h100-8")


def test_a_tpu_holds_its_runtime_limit_and_a_host_cpu_has_no_budget():
    v5e = parse_topology("v5e-1")
    assert usable_memory(v5e, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}) == Usable(v5e.device.runtime_bytes)
    assert usable_memory(parse_topology("cpu-4"), {}) is None


@given(st.floats(min_value=1e-3, max_value=1.0), st.sampled_from(["0.3", "lots", "", "0", "-1", "1.5"]))
def test_a_gpu_share_comes_from_the_caller_then_the_environment_then_jaxs_default(share, variable):
    """Property: a share given by a config or the ini wins; else a valid variable; else 0.75, said as the default."""
    environ = {"XLA_PYTHON_CLIENT_MEM_FRACTION": variable}
    assert usable_memory(H100, environ, fraction=(share, "aot_memory_fraction")) == Usable(
        int(H100.device.memory_bytes * share), share, "XLA_PYTHON_CLIENT_MEM_FRACTION", "aot_memory_fraction")
    from_environment = usable_memory(H100, environ)
    valid = variable not in ("lots", "", "0", "-1", "1.5")
    assert from_environment.fraction == (float(variable) if valid else 0.75)
    assert from_environment.source == ("XLA_PYTHON_CLIENT_MEM_FRACTION" if valid else None)
