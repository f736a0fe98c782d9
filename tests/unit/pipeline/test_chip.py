"""aotcheck.pipeline.chip: the procedures of `aotcheck calibrate` against a stand-in runtime
(tests/chip_standin.py: a FAKE chip, bookkeeping by the rules a v5e chip showed) over real deviceless
v5e compiles; libtpu's E0101 read."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, strategies as st
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from aotcheck.pipeline.chip import compile_on, parse_e0101, run_step, start_server, try_size
from aotcheck.targets.devices import get_devices_for_topology
from chip_standin import StandInChip

MiB = 2**20


def lowered(rows, *, params=False):
    """A deviceless v5e-1 program: a Gram matrix of ``rows`` x 1024, with weights to hold where asked."""
    (device,) = get_devices_for_topology("v5e-1").devices
    sharding = NamedSharding(Mesh(np.array([device]), ("d",)), P())
    x = jax.ShapeDtypeStruct((rows, 1024), jnp.float32, sharding=sharding)
    if params:
        w = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=sharding)}
        return jax.jit(lambda w, x: (jnp.tanh((x @ w["w"]) @ x.T) @ x).sum(0)).lower(w, x)
    return jax.jit(lambda x: (jnp.tanh(x @ x.T) @ x).sum(0)).lower(x)  # [rows, rows] of temporaries.


def test_a_step_run_reads_its_code_its_reservation_and_what_it_held():
    chip = StandInChip()
    program = lowered(8192)  # 256 MiB of temporaries: past the core's VMEM, in HBM.
    m = program.compile().memory_analysis()
    run = run_step(chip, compile_on(chip, program), repeat=2)
    # The code is what stays in use once its arguments and outputs are gone; the temporaries, bytes_reserved.
    # (The chip reserves a few KiB less than the temporaries: the stand-in its peak beside its I/O.)
    assert run.code_bytes == m.generated_code_size_in_bytes and 0 <= m.temp_size_in_bytes - run.reserved_bytes < 64 << 10
    held = m.argument_size_in_bytes + m.output_size_in_bytes + m.generated_code_size_in_bytes + run.reserved_bytes
    assert run.footprint_bytes == held and run.seconds >= 0
    assert chip.memory().in_use == 0  # Released after.


def test_a_step_that_donates_beside_held_weights_runs_again_on_a_chip_that_holds_them_once():
    """The chip showed it (llm-256k's step, 14.2 GiB of weights and pool on 15.75): the runs after the first
    make the donated arguments again only once the old ones are gone, never both at once."""
    (device,) = get_devices_for_topology("v5e-1").devices
    sharding = NamedSharding(Mesh(np.array([device]), ("d",)), P())
    arg = jax.ShapeDtypeStruct((16 * MiB,), jnp.float32, sharding=sharding)  # 64 MiB each.
    program = jax.jit(lambda w, x: x * 2 + w[0], donate_argnums=1).lower(arg, arg)
    chip = StandInChip(limit=180 * MiB)  # Weights and pool once (128 MiB), not twice (192).
    run = run_step(chip, compile_on(chip, program), repeat=3)
    assert run.footprint_bytes >= 128 * MiB and chip.runs == ["jit__lambda"] * 4


def test_a_size_runs_or_is_refused_where_the_chip_refuses_it():
    chip = StandInChip()
    assert try_size(chip, lambda: lowered(1024))["ran"]
    refused = try_size(chip, lambda: lowered(2**20 * 5))  # 20 GiB of input on a 15.75 GiB chip.
    assert refused == {"ran": False, "refused": "compile", "message": refused["message"]}
    assert "exceeds available HBM" in refused["message"] or "Ran out of memory" in refused["message"]
    small = StandInChip(limit=8 * MiB)  # Compiles (the compiler's limit is the chip's), the runtime refuses.
    ran = try_size(small, lambda: lowered(2048))
    assert not ran["ran"] and ran["refused"] == "run"


def test_a_server_holds_its_weights_across_buckets_and_fails_where_a_run_finds_no_room():
    buckets = [(f"step[tokens={n}]", lowered(n, params=True), ["params", "batch"], None) for n in (1024, 8192)]
    roomy = StandInChip()
    started = start_server(roomy, buckets)
    assert started["started"] and started["spare_bytes"] > 0
    assert len(roomy.runs) == 2
    # Room for the largest bucket's inputs, outputs and code, and half its temporaries: its run fails.
    big = buckets[1][1].compile().memory_analysis()
    tight = StandInChip(limit=big.argument_size_in_bytes + big.output_size_in_bytes + big.generated_code_size_in_bytes
                        + big.temp_size_in_bytes // 2)
    failed = start_server(tight, buckets)
    assert not failed["started"] and failed["at"] == "step[tokens=8192]" and failed["refused"] == "run"
    error = failed["error"]
    assert error["program"] and "E0101" in error["message"]
    assert abs(error["asked_bytes"] - big.temp_size_in_bytes) < 64 << 10  # Its reservation, said to 0.01M.
    assert error["free_bytes"] < error["asked_bytes"]


@given(st.floats(0, 1000), st.floats(0, 1000), st.sampled_from(["K", "M", "G"]))
def test_e0101_says_its_sizes_in_binary_units(asked, free, unit):
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}[unit]
    message = (f"E0101: RuntimeProgramAllocationFailure: Error loading program 'jit_step': Attempting to reserve "
               f"{asked:.2f}{unit} at the bottom of memory. That was not possible. There are {free:.2f}{unit} free, "
               f"0B reserved, and {free:.2f}{unit} reservable.")
    parsed = parse_e0101(message)
    assert parsed["program"] == "jit_step"
    assert parsed["asked_bytes"] == int(float(f"{asked:.2f}") * scale)
    assert parsed["free_bytes"] == int(float(f"{free:.2f}") * scale)


def test_a_message_without_sizes_keeps_its_program_and_another_error_is_none():
    assert parse_e0101("E0101: Error loading program 'jit_structured_decode'") == {
        "program": "jit_structured_decode", "asked_bytes": None, "free_bytes": None}
    assert parse_e0101("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm") is None
