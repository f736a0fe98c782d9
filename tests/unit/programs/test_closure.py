"""The code a config runs, as modules: a project's files by content (what they import followed), an
installed distribution by its version (an editable one by content), a registering module by content
alone. Real modules, written and imported in a temporary directory."""

from __future__ import annotations

import functools
import re
import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from aotcheck.programs.closure import EDITED, code_closure, code_roots


def write_before_this_process(path, text):
    """Writes a file dated an hour back: as a project's files are, older than the process reading them
    (one changed while the process runs is :data:`EDITED`)."""
    import os
    import time

    path.write_text(text)
    past = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(past, past))


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project of four modules, and a distribution 'toylib' installed into a directory on the path."""
    files = {
        "helper.py": "import math\n\ndef act(x):\n    return math.tanh(x)\n",
        "pkg/__init__.py": "",
        "pkg/model_a.py": "from . import util\nimport helper\n\nclass Model:\n    def __call__(self, x):\n"
                          "        return helper.act(x) + util.ONE\n",
        "pkg/util.py": "ONE = 1\n",
        "model_b.py": "import toylib\n\ndef step(x):\n    return toylib.scale(x)\n",
        "registers.py": "import helper, model_b\nfrom pkg import model_a\nfrom consts import SCALE\n\nWIDTH = 3\n\n"
                        "def scaled(x):\n    return SCALE * x\n\n"
                        "def build():\n    return {'fn': model_b.step, 'scale': scaled}\n",
        "consts.py": "SCALE = 2\n",
        "lazy_user.py": "def f(x):\n    import lazy\n    return lazy.g(x)\n",
        "lazy.py": "def g(x):\n    return x\n",
        "vendor/toylib/__init__.py": "def scale(x):\n    return 2 * x\n\n\ndef wrap(f):\n    def g(x):\n        return f(x)\n    return g\n",
        "vendor/toylib-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: toylib\nVersion: 1.0\n",
        "vendor/toylib-1.0.dist-info/RECORD": "toylib/__init__.py,,\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        write_before_this_process(tmp_path / name, textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path / "vendor"))
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("helper", "pkg", "pkg.model_a", "pkg.util", "model_b", "registers", "toylib", "lazy_user", "lazy",
                   "consts"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    from aotcheck.programs import closure
    for cached in (closure._install_dirs, closure._installed_module, closure._owner):
        cached.cache_clear()
    monkeypatch.setattr(closure, "_install_dirs", functools.lru_cache(maxsize=1)(closure._install_dirs.__wrapped__))
    importlib.invalidate_caches()
    importlib.import_module("registers")
    return tmp_path


def test_a_class_is_followed_through_its_methods_and_its_modules_imports(project):
    from pkg.model_a import Model

    closure = code_closure(code_roots({"model": Model()}))
    assert {"pkg.model_a", "pkg", "pkg.util", "helper"} <= set(closure)
    assert closure["helper"].startswith("sha256 ") and closure["math"].startswith(("python ", "builtin"))
    assert "model_b" not in closure and "toylib" not in closure  # Not used by this config.


def test_an_installed_distribution_counts_by_its_version_and_an_edit_in_place_is_another_input(project):
    import model_b
    import toylib

    closure = code_closure(code_roots(model_b.step))
    assert re.fullmatch(r"toylib 1\.0 [0-9a-f]{16}", closure["toylib"]), closure["toylib"]
    assert closure["model_b"].startswith("sha256 ")
    # The same version patched by hand in site-packages (issue 52, V26): not the same input.
    write_before_this_process(Path(toylib.__file__), Path(toylib.__file__).read_text() + "# patched\n")
    edited = code_closure(code_roots(model_b.step))
    assert edited["toylib"].startswith("toylib 1.0 ") and edited["toylib"] != closure["toylib"]


def test_a_registering_module_counts_by_content_and_only_the_imports_its_config_reads(project):
    import registers

    config = registers.build()
    walked = code_closure(code_roots(config), registering=["registers"])
    assert walked["registers"].startswith("sha256 ") and "model_b" in walked  # Reached through the config.
    assert "consts" in walked  # `from consts import SCALE`, SCALE read by a function the config holds.
    assert "pkg.model_a" not in walked and "helper" not in walked  # Imported there, but not this config's.
    followed = code_closure(code_roots(config))
    assert {"pkg.model_a", "helper"} <= set(followed)


def test_an_installed_functions_closure_is_walked_for_the_users_code_it_holds(project):
    import helper
    import toylib

    closure = code_closure(code_roots(toylib.wrap(helper.act)))
    assert closure["toylib"].startswith("toylib 1.0 ") and closure["helper"].startswith("sha256 ")


def test_a_file_edited_after_the_process_started_is_not_trusted(project):
    import os

    import helper

    later = os.stat(project / "helper.py").st_mtime_ns + 3600 * 10**9
    os.utime(project / "helper.py", ns=(later, later))
    assert code_closure(code_roots(helper.act))["helper"] == EDITED


def test_an_edit_changes_the_file_digest_and_only_its_importers(project):
    from pkg.model_a import Model
    import model_b

    a, b = code_closure(code_roots(Model)), code_closure(code_roots(model_b.step))
    write_before_this_process(project / "helper.py", (project / "helper.py").read_text() + "# edited\n")
    a2, b2 = code_closure(code_roots(Model)), code_closure(code_roots(model_b.step))
    assert a2["helper"] != a["helper"] and a2 != a
    assert b2 == b  # model_b does not import helper.


def test_an_editable_install_is_the_projects_code():
    import aotcheck.programs.closure as module

    closure = code_closure(["aotcheck.programs.closure"])
    # This repository is installed editable (README's quick start): its files count by content.
    assert closure["aotcheck.programs.closure"].startswith("sha256 "), closure["aotcheck.programs.closure"]
    assert module.__file__ and "site-packages" not in module.__file__


def test_the_closure_does_not_depend_on_what_this_process_happened_to_import(project):
    """A compile worker that lowered another case first has imported more (a lazy import ran): the
    closure, read from files and specs, is the same either way."""
    import lazy_user

    before = code_closure(code_roots(lazy_user.f))
    assert "lazy" not in sys.modules and before["lazy"].startswith("sha256 ")
    lazy_user.f(1)  # Runs the lazy import.
    assert "lazy" in sys.modules and code_closure(code_roots(lazy_user.f)) == before


def test_a_submodule_of_an_installed_package_not_imported_is_not_imported_to_name_it(project, monkeypatch):
    """`from toylib import sub` under TYPE_CHECKING, in a file whose config never imported toylib: its
    version names it, and toylib stays unimported (such a package can be a heavy one)."""
    write_before_this_process(project / "typed.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                    "    from toylib import sub\n\n\ndef f(x):\n    return x\n")
    monkeypatch.delitem(sys.modules, "typed", raising=False)
    monkeypatch.delitem(sys.modules, "toylib", raising=False)
    import typed  # noqa: F401

    closure = code_closure(["typed"])
    assert closure["toylib.sub"].startswith("toylib 1.0") and "toylib" not in sys.modules
