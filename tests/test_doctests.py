"""The examples in aotcheck's docstrings run and say what they show."""

import doctest
import importlib
import pkgutil

import pytest

import aotcheck

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(aotcheck.__path__, "aotcheck.")
    if m.name not in ("aotcheck.__main__",)
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
