"""The package's shape: every import of aotcheck's own modules looks down the pipeline, and none cycles.

The pipeline, bottom to top (a module may import its own layer and the ones below):

    _runtime, units -> targets -> programs -> figures -> gate -> render -> session, ini -> plugin, cli
"""

import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "aotcheck"

LAYERS = [
    ("aotcheck._runtime", "aotcheck.units", "aotcheck._files"),
    ("aotcheck.targets",),
    ("aotcheck.programs", "aotcheck.models", "aotcheck.adapters"),
    ("aotcheck.figures",),
    ("aotcheck.gate",),
    ("aotcheck.render",),
    ("aotcheck.session", "aotcheck.ini", "aotcheck.scaffold"),
    ("aotcheck.plugin", "aotcheck.cli"),
    ("aotcheck", "aotcheck.__main__"),  # The public surface re-exports from everywhere.
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    best, rank = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, f"{module} belongs to no layer: add it to LAYERS"
    return rank


def imports_of(module: str) -> set[str]:
    """aotcheck modules that ``module`` imports, anywhere in its body (function-level imports too)."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "aotcheck"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "aotcheck":
                continue
            for alias in node.names:  # `from aotcheck.gate import case` imports a module.
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in out if m != module}


GRAPH = {m: imports_of(m) for m in MODULES}


def test_no_import_cycles():
    graphlib.TopologicalSorter(GRAPH).prepare()  # Raises CycleError naming the cycle.


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_look_down(module):
    upward = sorted(m for m in GRAPH[module] if layer_of(m) > layer_of(module))
    assert not upward, f"{module} (layer {layer_of(module)}) imports {upward} from above it"


def test_the_checker_catches_a_cycle_and_an_upward_import():
    # The two checks above would pass vacuously if the graph were empty or the layers inverted.
    assert GRAPH["aotcheck.session"] >= {"aotcheck.gate.check", "aotcheck.render.text"}
    assert layer_of("aotcheck.gate.check") > layer_of("aotcheck.programs.compile")
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({**GRAPH, "aotcheck.targets.topology": {"aotcheck.session"}}).prepare()
