"""Finding registered configs: importing the modules (or files) that register them.

A compile worker process (see :mod:`aotcheck.gate.isolation`) must see the same
registry as its parent, so :func:`import_sources` imports each registering
module under the name the parent imported it by: a config module inside a
package keeps its package, and its relative imports work.

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "doc_configs.py"
    >>> _ = path.write_text("WIDTH = 256")
    >>> import_sources([("doc_configs", str(path))])
    >>> sys.modules["doc_configs"].WIDTH
    256
    >>> load_config_modules(["no/such/file.py"], rootdir=path.parent)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    aotcheck.programs.loader.LoaderError: Config module file .../no/such/file.py does not exist.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from aotcheck.errors import AotcheckError
from aotcheck.programs.registry import registrations


class LoaderError(AotcheckError, ImportError):
    """A config module that could not be imported."""


# Every module whose import registered configs in this process (config modules, conftest files), as
# ``(module name, file)``: a compile worker imports them all, whatever their registrations hold (a
# builder imported from elsewhere, a config built from a library's functions). Modules that registered
# nothing (a conftest of fixtures, with its side effects) are left alone.
_LOADED: list[tuple[str, str]] = []


def note_loaded(name: str, path: str) -> None:
    """Remembers that importing ``name`` (from ``path``) registered configs here."""
    if (name, path) not in _LOADED:
        _LOADED.append((name, path))


def loaded_sources() -> list[tuple[str, str]]:
    """The modules :func:`note_loaded` remembered, in the order they were imported."""
    return list(_LOADED)


def load_config_modules(specs: Iterable[str], *, rootdir: Path | None = None) -> None:
    """Imports each spec: a dotted module name, or a ``.py`` path (relative to ``rootdir``).

    Importing is what registers: modules call :func:`aotcheck.register`.
    """
    rootdir = Path(rootdir or Path.cwd())
    for spec in specs:
        before = registrations()
        spec = spec.strip()
        if not spec:
            continue
        try:
            if spec.endswith(".py") or "/" in spec:
                path = (rootdir / spec).resolve()
                if not path.is_file():
                    raise LoaderError(f"Config module file {path} does not exist.")
                if _already_imported(path):  # The rootdir's conftest.py, loaded first: once is enough.
                    continue
                name = f"aotcheck_configs_{path.stem}_{abs(hash(str(path)))}"
                _exec_file(name, path)
                if registrations() != before:
                    note_loaded(name, str(path))
            else:
                if str(rootdir) not in sys.path:
                    sys.path.insert(0, str(rootdir))
                module = importlib.import_module(spec)
                if registrations() != before and getattr(module, "__file__", None):
                    note_loaded(spec, module.__file__)
        except LoaderError:
            raise
        except Exception as e:
            raise LoaderError(f"Importing config module {spec!r} failed: {type(e).__name__}: {e}") from e


def _already_imported(path: Path) -> bool:
    """Whether a module of this process was imported from ``path`` (a conftest.py pytest or the CLI loaded)."""
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and file.endswith(path.name) and Path(file).resolve() == path:
            return True
    return False


def _exec_file(name: str, path: Path) -> None:
    if name in sys.modules:
        return
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise LoaderError(f"{path} is not an importable Python file.")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def main_script() -> str | None:
    """The file of the script this process runs as ``python script.py``: a compile process imports it,
    under another name, when the configs it asks for were registered nowhere else (a script that
    registers a config built by a helper module's function). None for ``python -m ...`` (pytest's and
    aotcheck's own), a console script, an interactive session, a notebook or ``python -c``."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or getattr(main, "__spec__", None) is not None or not isinstance(path, str):
        return None
    return os.path.abspath(path) if path.endswith(".py") and os.path.isfile(path) else None


def main_has_no_file() -> bool:
    """Whether this process's main program has no file (an interactive session, a notebook, ``python -c``):
    configs registered there cannot be registered again in a compile process."""
    main = sys.modules.get("__main__")
    return main is not None and not isinstance(getattr(main, "__file__", None), str)


def import_main_script(path: str) -> None:
    """Imports the parent's script (:func:`main_script`) under another name, so its main block does not
    run; LoaderError when importing it runs the script or exits."""
    try:
        import_sources([("__main__", path)])
    except SystemExit as e:
        raise LoaderError(f"Importing the script {path} (to register its configs in the compile process) exited "
                          f"({e.code!r}): put the code that runs it under `if __name__ == \"__main__\":`, so "
                          "importing it only registers.") from None


def _same_file(a: str | None, b: str) -> bool:
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False


def imported(name: str) -> ModuleType:
    """The module :func:`import_sources` imported under ``name`` (a script's under its own name)."""
    return sys.modules["__aotcheck_main__" if name == "__main__" else name]


def import_sources(sources: Iterable[tuple[str, str]]) -> None:
    """Imports each ``(module name, file)`` as the parent did: by name when that finds the same file
    (packages and relative imports intact), else the file itself under that name.

    A script that registered configs (``__main__``) is run under another name, so code
    under its ``if __name__ == "__main__":`` guard does not run again.
    """
    for name, path in sources:
        if name == "__main__":  # A script: its registrations, not its main block (as multiprocessing does).
            name = "__aotcheck_main__"
        module = sys.modules.get(name)
        if module is not None and _same_file(getattr(module, "__file__", None), path):
            continue
        if module is not None:  # Another file under the same name (two conftest.py files, say).
            _exec_file(f"{name}__aotcheck_{abs(hash(path))}", Path(path))
            continue
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        try:
            if found is not None and _same_file(found.origin, path):
                importlib.import_module(name)
            else:  # A module pytest or the loader made from a file (e.g. importmode=importlib).
                _exec_file(name, Path(path))
        except LoaderError:
            raise
        except Exception as e:
            raise LoaderError(f"Importing config module {name!r} ({path}) failed: {type(e).__name__}: {e}") from e
