"""aotcheck.ini: ``aotcheck check`` reads the configuration pytest would (the same file, the same
values), checked against pytest's own reading of each layout; what it cannot read is named."""

import pytest

from aotcheck.ini import IniError, find_ini, read_ini

LAYOUTS = {
    "pytest.ini": {"pytest.ini": "[pytest]\naot_topologies = v4-8 v5e-16\n"},
    "pytest.ini without its section wins over tox.ini": {
        "pytest.ini": "", "tox.ini": "[pytest]\naot_topologies = v4-8\n"},
    "tox.ini": {"tox.ini": "[tox]\nenvlist = py312\n\n[pytest]\naot_topologies = v5e-16\n"},
    "tox.ini without [pytest] gives way to setup.cfg": {
        "tox.ini": "[tox]\nenvlist = py312\n", "setup.cfg": "[tool:pytest]\naot_topologies = h100-8\n"},
    "pyproject.toml's ini_options": {
        "pyproject.toml": "[tool.pytest.ini_options]\naot_topologies = ['v4-8', 'h100-8']\n"},
    "pyproject.toml without a pytest table gives way to tox.ini": {
        "pyproject.toml": "[project]\nname = 'x'\n", "tox.ini": "[pytest]\naot_topologies = v6e-8\n"},
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_file_and_values_are_the_ones_pytest_reads(pytester, layout):
    for name, text in LAYOUTS[layout].items():
        (pytester.path / name).write_text(text)
    config = pytester.parseconfig(pytester.path)  # pytest's own reading (aotcheck's plugin adds the keys).
    ini = find_ini(pytester.path)
    assert ini.path == config.inipath and ini.rootdir == config.rootpath
    assert ini.args("aot_topologies") == config.getini("aot_topologies")


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options\n")
    with pytest.raises(IniError, match=r"pyproject.toml: cannot read it as a pytest configuration"):
        read_ini(tmp_path / "pyproject.toml")
    (tmp_path / "pytest.ini").write_text("[pytest]\naot_strict = maybe\n")
    with pytest.raises(IniError, match=r"aot_strict = 'maybe' is not a boolean; write true or false"):
        read_ini(tmp_path / "pytest.ini").flag("aot_strict")
