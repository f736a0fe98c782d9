"""Out of memory worded from its record: each real form (tests/fixtures/oom) read by the compile's reader,
then worded; never XLA's text re-read."""

from __future__ import annotations

from pathlib import Path

from aotcheck.errors import Overflow
from aotcheck.programs.oom import overflow_of
from aotcheck.render.memory import hbm_words, oom_words

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "oom"


def words(name: str, topology: str) -> str:
    return oom_words(overflow_of((FIXTURES / name).read_text()), topology)


def test_tpu_hbm_words_say_needed_available_breakdown_and_allocations():
    short = words("tpu-hbm-short.libtpu-0.0.50.1.txt", "v5e-1")
    assert short == ("does not fit: XLA needs 20.00 GiB for HLO temporaries of the 15.75 GiB HBM a device can use "
                     "on v5e-1: 127%")
    long = words("tpu-hbm-capacity.field.txt", "v4-8").splitlines()
    assert long[0] == "does not fit: XLA needs 63.80 GiB of the 30.75 GiB HBM a device can use on v4-8: 207%"
    assert long[1].startswith("XLA's figures per device: reserved 1.25 GiB, program 63.80 GiB, arguments 0 B")
    assert long[2] == "Largest allocations XLA names:"
    assert "2.00 GiB  f32[32,4096,4096] (HLO temp)" in long[3] and long[3].endswith("at attention.py:1059")
    assert "XLA's %copy.88" in long[4]


def test_gpu_words_say_what_the_allocator_could_not_get():
    text = words("gpu-buffer-assignment.field.txt", "h100-8").splitlines()
    assert text[0] == "does not fit in HBM on h100-8: XLA could not allocate 4.44 GiB"
    assert "parameter allocation 372.76 MiB" in text[1] and "f32[4096,128,3]" in text[3]


def test_vmem_and_smem_are_worded_in_their_space_never_as_hbm():
    vmem = words("tpu-vmem-scoped.libtpu-0.0.50.1.txt", "v5e-1")
    assert vmem.startswith("does not fit in VMEM on v5e-1: the Pallas kernel jit(<lambda>)/pallas_call")
    assert "--xla_tpu_scoped_vmem_limit_kib=32768" in vmem and "HBM on" not in vmem
    smem = words("tpu-smem-allocation.libtpu-0.0.50.1.txt", "v5e-1")
    assert smem.startswith("does not fit in SMEM on v5e-1") and "No flag raises it" in smem


def test_no_record_shows_xlas_text_as_it_came():
    """A report written before the record was read (or words no reader knows): XLA's lines, not a guess."""
    text = oom_words(None, "v5e-1", text="RESOURCE_EXHAUSTED: something new\n\n  details")
    assert text == "does not fit in HBM on v5e-1; XLA says:\nRESOURCE_EXHAUSTED: something new\n  details"
    assert hbm_words(Overflow("hbm", None, None), "v5e-1") == "does not fit in HBM on v5e-1"


def test_a_scoped_limit_is_advised_with_room_where_xlas_figure_is_not_a_multiple_of_4_mib():
    """XLA's scoped size is what it had placed when it stopped: megablox's gmm reported 22.00 MiB at the
    16 MiB default and 22.82 MiB at a 22 MiB limit (libtpu 0.0.50.1, tests/e2e/test_eval_step.py), so
    the limit advised is rounded up to 4 MiB and says why; an exact multiple is advised as it is."""
    from aotcheck.render.memory import explain_overflow

    gmm = Overflow("vmem", 22 * 2**20, 16 * 2**20, "scoped", op_name="jit(gmm)/pallas_call", kernel=True)
    text = explain_overflow(gmm, "v5e-1")
    assert "To raise the limit to 24.00 MiB (XLA's figure rounded up to 4 MiB" in text
    assert "vmem_limit_bytes=25165824" in text and "--xla_tpu_scoped_vmem_limit_kib=24576" in text
    exact = explain_overflow(Overflow("vmem", 32 * 2**20, 16 * 2**20, "scoped", kernel=True), "v5e-1")
    assert "To raise the limit to 32.00 MiB:" in exact and "rounded up" not in exact


def test_the_limit_advised_for_the_canary_is_one_the_chip_compiled_and_ran():
    """calibration/vmem/: the canary's eval step on a real v5e chip and deviceless with the same toolchain
    (jax 0.10.2, libtpu 0.0.42.1; calibration/vmem/canary_vmem.py). The chip refused it at 22.00M of a 16M
    limit, and at 22.82M of a 22M one (XLA's first figure, advised as it is, would not have done); the limit
    aotcheck advises from the first refusal, rounded up to 4 MiB, is one the chip compiled and ran. The
    deviceless compile said everything the chip said, to the byte of each program's temporaries."""
    import json

    from aotcheck.render.memory import explain_overflow

    def parse_bytes(said: str) -> int:  # XLA's "22.00M": MiB, as its scoped-VMEM line writes sizes.
        return round(float(said[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[said[-1]])

    vmem = Path(__file__).resolve().parents[3] / "calibration" / "vmem"
    chip, deviceless = (json.loads((vmem / f"canary@v5e-1x1@libtpu-0.0.42.1.{m}.json").read_text())
                        for m in ("chip", "deviceless"))
    programs = ("train_step", "eval_step", "eval_step@22528", "eval_step@23552", "eval_step@24576")
    for name in programs:
        assert {k: v for k, v in chip[name].items() if k != "seconds"} == \
            {k: v for k, v in deviceless[name].items() if k != "seconds"}, name
    refused = chip["eval_step"]
    overflow = Overflow("vmem", parse_bytes(refused["size"]), parse_bytes(refused["limit"]), "scoped", kernel=True)
    advised = int(explain_overflow(overflow, "v5e-1").split("--xla_tpu_scoped_vmem_limit_kib=")[1].split()[0])
    assert advised == 24576 and chip[f"eval_step@{advised}"]["compiled"] and chip["runs"][f"eval_step@{advised}"]["ran"]
    exact = round(parse_bytes(refused["size"]) / 1024)
    assert not chip[f"eval_step@{exact}"]["compiled"]  # XLA's figure as the limit: refused, for 22.82M.
    assert chip["train_step"]["compiled"] and chip["runs"]["train_step"]["ran"]
