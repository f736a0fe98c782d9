"""``aotcheck calibrate``: every selected case held against this host's TPU chip, one record each.

For each case of the plan on the local chip's target (``v5e-1x1`` on one v5e chip):

1. its deviceless figures, measured as the gate measures them (a compile worker, no chip);
2. the same program lowered for the chip and compiled there: ``figures_equal`` says whether the chip's
   compiler gave the deviceless memory figures;
3. run once on zeros of its arguments (:func:`aotcheck.pipeline.chip.run_step`);
4. where it has a fit search: run at its answer N and at N + step (:func:`~aotcheck.pipeline.chip.try_size`);
5. a server's buckets (per config): started at the pool the boot budget predicts is the largest that
   starts, and at 1% more (:func:`~aotcheck.pipeline.chip.start_server`).

Each becomes one :class:`~aotcheck.gate.calibration.Calibration` under ``calibration/``, judged by the
model at once and by CI ever after. The chip is whatever :class:`~aotcheck.pipeline.chip.Runtime` is
given: :class:`~aotcheck.pipeline.chip.JaxChip` on a TPU host; tests give a stand-in with the chip's rules
(and ``on_chip=contextlib.nullcontext``: the target's deviceless devices stand for the chip's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ContextManager

from aotcheck import _runtime
from aotcheck.programs.oom import overflow_of
from aotcheck.gate.boot import boot_budget, load_order
from aotcheck.targets.usable import Usable
from aotcheck.gate.calibration import CALIBRATED, Calibration, write_record
from aotcheck.gate.golden import GoldenStore
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.chip import Fill, Runtime, RuntimeRefused, compile_on, run_step, start_server, try_size
from aotcheck.pipeline.measurement import Measurement
from aotcheck.pipeline.stages import lower
from aotcheck.plan import make_plan
from aotcheck.programs.knobs import knob_of
from aotcheck.programs.lowering import argument_kinds
from aotcheck.programs.registry import Registry
from aotcheck.settings import GateSettings
from aotcheck.targets.devices import NoChip, on_this_host

# The memory figures the chip's compile must give as the deviceless one did.
MEMORY = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes", "peak_bytes")
KEEP = (*MEMORY, "peak_params_bytes", "peak_kv_cache_bytes", "flops", "flops_xla")
# How far above the predicted largest pool the second start-up tries (it must fail).
ABOVE = 0.01


def has_tpu(dev: Path = Path("/dev")) -> bool:
    """Whether this host shows a TPU to its processes (``/dev/accel*``, or ``/dev/vfio`` groups), read
    without starting jax: on a host without one, jax's TPU backend would spend seconds and print libtpu's
    warnings to learn as much.

    Example:
        >>> has_tpu(Path("/nonexistent"))
        False
    """
    return any(dev.glob("accel[0-9]*")) or any(p.name.isdigit() for p in (dev / "vfio").glob("*"))


def calibrate(settings: GateSettings, registry: Registry, *, runtime: Runtime, out: Path,
              measure: Callable[[Case], Measurement], on_chip: Callable[[], ContextManager[Any]] = on_this_host,
              say: Callable[[str], None] = lambda line: None) -> list[Calibration]:
    """Every case of the plan of ``settings`` (its one target: the chip's) held against ``runtime``;
    ``measure``: the deviceless measurement (the gate's compile worker). Writes one record per case,
    one per server, under ``out``; returns them."""
    plan = make_plan(settings, registry, GoldenStore(settings.golden_dir))
    records: list[Calibration] = []
    servers: dict[str, list[tuple[Case, Any, Measurement]]] = {}
    toolchain = _runtime.toolchain(_runtime.LIBTPU)
    for planned in plan.cases:
        case = planned.case
        if planned.skip:
            say(f"{case.id}: skipped ({planned.skip})")
            continue
        config = registry.get(case.config).programs()[case.program_id]
        measured = measure(case)
        if case.bucket:
            servers.setdefault(case.config, []).append((case, config, measured))
        label = _label(case, measured)
        figures = {label: _kept(measured.figures)}
        try:
            with on_chip():
                program = compile_on(runtime, lower(case, config).lowered)  # One compile: figures, then runs.
                chip = runtime.figures(program)
                equal = all(chip.get(k) == measured.figures.get(k) for k in MEMORY)
                step = run_step(runtime, program, fill=run_inputs(config))
                del program
        except RuntimeRefused as e:  # A program the chip would not compile or run: recorded, and judged so.
            records.append(Calibration(case.id, toolchain, CALIBRATED, runtime.memory().limit, figures, step={
                "at": label, "refused": e.where, "message": e.message.strip().splitlines()[0][:400]}))
            say(f"{case.id}: refused at {e.where}")
            continue
        record = Calibration(case.id, toolchain, CALIBRATED, runtime.memory().limit, figures, figures_equal=equal,
                             step={"at": label, "code_bytes": step.code_bytes, "reserved_bytes": step.reserved_bytes,
                                   "footprint_bytes": step.footprint_bytes, "seconds": step.seconds})
        fit = measured.details.fit if measured.details is not None else None
        if fit is not None and fit.max_size and not fit.upper_bound:
            record = _with_fit(record, runtime, case, config, fit, measure, on_chip)
        records.append(record)
        say(f"{case.id}: recorded")
    for name, group in servers.items():
        records.append(_server(name, group, runtime, toolchain, on_chip))
        say(f"{name}/* on {group[0][0].target}: recorded")
    for record in records:
        write_record(out, record)
    return records


def run_inputs(config: Any) -> Fill | None:
    """The config's ``run_inputs`` (a trainer's or an inference config's: none, zeros are valid)."""
    return getattr(config, "run_inputs", None)


def _label(case: Case, measured: Measurement) -> str:
    """The figures' key: the program id, with its searched size where it has one (``prefill[batch=32]``)."""
    fit = measured.details.fit if measured.details is not None else None
    return f"{case.program_id}[{fit.knob}={fit.configured}]" if fit is not None and not case.bucket else case.program_id


def _kept(figures: Mapping[str, Any]) -> dict[str, Any]:
    return {k: figures[k] for k in KEEP if k in figures}


def _with_fit(record: Calibration, runtime: Runtime, case: Case, config: Any, fit: Any,
              measure: Callable[[Case], Measurement], on_chip: Callable[[], ContextManager[Any]]) -> Calibration:
    """The fit's answer N run on the chip, and N + step."""
    knob = knob_of(config, fit.knob, case.target)
    answer, above = fit.max_size, fit.max_size + fit.step

    def lowered_at(size: int) -> Callable[[], Any]:
        return lambda: lower(case, knob.rebuild(size)).lowered

    with on_chip():
        fill = run_inputs(config)
        at, over = try_size(runtime, lowered_at(answer), fill=fill), try_size(runtime, lowered_at(above), fill=fill)
    label = f"{case.program_id}[{fit.knob}={answer}]"
    figures = {**record.figures, label: {"peak_bytes": fit.peak_at_max}}
    section = {"at": label, "knob": fit.knob, "answer": answer, "step": fit.step, "ran": at["ran"],
               "footprint_bytes": at.get("footprint_bytes"),
               "above": {"refused": over.get("refused") or "none", "message": over.get("message", ""),
                         "needed_bytes": None if over["ran"] else _needed(over.get("message", ""))}}
    return Calibration(record.case, record.toolchain, record.source, record.bytes_limit, figures, record.step,
                       section, record.boot, record.figures_equal)


def _needed(message: str) -> int | None:
    """What the chip's compiler said the program needed (``HLO temporaries (15.78G)``): its refusal read as
    a compile's is (:func:`aotcheck.programs.oom.overflow_of`), the chip's compile having raised it bare."""
    overflow = overflow_of(message)
    return overflow.size_bytes if overflow is not None and overflow.hbm else None


def _server(name: str, group: Sequence[tuple[Case, Any, Measurement]], runtime: Runtime,
            toolchain: Mapping[str, str | None], on_chip: Callable[[], ContextManager[Any]]) -> Calibration:
    """A server's buckets started on the chip at the predicted largest pool, and at 1% more."""
    target = group[0][0].target
    by_id = {(case.program, case.bucket): (case, config, m) for case, config, m in group}
    kept = {key: _kept(m.figures) for key, (_, _, m) in by_id.items()}
    programs = list(dict.fromkeys(case.program for case, _, _ in group))
    kv = next(((case, config) for case, config, m in group if m.figures.get("peak_kv_cache_bytes")), None)
    pages = kv[1].knobs["pages"].size if kv is not None and "pages" in (kv[1].knobs or {}) else None
    page_bytes = int(by_id[(kv[0].program, kv[0].bucket)][2].figures["peak_kv_cache_bytes"] // pages) if kv and pages else 0
    limit = runtime.memory().limit
    boot = boot_budget(list(kept.items()), target.topology, pages=pages, usable=Usable(limit), programs=programs)
    largest = boot.kv_evict_max_pages if boot is not None and boot.kv_evict_max_pages is not None else 0
    trials = []
    for n in (largest, math.ceil(largest * (1 + ABOVE))):
        buckets = []
        with on_chip():
            for key in load_order(list(by_id), programs):
                case, config, measured = by_id[key]
                if "pages" in (config.knobs or {}) and measured.figures.get("peak_kv_cache_bytes"):
                    config = knob_of(config, "pages", case.target).rebuild(n)
                lowered = lower(case, config)
                leaves = argument_kinds(lowered.config, lowered.lowered.args_info[0])
                kinds = [k[0] if len(set(k)) == 1 else "batch" for k in leaves]
                buckets.append((case.program_id, lowered.lowered, kinds, run_inputs(config)))
            trials.append({"pages": n, **start_server(runtime, buckets)})
    section = {"page_bytes": page_bytes, "programs": programs, "trials": trials,
               "largest_started": max((t["pages"] for t in trials if t["started"]), default=0)}
    figures = {by_id[key][0].program_id: f for key, f in kept.items()}  # The record keys a program by its id.
    return Calibration(f"{name}/*@{target}", dict(toolchain), CALIBRATED, limit, figures, boot=section, figures_equal=None)


def no_chip_message(error: NoChip | None = None) -> str:
    """What ``aotcheck calibrate`` says on a host with no TPU."""
    why = f" ({error})" if error is not None else ""
    return (f"aotcheck calibrate runs on a host with a TPU{why}; this host has none. Run it on a TPU VM "
            "(one v5e chip is enough) with the toolchain of the goldens it is held against, e.g. "
            "requirements-oldest.lock's jax 0.10.2 and libtpu 0.0.42.1; its records go under calibration/")


def add_command(sub: Any, load: Callable[[Sequence[str] | None], None]) -> None:
    """``aotcheck calibrate``'s parser, under the CLI's subcommands (``load`` registers the configs)."""
    p = sub.add_parser("calibrate", help="hold the selected cases against this host's TPU chip: one record each",
                       description="Compiles each selected case on this host's TPU, runs it on zeros and writes "
                       "what the chip did beside aotcheck's deviceless figures, one JSON record per case under "
                       "--out; exits 2 on a host with no TPU, 1 where the chip disagrees with aotcheck's model.")
    p.add_argument("--configs", default="*", help="glob(s) over config names, comma-separated (default every one)")
    p.add_argument("--case", action="append", default=[], metavar="ID", help="only this case (repeatable)")
    p.add_argument("--module", dest="config_modules", action="append", default=[], help="a module registering configs")
    p.add_argument("--out", default="calibration", help="where the records go (default calibration/)")
    p.set_defaults(func=lambda args: command(args, load))


def command(args: Any, load: Callable[[Sequence[str] | None], None]) -> int:
    """The command: 2 with no TPU here, 1 where a verdict disagrees with the chip, else 0."""
    import sys  # noqa: PLC0415

    from aotcheck.gate.calibration import agreements  # noqa: PLC0415
    from aotcheck.gate.isolation import Measurer  # noqa: PLC0415
    from aotcheck.ini import find_ini  # noqa: PLC0415
    from aotcheck.pipeline.chip import JaxChip  # noqa: PLC0415
    from aotcheck.programs.registry import REGISTRY  # noqa: PLC0415
    from aotcheck.render.calibration import calibration_markdown  # noqa: PLC0415
    from aotcheck.targets.devices import local_tpu_topology  # noqa: PLC0415

    if not has_tpu():
        print(f"aotcheck: error: {no_chip_message()}", file=sys.stderr)
        return 2
    try:
        topology = local_tpu_topology()
    except NoChip as e:
        print(f"aotcheck: error: {no_chip_message(e)}", file=sys.stderr)
        return 2
    load(args.config_modules)
    ini = find_ini(Path.cwd())
    settings = GateSettings.parse(rootdir=ini.rootdir, topologies=topology.name, slices="1", configs=args.configs,
                                  cases=args.case, cache_dir=None, front_end="cli")
    measurer = Measurer()
    try:
        records = calibrate(settings, REGISTRY, runtime=JaxChip(), out=Path(args.out), measure=measurer, say=print)
    finally:
        measurer.close()
    print(calibration_markdown(records))
    return 0 if all(a.agrees for r in records for a in agreements(r)) else 1
