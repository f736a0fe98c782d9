"""The docs' generated parts, from the code and the data: run it after changing either.

    python tools/gendocs.py          # rewrites every generated block under docs/
    python tools/gendocs.py --check  # exits 1 naming each block that is not what the code says

A block sits between ``<!-- begin generated: NAME -->`` and ``<!-- end generated: NAME -->`` lines; the
text around it is written by hand. The names:

- ``figures``: the figure table (:mod:`aotcheck.figures.table`, worded by ``render.markdown.figures_table``);
- ``options``: every setting, as each front end spells it (:data:`aotcheck.settings.SETTINGS`);
- ``fields CLASS``: a config class's fields, from its dataclass fields and the ``Attributes:`` of its
  docstrings (a field without words is an error: document it where it is declared);
- ``timings``: benchmarks/timings.csv, newest first, with the ratios measured side by side.

tests/test_docs.py runs ``--check``'s logic, so a stale block fails the suite.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "benchmarks"))

BLOCK = re.compile(r"(<!-- begin generated: (?P<name>[^>]+?) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def options_table() -> str:
    """Every setting: its pytest option, ``aotcheck check``'s flag, its ini key, default and meaning."""
    from aotcheck.settings import SETTINGS

    def code(name: str | None) -> str:
        return f"`{name}`" if name else ""

    lines = ["| setting | pytest | `aotcheck check` | ini key | default | what it does |",
             "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        default = s.default if s.action != "store_true" else "off"
        default = " ".join(default) if isinstance(default, (list, tuple)) else default
        shown = "" if default in ("", None, [], ()) else f"`{default}`"
        lines.append(f"| {s.name} | {code(s.pytest)} | {code(s.cli)} | {code(s.ini)} | {shown} | {_cell(s.help)} |")
    return "\n".join(lines) + "\n"


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its words, from the ``Attributes:`` sections of ``cls``'s docstrings; a subclass's words
    for a field it inherits win over its base's."""
    words: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        section = re.search(r"^Attributes:\n((?:[ \t]+\S.*\n?|\n)+)", inspect.getdoc(klass) or "", re.M)
        name = None
        for line in (section[1] if section else "").splitlines():
            entry = re.match(r"^    (\w+)(?: \([^)]*\))?: (.*)$", line)
            if entry:
                name = entry[1]
                words[name] = entry[2]
            elif name and line.startswith("     "):
                words[name] += " " + line.strip()
            else:
                name = None
    return words


def fields_table(cls: type) -> str:
    """``cls``'s fields: name, default and meaning (ValueError naming an undocumented field)."""
    words = field_docs(cls)
    lines = ["| field | default | what it is |", "|---|---|---|"]
    missing = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        if not words.get(f.name):
            missing.append(f.name)
            continue
        if f.default is not dataclasses.MISSING:
            default = f"`{f.default!r}`"
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f"`{f.default_factory()!r}`"  # type: ignore[misc]
        else:
            default = "required"
        lines.append(f"| `{f.name}` | {_cell(default)} | {_cell(words[f.name])} |")
    if missing:
        raise ValueError(f"{cls.__name__}: no words for {', '.join(missing)}: give each an entry under Attributes: "
                         "in the docstring of the class that declares it")
    return "\n".join(lines) + "\n"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"


def timings_tables() -> str:
    """benchmarks/timings.csv as two tables: the ratios measured side by side, then every row, newest first."""
    from timings import ratios, read

    rows = read()
    out = ["Ratios of the same work measured side by side in one run:", "",
           "| date | commit | cores | ratio | value | numerator | denominator |", "|---|---|---|---|---|---|---|"]
    for top, bottom, num, den, row in reversed(ratios(rows)):
        prefix = top.rsplit(": ", 1)[0] + ": " if ": " in top else ""
        out.append(f"| {row.date} | `{row.commit}` | {row.cores} | {_cell(top)} / {_cell(bottom.removeprefix(prefix))} "
                   f"| {num / den:.3f} | {_duration(num)} | {_duration(den)} |")
    out += ["", "Every timing, newest first:", "", "| date | commit | machine | cores | command | wall |",
            "|---|---|---|---|---|---|"]
    for row in reversed(rows):
        out.append(f"| {row.date} | `{row.commit}` | {_cell(row.machine)} | {row.cores} | `{_cell(row.command)}` "
                   f"| {_duration(row.seconds)} |")
    return "\n".join(out) + "\n"


def generators() -> dict[str, Callable[[], str]]:
    """Block name -> what makes its text."""
    from aotcheck import FunctionConfig, InferenceConfig, ServingConfig, TrainerConfig
    from aotcheck.render.markdown import figures_table

    made: dict[str, Callable[[], str]] = {"figures": lambda: figures_table().rstrip("\n") + "\n",
                                          "options": options_table, "timings": timings_tables}
    for cls in (TrainerConfig, InferenceConfig, FunctionConfig, ServingConfig):
        made[f"fields {cls.__name__}"] = lambda cls=cls: fields_table(cls)
    return made


def render(text: str, made: dict[str, Callable[[], str]], *, where: str = "") -> str:
    """``text`` with each generated block's body made anew (KeyError naming an unknown block)."""
    def body(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in made:
            raise KeyError(f"{where}: no generator for block {name!r}; the names are {', '.join(sorted(made))}")
        return f"{match[1]}\n{made[name]()}\n{match[4]}"

    return BLOCK.sub(body, text)


def stale(paths: list[Path] | None = None) -> list[str]:
    """The docs pages whose generated blocks are not what the code and data make now."""
    made = generators()
    return [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in (paths or sorted(DOCS.glob("*.md")))
            if render(p.read_text(), made, where=p.name) != p.read_text()]


def main(argv: list[str]) -> int:
    made = generators()
    pages = sorted(DOCS.glob("*.md"))
    if "--check" in argv:
        old = stale(pages)
        for page in old:
            print(f"{page}: a generated block is stale; run python tools/gendocs.py", file=sys.stderr)
        return 1 if old else 0
    for page in pages:
        text = page.read_text()
        new = render(text, made, where=page.name)
        if new != text:
            tmp = page.with_suffix(".md.tmp")  # Whole or not at all: a page is never half-written.
            tmp.write_text(new)
            tmp.replace(page)
            print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
