"""How each setting of the gate is spelled: its pytest option, ``aotcheck check``'s flag, its ini key.

A leaf: the settings table (:mod:`aotcheck.settings`), the front ends and :mod:`aotcheck.render`
(accept commands, the words of a message that name a setting) all read the spellings here, so a
setting is renamed in one line.

Example:
    >>> flag_names("pytest")["topologies"], flag_names("cli")["topologies"], flag_names("cli")["tolerances"]
    ('--aot-topologies', '--topologies', 'aot_tolerances')
    >>> SPELLINGS["hbm_headroom"].ini, option("cases", "llm/step[tokens=16]@v5e-16x1")
    ('aot_hbm_headroom', '--aot-case=llm/step[tokens=16]@v5e-16x1')
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import NamedTuple


class Spelling(NamedTuple):
    """One setting's names: the plugin's option, the CLI's flag, the ini key (None: it has none there)."""

    pytest: str | None
    cli: str | None
    ini: str | None


SPELLINGS: dict[str, Spelling] = {
    "topologies": Spelling("--aot-topologies", "--topologies", "aot_topologies"),
    "slices": Spelling("--aot-slices", "--slices", "aot_slices"),
    "configs": Spelling("--aot-configs", "--configs", "aot_configs"),
    "cases": Spelling("--aot-case", "--case", None),
    "golden_dir": Spelling("--aot-golden-dir", "--golden-dir", "aot_golden_dir"),
    "update": Spelling("--update-golden", "--update-golden", None),
    "strict": Spelling("--aot-strict", "--strict", "aot_strict"),
    "report": Spelling("--aot-report", "--report", None),
    "export": Spelling("--aot-export", "--export", "aot_export"),
    "shard": Spelling("--aot-shard", "--shard", None),
    "fit": Spelling("--aot-fit", "--fit", "aot_fit"),
    "libtpu_init_args": Spelling("--aot-libtpu-init-args", "--libtpu-init-args", "aot_libtpu_init_args"),
    "default_options": Spelling(None, "--default-options", "aot_default_options"),
    "cache_dir": Spelling("--aot-cache-dir", "--cache-dir", "aot_cache_dir"),
    "no_cache": Spelling("--aot-no-cache", "--no-cache", None),
    "cache_url": Spelling("--aot-cache-url", "--cache-url", "aot_cache_url"),
    "cache_mode": Spelling("--aot-cache-mode", "--cache-mode", "aot_cache_mode"),
    "hbm_headroom": Spelling(None, None, "aot_hbm_headroom"),
    "memory_fraction": Spelling(None, None, "aot_memory_fraction"),
    "tolerances": Spelling(None, None, "aot_tolerances"),
    "metric_drift": Spelling(None, None, "aot_metric_drift"),
    "config_modules": Spelling(None, "--module", "aot_config_modules"),
}
"""Every setting, by the keyword ``GateSettings.parse`` takes, in the order ``--help`` lists them."""

FRONT_ENDS = ("pytest", "cli")

# libtpu reads its launch flags from this variable when it loads: a run takes them as its launch flags
# (compiler options, in the cache key and each golden) and no compile process inherits the variable.
ENVIRONMENT_FLAGS = "LIBTPU_INIT_ARGS"


def flag_names(front_end: str) -> dict[str, str]:
    """How ``front_end`` (``"pytest"`` or ``"cli"``) names each setting in a message: its flag, else its ini key."""
    return {name: getattr(s, front_end) or s.ini for name, s in SPELLINGS.items() if getattr(s, front_end) or s.ini}


def names_in_messages(flags: Mapping[str, str], from_ini: Collection[str] = ()) -> dict[str, str]:
    """How a message names each setting: the front end's ``flags``, but the ini key for a value the
    ini gave (``from_ini``), since that is what the user wrote.

    Example:
        >>> names = names_in_messages(flag_names("pytest"), from_ini=["slices"])
        >>> names["slices"], names["topologies"]
        ('aot_slices', '--aot-topologies')
    """
    return {**flags, **{name: SPELLINGS[name].ini for name in from_ini
                        if name in SPELLINGS and SPELLINGS[name].ini}}  # type: ignore[misc]


def option(name: str, value: str) -> str:
    """The pytest option that gives setting ``name`` ``value`` (an accept command is a pytest run)."""
    flag = SPELLINGS[name].pytest
    assert flag is not None, f"{name} has no pytest option"
    return f"{flag}={value}"


def ini_override(name: str, value: str) -> list[str]:
    """``-o key=value``: a setting pytest has no option for, given to a pytest run as its ini's."""
    return ["-o", f"{SPELLINGS[name].ini}={value}"]
