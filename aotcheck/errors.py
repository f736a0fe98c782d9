"""What can go wrong while measuring a case, as a small hierarchy of typed errors with one JSON form.

Every error crosses the compile worker's pipe as :func:`error_to_json` and comes back as
:func:`error_from_json`: the same class with the same fields (aotcheck's own errors, Python's
built-in ones), or a :class:`UserCodeError` naming the class user code raised. Nothing is
attached to an exception after it is made, and nothing downstream matches its message: an
out-of-memory compile is an :class:`OutOfMemory` from the moment XLA says so.

=========================  ==============================================================
class                      what went wrong
=========================  ==============================================================
:class:`ConfigError`       the config, mesh, rules, topology or a name in it (a ValueError)
:class:`UserCodeError`     code of the user's raised while building or lowering (its class named)
:class:`CompileError`      XLA refused the program
:class:`OutOfMemory`       ... because it does not fit: what filled the memory in ``details``
:class:`WorkerCrashed`     the compile process died (a signal, the host's OOM killer)
=========================  ==============================================================

Example:
    >>> error = OutOfMemory("RESOURCE_EXHAUSTED: Ran out of memory", details={"peak_buffers": []})
    >>> again = error_from_json(error_to_json(error))
    >>> type(again).__name__, str(again), again.details
    ('OutOfMemory', 'RESOURCE_EXHAUSTED: Ran out of memory', {'peak_buffers': []})
    >>> error_from_json(error_to_json(KeyError("no such key")))
    KeyError('no such key')
    >>> error = error_from_json({"type": "somewhere.Else", "message": "boom"})
    >>> error, error_type(error)
    (UserCodeError('somewhere.Else: boom'), 'Else')
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Mapping
from typing import Any


class AotcheckError(Exception):
    """aotcheck's errors that carry fields beyond their message; each says how it crosses as JSON."""

    def fields(self) -> dict[str, Any]:
        """What the error carries besides its message, as JSON (none by default)."""
        return {}

    @classmethod
    def from_fields(cls, message: str, fields: Mapping[str, Any]) -> "AotcheckError":
        return cls(message)


class ConfigError(AotcheckError, ValueError):
    """The config is wrong: a name, a mesh, partition rules, a topology. The message names the fix."""


class UserCodeError(AotcheckError, RuntimeError):
    """An error of a class not rebuilt on this side of the worker's pipe (user code's, a library's):
    ``type_name`` names it."""

    def __init__(self, message: str, *, type_name: str = "UserCodeError") -> None:
        super().__init__(message)
        self.type_name = type_name

    def fields(self) -> dict[str, Any]:
        return {"type_name": self.type_name}

    @classmethod
    def from_fields(cls, message: str, fields: Mapping[str, Any]) -> "UserCodeError":
        return cls(message, type_name=str(fields.get("type_name") or "UserCodeError"))


class CompileError(AotcheckError, RuntimeError):
    """XLA refused to compile a program; the message says which and why."""


class OutOfMemory(CompileError):
    """XLA refused the program because it does not fit the device's memory. ``details``: what filled
    the memory (the JSON form of :class:`aotcheck.figures.program.Details`), when XLA's dump said."""

    def __init__(self, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = dict(details) if details is not None else None

    def with_details(self, details: Mapping[str, Any]) -> "OutOfMemory":
        """The same error, saying what filled the memory."""
        return type(self)(str(self), details=details)

    def fields(self) -> dict[str, Any]:
        return {"details": self.details} if self.details is not None else {}

    @classmethod
    def from_fields(cls, message: str, fields: Mapping[str, Any]) -> "OutOfMemory":
        return cls(message, details=fields.get("details"))


def out_of_memory(message: str) -> bool:
    """Whether XLA's error message says the program ran out of memory (read once, where XLA raises).

    Example:
        >>> out_of_memory("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm."), out_of_memory("bad shape")
        (True, False)
    """
    return "RESOURCE_EXHAUSTED" in message or "Ran out of memory" in message


class WorkerCrashed(AotcheckError, RuntimeError):
    """A compile process died (a signal, an abort, the host's OOM killer) while measuring a case."""

    def __init__(self, message: str, *, signal_name: str | None = None, tail: tuple[str, ...] = (),
                 log: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.tail = tuple(tail)
        self.log = tuple(log)  # Everything the worker printed while on the case (a crash handler's stack too).

    def fields(self) -> dict[str, Any]:
        return {"signal_name": self.signal_name, "tail": list(self.tail), "log": list(self.log)}

    @classmethod
    def from_fields(cls, message: str, fields: Mapping[str, Any]) -> "WorkerCrashed":
        return cls(message, signal_name=fields.get("signal_name"), tail=tuple(fields.get("tail") or ()),
                   log=tuple(fields.get("log") or ()))


def error_type(error: BaseException) -> str:
    """The name of an error's class as the user's code raised it, even across a worker."""
    return error.type_name if isinstance(error, UserCodeError) else type(error).__name__


def error_to_json(error: BaseException) -> dict[str, Any]:
    """An exception as JSON: its class's import path, its message, and its fields if it is aotcheck's."""
    cls = type(error)
    message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    out: dict[str, Any] = {"type": f"{cls.__module__}.{cls.__qualname__}", "message": message}
    if isinstance(error, AotcheckError) and error.fields():
        out["fields"] = error.fields()
    return out


def error_from_json(data: Mapping[str, Any]) -> Exception:
    """The exception :func:`error_to_json` described: the same class when it is importable
    (aotcheck's own, Python's built-in ones), else a :class:`UserCodeError` naming it."""
    module_name, _, name = data["type"].rpartition(".")
    cls: Any = None
    if module_name == "builtins":
        cls = getattr(builtins, name, None)
    elif module_name == "aotcheck" or module_name.startswith("aotcheck."):  # Not jax's: some take a tracer.
        try:
            cls = importlib.import_module(module_name)
            for part in name.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError):
            cls = None
    if isinstance(cls, type) and issubclass(cls, AotcheckError):
        return cls.from_fields(data["message"], data.get("fields") or {})
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(data["message"])
        except Exception:  # A class whose constructor wants more than a message.
            pass
    return UserCodeError(f"{data['type']}: {data['message']}", type_name=name)
