"""A toolchain upgrade in words (aotcheck.render.upgrade): what moved, and what to do.

FAKE: upgrades made by hand (no compile): what is tested is the advice for each direction.
"""

from aotcheck.gate.compare import Change, Row, Tolerance
from aotcheck.gate.upgrade import Upgrade
from aotcheck.pipeline.case import Case
from aotcheck.render.upgrade import upgrade_advice, upgrade_lines

MOVED = [("lm/prefill@v4-8x1", [Row("peak_bytes", 100.0, 120.0, Tolerance(0.01), Change.REGRESSION)])]


def test_an_upgrade_is_accepted_with_the_runs_options_and_a_downgrade_never():
    up = Upgrade({"jax": "0.10.2"}, {"jax": "0.12.0.1"}, MOVED, [], [Case.parse("lm/prefill@v4-8x1")])
    advice, command = upgrade_advice(up, golden_dir="ci/golden", extra=["--aot-fit=batch"])
    assert command == "pytest --update-golden --aot-configs=lm --aot-topologies=v4-8x1 --aot-golden-dir=ci/golden " \
                      "--aot-fit=batch"
    down = Upgrade({"jax": "0.12.0.1"}, {"jax": "0.10.2"}, MOVED, [], [Case.parse("lm/prefill@v4-8x1")], "downgrade")
    advice, command = upgrade_advice(down, golden_dir="golden")
    assert command is None and advice.startswith("Do not accept these figures")
    assert "older toolchain than the goldens'" in upgrade_lines(down, golden_dir="golden")[0]
