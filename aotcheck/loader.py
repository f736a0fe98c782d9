"""Finding registered configs: importing the modules (or files) that register them."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path


class LoaderError(ImportError):
    """A config module that could not be imported."""


def load_config_modules(specs: Iterable[str], *, rootdir: Path | None = None) -> None:
    """Imports each spec: a dotted module name, or a ``.py`` path (relative to ``rootdir``).

    Importing is what registers: modules call :func:`aotcheck.register`.
    """
    rootdir = Path(rootdir or Path.cwd())
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        try:
            if spec.endswith(".py") or "/" in spec:
                path = (rootdir / spec).resolve()
                if not path.is_file():
                    raise LoaderError(f"Config module file {path} does not exist.")
                name = f"aotcheck_configs_{abs(hash(str(path)))}"
                if name in sys.modules:
                    continue
                module_spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[name] = module
                module_spec.loader.exec_module(module)
            else:
                if str(rootdir) not in sys.path:
                    sys.path.insert(0, str(rootdir))
                importlib.import_module(spec)
        except LoaderError:
            raise
        except Exception as e:
            raise LoaderError(f"Importing config module {spec!r} failed: {type(e).__name__}: {e}") from e
