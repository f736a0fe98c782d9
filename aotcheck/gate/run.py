"""Records of a run that the terminal words (:mod:`aotcheck.render.summary`): its header and an interruption.

The session fills them; it words neither.

Example:
    >>> stop = Interrupted("SIGTERM", done=3, planned=10, update=False)
    >>> Interrupted.from_json(stop.to_json()) == stop
    True
"""

from __future__ import annotations
from aotcheck.pipeline.cache import CacheSpec
from aotcheck.records import Record

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Interrupted(Record):
    """A run ended early (Ctrl-C, SIGTERM, SIGHUP): what ended it and how far it got."""

    signal: str
    done: int
    planned: int
    update: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunHeader:
    """What a run says before its first case.

    Attributes:
        targets: The targets it checks, by name.
        declared: Configs compiled on targets of their own beyond those, each as (config, its targets'
            names): a config that names its targets (``targets=("v5e-1x1",)``) is checked where it is deployed.
        golden_dir: Where its goldens are; ``golden_dir_missing``: that directory does not exist (and
            the run does not update), with the ``rootdir`` the path is relative to; ``golden_dir_state``:
            what it is instead, where it is no directory: ``"absent"``, ``"a file"``, ``"a dangling link"``.
        update: Whether it writes goldens.
        cache: The figures cache (None: none): its directory, the store the runners share behind it and
            whether this run writes to it.
        shard: ``(K, N)`` when sharded, with ``shard_seconds``: (this shard's expected compile seconds, the matrix's).
        toolchain: The versions behind its figures.
        foreign: Golden files made with another toolchain, each with the versions it names.
        families: The TPU chip families its presets go to (None: presets off).
        launch_flags: The launch flags sent as compiler options (None: none given and presets on),
            with ``dropped`` runtime-only flags and whether they came from the environment.
        unused_environment_flags: The environment's LIBTPU_INIT_ARGS, when a setting overrides it.
        unused_cache: Cache settings given that change nothing, each as (the setting, its name as said,
            its value, the name of the setting that makes it moot).
        fit: The knob searched on every config that offers it.
        front_end: ``"pytest"`` or ``"cli"``: how a hint spells a setting.
        no_eval: Configs with a train step and no eval step: said once each.
    """

    targets: tuple[str, ...]
    golden_dir: str
    update: bool
    cache: CacheSpec | None = None
    shard: tuple[int, int] | None = None
    shard_seconds: tuple[float, float] | None = None
    toolchain: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    foreign: tuple[str, ...] = ()
    families: tuple[str, ...] | None = ()
    launch_flags: Mapping[str, str] | None = None
    dropped: int = 0
    environment_flags_used: bool = False
    unused_environment_flags: str | None = None
    unused_cache: tuple[tuple[str, str, str, str], ...] = ()
    fit: str | None = None
    declared: tuple[tuple[str, tuple[str, ...]], ...] = ()
    golden_dir_missing: bool = False
    golden_dir_state: str | None = None
    rootdir: str = ""
    front_end: str = "pytest"
    no_eval: tuple[str, ...] = ()
