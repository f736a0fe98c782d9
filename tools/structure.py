"""The package's shape, measured: what issue 55's before-and-after table holds.

    python tools/structure.py [TREE ...]   # each a checkout's root (default: this one)

For each tree: modules and lines under aotcheck/, the largest function, hand-written ``from_json``
methods (records.py's own excepted: it is the codec), places that read an id's text back (a call of
an id reader, or text split at ``@``, outside the id grammar's own modules and the readers of what a
user wrote), session.py's and programs/options.py's lines, and imports of the chip tables
(targets.tpu, targets.gpu) outside targets/.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ID_READERS = {"Case.parse", "Target.parse", "split_case_id", "split_target", "parse_program_id"}
GRAMMAR = ("programs/names.py", "targets/topology.py", "pipeline/case.py")
USER_TEXT = ("readers.py", "cmdline.py", "scaffold.py", "targets/globs.py", "settings.py", "bisect.py")


def _id_reads(tree: ast.AST) -> int:
    found = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        short = name.rpartition(".")[2]
        if name in ID_READERS or short in ID_READERS - {"parse"}:
            found += 1
        elif isinstance(node.func, ast.Attribute) and short in ("partition", "rpartition", "split", "rsplit") \
                and any(isinstance(a, ast.Constant) and a.value == "@" for a in node.args):
            found += 1
        elif short == "match" and "_ID" in name:
            found += 1
    return found


def measure(root: Path) -> dict[str, object]:
    package = root / "aotcheck"
    modules = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    lines = largest = from_json = id_places = chip_imports = 0
    largest_name = ""
    for path in modules:
        rel = path.relative_to(package).as_posix()
        text = path.read_text()
        lines += len(text.splitlines())
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > largest:
                    largest, largest_name = size, f"{rel}:{node.name}"
                if node.name == "from_json" and rel != "records.py":
                    from_json += 1
            if isinstance(node, ast.ImportFrom) and not rel.startswith("targets/") and \
                    (node.module or "") in ("aotcheck.targets.tpu", "aotcheck.targets.gpu"):
                chip_imports += 1
        if not rel.endswith(GRAMMAR) and not rel.endswith(USER_TEXT) and rel != "pipeline/store.py":
            id_places += 1 if _id_reads(tree) else 0
    size = lambda rel: len((package / rel).read_text().splitlines()) if (package / rel).exists() else 0  # noqa: E731
    return {"modules": len(modules), "lines": lines, "largest function": f"{largest} ({largest_name})",
            "hand-written from_json": from_json, "modules that read an id back": id_places,
            "session.py": size("session.py"), "programs/options.py": size("programs/options.py"),
            "chip-table imports outside targets/": chip_imports}


if __name__ == "__main__":
    roots = [Path(a) for a in sys.argv[1:]] or [Path(__file__).resolve().parents[1]]
    found = [measure(r) for r in roots]
    print("| | " + " | ".join(r.name for r in roots) + " |")
    print("|---" * (len(roots) + 1) + "|")
    for key in found[0]:
        print(f"| {key} | " + " | ".join(str(f[key]) for f in found) + " |")
