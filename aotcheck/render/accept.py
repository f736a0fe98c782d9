"""The command that accepts cases' current figures as their goldens, worded: one builder for every place
that shows one (a case's message from its :class:`~aotcheck.gate.outcome.Accept` record, a server's bill,
the toolchain upgrade's advice in :mod:`aotcheck.render.upgrade`). Every option is spelled as
:mod:`aotcheck.spellings` spells it for pytest (an accept command is a pytest run).

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> accept_all_command([Case.parse(c) for c in ("lm/prefill@v4-8x1", "lm/train_step@v5e-16x2", "toy/step@v4-8x1")])
    'pytest --update-golden --aot-configs=lm,toy --aot-topologies=v4-8x1,v5e-16x2'
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from aotcheck.gate.outcome import Accept
from aotcheck.pipeline.case import Case
from aotcheck.spellings import option

UPDATE = option("update", "").removesuffix("=")  # --update-golden, a switch.


def accept_all_command(cases: Sequence[Case], *, extra: Sequence[str] = ()) -> str:
    """One command that accepts these cases' (or case ids') current figures as their goldens; ``extra``:
    the options of the run that decide the figures or where goldens are (the golden directory, its
    launch flags, ...), repeated after the selection, quoted for a shell.

    Example:
        >>> accept_all_command([Case.of("lm", "prefill", "v4-8")], extra=["--aot-libtpu-init-args=--xla_a=1 --xla_b=2"])
        "pytest --update-golden --aot-configs=lm --aot-topologies=v4-8x1 '--aot-libtpu-init-args=--xla_a=1 --xla_b=2'"
        >>> accept_all_command([Case.parse("lm[v2]/step@v4-8x1")], extra=golden_dir_option("ci/golden"))
        "pytest --update-golden '--aot-configs=lm[[]v2]' --aot-topologies=v4-8x1 --aot-golden-dir=ci/golden"
    """
    args = ["pytest", UPDATE, option("configs", ",".join(sorted({glob_quote(c.config) for c in cases}))),
            option("topologies", ",".join(sorted({str(c.target) for c in cases})))]
    return shlex.join([*args, *extra])


def accept_case_command(accept: Accept) -> str:
    """The command that accepts one case's current figures as its golden: the case by its id with
    aotcheck's own option (which a bucket's brackets pass through, as pytest's ``-k`` does not), then
    its run's options, quoted for a shell.

    Example:
        >>> accept_case_command(Accept(Case.parse("llm/step[tokens=16]@v5e-16x1"), ("--aot-golden-dir=ci golden",)))
        "pytest --update-golden '--aot-case=llm/step[tokens=16]@v5e-16x1' '--aot-golden-dir=ci golden'"
    """
    return shlex.join(["pytest", UPDATE, option("cases", accept.case.id), *accept.args])


def golden_dir_option(golden_dir: str | None) -> list[str]:
    """The option naming a golden directory as a report records it: none for the default (``golden``).

    Example:
        >>> golden_dir_option("golden"), golden_dir_option(None), golden_dir_option("ci/golden")
        ([], [], ['--aot-golden-dir=ci/golden'])
    """
    return [option("golden_dir", golden_dir)] if golden_dir and golden_dir != "golden" else []


def glob_quote(name: str) -> str:
    """A config name as a glob that matches only it (``lm[v2]`` -> ``lm[[]v2]``)."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in name)
