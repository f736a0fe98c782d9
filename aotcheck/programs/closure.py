"""The code a built config runs, as modules: the project's by content, installed packages' by version.

What a config's program lowers to is decided by its code and everything that code imports. A case
whose code closure (this), toolchain, options and target are unchanged lowers to the same program,
so its figures can be answered without tracing it (:mod:`aotcheck.pipeline.inputs`).

The walk starts at the code the config holds: its functions (with their defaults, closure cells and
the globals their code names), its classes, the modules it names. A module of the project (a file
that is not part of an installed distribution) counts by its bytes, and the modules it imports are
walked too, as are the packages above it; a module of an installed distribution counts by that
distribution's name and version (an editable install is the project's); the standard library by
Python's version. A module that registers configs (a ``conftest.py``) counts by its bytes, and of
its imports only those bound to a name the config's code reads are walked (``from consts import
SCALE``, read by a function the config holds), so an edit of one model re-lowers the configs that use
it, not every config the conftest registers. A project file changed after the process started is
not what it imported (:data:`EDITED`), and a walk cut short (:data:`CUT_SHORT`) is not the whole
closure: a caller trusts neither.

Example:
    >>> import json
    >>> closure = code_closure(code_roots({"encode": json.dumps}))
    >>> closure["json"].startswith("python ")
    True
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import sys
import sysconfig
import time
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_MAX_OBJECTS = 50_000


CUT_SHORT = "(walk cut short)"  # A pseudo-module: the walk met more objects than it reads; trust nothing.
EDITED = "edited during this run"  # A project file changed after this process started: not what it imported.
_STARTED_NS = time.time_ns()  # Imported with aotcheck, before any config module.


def code_roots(obj: Any) -> dict[str, frozenset[str]]:
    """The modules whose code a built config (or anything) holds, each with the global names its
    reached functions read: where its functions and classes are defined, the modules it or its
    functions' globals name, followed through fields, containers, partials, closures and defaults.

    Example:
        >>> import functools, json, textwrap
        >>> sorted(code_roots([functools.partial(json.dumps, indent=2), textwrap.TextWrapper]))
        ['json', 'textwrap']
    """
    found: dict[str, set[str]] = {}
    seen: set[int] = set()
    stack: list[Any] = [obj]
    keep: list[Any] = []  # What was met stays alive, so an id is not reused within the walk.
    while stack:
        value = stack.pop()
        if id(value) in seen or value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
            continue
        if len(seen) >= _MAX_OBJECTS:
            found.setdefault(CUT_SHORT, set())
            break
        seen.add(id(value))
        keep.append(value)
        stack.extend(_parts(value, found))
    return {m: frozenset(names) for m, names in found.items() if m and m != "builtins"}


def _parts(value: Any, found: dict[str, set[str]]) -> list[Any]:
    """What to walk next from ``value``; the modules it names added to ``found`` (with the globals a
    function there reads). The globals of an installed package's code are not walked into (its version
    stands for all of it), its closures and defaults are (they may hold the user's functions); the
    project's classes are walked method by method (a model's ``__call__`` names the helpers it uses)."""
    if isinstance(value, types.ModuleType):
        found.setdefault(value.__name__, set())
        return []
    if isinstance(value, type):
        found.setdefault(value.__module__, set())
        return [member for klass in value.__mro__ if not _installed_module(klass.__module__)
                for member in vars(klass).values()]
    if isinstance(value, types.FunctionType):
        module = value.__module__ or ""
        names = _names(value.__code__)
        found.setdefault(module, set()).update(names)
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # An empty cell.
                pass
        named = [] if _installed_module(module) else [value.__globals__[n] for n in names if n in value.__globals__]
        return [*cells, *named, *(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()]
    if isinstance(value, types.MethodType):
        return [value.__func__, value.__self__]
    if isinstance(value, functools.partial):
        return [value.func, *value.args, *value.keywords.values()]
    if isinstance(value, (staticmethod, classmethod)):
        return [value.__func__]
    if isinstance(value, property):
        return [value.fget, value.fset, value.fdel]
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        found.setdefault(getattr(value, "__module__", None) or "", set())
        return []
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    found.setdefault(type(value).__module__, set())
    if dataclasses.is_dataclass(value):
        return [type(value), *(getattr(value, f.name, None) for f in dataclasses.fields(value))]
    wrapped = getattr(value, "__wrapped__", None)  # A jitted or decorated function.
    attributes = getattr(value, "__dict__", None)
    return [type(value), *([wrapped] if wrapped is not None else []),
            *(attributes.values() if isinstance(attributes, dict) else [])]


@functools.lru_cache(maxsize=4096)
def _installed_module(name: str) -> bool:
    """Whether the module ``name`` is installed code (a distribution's, the standard library's, a builtin)."""
    file = getattr(sys.modules.get(name), "__file__", None)
    return not file or _installed(file) is not None


def _names(code: types.CodeType) -> set[str]:
    """The global names a function's code (and the code nested in it) may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def code_closure(roots: Iterable[str] | Mapping[str, Iterable[str]], *, registering: Iterable[str] = (),
                 files: dict[str, str] | None = None) -> dict[str, str]:
    """Module name -> what it counts as: ``sha256 <digest>`` of a project file, ``<distribution>
    <version>`` of an installed one, ``python <version>`` of the standard library, ``builtin`` of a
    module without a file, ``absent`` of a name no finder knows, :data:`EDITED` for a project file
    changed since this process started. ``roots``: :func:`code_roots`'s modules (with the names their
    functions read); ``registering``: modules that register configs, counted by content, of whose
    imports only those bound to a name a reached function reads are walked (see the module's
    docstring). ``files``: filled with each project module's file.

    Example:
        >>> code_closure(["sys"])
        {'sys': 'builtin'}

    A closure is walked once per process per roots: asked again, it is the same answer while every file
    it read stands as it was read (same size and modification time), else walked afresh.
    """
    named = sorted((m, tuple(sorted(n))) for m, n in roots.items()) if isinstance(roots, Mapping) \
        else [(m, ()) for m in sorted(set(roots))]
    # A root by its name and the file it is now (two projects in one process may both have a `model`).
    key = (tuple((m, n, _file_of(m)) for m, n in named), tuple(sorted(set(registering))))
    memo = _CLOSURES.get(key)
    if memo is not None and all(_stat(path) == seen for path, seen in memo[2].items()) \
            and all(_file_of(module) in (None, file) for module, file in memo[1].items()):
        if files is not None:
            files.update(memo[1])
        return dict(memo[0])
    mine: dict[str, str] = {}
    read_files: dict[str, tuple[int, int] | None] = {}
    out = _walk(roots, set(registering), mine, read_files)
    _CLOSURES[key] = (out, mine, read_files)
    if files is not None:
        files.update(mine)
    return dict(out)


# Closures already walked in this process: roots -> (the closure, its project files, every file read as
# (size, mtime) when it was read).
_CLOSURES: dict[tuple[Any, ...], tuple[dict[str, str], dict[str, str], dict[str, tuple[int, int] | None]]] = {}


def _file_of(module: str) -> str | None:
    """The file of the module ``module`` as imported here (None where it is not imported, or has none)."""
    return getattr(sys.modules.get(module), "__file__", None)


def _stat(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def _walk(roots: Iterable[str] | Mapping[str, Iterable[str]], registering: set[str], files: dict[str, str],
          read_files: dict[str, tuple[int, int] | None]) -> dict[str, str]:
    """:func:`code_closure`'s walk; ``read_files``: filled with each file read, as it stood when read."""
    read = {m: set(n) for m, n in roots.items()} if isinstance(roots, Mapping) else {}
    out: dict[str, str] = {}
    stack = sorted(set(roots), reverse=True)
    while stack:
        name = stack.pop()
        if name in out:
            continue
        found = _locate(name)
        if found is None:
            out[name] = "absent"
            continue
        file, package, is_package = found
        if not file:
            out[name] = "builtin"
            continue
        installed = _installed(file)
        if installed is not None:
            # A distribution's module by its version and, where it is source, its bytes: a package edited
            # in place (a model in site-packages patched by hand) is another input, on every runner alike.
            source = _source_digest(file, read_files) if not installed.startswith("python ") else ""
            out[name] = f"{installed} {source}" if source else installed
            continue
        digest, imports, bindings, mtime = _project_file(file, package=package, is_package=is_package,
                                                         read_files=read_files)
        out[name] = EDITED if mtime > _STARTED_NS else f"sha256 {digest}"
        files[name] = file
        parents = [name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)]
        if name in registering:  # What the config's code reads of what this module imported.
            follow = [*parents, *(m for bound in read.get(name, ()) for m in bindings.get(bound, ()))]
        else:
            follow = [*parents, *imports]
        stack.extend(m for m in follow if m not in out)
    return dict(sorted(out.items()))


def _locate(name: str) -> tuple[str | None, str, bool] | None:
    """A module's file, package and whether it is a package: from the imported module, else from its
    spec without importing it (whether an earlier case imported a module lazily must not change the
    closure); None for a name no finder knows."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None), getattr(module, "__package__", None) or "", hasattr(module, "__path__")
    top = name.partition(".")[0]
    if top != name and top not in sys.modules:
        # A submodule of a package not imported here (a `from tensorflow import keras` under TYPE_CHECKING):
        # an installed package's version stands for it, found without importing the package.
        found = _locate(top)
        if found is None or (found[0] and _installed(found[0]) is not None):
            return found
    try:
        spec = importlib.util.find_spec(name)  # Imports the parent package (a project's, imported as a rule).
    except Exception:  # A parent whose import fails here: the name is not one the config can have run.
        return None
    if spec is None:
        return None
    is_package = spec.submodule_search_locations is not None
    package = name if is_package else name.rpartition(".")[0]
    return (spec.origin if spec.has_location else None), package, is_package


def _project_file(file: str, *, package: str, is_package: bool, read_files: dict[str, tuple[int, int] | None]
                  ) -> tuple[str, list[str], dict[str, list[str]], int]:
    """A project file's digest, the modules it imports (absolute names, a ``from`` import's names as
    possible submodules), the names those imports bind (name -> modules), and its mtime; read once per
    process per version of the file."""
    path = Path(file)
    if path.suffix in (".pyc", ".pyo"):
        path = Path(importlib.util.source_from_cache(file)) if "__pycache__" in path.parts else path
    try:
        stat = path.stat()
    except OSError:
        read_files[str(path)] = None
        return "unreadable", [], {}, 0
    read_files[str(path)] = (stat.st_size, stat.st_mtime_ns)
    digest, imports, bindings = _read_project_file(str(path), stat.st_mtime_ns, stat.st_size, package, is_package)
    return digest, imports, bindings, stat.st_mtime_ns


@functools.lru_cache(maxsize=4096)
def _read_project_file(path: str, _mtime: int, _size: int, package: str, is_package: bool
                       ) -> tuple[str, list[str], dict[str, list[str]]]:
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):  # Not Python source (an extension module): its bytes say it all.
        return digest, [], {}
    imports: list[str] = []
    bindings: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imports.append(alias.name)
                bindings.setdefault(alias.asname or alias.name.split(".")[0], []).append(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            if base:
                imports.append(base)
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    # `from pkg import x`: x may be a submodule (absent from the closure when it is not).
                    imports.append(f"{base}.{alias.name}")
                    bindings.setdefault(alias.asname or alias.name, []).extend([base, f"{base}.{alias.name}"])
    return digest, imports, bindings


def _absolute(module: str | None, level: int, package: str) -> str:
    """A ``from`` import's module as an absolute name (``from .x import y`` in ``pkg.sub`` -> ``pkg.x``)."""
    if level == 0:
        return module or ""
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return ""
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{module}" if module and base else (module or base)


def installed_file(file: str) -> bool:
    """Whether ``file`` is the standard library's or an installed (not editable) distribution's.

    Example:
        >>> installed_file(ast.__file__), installed_file("/nowhere/conftest.py")
        (True, False)
    """
    return _installed(file) is not None


def standard_library_file(file: str) -> bool:
    """Whether ``file`` is the standard library's (not a site directory's inside Python's prefix).

    Example:
        >>> standard_library_file(ast.__file__), standard_library_file(functools.__file__)
        (True, True)
    """
    return (_installed(file) or "").startswith("python ")


def _source_digest(file: str, read_files: dict[str, tuple[int, int] | None]) -> str:
    """The first 16 hex digits of a ``.py`` file's sha256 (read once per version of it); "" for any other."""
    if not file.endswith(".py"):
        return ""
    try:
        stat = os.stat(file)
    except OSError:
        read_files[file] = None
        return ""
    read_files[file] = (stat.st_size, stat.st_mtime_ns)
    return _file_digest(file, stat.st_mtime_ns, stat.st_size)[:16]


@functools.lru_cache(maxsize=4096)
def _file_digest(path: str, _mtime: int, _size: int) -> str:
    """A file's sha256, once per version of it (an installed module's: its bytes, not its imports)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _installed(file: str) -> str | None:
    """``<distribution> <version>`` if ``file`` belongs to an installed (not editable) distribution,
    ``python <version>`` if it is the standard library's, else None (the project's)."""
    real = os.path.realpath(file)
    for directory, owner in _install_dirs():  # Longest first: the innermost directory holding it decides.
        if real.startswith(directory):
            if owner is not None:
                return owner
            top = real[len(directory):].lstrip(os.sep).split(os.sep, 1)[0].removesuffix(".py")
            return _owner(directory, top.split(".")[0])  # No owner: a file of the project's, by content.
    return None


@functools.lru_cache(maxsize=1)
def _install_dirs() -> tuple[tuple[str, str | None], ...]:
    """Where installed code lives: site directories (owner looked up by top-level name) and the
    standard library (owned by Python). Longest first, so a venv inside the stdlib's prefix resolves."""
    paths = sysconfig.get_paths()
    python = f"python {sys.version.split()[0]}"
    dirs = {os.path.realpath(paths[k]) + os.sep: None for k in ("purelib", "platlib") if k in paths}
    import site

    for d in [*getattr(site, "getsitepackages", lambda: [])(), site.getusersitepackages()]:
        dirs.setdefault(os.path.realpath(d) + os.sep, None)
    for p in sys.path:  # A distribution installed into another directory on the path (--target, a vendor dir).
        if p and os.path.isdir(p) and any(n.endswith(".dist-info") for n in _listdir(p)):
            dirs.setdefault(os.path.realpath(p) + os.sep, None)
    for k in ("stdlib", "platstdlib"):
        if k in paths:
            dirs[os.path.realpath(paths[k]) + os.sep] = python
    return tuple(sorted(dirs.items(), key=lambda item: -len(item[0])))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


@functools.lru_cache(maxsize=1024)
def _owner(directory: str, top: str) -> str | None:
    """``<distribution> <version>`` of the distribution in ``directory`` that installed the top-level
    module ``top`` (None: none did, or it is installed editable). The likely one (its name is the
    module's) is asked first, then each one's ``top_level.txt``, then its RECORD: a few files read,
    not every distribution's file list."""
    infos = sorted(n for n in _listdir(directory) if n.endswith(".dist-info"))
    wanted = top.lower().replace("_", "-")
    likely = [n for n in infos if n.split("-")[0].lower().replace("_", "-") == wanted]
    for info in [*likely, *(n for n in infos if n not in likely)]:
        dist = importlib.metadata.Distribution.at(os.path.join(directory, info))
        tops = (dist.read_text("top_level.txt") or "").split()
        if tops and top not in tops:
            continue
        if not tops and info not in likely:
            record = dist.read_text("RECORD") or ""
            if not any(line.startswith((f"{top}/", f"{top}.py,", f"{top}.")) for line in record.splitlines()):
                continue
        return None if _editable(dist) else f"{dist.metadata['Name']} {dist.version}"
    return None


def _editable(dist: importlib.metadata.Distribution) -> bool:
    """Whether ``dist`` is the project's own, installed editable (its code is counted by content)."""
    direct = dist.read_text("direct_url.json") or ""
    return '"editable": true' in direct.replace("'", '"')


__all__ = ["CUT_SHORT", "EDITED", "code_closure", "code_roots"]
