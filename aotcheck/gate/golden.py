"""The golden store: one JSON file per case, written atomically, read strictly.

Layout: ``<golden dir>/<config>/<program>@<topology>x<slices>.json``, sorted
keys, integer bytes, plus the toolchain and compiler options that produced the
figures (figures are only comparable under the same compiler).

Example:
    >>> import tempfile
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.gate.golden import GoldenStore
    >>> store = GoldenStore(tempfile.mkdtemp())
    >>> case = Case.of("lm-tiny", "train_step", "v4-8", 1)
    >>> store.write(case, {"peak_bytes": 1024}, toolchain={"jax": "0.10.2"}, compiler_options={})
    <GoldenAction.CREATED: 'created'>
    >>> store.read(case).figures
    {'peak_bytes': 1024}
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from aotcheck.records import Record, field
from aotcheck.errors import AotcheckError
from aotcheck._files import atomic_write_text, probe_writable
from aotcheck.pipeline.case import Case
from aotcheck.figures.program import details_problem, value_problem
from aotcheck.gate.verdict import GoldenAction
from aotcheck.targets.platform import Platform

FORMAT = 1


class GoldenError(AotcheckError, ValueError):
    """A golden file that cannot be read; the message names the file."""


@dataclasses.dataclass(frozen=True)
class Golden(Record):
    """What a golden file holds (:meth:`to_json` is its body, as an outcome carries it).

    Example:
        >>> golden = Golden({"peak_bytes": 1024}, {"jax": "0.12.0.1"}, {}, Path("lm/prefill@v4-8x1.json"))
        >>> Golden.from_json(golden.to_json(), path=golden.path) == golden
        True
    """

    figures: dict[str, int | float]
    toolchain: dict[str, str | None]
    compiler_options: dict[str, str]
    path: Path = field(compare=False, skip=True)  # Where it was read: not what it holds.
    details: dict[str, Any] = field(default_factory=dict)  # What explains the figures (not gated).
    # A server's bucket: what a device could hold when it was made (targets.usable.Usable's JSON), so that its
    # start-up is judged then as it was (a memory fraction lowered since is a start lost, not a start never had).
    usable: dict[str, Any] | None = field(default=None, omit="none", decode=lambda value, _: _usable(value))
    # How the config was built (its knobs' sizes and declared settings) and its lowered module's digest.
    settings: dict[str, Any] = field(default_factory=dict, omit="empty")
    program: str | None = field(default=None, omit="none")

    @classmethod
    def __json_read__(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        return {**data, "toolchain": data.get("toolchain") or {}, "compiler_options": data.get("compiler_options") or {}}


def _usable(value: Any) -> dict[str, Any] | None:
    """A golden's ``usable`` as read: an object with an integer ``bytes``, else None (judged as the run's)."""
    return dict(value) if isinstance(value, dict) and isinstance(value.get("bytes"), int) else None


def toolchain_problem(toolchain: Any) -> str | None:
    """What is wrong with a recorded toolchain (package -> its version string, null when not installed), or
    None: a version of another type would break every comparison and table of versions.

    Example:
        >>> toolchain_problem({"jax": "0.12.0.1", "libtpu": None}) is None
        True
        >>> toolchain_problem({"jax": ["0.12.0.1"]})
        "its 'toolchain' field 'jax' must be a version string or null, not list (['0.12.0.1'])"
    """
    if not isinstance(toolchain, Mapping):
        return f"its 'toolchain' must be an object, not {type(toolchain).__name__}"
    for name, version in toolchain.items():
        if not isinstance(name, str) or not (version is None or isinstance(version, str)):
            return (f"its 'toolchain' field {name!r} must be a version string or null, not "
                    f"{type(version).__name__} ({version!r})")
    return None


def version_step(before: str | None, now: str | None) -> str:
    """``"newer"`` or ``"older"``: how version ``now`` stands to ``before`` (as versions: 0.10 is newer
    than 0.9), or ``"not comparable"`` (a version missing on one side, or not a version, such as the path
    of a libtpu.so loaded instead of the package).

    Example:
        >>> version_step("0.9.9", "0.10.2"), version_step("0.12.0.1", "0.10.2"), version_step("0.0.50.1", None)
        ('newer', 'older', 'not comparable')
    """
    try:
        old, new = Version(str(before)), Version(str(now))
    except InvalidVersion:
        return "not comparable"
    return "newer" if new > old else "older" if new < old else "the same version, written differently"


NEWER_GOLDEN = "golden made with a newer toolchain than this one"
"""How a toolchain note on a golden of a newer toolchain begins (such a golden is never accepted over)."""


def toolchain_note(golden_toolchain: dict[str, Any], *, platform: Platform) -> str | None:
    """Says how a golden's toolchain differs from this process's for ``platform``'s targets, or None.

    Example:
        >>> from aotcheck.targets.platform import TPU
        >>> toolchain_note(TPU.toolchain(), platform=TPU) is None
        True
        >>> toolchain_note({**TPU.toolchain(), "libtpu": "0.0.1"}, platform=TPU)  # doctest: +ELLIPSIS
        'golden made with another toolchain (libtpu 0.0.1 -> ...); figures may differ for that reason alone'
        >>> toolchain_note({**TPU.toolchain(), "libtpu": "99.0"}, platform=TPU)  # doctest: +ELLIPSIS
        "golden made with a newer toolchain than this one (libtpu 99.0 -> ...); ... install the golden's toolchain ..."
    """
    now = platform.toolchain()
    differ = [k for k in now if golden_toolchain.get(k) != now[k]]
    if not differ:
        return None
    diffs = ", ".join(f"{k} {golden_toolchain.get(k)} -> {now[k]}" for k in differ)
    if all(version_step(golden_toolchain.get(k), now[k]) == "older" for k in differ):
        return (f"{NEWER_GOLDEN} ({diffs}); figures may differ for that reason "
                "alone, and are not to be accepted over it: install the golden's toolchain to check against it")
    return "golden made with another toolchain (" + diffs + "); figures may differ for that reason alone"


def golden_document(
    case: Case, figures: dict[str, int | float], *, toolchain: dict[str, Any], compiler_options: dict[str, str],
    details: dict[str, Any] | None = None, usable: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None, program: str | None = None,
) -> dict[str, Any]:
    """The JSON document stored for ``case``: figures (gated) and ``details`` (the peak's largest
    buffers and the largest collectives, which explain a change but are not gated one by one); a
    server's bucket's ``usable`` (what a device could hold then, :class:`aotcheck.targets.usable.Usable`)."""
    return {
        "format": FORMAT,
        "case": case.id,
        "figures": {k: _plain(v) for k, v in figures.items()},
        "toolchain": dict(toolchain),
        "compiler_options": dict(compiler_options),
        "details": dict(details or {}),
        **({"usable": dict(usable)} if usable is not None else {}),
        **({"settings": dict(settings)} if settings else {}),
        **({"program": program} if program else {}),
    }


def _plain(value: int | float) -> int | float:
    # Integers stay integers (bytes); integral floats (FLOP counts) too, so the
    # files read the same whatever produced them.
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def written_for(text: str) -> Case | None:
    """The case id a golden file's text says it was written for, None if it is not a golden
    aotcheck wrote (a file of the user's own: it is never called stale nor removed).

    Example:
        >>> written_for('{"format": 1, "case": "lm-tiny/train_step@v4-8x1", "figures": {}}')
        Case.parse('lm-tiny/train_step@v4-8x1')
        >>> written_for('{"owners": ["me"]}'), written_for('not json')
        (None, None)
    """
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("case"), str) \
            or not isinstance(doc.get("figures"), dict):
        return None
    try:
        return Case.parse(doc["case"])
    except ValueError:
        return None


def parse_document(text: str, path: Path, *, case: Case | None = None) -> Golden:
    """Parses and validates a golden file's text; GoldenError names ``path``. With ``case``,
    the file must say it holds that case's figures (two names differing only in letter case
    share one file on macOS and Windows)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise GoldenError(f"Golden file {path} is not valid JSON ({e}). Fix it, or regenerate it with --update-golden.") from e
    if not isinstance(doc, dict):
        raise GoldenError(f"Golden file {path} must hold a JSON object, not {type(doc).__name__}.")
    for key, kind in (("figures", dict), ("toolchain", dict), ("compiler_options", dict)):
        if key not in doc:
            raise GoldenError(f"Golden file {path} has no {key!r} key. Regenerate it with --update-golden.")
        if not isinstance(doc[key], kind):
            raise GoldenError(f"Golden file {path}: {key!r} must be an object, not {type(doc[key]).__name__}.")
    problem = toolchain_problem(doc["toolchain"])
    if problem:
        raise GoldenError(f"Golden file {path}: {problem}, so this golden is corrupt. Fix it, or regenerate it "
                          "with --update-golden.")
    for name, value in doc["figures"].items():
        problem = value_problem(name, value)
        if problem:
            raise GoldenError(f"Golden file {path}: {problem}, so this golden is corrupt. Fix it, or regenerate "
                              "it with --update-golden.")
    details = doc.get("details")
    problem = details_problem(details)
    if problem:
        raise GoldenError(f"Golden file {path}: its 'details' (peak buffers, collectives) cannot be read "
                          f"({problem}). Fix it, or regenerate it with --update-golden.")
    if case is not None and doc.get("case") != case.id:
        said = doc.get("case")
        raise GoldenError(
            f"Golden file {path} "
            + (f"holds the figures of {said!r}, not of {case.id!r}" if said else f"names no case (it should hold {case.id!r})")
            + (" (their names differ only in letter case, and this filesystem keeps one file for both; rename "
               "one config or program)" if str(said).casefold() == case.id.casefold() else "")
            + ". Regenerate it with --update-golden.")
    settings, program = doc.get("settings"), doc.get("program")
    return Golden(doc["figures"], doc["toolchain"], doc["compiler_options"], path, details or {},
                  _usable(doc.get("usable")), settings=dict(settings) if isinstance(settings, dict) else {},
                  program=program if isinstance(program, str) else None)


def unreadable_golden(path: Path, error: OSError | UnicodeDecodeError) -> str:
    """Why a golden file cannot be read, and the one fix that applies (hardening round 5, V77-V80: a directory
    and a symlink loop were told to fix their permissions).

    Example:
        >>> unreadable_golden(Path("g/a@v4-8x1.json"), IsADirectoryError(21, "Is a directory"))
        'g/a@v4-8x1.json is a directory, not a golden file: remove it (its golden is written there), then regenerate it with --update-golden.'
    """
    if isinstance(error, IsADirectoryError):
        return f"{path} is a directory, not a golden file: remove it (its golden is written there), then regenerate it " \
               "with --update-golden."
    if isinstance(error, OSError) and error.errno == errno.ELOOP:
        return f"{path} is a symbolic link that loops (it never reaches a file): remove it, then regenerate it with " \
               "--update-golden."
    if isinstance(error, PermissionError):
        return f"Golden file {path} cannot be read (permission denied). Fix its permissions, or remove it and " \
               "regenerate it with --update-golden."
    if isinstance(error, UnicodeDecodeError):
        return f"Golden file {path} is not UTF-8 text. Remove it, then regenerate it with --update-golden."
    return f"Golden file {path} cannot be read ({error.strerror or error}). Remove it, then regenerate it with " \
           "--update-golden."


class GoldenStore:
    """Golden files under one directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, case: Case) -> Path:
        return self.root / case.golden_relpath

    def read(self, case: Case) -> Golden | None:
        """The case's golden, None if it has none; GoldenError if it is corrupt or unreadable."""
        path = self.path(case)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            raise GoldenError(unreadable_golden(path, e)) from e
        return parse_document(text, path, case=case)

    def write(
        self,
        case: Case,
        figures: dict[str, int | float],
        *,
        toolchain: dict[str, Any],
        compiler_options: dict[str, str],
        details: dict[str, Any] | None = None,
        usable: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
        program: str | None = None,
    ) -> GoldenAction:
        """Writes the case's golden (atomically) and says what that did."""
        path = self.path(case)
        text = dumps(golden_document(case, figures, toolchain=toolchain, compiler_options=compiler_options,
                                     details=details, usable=usable, settings=settings, program=program))
        try:
            old = path.read_text()
        except FileNotFoundError:
            old = None
        if old == text:
            return GoldenAction.UNCHANGED
        atomic_write_text(path, text)
        return GoldenAction.CREATED if old is None else GoldenAction.CHANGED

    def cases(self) -> dict[Case, Path]:
        """Every golden file aotcheck wrote, by its case: JSON files whose ``case`` names the case of their
        path (``config/program@topoxN.json``). Other files are the user's, left alone."""
        if not self.root.is_dir():
            return {}
        out = {}
        for path in sorted(self.root.rglob("*.json")):
            rel = path.relative_to(self.root).as_posix()
            try:
                case = written_for(path.read_text())
            except (OSError, UnicodeDecodeError):
                continue
            if case is not None and case.golden_relpath == rel:
                out[case] = path
        return out

    def check_writable(self) -> None:
        """Raises GoldenError unless golden files can be written here."""
        if (self.root.exists() and not self.root.is_dir()) or (self.root.is_symlink() and not self.root.exists()):
            what = "a file, not a directory" if self.root.exists() else "a symbolic link whose target does not exist"
            raise GoldenError(f"The golden directory {self.root} is {what}; --update-golden writes goldens into a "
                              "directory there: move it aside or repair the link, or give another golden directory.")
        try:
            probe_writable(self.root)
        except OSError as e:
            raise GoldenError(f"The golden directory {self.root} is not writable ({e.strerror}); --update-golden needs it.") from e
