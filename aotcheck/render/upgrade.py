"""A toolchain upgrade (:class:`aotcheck.gate.upgrade.Upgrade`) in words: its heading, what moved and by
how much, and what to do; the pieces both renderers use (the terminal's lines here, the Markdown
summary's in :mod:`aotcheck.render.markdown`).

Example:
    >>> from aotcheck.gate.compare import Change, Row, Tolerance
    >>> from aotcheck.pipeline.case import Case
    >>> up = Upgrade({"jax": "0.10.2"}, {"jax": "0.12.0.1"},
    ...              [("lm/prefill@v4-8x1", [Row("peak_bytes", 100.0, 120.0, Tolerance(0.01), Change.REGRESSION)])],
    ...              ["lm/prefill@v5e-16x1"], [Case.parse("lm/prefill@v4-8x1"), Case.parse("lm/prefill@v5e-16x1")])
    >>> print("\\n".join(upgrade_lines(up, golden_dir="golden")))
    aotcheck: toolchain upgrade: 2 case(s) judged against goldens made with jax 0.10.2; now jax 0.12.0.1. 1 moved, 1 did not.
    <BLANKLINE>
    case               figure      golden  now    change
    -----------------  ----------  ------  -----  ------
    lm/prefill@v4-8x1  peak_bytes  100 B   120 B  +20.0%
    <BLANKLINE>
    Did not move (every figure within tolerance): lm/prefill@v5e-16x1
    <BLANKLINE>
    To accept the new toolchain's figures for all of them: pytest --update-golden --aot-configs=lm --aot-topologies=v4-8x1,v5e-16x1
"""

from __future__ import annotations

from collections.abc import Sequence

from aotcheck.gate.upgrade import Upgrade
from aotcheck.render.accept import accept_all_command, golden_dir_option
from aotcheck.render.tables import fmt_value, table
from aotcheck.units import fmt_pct


def toolchain_text(toolchain: dict[str, str | None]) -> str:
    """``jax 0.12.0.1, jaxlib 0.12.0.1, libtpu 0.0.50.1``."""
    return ", ".join(f"{k} {v}" for k, v in toolchain.items())


def upgrade_rows(upgrade: Upgrade) -> list[list[str]]:
    """case / figure / golden / now / change, one row per figure that moved (tables of both renderers)."""
    rows = []
    for case_id, changes in upgrade.moved:
        for r in changes or []:
            rows.append([case_id, r.metric, fmt_value(r.metric, r.golden), fmt_value(r.metric, r.now),
                         fmt_pct(r.ratio) if r.ratio is not None else r.change.value])
    return rows


def upgrade_heading(upgrade: Upgrade) -> str:
    """What the goldens' toolchain is to this run's, in a few words (both renderers' headings).

    Example:
        >>> upgrade_heading(Upgrade({}, {}, [], [], [], "downgrade"))
        "older toolchain than the goldens'"
    """
    return {"upgrade": "toolchain upgrade", "downgrade": "older toolchain than the goldens'"}.get(
        upgrade.direction, "toolchain change")


def upgrade_summary(upgrade: Upgrade) -> str:
    """The cases, both toolchains and which way this run's stands to the goldens' (both renderers)."""
    now = toolchain_text(upgrade.now)
    if upgrade.direction == "downgrade":
        now += ", which is older (a downgrade: the CI lock or this machine is behind the goldens)"
    elif upgrade.direction != "upgrade":
        now += (", neither newer nor older throughout ("
                + ", ".join(f"{k} {step}" for k, step in upgrade.steps.items()) + ")")
    return (f"{len(upgrade.cases)} case(s) judged against goldens made with {toolchain_text(upgrade.before)}; "
            f"now {now}")


def upgrade_advice(upgrade: Upgrade, *, golden_dir: str, extra: Sequence[str] = ()) -> tuple[str, str | None]:
    """What to do, and the command (None: none to run). A downgrade is never accepted over the goldens."""
    if upgrade.direction == "downgrade":
        return ("Do not accept these figures: they would take the goldens back to an older toolchain. Install the "
                f"goldens' toolchain ({toolchain_text(upgrade.before)}) to check against them.", None)
    command = accept_all_command(upgrade.cases, extra=[*golden_dir_option(golden_dir), *extra])
    if upgrade.direction == "upgrade":
        return "To accept the new toolchain's figures for all of them:", command
    return "If this run's toolchain is the one the goldens should follow, to accept its figures for all of them:", command


def upgrade_lines(upgrade: Upgrade, *, golden_dir: str, extra: Sequence[str] = ()) -> list[str]:
    """The toolchain upgrade (or downgrade): what moved, by how much, what did not move, and what to do: the
    command accepting it all for an upgrade, the goldens' toolchain to install for a downgrade."""
    lines = [f"aotcheck: {upgrade_heading(upgrade)}: {upgrade_summary(upgrade)}. "
             f"{len(upgrade.moved)} moved, {len(upgrade.unmoved)} did not."]
    if upgrade.moved:
        lines += ["", table(["case", "figure", "golden", "now", "change"], upgrade_rows(upgrade))]
    if upgrade.unmoved:
        lines += ["", "Did not move (every figure within tolerance): " + ", ".join(upgrade.unmoved)]
    advice, command = upgrade_advice(upgrade, golden_dir=golden_dir, extra=extra)
    lines += ["", advice + (f" {command}" if command else "")]
    return lines
