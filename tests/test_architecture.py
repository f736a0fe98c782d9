"""The package's shape: every import of aotcheck's own modules looks down the pipeline, and none cycles.

The pipeline, bottom to top (a module may import its own layer and the ones below):

    _runtime, units -> targets -> programs -> figures -> pipeline -> gate -> render -> settings, ini -> plan
    -> session -> plugin, cli
"""

import ast
import graphlib
import importlib
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "aotcheck"

LAYERS = [
    ("aotcheck._runtime", "aotcheck.units", "aotcheck._files", "aotcheck.errors", "aotcheck.spellings",
     "aotcheck.records"),
    ("aotcheck.targets",),
    ("aotcheck.programs", "aotcheck.models", "aotcheck.adapters"),
    ("aotcheck.figures",),
    ("aotcheck.pipeline",),
    ("aotcheck.gate",),
    ("aotcheck.render",),
    ("aotcheck.settings", "aotcheck.readers", "aotcheck.ini", "aotcheck.scaffold", "aotcheck.usage"),
    ("aotcheck.plan",),
    ("aotcheck.session", "aotcheck.calibrate", "aotcheck.interruption"),
    ("aotcheck.plugin", "aotcheck.cli", "aotcheck.cmdline", "aotcheck.shipping", "aotcheck.matrix",
     "aotcheck.bisect"),
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
    assert GRAPH["aotcheck.session"] >= {"aotcheck.gate.check", "aotcheck.plan"}
    assert GRAPH["aotcheck.plugin"] >= {"aotcheck.render.text", "aotcheck.session"}
    assert layer_of("aotcheck.gate.check") > layer_of("aotcheck.programs.compile")
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({**GRAPH, "aotcheck.targets.topology": {"aotcheck.session"}}).prepare()


def test_the_session_words_nothing():
    """Words happen only where things are shown: the session hands the front ends records (an outcome with
    its accept command, the run's header, an interruption) and imports nothing from render/."""
    worded = sorted(m for m in GRAPH["aotcheck.session"] | GRAPH["aotcheck.plan"] if m.startswith("aotcheck.render"))
    assert not worded, worded


def imported_names(module: str) -> set[tuple[str, str]]:
    """(module, name) of every ``from aotcheck.x import name`` in ``module``."""
    out = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aotcheck"):
            out |= {(node.module, alias.name) for alias in node.names}
    return out


def test_errors_are_named_from_their_leaf_module():
    """Errors live in aotcheck.errors, which imports nothing of aotcheck's but the records' codec (itself a
    leaf): no module reaches into the compile workers' module (gate/isolation.py) to name one."""
    assert GRAPH["aotcheck.errors"] <= {"aotcheck.records"} and GRAPH["aotcheck.records"] == set()
    from_isolation = {(m, n) for m in MODULES for (where, n) in imported_names(m) if where == "aotcheck.gate.isolation"}
    named = sorted((m, n) for m, n in from_isolation if n.endswith(("Error", "Crashed")) or "error" in n)
    assert not named, named
    assert ("aotcheck.errors", "OutOfMemory") in imported_names("aotcheck.gate.check")  # The check above bites.


# The one use of jax's internals, where jax has no public path: a deviceless GPU executable implements
# no cost analysis (UNIMPLEMENTED), and only jax's internal binding runs XLA's HloCostAnalysis on a
# compiled module (figures/program.py's _cost_model; it degrades to no raw figures where it is gone).
NO_PUBLIC_PATH = {("aotcheck.figures.program", "jax._src.lib")}


def test_no_private_jax_attribute_in_the_package():
    """Only jax's public API: no ``jax._src``, no attribute of a jax object that starts with an underscore
    (``lowered._lowering``), read from each module's syntax tree; :data:`NO_PUBLIC_PATH` excepted."""
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (module, node.module) in NO_PUBLIC_PATH:
                continue
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jax._src"):
                found.append(f"{module}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                found += [f"{module}: import {a.name}" for a in node.names if a.name.startswith("jax._src")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in ("jax", "jaxlib", "lowered", "compiled"):
                    found.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in ("_lowering", "_executable", "kept_var_idx"):
                found.append(f"{module}:{node.lineno}: getattr(..., {node.value!r})")
    assert not found, found


def test_no_frame_inspection_in_the_package():
    """register() learns a config's module from what it registers, not from its caller's frame (which is
    what kept a Registry of one's own from the compile workers): no ``sys._getframe``, no ``inspect`` frames.
    One module asks, and is the only one: programs/reads.py, whose question is whose code reads a variable or
    a file (the project's, or a package's own), which only the stack answers."""
    found = [f"{module}:{node.lineno}: {node.attr}" for module, path in MODULES.items() if module != "aotcheck.programs.reads"
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and (node.attr in ("_getframe", "currentframe", "f_globals", "f_back")
                                                     or (node.attr == "stack" and getattr(node.value, "id", "") == "inspect"))]
    assert not found, found


PAST_TARGETS = sorted(m for m in MODULES if layer_of(m) > layer_of("aotcheck.targets"))
PLATFORM_NAMES = {"tpu", "gpu", "cpu"}


def platform_questions(module: str) -> list[str]:
    """Where ``module`` asks which platform or chip a target is: a platform's name as a literal
    (``"tpu"``), ``.platform`` compared by value (``==``, ``!=``, ``in``), or the hardware row itself
    (``.chip``, ``.hardware``, ``is_tpu``), or a platform compared by identity (``p is GPU``). A piece of an
    f-string (``f"tpu{name}"``, a spelling) is no question."""
    found = []
    tree = ast.parse(MODULES[module].read_text())
    pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in PLATFORM_NAMES and id(node) not in pieces:
            found.append(f"{module}:{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                   for op in node.ops) \
                and any(isinstance(x, ast.Attribute) and x.attr == "platform" for x in [node.left, *node.comparators]):
            found.append(f"{module}:{node.lineno}: .platform compared by value")
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) \
                and any(_platform_value(x) for x in [node.left, *node.comparators]):
            found.append(f"{module}:{node.lineno}: a platform compared by identity")
        elif isinstance(node, ast.Attribute) and node.attr in ("chip", "hardware", "is_tpu"):
            found.append(f"{module}:{node.lineno}: .{node.attr}")
    return found


def _platform_value(node: ast.AST) -> bool:
    """``TPU``, ``GPU``, ``CPU`` (a name or an attribute: ``platform.GPU``)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name in PLATFORM_VALUES


PLATFORM_VALUES = {"TPU", "GPU", "CPU"}


def test_nothing_past_the_targets_asks_which_platform_or_chip():
    """A target says what downstream needs (targets/platform.py: its Platform's compiler, toolchain, worker
    environment, flags; its DeviceSpec's capacity and peak rates), so nothing past targets/ names a
    platform or looks at the chip: a new platform is a new Platform value, not a branch in ten modules."""
    found = [line for module in PAST_TARGETS for line in platform_questions(module)]
    assert not found, found


CHIP_TABLES = {"aotcheck.targets.tpu", "aotcheck.targets.gpu"}


def test_only_targets_reads_the_chip_tables():
    """Issue 55: the TPU and GPU tables are targets/' own; past it, a chip's figures come from its Topology
    and DeviceSpec (a scoped VMEM default, an SMEM size, a runtime limit), its preset policy from
    targets/presets.py. An import of targets.tpu or targets.gpu elsewhere is a second policy in the making."""
    found = sorted(f"{m} imports {i}" for m in MODULES if not m.startswith("aotcheck.targets")
                   for i in imports_of(m) & CHIP_TABLES)
    assert not found, found
    assert imports_of("aotcheck.targets.presets") & CHIP_TABLES  # The check reads imports (else it passes vacuously).


ID_READERS = {"Case.parse", "Target.parse", "split_case_id", "split_target", "parse_program_id"}
# Where an id's text may be read back: the grammar's own modules, the readers of what a user wrote (their
# options, ini, target globs, a scaffold's names), and the readers of what aotcheck stored as text (a golden
# file's ``case``, a calibration record's). Everywhere else a case, target or bucket travels as a value.
ID_HOMES = {
    "aotcheck.programs.names": "the grammar of program and case ids",
    "aotcheck.targets.topology": "the grammar of a target's name",
    "aotcheck.pipeline.case": "Case.parse itself, and a case's JSON form (records.leaf)",
    "aotcheck.readers": "--aot-case, as the user wrote it",
    "aotcheck.cmdline": "aotcheck's own --topology, as the user wrote it",
    "aotcheck.scaffold": "aotcheck init's targets, as the user wrote them",
    "aotcheck.targets.globs": "--aot-topologies' globs, as the user wrote them",
    "aotcheck.bisect": "aotcheck bisect's CASE, as the user wrote it",
    "aotcheck.gate.golden": "a golden file's case, as stored",
    "aotcheck.gate.calibration": "a calibration record's case (a server's ``*`` is no Case), as stored",
}


def id_reads(module: str) -> list[str]:
    """Where ``module`` reads an id's text: a call of an id reader, or text split at ``@`` (a case id's)."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name in ID_READERS or name.rpartition(".")[2] in ID_READERS - {"Case.parse", "Target.parse"}:
            found.append(f"{module}:{node.lineno}: {name}")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("partition", "rpartition", "split", "rsplit") \
                and any(isinstance(a, ast.Constant) and a.value == "@" for a in node.args):
            found.append(f"{module}:{node.lineno}: {name}('@')")
    return found


def test_ids_are_read_back_in_one_place():
    """Issue 55, item 5: a case's id is text for people and files; code past the readers carries the Case, its
    Target and its Bucket as values (a worker's request, an item's reports, a golden store's listing, a
    manifest, an accept command), so no module parses one back (the nodeid, a golden's path, a bucket)."""
    found = [line for module in MODULES if module not in ID_HOMES for line in id_reads(module)
             if "pipeline.store" not in line]  # A store URL's credentials end at '@': not an id.
    assert not found, found
    assert id_reads("aotcheck.pipeline.case") and id_reads("aotcheck.readers")  # The check sees the homes' reads.


def test_the_platform_check_bites(tmp_path, monkeypatch):
    # The check above passes vacuously if it reads nothing: a module that branches on a platform fails it.
    path = tmp_path / "branchy.py"
    path.write_text('def f(t, p):\n    return t.topology.platform == "gpu" or t.topology.chip or p is GPU or p is not platform.TPU\n')
    monkeypatch.setitem(MODULES, "aotcheck.gate.branchy", path)
    assert len(platform_questions("aotcheck.gate.branchy")) == 5
    assert "aotcheck.plugin" in PAST_TARGETS and "aotcheck.targets.platform" not in PAST_TARGETS


def test_architecture_md_names_every_module():
    """ARCHITECTURE.md has one line per module: a module it does not name is a module nobody can find."""
    page = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    unnamed = [str(path.relative_to(PACKAGE)) for path in MODULES.values()
               if not (path.name == "__init__.py" and path.parent != PACKAGE)  # Empty package markers.
               and str(path.relative_to(PACKAGE)) not in page and f"`{path.name}`" not in page
               and f"{path.name}`" not in page]
    assert not unnamed, f"ARCHITECTURE.md does not name {unnamed}"


# Exceptions that are no error of aotcheck's: pytest's carrier of a failed case's message (its item's repr).
# pytest's failure of a case; a signal inside measure() that never leaves answered() (no one is told it).
NOT_ERRORS = {("aotcheck.plugin", "AotFailure"), ("aotcheck.pipeline.measure", "Uncached")}


def test_every_error_is_an_aotcheck_error():
    """One base: a caller catches AotcheckError for everything aotcheck says is wrong (and the gate names any
    other class a user's code raised, a ValueError of its own too); each keeps the built-in base it had."""
    from aotcheck.errors import AotcheckError

    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (module, node.name) not in NOT_ERRORS:
                cls = getattr(importlib.import_module(module), node.name, None)
                if isinstance(cls, type) and issubclass(cls, BaseException) and not issubclass(cls, AotcheckError):
                    found.append(f"{module}.{node.name}")
    assert not found, f"not under AotcheckError: {found}"


TESTS = PACKAGE.parent / "tests"

# Modules whose tests live in another module's file (or in a run end to end): where, and why no file of
# their own. A module not here has tests/unit/<package>/test_<module>.py (tests/unit/test_<module>.py at
# the top); every module also runs its docstring examples (tests/test_doctests.py).
TESTED_ELSEWHERE = {
    "aotcheck.models.canary": ("tests/e2e/test_eval_step.py", "a TPU kernel's VMEM: only a real v5e compile shows it"),
    "aotcheck.__main__": ("tests/e2e/test_cli.py", "two lines: `python -m aotcheck`, run by every CLI test"),
    "aotcheck._runtime": ("tests/e2e/test_plugin.py", "the environment libtpu loads in: what a real run prints"),
    "aotcheck.session": ("tests/e2e/test_gate.py", "one run of the gate: the end-to-end runs"),
    "aotcheck.shipping": ("tests/e2e/test_export.py", "aotcheck export and load: real exports, loads in fresh processes"),
    "aotcheck.matrix": ("tests/unit/gate/test_engines.py", "aotcheck shards: each format run as a command and validated"),
    "aotcheck.interruption": ("tests/e2e/test_interruptions.py", "signals against real runs"),
    "aotcheck.gate.ship": ("tests/e2e/test_export.py", "a passing case ships, a failing one does not: real runs"),
    "aotcheck.targets.tpu": ("tests/unit/targets/test_topology.py", "the TPU table, row by row against its names"),
    "aotcheck.targets.devices": ("tests/unit/targets/test_topology.py", "libtpu's device counts for the table"),
    "aotcheck.programs.options": ("tests/unit/programs/test_compile.py", "presets and launch flags, as compiles take them"),
    "aotcheck.programs.loader": ("tests/e2e/test_frontends.py", "imports in the compile workers, as the parent did"),
    "aotcheck.adapters.flax_linen": ("tests/unit/adapters/test_base.py", "one adapter of three, checked together"),
    "aotcheck.adapters.flax_nnx": ("tests/unit/adapters/test_base.py", "one adapter of three, checked together"),
    "aotcheck.adapters.equinox": ("tests/unit/adapters/test_base.py", "one adapter of three, checked together"),
    "aotcheck.adapters.maxtext": ("tests/e2e/test_maxtext.py", "MaxText itself, installed in a fresh venv"),
    "aotcheck.figures.known_kernels": ("tests/unit/figures/test_kernels.py", "the kernels' costs, on compiled kernels"),
    "aotcheck.figures.flops": ("tests/unit/figures/test_loops.py", "FLOPs per instruction, counted inside loops"),
    "aotcheck.figures.sources": ("tests/unit/pipeline/test_cache.py", "source lines that follow an edit on a cache hit"),
    "aotcheck.figures.splits": ("tests/unit/figures/test_sharding.py", "the shardings the lint reads"),
}


def own_test_file(module: str) -> Path:
    """``aotcheck.targets.topology`` -> tests/unit/targets/test_topology.py; a front end at the top
    (``aotcheck.cli``, ``aotcheck.plugin``) is run end to end: tests/e2e/test_cli.py."""
    *package, name = module.split(".")[1:]
    name = name.lstrip("_")  # aotcheck._files -> test_files.py
    unit = TESTS.joinpath("unit", *package, f"test_{name}.py")
    front_end = TESTS / "e2e" / f"test_{name}.py"
    return front_end if not package and not unit.exists() and front_end.exists() else unit


def test_every_module_has_its_test_file_or_says_where_its_tests_are():
    """A newcomer finds a module's tests at tests/unit/<package>/test_<module>.py (a front end's at
    tests/e2e/test_<module>.py), or in TESTED_ELSEWHERE,
    which names the file (it must exist and name the module) and why. End-to-end runs are in tests/e2e/."""
    problems = []
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        own = own_test_file(module)
        if own.exists():
            if module in TESTED_ELSEWHERE:
                problems.append(f"{module} has {own.relative_to(TESTS.parent)}: take it off TESTED_ELSEWHERE")
            continue
        if module not in TESTED_ELSEWHERE:
            problems.append(f"{module}: no {own.relative_to(TESTS.parent)}, and TESTED_ELSEWHERE does not say where")
            continue
        where = TESTS.parent / TESTED_ELSEWHERE[module][0]
        short = module.rpartition(".")[2]
        if not where.exists() or (module not in where.read_text() and f"import {short}" not in where.read_text()
                                  and module.partition(".")[2] not in where.read_text()):
            problems.append(f"{module}: {where.relative_to(TESTS.parent)} does not exist or does not name it")
    problems += [f"{m}: in TESTED_ELSEWHERE but no such module" for m in TESTED_ELSEWHERE if m not in MODULES]
    assert not problems, "\n".join(problems)


def test_tests_are_laid_out_as_unit_by_module_and_end_to_end_apart():
    top = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert top == ["test_architecture.py", "test_docs.py", "test_doctests.py", "test_repo.py"], top  # The repository's own shape.
    assert list(TESTS.glob("e2e/test_*.py")) and list(TESTS.glob("unit/*/test_*.py"))
    names = [p.name for p in TESTS.rglob("test_*.py")]
    if len(names) != len(set(names)):  # gate/ and render/ each have a test_upgrade.py: found by path, not name.
        assert "--import-mode=importlib" in (TESTS.parent / "tox.ini").read_text(), \
            "test files share a name: pytest's default import mode imports them by it (tox.ini: --import-mode=importlib)"


# The shape a reader can hold: modules and functions short enough to read in one sitting (issue 41).
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 80


def test_no_module_is_longer_than_a_reader_holds():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_is_longer_than_a_reader_holds():
    long = [f"{m}.{node.name}: {node.end_lineno - node.lineno + 1}" for m, p in MODULES.items()
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


MODEL_KINDS = {"TrainerConfig", "InferenceConfig", "ServingConfig"}


def kind_branches(module: str) -> list[str]:
    """Where ``module`` asks which kind of config it holds (``isinstance(c, TrainerConfig)``): past
    programs/ every config is the one compiled kind, a FunctionConfig."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
            names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "") for n in ast.walk(node.args[1])}
            if names & MODEL_KINDS:
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_past_the_programs_every_config_is_one_kind(tmp_path, monkeypatch):
    past = [m for m in MODULES if layer_of(m) > layer_of("aotcheck.programs")]
    found = [line for module in past for line in kind_branches(module)]
    assert not found, found
    path = tmp_path / "kindly.py"  # The check bites: a branch on a model config's kind is caught.
    path.write_text("def f(c):\n    return isinstance(c, (config.TrainerConfig, int))\n")
    monkeypatch.setitem(MODULES, "aotcheck.gate.kindly", path)
    assert len(kind_branches("aotcheck.gate.kindly")) == 1


def test_the_packages_shape_is_as_issue_55_left_it():
    """tools/structure.py measures what issue 55's table holds; what it fixed stays fixed: no record's JSON
    written by hand, ids read back only from stored files (a golden's, a calibration record's), no chip
    table read past targets/."""
    sys.path.insert(0, str(PACKAGE.parent / "tools"))
    import structure  # noqa: PLC0415  (tools/ is a directory of scripts, not a package)

    shape = structure.measure(PACKAGE.parent)
    assert shape["hand-written from_json"] == 0 and shape["chip-table imports outside targets/"] == 0
    assert shape["modules that read an id back"] <= 2 and shape["modules"] == len(MODULES)
