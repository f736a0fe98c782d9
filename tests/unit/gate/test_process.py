"""aotcheck.gate.process: a compile worker's environment (pure logic: no process is started here; the
workers themselves run in tests/unit/gate/test_isolation.py and every end-to-end run)."""

from aotcheck import _runtime
from aotcheck.gate.process import worker_environment
from aotcheck.targets.topology import parse_topology


def test_a_worker_runs_without_the_launch_flags_and_with_its_platforms_settings(monkeypatch):
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_latency_hiding_scheduler=false")
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    for name in ("v5e-16", "h100-8", "cpu-4"):
        env = worker_environment(parse_topology(name))
        # The session took the launch flags as compiler options: libtpu must not read them a second time.
        assert "LIBTPU_INIT_ARGS" not in env, name
        assert env["JAX_PLATFORMS"] == "cpu" and env[_runtime.WORKER_ENV] == "1", name
        assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x", name  # The rest of the environment, as it is.
