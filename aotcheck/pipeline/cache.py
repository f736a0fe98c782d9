"""The figures cache: compiled figures keyed by everything that determines them.

JAX's persistent compilation cache cannot serve deviceless TPU compiles (it
writes executables it cannot read back without a TPU client), and what aotcheck
needs is the figures anyway. Lowering is cheap and compiling is not, so a case
whose lowered program, compiler options, target and toolchain are unchanged
reuses its figures without compiling.

Example:
    >>> import tempfile
    >>> from aotcheck.pipeline.cache import FiguresCache, cache_key
    >>> cache = FiguresCache(tempfile.mkdtemp())
    >>> key = cache_key(module_text="module @m {}", compiler_options={}, topology="v4-8",
    ...                 num_slices=1, toolchain={"jax": "0.10.2"})
    >>> figures = dict.fromkeys(REQUIRED_FIGURES, 1)
    >>> cache.put(key, {"figures": figures, "compile_seconds": 2.5, "details": {}}, toolchain={"jax": "0.10.2"})
    >>> cache.get(key, toolchain={"jax": "0.10.2"})["figures"] == figures
    True
    >>> cache.put(key, {"figures": {"flops": 1.0}, "compile_seconds": 2.5}, toolchain={"jax": "0.10.2"})  # A miss.
    >>> cache.get(key, toolchain={"jax": "0.10.2"}) is None
    True

A run that writes goldens reads nothing from it (``read=False``): its entries are
files anyone can edit coherently, and a golden is what a compile said.

    >>> writer = FiguresCache(cache.root, read=False)
    >>> writer.put(key, {"figures": figures, "compile_seconds": 2.5, "details": {}}, toolchain={"jax": "0.10.2"})
    >>> writer.get(key, toolchain={"jax": "0.10.2"}) is None, cache.get(key, toolchain={"jax": "0.10.2"}) is not None
    (True, True)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aotcheck.figures.program import REQUIRED_FIGURES, details_problem, figures_problem
from aotcheck.figures.sources import anchors_problem
from aotcheck._files import atomic_write_bytes, probe_writable
from aotcheck.records import Record
from aotcheck.pipeline.store import SharedStore
from aotcheck.programs import reads

# Bump when the figures computed from the same executable change meaning or
# gain names (e.g. a new loop-aware figure): old entries then miss.
# 3: figures from family-isolated processes only. 4: collectives inside every called
# computation (7x's sparsecore call-starts); entries validated field by field.
# 5: the peak split by class (peak_*_bytes), its largest buffers and collectives.
# 6: the peak's moment found by a sweep over every live range; fit searches (fit_max_*).
# 7: VMEM-colored buffers counted in the peak's classes, as XLA's peak counts them.
# 8: compile cost (compile_cpu_seconds, lower_cpu_seconds); presets this libtpu refuses not sent.
# 9: entry parameters read from libtpu 0.0.50.1's buffer assignment too ("size N, page P, parameter K").
# 10: details carry the lint of activations left unsharded (figures.sharding); entries carry anchors,
#     so a hit names the source lines as they are now (figures.sources).
# 11: XLA's raw costs from its HloCostAnalysis where an executable has none (deviceless GPUs); GPU
#     entries keyed by the CUDA plugin's version.
# 12: the HLO reader reads a statement whole (a Pallas kernel's config holds raw newlines); kernels'
#     declared costs and ragged dots in flops; details carry what flops may miss (uncounted), a model
#     library's own line, the lint in mesh axes; FunctionConfig argument kinds.
# 13: a packaged model's step called by aotcheck's adapter (MaxText's) is sourced at the library's line.
# 14: XLA's raw costs absent (not zeros) where its cost analysis fails, with an xla_cost record in the details.
# 15: the ledger (figures.ledger): every opcode and custom-call target a rule; ragged-all-to-all,
#     collective-broadcast, send/recv (the DCN legs between slices) counted; 7x's SparseCore offload under
#     libtpu 0.0.51 followed; dots XLA rewrote as multiply + reduce counted; kernels counted by a cost
#     registered by name (details.kernels says which basis); ops without a rule named in uncounted.
# 16: a kernel's constant operand read through a loop that keeps it in two elements (the TPU compiler's
#     memory-space copies: MaxText's splash masks); details.kernels says which counts are bounds over a
#     static buffer (megablox's declared gmm, ragged paged attention).
# 17: large TPU slices compiled as tori (wraparound where Cloud TPU closes the axis: v4/v5p/7x slices
#     of whole 4x4x4 cubes, v5e/v6e's 16-chip rows), as MaxText's and xpk's tables build them.
# 18: the peak's split has a class of its own for a server's KV pool (peak_kv_cache_bytes; it was counted
#     as batch), arguments of kind kv_cache.
# 19: each Pallas TPU kernel's scoped VMEM and SMEM against their limits (vmem_scoped_bytes, vmem_limit_bytes,
#     smem_bytes, smem_limit_bytes; details.scoped); a server's buckets keep the weights they do not read.
# 21: entries keep the lowered module's digest (program), which goldens record with the config's settings,
#     so that a cached answer is a fresh one's whole (gate.check.unread_settings reads it).
FIGURES_VERSION = 21

__all__ = ["FIGURES_VERSION", "FiguresCache", "REQUIRED_FIGURES", "cache_key", "entry_digest", "entry_problem"]


def cache_key(
    *,
    module_text: str,
    compiler_options: Mapping[str, str],
    topology: str,
    num_slices: int,
    toolchain: Mapping[str, Any],
    wraparound: tuple[bool, ...] = (),
    figures_version: int = FIGURES_VERSION,
) -> str:
    """A digest of everything that determines a program's figures (``wraparound``: the slice's torus,
    part of the device description the compiler is given, not of the lowered program)."""
    payload = json.dumps(
        {
            "module": hashlib.sha256(module_text.encode()).hexdigest(),
            "options": dict(sorted(compiler_options.items())),
            "topology": topology,
            "slices": num_slices,
            "wraparound": list(wraparound),
            "toolchain": dict(sorted(toolchain.items())),
            "figures_version": figures_version,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def entry_digest(entry: Mapping[str, Any]) -> str:
    """A digest of what an entry's source lines are read from: its details and its anchors, as stored
    (what the index's line mapping was made from; an entry changed since is not answered through it).

    Example:
        >>> entry_digest({"details": {"a": 1}, "anchors": {}}) == entry_digest({"anchors": {}, "details": {"a": 1}})
        True
    """
    return hashlib.sha256(json.dumps([entry.get("details"), entry.get("anchors", {})], sort_keys=True).encode()
                          ).hexdigest()


def _seal(entry: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in entry.items() if k != "seal"}, sort_keys=True).encode()
                          ).hexdigest()


def sealed(entry: Mapping[str, Any]) -> bytes:
    """An entry's bytes as stored: its JSON with ``seal``, a digest over everything else it holds (key,
    figures, details), so that an entry edited by hand, here or in a shared store, is named and
    compiled afresh rather than answered (issue 52, V12).

    Example:
        >>> data = sealed({"key": "k", "figures": {"flops": 1.0}})
        >>> seal_problem(json.loads(data)) is None
        True
        >>> seal_problem(json.loads(data.replace(b"1.0", b"0.5")))
        'its seal does not match what it holds (edited since it was written)'
    """
    return json.dumps({**entry, "seal": _seal(entry)}, sort_keys=True).encode()


def seal_problem(entry: Any) -> str | None:
    """Why ``entry`` (read back) is not as :func:`sealed` wrote it; None when it is."""
    if not isinstance(entry, dict):
        return None  # The entry's own check says what it is not.
    if "seal" not in entry:
        return "unsealed"  # An older aotcheck's: a miss, not news.
    if entry["seal"] != _seal(entry):
        return "its seal does not match what it holds (edited since it was written)"
    return None


def entry_problem(entry: Any, *, key: str, toolchain: Mapping[str, Any]) -> str | None:
    """Why ``entry`` (read from a file or a store) is not a whole figures entry for ``key`` under
    ``toolchain``, in words; None when it is one."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    checks = (
        (entry.get("key") != key, "another key's entry"),
        (entry.get("figures_version") != FIGURES_VERSION,
         f"figures version {entry.get('figures_version')!r}, not {FIGURES_VERSION}"),
        (entry.get("toolchain") != dict(toolchain), "another toolchain's"),
        # Older versions cached these; a fresh compile may split the peak.
        (entry.get("attribution_problem") is not None, "its peak not split by class"),
        (isinstance(entry.get("compile_seconds"), bool) or not isinstance(entry.get("compile_seconds"), (int, float)),
         "no compile seconds"),
    )
    for failed, why in checks:
        if failed:
            return why
    # Details it cannot give back whole (a hand edit, an old bug) would surface as an error of the
    # user's code on every run: a miss, and the entry rewritten.
    return (figures_problem(entry.get("figures")) or details_problem(entry.get("details"))
            or anchors_problem(entry.get("anchors", {})))


@dataclasses.dataclass(frozen=True)
class CacheSpec(Record):
    """Where a run's figures cache is and how the run uses it: made once from the settings, opened by the
    session and, from the request that carries it, by each compile worker (:meth:`open`).

    Example:
        >>> spec = CacheSpec(Path(".aotcheck-cache"), read=False)
        >>> CacheSpec.from_json(spec.to_json()) == spec, spec.open().read
        (True, False)
    """

    dir: Path
    read: bool = True  # False under update: a golden takes no figures (nor presets) from a cache.
    url: str | None = None  # The shared store behind it (pipeline.store), its URL checked by the settings.
    shares: bool = False  # Whether this run writes to the shared store.

    def open(self) -> "FiguresCache":
        shared = SharedStore(self.url, write=self.shares) if self.url else None
        return FiguresCache(self.dir, read=self.read, shared=shared, spec=self)


class FiguresCache:
    """A directory of ``<key>.json`` entries, safe for concurrent xdist workers, with an optional
    :class:`~aotcheck.pipeline.store.SharedStore` behind it (``shared``: runners' common cache).

    An entry is trusted only if it is whole: its key, this figures version, this
    toolchain, every required figure present and numeric (:func:`entry_problem`). Anything
    else is a miss, named once in :attr:`notes`, and the case is compiled (and the entry
    rewritten). A local miss asks the shared store, whose answer is checked the same way and
    kept locally. A cache that cannot be written turns itself off and says so once in
    :attr:`notes` (never a Python warning: a user's ``-W error`` must not turn it into a crash).

    Beside the entries, an index by a case's inputs (:mod:`aotcheck.pipeline.inputs`): what
    determined its lowered program -> the entry's key, so an unchanged case is answered without
    being lowered (:meth:`key_for`, :meth:`remember`).
    """

    def __init__(self, root: str | os.PathLike[str], *, read: bool = True, shared: SharedStore | None = None,
                 spec: CacheSpec | None = None) -> None:
        self.spec = spec or CacheSpec(Path(root), read, shared.url if shared else None, bool(shared and shared.write))
        self.root = Path(root)
        self.read = read  # False: entries are written, never answered from (an update run).
        self.shared = shared
        self.enabled = True
        self._notes: list[str] = []

    @property
    def notes(self) -> list[str]:
        """What this cache (and its shared store) had to say, each thing once."""
        shared = self.shared.notes if self.shared is not None else []
        return list(dict.fromkeys([*self._notes, *shared]))

    def usable(self) -> bool:
        """Whether entries can be written here (creates the directory)."""
        try:
            probe_writable(self.root)
            return True
        except OSError:
            return False

    def may_answer(self) -> bool:
        """Whether a case may be answered without lowering it: entries are read, and an index by inputs is
        here or may be in the shared store behind (a cold cache's first run has none: its cases compile)."""
        return self.enabled and self.read and (self.shared is not None or (self.root / "inputs").is_dir())

    @staticmethod
    def _name(key: str, kind: str = "") -> str:
        return f"{kind}{key[:2]}/{key}.json"

    def _load(self, name: str, check: Callable[[Any], str | None]) -> dict[str, Any] | None:
        """The entry ``name``: the local file, else (absent or wrong) the shared store's, kept locally;
        None on a miss. An entry ``check`` finds wrong is a miss, and named."""
        if not self.enabled or not self.read:
            return None
        path = self.root / name
        try:
            entry = self._checked(path.read_bytes(), check, where=str(path))
        except OSError:
            entry = None
        if entry is not None or self.shared is None:
            return entry
        data = self.shared.get(name)
        entry = self._checked(data, check, where=self.shared.where(name)) if data is not None else None
        if entry is not None and not name.startswith("inputs/"):  # A verdict from it names the store.
            entry = {**entry, "cached_from": self.shared.where(name)}
        if entry is not None:
            try:
                atomic_write_bytes(path, data)
            except OSError:  # Kept here or not, the answer is the same.
                pass
        return entry

    def _checked(self, data: bytes, check: Callable[[Any], str | None], *, where: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(data)
        except ValueError:
            entry, problem = None, "not whole JSON"
        else:
            problem = seal_problem(entry) or check(entry)
        if problem is None:
            return {k: v for k, v in entry.items() if k != "seal"}
        # Another version's or toolchain's entries are expected after an upgrade: a miss, not news.
        if not problem.startswith(("figures version", "another toolchain", "index version", "unsealed")):
            self._notes.append(f"aotcheck: the cache entry {where} is not usable ({problem}); compiled afresh.")
        return None

    def get(self, key: str, *, toolchain: Mapping[str, Any]) -> dict[str, Any] | None:
        """The entry (``{"figures": ..., "compile_seconds": ...}``), or None on a miss or any doubt."""
        return self._load(self._name(key), lambda e: entry_problem(e, key=key, toolchain=toolchain))

    def put(self, key: str, measured: Mapping[str, Any], *, toolchain: Mapping[str, Any],
            anchors: Mapping[str, list[int]] | None = None) -> None:
        """Stores a view of a measurement's JSON (its figures, compile seconds and the ``details`` that
        explain them), with where the source lines they name stand in the lowered program (``anchors``,
        :mod:`aotcheck.figures.sources`): only whole answers (the peak split by class), so that an entry
        says what a fresh compile would. The shared store gets the same bytes."""
        entry = {**measured, "key": key, "figures_version": FIGURES_VERSION, "toolchain": dict(toolchain),
                 "anchors": dict(anchors or {})}
        self._store(self._name(key), sealed(entry))

    def key_for(self, inputs: str) -> tuple[str, dict[str, str], str, dict[str, Any]] | None:
        """What a run recorded for the case with these inputs: the entry key it lowered to, the source
        lines the entry's details name as those inputs name them (the entry's line -> theirs), a digest of
        the entry those lines were mapped from (:func:`entry_digest`: an entry rewritten since, by another
        run or a hand, is not the one they map), and what the project's code read besides its code
        (:mod:`aotcheck.programs.reads`: changed since, the index does not answer)."""
        def check(entry: Any) -> str | None:
            if (not isinstance(entry, dict) or entry.get("inputs") != inputs or not isinstance(entry.get("key"), str)
                    or not isinstance(entry.get("details"), str) or not isinstance(entry.get("lines"), dict)
                    or not all(isinstance(v, str) for v in entry["lines"].values())):
                return "not an index entry for these inputs"
            if entry.get("figures_version") != FIGURES_VERSION or not reads.well_formed(entry.get("reads")):
                return "index version"  # Older entries did not record what the project read: not vouched for.
            return None
        found = self._load(self._name(inputs, "inputs/"), check)
        if found is None:
            return None
        return found["key"], dict(found["lines"]), found["details"], found["reads"]

    def remember(self, inputs: str, key: str, lines: Mapping[str, str], entry: Mapping[str, Any],
                 read: Mapping[str, Any]) -> None:
        """Records that the case with these inputs lowered to the entry ``key`` (``entry``: its details and
        anchors as stored), whose source lines read as ``lines`` say for these inputs; ``read``: what the
        project's code had read (:func:`aotcheck.programs.reads.recorded`)."""
        entry = {"inputs": inputs, "key": key, "lines": dict(lines), "details": entry_digest(entry),
                 "reads": dict(read), "figures_version": FIGURES_VERSION}
        self._store(self._name(inputs, "inputs/"), sealed(entry))

    def _store(self, name: str, data: bytes) -> None:
        if not self.enabled:
            return
        try:
            atomic_write_bytes(self.root / name, data)
        except OSError as e:
            self.enabled = False
            self._notes.append(f"aotcheck: the figures cache {self.root} is not writable ({e.strerror}); "
                               "running uncached.")
            return
        if self.shared is not None:
            self.shared.put(name, data)
