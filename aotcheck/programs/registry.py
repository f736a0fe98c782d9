"""Named configs: register them, list them, build them.

Example:
    >>> from aotcheck.programs.registry import Registry
    >>> registry = Registry()
    >>> @registry.register("my-model")
    ... def my_model():
    ...     ...  # return a TrainerConfig, InferenceConfig or FunctionConfig
    >>> registry.names()
    ['my-model']
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from aotcheck.errors import ConfigError
from aotcheck.programs.config import Config, FunctionConfig, InferenceConfig, TrainerConfig
from aotcheck.programs.fingerprint import Fingerprint, fingerprint
from aotcheck.programs.model import as_functions
from aotcheck.programs.names import name_problem
from aotcheck.programs.serving import ServingConfig

Builder = Callable[[], Config | list[Config] | tuple[Config, ...]]


class RegistryError(ConfigError):
    """A duplicate name, an unknown name, or a config whose builder failed."""


class ConfigNotFound(RegistryError):
    """No config is registered under the name asked for; the message lists those that are."""


class ProgramNotFound(RegistryError):
    """The config exists but defines no such program; the message lists the ones it has."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One registered name: a builder of one or more configs (e.g. trainer + inference)."""

    name: str
    build: Builder
    description: str = ""
    module: str | None = None  # The module that registered it (a child process imports it the same way)...
    source: str | None = None  # ...and its file, for modules that have no importable name.

    def configs(self) -> list[FunctionConfig]:
        """Builds the configs once per process (the plan, the stale-golden check and every case of the
        config read the same build); any failure is re-raised naming this config, each time."""
        built = self._built
        if isinstance(built, RegistryError):
            raise built
        return list(built)

    @functools.cached_property
    def _built(self) -> "list[FunctionConfig] | RegistryError":
        try:
            configs = self._build()
        except RegistryError as e:
            return e
        # Taken at once, before anything uses the build (and fills a cache inside it).
        self.__dict__["_fingerprint"] = fingerprint(configs)
        return configs

    def fingerprint(self) -> "Fingerprint | None":
        """What this process's build of the config looks like (:func:`fingerprint`), taken as it was
        built; None when it does not build."""
        return None if isinstance(self._built, RegistryError) else self.__dict__["_fingerprint"]

    def rebuilt(self) -> "tuple[list[FunctionConfig], Fingerprint]":
        """A fresh build (the builder called again), with its fingerprint: a builder must return the
        same config on every call, and :meth:`unstable` compares."""
        configs = self._build()
        return configs, fingerprint(configs)

    def unstable(self) -> str | None:
        """Where a second build of the config differs from the first (``"[0].make_args.<width>: 128 vs
        256"``), None when they are alike or it does not build; asked once per process."""
        if "_unstable" not in self.__dict__:
            first = self.fingerprint()
            where = None
            if first is not None and callable(self.build):
                try:
                    where = first.difference(self.rebuilt()[1])
                except RegistryError as e:  # Built once, then failed: that is unstable too.
                    where = f"the second build failed: {e}"
            self.__dict__["_unstable"] = where
        return self.__dict__["_unstable"]

    def _build(self) -> list[FunctionConfig]:
        try:
            built = self.build() if callable(self.build) else self.build
        except Exception as e:
            raise RegistryError(f"Building config {self.name!r} failed: {type(e).__name__}: {e}") from e
        listed = list(built) if isinstance(built, (list, tuple)) else [built]
        if not listed:
            raise RegistryError(f"Config {self.name!r} built no config (its builder returned an empty "
                                f"{type(built).__name__}); return a TrainerConfig, InferenceConfig or FunctionConfig.")
        configs: list[FunctionConfig] = []
        for config in listed:
            if not isinstance(config, (TrainerConfig, InferenceConfig, FunctionConfig, ServingConfig)):
                raise RegistryError(
                    f"Config {self.name!r} built a {type(config).__name__}; expected a "
                    "TrainerConfig, InferenceConfig, FunctionConfig or ServingConfig (or a list of them)."
                )
            if isinstance(config, InferenceConfig) and not config.methods:
                raise RegistryError(f"Config {self.name!r} defines no program (an InferenceConfig with "
                                    "methods={}); give it at least one method to compile.")
            # One compiled kind past here: a server is a function per bucket, a model one per program.
            configs += config.expand() if isinstance(config, ServingConfig) else as_functions(config)
        programs: dict[str, FunctionConfig] = {}
        for config in configs:
            problem = name_problem(config.program, "Program")
            if problem:
                raise RegistryError(f"Config {self.name!r}: {problem}")
            program = config.programs[0]
            twin = next((p for p in programs if p.casefold() == program.casefold()), None)
            if twin == program:
                raise RegistryError(f"Config {self.name!r} defines program {program!r} twice.")
            if twin is not None:
                raise RegistryError(f"Config {self.name!r} defines programs {twin!r} and {program!r}, which differ "
                                    "only in letter case: their golden files would be one file on macOS and "
                                    "Windows. Rename one.")
            programs[program] = config
        return configs

    def programs(self) -> dict[str, FunctionConfig]:
        """Program name -> the config that defines it."""
        return {p: c for c in self.configs() for p in c.programs}

    def program(self, program: str) -> FunctionConfig:
        """The config that defines ``program``; ProgramNotFound names the ones there are."""
        programs = self.programs()
        if program not in programs:
            raise ProgramNotFound(f"Config {self.name!r} has no program {program!r}; it has {', '.join(programs)}.")
        return programs[program]


def home_of(build: Builder | Config) -> tuple[str | None, str | None]:
    """``(module name, file)`` defining ``build``'s code: a builder function's module (a compile worker
    imports it to register the same configs), or for a config registered as built, the module of its
    own functions (its loss, methods or function), found without looking at who called.

    Example:
        >>> home_of(home_of)[0]
        'aotcheck.programs.registry'
    """
    candidates: list[Any] = [build]
    if dataclasses.is_dataclass(build):
        for field in dataclasses.fields(build):
            value = getattr(build, field.name)
            candidates += list(value.values()) if isinstance(value, Mapping) else [value]
    for candidate in candidates:
        while isinstance(candidate, functools.partial):
            candidate = candidate.func
        if callable(candidate):
            candidate = inspect.unwrap(candidate)  # functools.cache, functools.wraps decorators.
        code = getattr(candidate, "__code__", None)
        module = getattr(candidate, "__module__", None)
        if code is not None and module is not None:
            return module, code.co_filename
    return None, None


_registrations = 0  # Across every Registry: whether importing a module registered anything.


def registrations() -> int:
    """How many configs this process has registered so far, in any registry: a module whose import
    moves it registered configs, and a compile worker must import it too (:mod:`aotcheck.programs.loader`)."""
    return _registrations


class Registry:
    """A set of named configs. ``aotcheck.REGISTRY`` is the one the plugin and CLI read."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, build: Builder | Config | None = None, *, description: str = "") -> Any:
        """Registers ``build`` (a config, or a function returning configs) under ``name``.

        Use as a call, ``registry.register("lm", build_fn)``, or as a decorator,
        ``@registry.register("lm")``. Returns the builder, so decorating keeps it.

        Raises:
            RegistryError: ``name`` is already registered.
        """


        def add(fn: Builder | Config) -> Any:
            problem = name_problem(name, "Config")
            if problem:
                raise RegistryError(problem)
            if name in self._entries:
                raise RegistryError(
                    f"A config named {name!r} is already registered; pick another name "
                    "or remove the first registration."
                )
            doc = description or (getattr(fn, "__doc__", "") or "").strip().split("\n")[0]
            self._entries[name] = Entry(name, fn, doc, *home_of(fn))
            global _registrations
            _registrations += 1
            return fn

        return add if build is None else add(build)

    def locate(self, modules: Iterable[tuple[str, str]] = ()) -> tuple[str, str] | None:
        """``(module, attribute)`` where this registry is a module-level name, for a compile worker to find
        it by importing ``modules`` (those whose import registered configs) and :meth:`sources`; None for
        ``aotcheck.REGISTRY`` (the worker's own).

        Raises:
            RegistryError: this registry is no module-level name of a module that registers into it.
        """
        if self is REGISTRY:
            return None
        for module, _ in [*modules, *self.sources()]:
            namespace = vars(sys.modules[module]) if module in sys.modules else {}
            for attribute, value in namespace.items():
                if value is self:
                    return module, attribute
        # A module-level name of another module than those that register (a registries.py the configs import).
        for module, loaded in list(sys.modules.items()):
            if module == "__main__" or getattr(loaded, "__spec__", None) is None:
                continue
            for attribute, value in list(vars(loaded).items()):
                if value is self:
                    return module, attribute
        main = sys.modules.get("__main__")
        if main is not None and any(value is self for value in vars(main).values()):
            raise RegistryError(
                "The compile workers cannot find this Registry: it is a name of the script you ran (__main__), which "
                "a worker does not run. Move it, and the configs registering into it, into a module the script "
                "imports, or measure in this process (measure=...).")
        raise RegistryError(
            "The compile workers cannot find this Registry: they import the modules that registered its configs "
            f"({', '.join(m for m, _ in self.sources()) or 'none'}) and look for it there. Make it a module-level name "
            "of the module that registers into it, or measure in this process (measure=...)."
        )

    def sources(self) -> list[tuple[str, str]]:
        """``(module name, file)`` of every module that registered configs, for a process that needs them too."""
        return sorted({(e.module, e.source) for e in self._entries.values()
                       if e.module and e.source and e.source.endswith(".py")})

    def case_twins(self) -> dict[str, str]:
        """Config name -> why it cannot be checked: its name differs from another's only in letter
        case, so their golden files would be one file on macOS and Windows."""
        by_fold: dict[str, list[str]] = {}
        for name in self.names():
            by_fold.setdefault(name.casefold(), []).append(name)
        return {name: (f"Configs {', '.join(map(repr, group))} differ only in letter case: their golden files would "
                       "be one file on macOS and Windows, and each run would compare one with the other's figures. "
                       "Rename one.")
                for group in by_fold.values() if len(group) > 1 for name in group}

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigNotFound(f"No config named {name!r}; registered: {', '.join(self.names()) or 'none'}.") from None

    def select(self, patterns: list[str] | None = None) -> list[Entry]:
        """Entries whose names match any of the glob ``patterns`` (all if None), sorted."""
        return [
            self._entries[n]
            for n in self.names()
            if not patterns or any(fnmatch.fnmatchcase(n, p) for p in patterns)
        ]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.select())

    def __len__(self) -> int:
        return len(self._entries)


REGISTRY = Registry()
register = REGISTRY.register
