"""The chip as referee: what a real chip saw of a case, kept as a record, and whether aotcheck's model
predicts it.

A :class:`Calibration` is one case x target x toolchain held against one chip: the deviceless figures
aotcheck compiled (from the same toolchain), and what the chip did with the program (``aotcheck
calibrate`` on a TPU host writes them; those taken before it existed say they were transcribed), in up
to three sections:

- ``step``: the program run once on zeros: the code the runtime loaded at its first run, the
  temporaries it reserved, the footprint, the step's seconds and the FLOP/s the loop-aware count implies;
- ``fit``: a fit search's answer run on the chip, and the next size refused (at compile or at run);
- ``boot``: a server's buckets run in load order beside its weights and a KV pool of several sizes:
  which started, and the E0101 of those that did not.

:func:`agreements` re-derives each verdict from the record's own figures (the boot budget of
:mod:`aotcheck.gate.boot`, the compiler's limit for a fit) and says whether it agrees with the chip: CI
checks every committed record under ``calibration/`` that way, so a change of the model that the chip
would refute fails there.

Example (FAKE figures; a real record is under ``calibration/``):
    >>> record = Calibration.from_json({
    ...     "schema": 1, "case": "lm/prefill@v5e-1x1", "toolchain": {"jax": "0.10.2"}, "source": "a doctest",
    ...     "bytes_limit": 16909336064, "figures": {"prefill[batch=4]": {"peak_bytes": 15 * 2**30}},
    ...     "fit": {"at": "prefill[batch=4]", "knob": "batch", "answer": 4, "step": 1, "ran": True,
    ...             "above": {"refused": "compile", "needed_bytes": 17 * 2**30, "message": "15.78G exceeds 15.75G"}}})
    >>> [(a.what, a.agrees) for a in agreements(record)]
    [('fits at batch=4', True), ('refused at batch=5', True)]
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotcheck.records import Record
from aotcheck import _files
from aotcheck.errors import AotcheckError
from aotcheck.gate.boot import Boot, boot_budget
from aotcheck.programs.names import parse_program_id, split_case_id
from aotcheck.targets.usable import Usable
from aotcheck.targets.topology import Target, Topology

SCHEMA = 1
# Who wrote a record that ``aotcheck calibrate`` took itself (any other source was transcribed).
CALIBRATED = "aotcheck calibrate"
# The fields each section must hold (None where the chip's side was not read; more may follow).
SECTIONS = {
    "step": ("at",),  # And RUN's fields, or ``refused`` and ``message`` where the chip refused the program.
    "fit": ("at", "knob", "answer", "step", "ran", "above"),
    "boot": ("page_bytes", "programs", "trials", "largest_started"),
}
# What a step's run reads (None where that was not read).
RUN = ("code_bytes", "reserved_bytes", "footprint_bytes", "seconds")
# How close the model must come to the chip's largest pool (the bar: within 1%).
POOL_TOLERANCE = 0.01


class CalibrationError(AotcheckError, ValueError):
    """A calibration record that is not whole: the file and what is wrong."""


@dataclasses.dataclass(frozen=True)
class Calibration(Record):
    """One case x target x toolchain against one chip.

    Attributes:
        case: The case's id (a server's: ``config/*@target``, its buckets in ``figures``).
        toolchain: jax, jaxlib and libtpu as the chip ran them (the deviceless figures' too).
        source: Who wrote it: ``aotcheck calibrate``, or where it was transcribed from.
        bytes_limit: The chip's ``memory_stats()["bytes_limit"]``.
        figures: The deviceless figures by program id (a size's too: ``prefill[batch=224]``).
        step: The program run once (:data:`SECTIONS`), or None.
        fit: A fit search's answer on the chip, or None.
        boot: A server's start-up on the chip, or None.
        figures_equal: Whether the chip's own compile gave the deviceless figures (None: not recorded).
    """

    case: str
    toolchain: Mapping[str, str | None]
    source: str
    bytes_limit: int
    figures: Mapping[str, Mapping[str, int | float]]
    step: Mapping[str, Any] | None = None
    fit: Mapping[str, Any] | None = None
    boot: Mapping[str, Any] | None = None
    figures_equal: bool | None = None

    __json_extra__ = {"schema": lambda record: SCHEMA}

    @classmethod
    def __json_read__(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """The record checked whole before it is read; :class:`CalibrationError` naming what is missing."""
        if data.get("schema") != SCHEMA:
            raise CalibrationError(f"schema {data.get('schema')!r}, not {SCHEMA}")
        missing = [k for k in ("case", "toolchain", "source", "bytes_limit", "figures") if k not in data]
        sections = [name for name in SECTIONS if data.get(name) is not None]
        if not sections:
            missing.append(" or ".join(SECTIONS))
        missing += [f"{name}.{k}" for name in sections for k in SECTIONS[name] if k not in data[name]]
        step = data.get("step") or {}
        missing += [f"step.{k}" for k in (("message",) if "refused" in step else RUN if step else ()) if k not in step]
        missing += [f"figures[{data[name]['at']!r}]" for name in sections if "at" in SECTIONS[name]
                    and data[name].get("at") not in (data.get("figures") or {})]
        if missing:
            raise CalibrationError(f"missing {', '.join(missing)}")
        if not isinstance(data["bytes_limit"], int) or data["bytes_limit"] <= 0:
            raise CalibrationError(f"bytes_limit {data['bytes_limit']!r}: a positive integer")
        return data

    @property
    def target(self) -> str:
        return split_case_id(self.case)[2]

    @property
    def config(self) -> str:
        return split_case_id(self.case)[0]

    @property
    def program(self) -> str:
        """The program's id, or ``*``: a server's every program."""
        return split_case_id(self.case)[1]

    @property
    def topology(self) -> Topology:
        return Target.parse(self.target).topology

    @property
    def file_name(self) -> str:
        """One file per case x target x toolchain, and one more for a record transcribed by hand.

        Example:
            >>> Calibration("lm/step@v5e-1x1", {"libtpu": "0.0.42.1"}, CALIBRATED, 1, {}).file_name
            'lm.step@v5e-1x1@libtpu-0.0.42.1.json'
        """
        libtpu = self.toolchain.get("libtpu") or "none"
        hand = "" if self.source == CALIBRATED else ".transcribed"
        return f"{self.case.replace('/', '.').replace('*', 'server')}@libtpu-{libtpu}{hand}.json"


@dataclasses.dataclass(frozen=True)
class Agreement:
    """One verdict re-derived from a record's figures against what the chip saw.

    Attributes:
        what: The verdict in words (``"starts at 4,282 pages"``).
        predicted: What the model says, in words.
        seen: What the chip did, in words.
        agrees: Whether they agree.
    """

    what: str
    predicted: str
    seen: str
    agrees: bool


def agreements(record: Calibration) -> list[Agreement]:
    """Each verdict the record can judge, re-derived from its figures, against the chip."""
    judges = {"step": _step, "fit": _fit, "boot": _boot}
    return [a for name, judge in judges.items() if getattr(record, name) is not None for a in judge(record)]


def _step(record: Calibration) -> list[Agreement]:
    """What a step's record can judge, each where the chip's side was recorded (None: not read).

    A v5e chip (libtpu 0.0.42.1, ``aotcheck calibrate``, 2026-12-07) loaded each program's code to the
    byte, and reserved at most its temporaries: lm-1b's prefill 0.940 of them, llm-256k's structured
    decode 0.9998, lm-tiny's train step 0.510 (its reservation is its peak less its arguments and
    outputs, plus 110-150 KiB, where that peak is HBM's). So the boot budget, which charges the
    temporaries, is a bound; so is what a program can hold at once: its arguments, outputs, temporaries
    and code (its ``peak_bytes`` is not one: lm-1b's prefill held 111,616 B more than peak + code)."""
    chip, out = record.step or {}, []
    figures = record.figures[chip["at"]]
    if "refused" in chip:
        limit = min(int(record.topology.device.memory_limit_bytes or 0), record.bytes_limit)
        fits = int(figures.get("peak_bytes", 0)) <= limit
        return [Agreement("runs on the chip", "fits" if fits else "does not fit",
                          f"refused at {chip['refused']}: {chip['message']}", not fits)]
    if chip.get("code_bytes") is not None:
        code = int(figures["generated_code_bytes"])
        out.append(Agreement("code loaded at the first run", f"{code:,} B", f"{int(chip['code_bytes']):,} B",
                             code == int(chip["code_bytes"])))
    if chip.get("reserved_bytes") is not None:
        temp, reserved = int(figures["temp_bytes"]), int(chip["reserved_bytes"])
        out.append(Agreement("temporaries reserved, at most the compiled ones", f"{temp:,} B", f"{reserved:,} B",
                             0 <= reserved <= temp))
    if chip.get("footprint_bytes") is not None:
        bound, seen = held_bound(figures), int(chip["footprint_bytes"])
        out.append(Agreement("I/O + temporaries + code bound the footprint", f"{bound:,} B", f"{seen:,} B",
                             seen <= bound))
    if chip.get("seconds") and figures.get("flops"):  # A program of no matrix work has no rate to judge.
        # A count the chip refutes is one whose step would beat the chip's peak rate.
        rate, peak = figures["flops"] / float(chip["seconds"]), record.topology.device.peak_flops or 0.0
        out.append(Agreement("FLOP/s within the chip's peak", f"{figures['flops']:.4g} FLOPs",
                             f"{float(chip['seconds'])} s: {rate / 1e12:.1f} TFLOP/s, {rate / peak:.2f} of peak",
                             0 < rate <= peak))
    return out


def held_bound(figures: Mapping[str, float]) -> int:
    """The most a program can hold at once: arguments + outputs - aliased + temporaries + code.

    Example:
        >>> held_bound({"argument_bytes": 8, "output_bytes": 4, "alias_bytes": 4, "temp_bytes": 2, "generated_code_bytes": 1})
        11
    """
    return int(sum(figures[k] for k in ("argument_bytes", "output_bytes", "temp_bytes", "generated_code_bytes"))
               - figures["alias_bytes"])


def _fit(record: Calibration) -> list[Agreement]:
    chip = record.fit or {}
    above, figures = chip["above"], record.figures[chip["at"]]
    knob, answer, step = chip["knob"], int(chip["answer"]), int(chip["step"])
    # The compiler refuses what passes its limit; the runtime runs what it compiled below bytes_limit.
    limit = int(record.topology.device.memory_limit_bytes or 0)
    peak = int(figures["peak_bytes"])
    fits = peak <= min(limit, record.bytes_limit)
    # The search's answer says the next size does not fit: the compiler refuses it, or the runtime does.
    needed = above.get("needed_bytes")
    said = f"does not fit (needs {int(needed):,} B of {limit:,} B)" if needed else "does not fit"
    return [Agreement(f"fits at {knob}={answer}", f"peak {peak:,} B {'<=' if fits else '>'} the limits",
                      "ran" if chip["ran"] else "refused", fits == bool(chip["ran"])),
            Agreement(f"refused at {knob}={answer + step}", said, f"refused at {above['refused']}",
                      above["refused"] in ("compile", "run"))]


def boot_of(record: Calibration, pages: int) -> Boot:
    """The boot budget of a boot record's server with a pool of ``pages``, on the chip's bytes_limit."""
    page = int((record.boot or {})["page_bytes"])
    buckets = [(program, {**f, "peak_kv_cache_bytes": pages * page if f["peak_kv_cache_bytes"] else 0,
                          **({"argument_bytes": f["argument_bytes"] - f["peak_kv_cache_bytes"] + pages * page,
                              "output_bytes": f["output_bytes"] - f["alias_bytes"] + pages * page,
                              "alias_bytes": pages * page} if f["peak_kv_cache_bytes"] else {})})
               for program, f in record.figures.items()]
    # The record (a JSON file) keys its programs by id: read as values here, where it is decoded.
    buckets = [(parse_program_id(program), f) for program, f in buckets]
    return boot_budget(buckets, record.topology, pages=pages, usable=Usable(record.bytes_limit),
                       programs=(record.boot or {})["programs"])


def _boot(record: Calibration) -> list[Agreement]:
    out = []
    for trial in (record.boot or {})["trials"]:
        boot = boot_of(record, int(trial["pages"]))
        started = bool(trial["started"])
        predicted = boot.start.value + (f" ({boot.usable_bytes - boot.total_bytes:,} B to spare)" if boot.start.value == "starts"
                                        else f" ({boot.tips})" if boot.tips else "")
        seen = "started" + (f" ({trial['spare_bytes']:,} B to spare)" if trial.get("spare_bytes") is not None else "") \
            if started else f"failed ({trial.get('error', {}).get('program')})"
        agrees = boot.boots == started
        error = trial.get("error") or {}
        if not started and error.get("program") and boot.tips not in (None, "weights", "kv"):
            agrees = agrees and error["program"] == boot.tips  # The bucket whose run failed is the one predicted.
        out.append(Agreement(f"{'starts' if started else 'fails'} at {int(trial['pages']):,} pages", predicted, seen, agrees))
    largest = int((record.boot or {})["largest_started"])
    boot = boot_of(record, largest)
    predicted = boot.kv_evict_max_pages or 0
    out.append(Agreement("the largest pool that starts", f"{predicted:,} pages (every program resident: "
                         f"{boot.kv_max_pages or 0:,})", f"{largest:,} pages",
                         abs(predicted - largest) <= POOL_TOLERANCE * largest))
    return out


def read_records(directory: Path) -> list[Calibration]:
    """Every record under ``directory``, sorted by file; :class:`CalibrationError` naming a bad one."""
    records = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            records.append(Calibration.from_json(json.loads(path.read_text())))
        except (CalibrationError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CalibrationError(f"{path}: not a calibration record ({e})") from e
    return records


def write_record(directory: Path, record: Calibration) -> Path:
    """The record written whole under ``directory`` (its :attr:`~Calibration.file_name`)."""
    path = Path(directory) / record.file_name
    _files.atomic_write_text(path, json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
    return path
