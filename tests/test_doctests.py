"""The examples in aotcheck's docstrings run, say what they show, and every module has some."""

import doctest
import importlib
import pkgutil

import pytest

import aotcheck

MODULES = sorted(m.name for m in pkgutil.walk_packages(aotcheck.__path__, "aotcheck.") if m.name != "aotcheck.__main__")
# Modules without examples, and why: packages only describe their layer; the plugin's hooks
# need a pytest session (tests/e2e/test_plugin.py runs it for real). Importing __main__ runs the CLI.
WITHOUT_EXAMPLES = {"aotcheck.plugin"} | {
    m.name for m in pkgutil.walk_packages(aotcheck.__path__, "aotcheck.") if m.ispkg}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder().find(module)
    examples = sum(len(t.examples) for t in tests)
    if name in WITHOUT_EXAMPLES:
        # Exempt only while it has none: an example added here must run, not be skipped by this list.
        assert examples == 0, f"{name} has {examples} docstring example(s): take it off WITHOUT_EXAMPLES"
        return
    assert examples > 0, f"{name} has no docstring example"
    skipped = [e.source for t in tests for e in t.examples if e.options.get(doctest.SKIP)]
    assert not skipped, f"{name} skips examples: {skipped}"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted == examples
