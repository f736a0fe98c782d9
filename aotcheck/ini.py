"""Reading the ``aot_*`` settings from a project's pytest configuration, without running pytest.

``python -m aotcheck check`` uses the same defaults as the plugin when run in a
repository: it finds the configuration file the way pytest does (from the
current directory upwards: ``pytest.ini``, ``.pytest.ini``, ``pyproject.toml``
with ``[tool.pytest.ini_options]``, ``tox.ini`` with ``[pytest]``, ``setup.cfg``
with ``[tool:pytest]``), and its directory is the rootdir.

Example:
    >>> import pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (root / "tox.ini").write_text("[pytest]\\naot_topologies = v4-8 v5e-16\\naot_tolerances =\\n    flops = 2%\\n")
    >>> ini = find_ini(root)
    >>> ini.rootdir == root, ini.args("aot_topologies"), ini.lines("aot_tolerances")
    (True, ['v4-8', 'v5e-16'], ['flops = 2%'])
"""

from __future__ import annotations

import dataclasses
import shlex
import tomllib
from pathlib import Path
from typing import Any

import iniconfig

from aotcheck.errors import AotcheckError

_CANDIDATES = (("pytest.toml", None), (".pytest.toml", None), ("pytest.ini", "pytest"), (".pytest.ini", "pytest"),
               ("pyproject.toml", None), ("tox.ini", "pytest"), ("setup.cfg", "tool:pytest"))
_TRUE, _FALSE = ("y", "yes", "t", "true", "on", "1"), ("n", "no", "f", "false", "off", "0")


class IniError(AotcheckError, ValueError):
    """A configuration file that cannot be read."""


@dataclasses.dataclass(frozen=True)
class Ini:
    """The ``[pytest]`` values of one file (empty when none was found) and its rootdir."""

    rootdir: Path
    values: dict[str, Any]
    path: Path | None = None

    def get(self, key: str, default: str = "") -> str:
        value = self.values.get(key, default)
        return " ".join(value) if isinstance(value, list) else str(value)

    def args(self, key: str) -> list[str]:
        value = self.values.get(key, [])
        return [str(v) for v in value] if isinstance(value, list) else shlex.split(str(value))

    def lines(self, key: str) -> list[str]:
        value = self.values.get(key, [])
        items = value if isinstance(value, list) else str(value).splitlines()
        return [str(line).strip() for line in items if str(line).strip()]

    def flag(self, key: str) -> bool:
        """A boolean as pytest reads one (y/yes/t/true/on/1, n/no/f/false/off/0); IniError otherwise."""
        value = self.values.get(key, False)
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise IniError(f"{self.path}: {key} = {value!r} is not a boolean; write true or false")


def _read(path: Path, section: str | None) -> dict[str, Any] | None:
    """The pytest table of one configuration file, or None where it has none (pytest looks further)."""
    name = path.name
    try:
        if name.endswith(".toml"):
            doc = tomllib.loads(path.read_text())
            if name == "pyproject.toml":  # pytest 9 reads [tool.pytest], older ones [tool.pytest.ini_options].
                tool = doc.get("tool", {}).get("pytest", {})
                table = tool.get("ini_options", tool if tool else None)
            else:
                table = doc.get("pytest", {})
            return None if table is None else dict(table)
        ini = iniconfig.IniConfig(str(path))
    except (OSError, ValueError, iniconfig.ParseError, tomllib.TOMLDecodeError) as e:
        raise IniError(f"{path}: cannot read it as a pytest configuration ({e})") from e
    if section is not None and section in ini:
        return dict(ini[section].items())
    if name in ("pytest.ini", ".pytest.ini"):
        return {}  # pytest takes these even without the section.
    return None


def read_ini(path: str | Path) -> Ini:
    """The file pytest chose (its ``config.inipath``), read as :func:`find_ini` reads it."""
    path = Path(path).resolve()
    section = dict(_CANDIDATES).get(path.name, "pytest")
    return Ini(path.parent, _read(path, section) or {}, path)


def find_ini(start: str | Path) -> Ini:
    """The pytest configuration that governs ``start`` (a directory), as pytest would find it."""
    start = Path(start).resolve()
    for directory in (start, *start.parents):
        for name, section in _CANDIDATES:
            path = directory / name
            if path.is_file() and (values := _read(path, section)) is not None:
                return Ini(directory, values, path)
    return Ini(start, {}, None)
