"""The docs are held to the code (issue 54): generated blocks current, every link and anchor there, every
command real, no timing written by hand, README a door of at most 300 lines, and the site builds.

Each checker is also shown failing on a page made wrong on purpose, so a check that reads nothing
cannot pass unnoticed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import gendocs  # noqa: E402  (tools/ is a directory of scripts, not a package)

PAGES = [ROOT / "README.md", ROOT / "DEVELOPING.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without its fenced code, inline code spans and generated blocks: what a person wrote as words."""
    text = gendocs.BLOCK.sub("", text)
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]+`", "", text)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def mkdocs_slug(heading: str) -> str:
    """The site's anchor for a heading (Python-Markdown's toc slugify, as mkdocs uses it)."""
    from markdown.extensions.toc import slugify

    return slugify(re.sub(r"`([^`]*)`", r"\1", heading.strip()), "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    headings = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {github_slug(h) for h in headings} | {mkdocs_slug(h) for h in headings} | \
        set(re.findall(r'<a (?:id|name)="([^"]+)"', text))


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file or anchor does not exist (a link to another site is not
    checked: there is no network here)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]+`", "", text)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.name}: {target} (no heading #{anchor} in {dest.name})")
    return broken


# Durations as a person would write them: "9 min 46 s", "40-130 s", "3.5 s", "about 10 minutes", "2 hours".
DURATION = re.compile(r"\b\d[\d.,]*(?:[-\u2013]\d[\d.,]*)?\s?(?:s|sec|secs|seconds?|ms|min|mins|minutes?|h|hours?)\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def hand_timings(text: str) -> list[str]:
    """The dates and durations written by hand in ``text``'s prose."""
    prose = _prose(text)
    return [m[0] for m in DATE.finditer(prose)] + [m[0] for m in DURATION.finditer(prose)]


def stale_commands(text: str) -> list[str]:
    """Each ``aotcheck WORD --flag`` shown as code in ``text`` that is no subcommand or no option of it, and
    each ``--aot-...`` option that the plugin does not have."""
    from aotcheck.cli import build_parser
    from aotcheck.spellings import SPELLINGS

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    commands = subparsers.choices
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    stale = []
    for code in [*blocks, *spans]:
        for command, rest in re.findall(r"^\s*(?:\$ )?(?:python -m )?aotcheck ([a-z][a-z-]*)((?: [^\n|;&#]*)?)",
                                        code, re.M):
            if command not in commands:
                stale.append(f"aotcheck {command}: no such command ({', '.join(commands)})")
                continue
            options = {o for a in commands[command]._actions for o in a.option_strings}
            stale += [f"aotcheck {command} {flag}: no such option" for flag in
                      re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest) if flag not in options]
    plugin = {s.pytest for s in SPELLINGS.values() if s.pytest}
    stale += [f"{flag}: no such pytest option" for flag in set(re.findall(r"(?<![\w-])(--aot-[a-z][a-z-]*)", text))
              if flag not in plugin]
    return stale


def test_every_generated_block_is_what_the_code_and_data_make():
    stale = gendocs.stale()
    assert not stale, f"{stale}: run python tools/gendocs.py"
    text = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    names = set(re.findall(r"<!-- begin generated: ([^>]+?) -->", text))
    assert names == set(gendocs.generators()), names  # Each table is shown somewhere, and no block is orphaned.


def test_a_stale_generated_block_is_named(tmp_path):
    page = tmp_path / "options.md"
    current = gendocs.render("<!-- begin generated: options -->\n<!-- end generated: options -->\n",
                             gendocs.generators())
    page.write_text(current.replace("--aot-topologies", "--aot-topology"))  # As if a flag were renamed.
    assert gendocs.stale([page]) == [str(page)]
    assert gendocs.render(page.read_text(), gendocs.generators()) == current
    page.write_text(current)
    assert gendocs.stale([page]) == []


def test_every_config_field_has_words():
    from aotcheck import FunctionConfig, InferenceConfig, ServingConfig, TrainerConfig

    for cls in (TrainerConfig, InferenceConfig, FunctionConfig, ServingConfig):
        assert gendocs.fields_table(cls).count("\n") > 10, cls  # fields_table raises on a field without words.


def test_every_link_and_anchor_in_the_docs_exists():
    broken = [b for page in PAGES for b in broken_links(page)]
    assert not broken, broken
    assert sum(len(re.findall(r"\]\(", p.read_text())) for p in PAGES) > 30  # The checker reads links.


def test_a_broken_link_and_a_missing_anchor_are_named(tmp_path):
    (tmp_path / "fit.md").write_text("# Fit\n\n## Every pool\n")
    page = tmp_path / "index.md"
    page.write_text("See [fit](fit.md#every-pool), [gone](serving.md) and [pools](fit.md#pools).\n")
    assert broken_links(page) == ["index.md: serving.md (no such file)", "index.md: fit.md#pools (no heading #pools in fit.md)"]


def test_every_command_the_docs_show_exists():
    """Hardening round 4: README named `aotcheck merge-reports`, a command that never existed."""
    stale = [f"{p.name}: {s}" for p in PAGES for s in stale_commands(p.read_text())]
    assert not stale, stale
    shown = sum(len(re.findall(r"aotcheck [a-z]", p.read_text())) for p in PAGES)
    assert shown > 20, shown


def test_a_stale_command_is_named():
    text = "Run `aotcheck merge-reports a.json` or `aotcheck check --topology v4-8 --configs x`, or `pytest --aot-topology=v4-8`.\n"
    assert sorted(stale_commands(text)) == sorted([
        "aotcheck merge-reports: no such command (" + ", ".join(_commands()) + ")",
        "aotcheck check --topology: no such option", "--aot-topology: no such pytest option"])


def _commands() -> list[str]:
    from aotcheck.cli import build_parser

    return list(next(a for a in build_parser()._actions if a.choices and isinstance(a.choices, dict)).choices)


def test_no_date_or_duration_is_written_by_hand():
    """Timings are data (benchmarks/timings.csv, rendered into docs/performance.md), never prose."""
    found = {p.name: hand_timings(p.read_text()) for p in PAGES if p.name != "ARCHITECTURE.md"}
    assert not any(found.values()), {k: v for k, v in found.items() if v}
    assert hand_timings("It took 9 min 46 s on 2026-12-06, and 40-130 s a step; `--timeout=600 s` is code.") == \
        ["2026-12-06", "9 min", "46 s", "40-130 s"]


def test_readme_is_a_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300, len(readme.splitlines())
    linked = set(re.findall(r"\]\(docs/([a-z0-9-]+\.md)", readme))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"README's map misses {sorted(pages - linked)}"


def _build(docs_root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # Not -q: it hides the warnings --strict counts, and a broken link then builds (mkdocs 1.6.1).
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about its successor.
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=docs_root, capture_output=True, text=True, timeout=300, env=env)


def test_the_site_builds_and_a_broken_link_fails_its_build(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs site's generator is in requirements.lock, which CI installs")
    built = _build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    pages = [p for p in (tmp_path / "site").rglob("index.html") if p.parent.name not in ("search", "assets")]
    assert len(pages) == len(list((ROOT / "docs").glob("*.md"))), sorted(str(p) for p in pages)

    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy)
    shutil.copytree(ROOT / "docs", copy / "docs")
    fit = copy / "docs" / "fit.md"
    fit.write_text(fit.read_text() + "\nSee [the pools](serving.md#no-such-heading) and [gone](gone.md).\n")
    broken = _build(copy, tmp_path / "site2")
    assert broken.returncode != 0
    assert "gone.md" in broken.stderr and "no-such-heading" in broken.stderr, broken.stderr[-3000:]
