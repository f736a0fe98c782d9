"""The library's line: a buffer, a collective or a lint finding made inside a model installed as a
package (esm2quinox, Gemma) names the model's own line (``library``) beside the user's call into it
(``source``), in the details, their JSON, the cache and the words (aotcheck.figures.frames).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from aotcheck.figures.attribution import PeakBuffer
from aotcheck.figures.frames import (
    FRAMEWORKS, Lines, instruction_library, instruction_source, is_framework, stack_frames,
)
from aotcheck.figures.hlo import parse_instruction
from aotcheck.figures.loops import CollectiveOp, analyze_hlo, top_collectives
from aotcheck.figures.program import Details
from aotcheck.figures.sources import anchors, remap, source_sequence
from aotcheck.render.tables import buffers_table, collectives_table

ROOT = Path(__file__).resolve().parents[3]
SITE = "/venv/lib/python3.12/site-packages"

# Innermost first, each frame's parent the next: an op of a packaged model (esm2quinox) under
# equinox, called from the user's loss (train.py:250), called by aotcheck's train step, called by
# pytest; an op of the user's own model (model.py) under flax; an optax op in the user's step.
FILES = [
    f"{SITE}/jax/_src/numpy/lax_numpy.py",   # 1
    f"{SITE}/equinox/nn/_linear.py",         # 2
    f"{SITE}/esm2quinox/_layer.py",          # 3
    f"{SITE}/esm2quinox/_esm2.py",           # 4
    f"{SITE}/equinox/_module/_prebuilt.py",  # 5
    "/usr/lib/python3.12/functools.py",      # 6
    "/home/me/proj/train.py",                # 7
    "/home/me/proj/model.py",                # 8
    f"{SITE}/flax/linen/linear.py",          # 9
    f"{SITE}/optax/_src/transform.py",       # 10
    f"{SITE}/_pytest/python.py",             # 11
    f"{SITE}/aotcheck/programs/lowering.py",  # 12
    "/src/aotcheck/aotcheck/adapters/maxtext.py",  # 13: aotcheck as a checkout (pip install -e)
    f"{SITE}/maxtext/layers/linears.py",     # 14
]
# location id -> (file id, line)
LOCATIONS = {1: (1, 5), 2: (2, 9), 3: (3, 67), 4: (4, 123), 5: (5, 30), 6: (6, 4), 7: (7, 250), 8: (8, 40),
             9: (9, 12), 10: (10, 77), 11: (11, 1), 12: (12, 300), 13: (13, 190), 14: (14, 162)}
# frame id -> (location id, parent frame id or 0); parents have smaller ids here.
FRAMES = {
    1: (11, 0),   # pytest
    2: (12, 1),   # aotcheck's step
    3: (7, 2),    # train.py:250, the user's call
    4: (6, 3),    # functools (stdlib) between
    5: (5, 4),    # equinox's __call__ wrapper
    6: (4, 5),    # esm2quinox/_esm2.py:123
    7: (3, 6),    # esm2quinox/_layer.py:67
    8: (2, 7),    # equinox's Linear
    9: (1, 8),    # jax: the innermost frame of the ESM2 op
    10: (8, 3),   # the user's own model.py:40, called from train.py:250
    11: (9, 10),  # flax under it
    12: (10, 3),  # optax, called from train.py:250
    13: (1, 1),   # jax called straight from pytest: no frame of the user's at all
    14: (13, 1),  # aotcheck's MaxText adapter lowering MaxText's step (a checkout: not site-packages)
    15: (14, 14),  # maxtext/layers/linears.py:162
    16: (1, 15),  # jax: the innermost frame of the MaxText op
}


def frame_tables() -> str:
    files = "\n".join(f'{i} "{f}"' for i, f in enumerate(FILES, 1))
    locations = "\n".join(f"{k} {{file_name_id={f} function_name_id=1 line={line} end_line={line} column=1 end_column=2}}"
                          for k, (f, line) in LOCATIONS.items())
    frames = "\n".join(f"{k} {{file_location_id={loc} parent_frame_id={parent + 1 if parent else 0}}}"
                       for k, (loc, parent) in FRAMES.items())
    return f'HloModule m\n\nFileNames\n{files}\n\nFunctionNames\n1 "f"\n\nFileLocations\n{locations}\n\nStackFrames\n{frames}\n\n'


def test_frames_name_the_users_line_and_the_packaged_models_line():
    frames = stack_frames(frame_tables())
    # The ESM2 op: the user's call (as today), and the innermost esm2quinox line inside that call.
    assert frames[9] == Lines("train.py:250", "esm2quinox/_layer.py:67")
    assert frames[8] == frames[9] and frames[7] == frames[9]  # equinox and jax frames inside are not the model's
    assert frames[6] == Lines("train.py:250", "esm2quinox/_esm2.py:123")
    # Frames of the frameworks only (equinox's wrapper, stdlib's functools) between the user's call
    # and the op: no library line, and never one of the runner's frames outside the call (pytest).
    assert frames[5] == Lines("train.py:250", None) and frames[4] == Lines("train.py:250", None)
    # The user's own model (not installed): its line is the user's; no second line.
    assert frames[11] == Lines("model.py:40", None)
    # optax inside the user's step: optax is a framework.
    assert frames[12] == Lines("train.py:250", None)
    # No frame outside installed packages: the innermost names the op, as before; the runner's is not a model's.
    assert frames[13] == Lines("jax/_src/numpy/lax_numpy.py:5", None)
    # A packaged model's step lowered by aotcheck's own adapter: no user's line, the library's is the source.
    assert frames[16] == Lines("maxtext/layers/linears.py:162", None) == frames[15]
    assert frames[14].source.endswith("maxtext.py:190") and frames[14].library is None  # No library inside: as was.
    assert {"jax", "flax", "optax", "equinox", "aotcheck", "numpy"} <= FRAMEWORKS and "esm2quinox" not in FRAMEWORKS
    assert is_framework("/usr/lib/python3.12/contextlib.py") and is_framework("<frozen runpy>")
    assert not is_framework(f"{SITE}/gemma/gm/nn/_modules.py") and not is_framework("/home/me/proj/model.py")


def test_an_instruction_names_both_lines_or_one():
    frames = stack_frames(frame_tables())
    packaged = parse_instruction('%d = f32[2]{0} dot(%a, %b), metadata={op_name="jit(f)/dot_general" stack_frame_id=9}')
    own = parse_instruction('%d = f32[2]{0} dot(%a, %b), metadata={op_name="jit(f)/dot_general" stack_frame_id=11}')
    older = parse_instruction('%d = f32[2]{0} dot(%a, %b), metadata={op_name="jit(f)/dot_general" '
                              'source_file="/home/me/proj/train.py" source_line=250}')
    assert (instruction_source(packaged, frames), instruction_library(packaged, frames)) == (
        "train.py:250", "esm2quinox/_layer.py:67")
    assert (instruction_source(own, frames), instruction_library(own, frames)) == ("model.py:40", None)
    # An older jax's source_file/source_line: one line only.
    assert (instruction_source(older, frames), instruction_library(older, frames)) == ("train.py:250", None)
    # A table of plain lines (as callers built before) still names the user's line.
    assert instruction_source(packaged, {9: "train.py:250"}) == "train.py:250"
    assert instruction_library(packaged, {9: "train.py:250"}) is None


def test_collectives_are_split_by_the_models_line():
    body = frame_tables() + '''ENTRY %main (p: f32[8]) -> (f32[64], f32[64], f32[64]) {
  %p = f32[8]{0} parameter(0)
  %ag.1 = f32[64]{0} all-gather(%p), dimensions={0}, metadata={op_name="jit(f)/vmap(eqx.nn.Linear)/dot_general" stack_frame_id=9}
  %ag.2 = f32[64]{0} all-gather(%p), dimensions={0}, metadata={op_name="jit(f)/vmap(eqx.nn.Linear)/dot_general" stack_frame_id=6}
  %ag.3 = f32[64]{0} all-gather(%p), dimensions={0}, metadata={op_name="jit(f)/vmap(eqx.nn.Linear)/dot_general" stack_frame_id=9}
  ROOT %t = (f32[64]{0}, f32[64]{0}, f32[64]{0}) tuple(%ag.1, %ag.2, %ag.3)
}
'''
    ops = top_collectives(analyze_hlo(body))
    assert [(op.source, op.library, op.count) for op in ops] == [
        ("train.py:250", "esm2quinox/_layer.py:67", 2), ("train.py:250", "esm2quinox/_esm2.py:123", 1)]
    assert ops[0].key != ops[1].key  # One JAX op name from two lines of the model: two collectives.
    assert "esm2quinox/_layer.py:67 via train.py:250" in collectives_table(ops)


def test_json_writes_the_library_only_where_there_are_two_lines():
    two = PeakBuffer(8, "temp", "jit(f)/exp", "f32[2]", "train.py:250", library="esm2quinox/_esm2.py:123")
    one = PeakBuffer(8, "temp", "jit(f)/exp", "f32[2]", "model.py:9")
    same = PeakBuffer(8, "temp", "jit(f)/exp", "f32[2]", "model.py:9", library="model.py:9")
    assert two.to_json()["library"] == "esm2quinox/_esm2.py:123" and PeakBuffer.from_json(two.to_json()) == two
    assert "library" not in one.to_json() and "library" not in same.to_json()
    assert PeakBuffer.from_json(one.to_json()) == one
    op = CollectiveOp("all-gather", "jit(f)/x", "train.py:250", 2, 64, library="esm2quinox/_esm2.py:123")
    assert CollectiveOp.from_json(op.to_json()) == op
    assert "library" not in CollectiveOp("all-gather", "jit(f)/x", "m.py:1", 2, 64).to_json()
    assert "esm2quinox/_esm2.py:123 via train.py:250" in buffers_table([two])
    assert "model.py:9" in buffers_table([one]) and " via " not in buffers_table([one])


@pytest.mark.parametrize("config", ["eqx-tiny", "lm-tiny", "nnx-tiny"])
def test_goldens_of_the_users_own_models_read_and_write_back_byte_identical(config):
    for path in sorted((ROOT / "golden" / config).glob("*.json")):
        details = json.loads(path.read_text())["details"]
        assert Details.from_json(details).to_json() == details, path


def test_cached_library_lines_follow_the_code_like_the_users():
    # Lowered program: two ops of the model's line 67 under the user's line 250, one of line 123.
    sequence = ["train.py:250", "train.py:250", "train.py:250", None,
                "esm2quinox/_layer.py:67", "esm2quinox/_layer.py:67", "esm2quinox/_esm2.py:123", None]
    details = Details([PeakBuffer(8, "temp", "a", "f32[2]", "train.py:250", library="esm2quinox/_layer.py:67"),
                       PeakBuffer(4, "temp", "b", "f32[1]", "train.py:250", library="esm2quinox/_esm2.py:123")], [])
    assert details.sources() == {"train.py:250", "esm2quinox/_layer.py:67", "esm2quinox/_esm2.py:123"}
    stored = anchors(details.sources(), sequence)
    # The user's file gained a line at the top; the package did not change.
    now = ["train.py:251"] * 3 + [None, "esm2quinox/_layer.py:67", "esm2quinox/_layer.py:67", "esm2quinox/_esm2.py:123",
                                  None]
    lines = remap(stored, now, needed=details.sources())
    moved = details.with_sources(lines)
    assert [(b.source, b.library) for b in moved.peak_buffers] == [
        ("train.py:251", "esm2quinox/_layer.py:67"), ("train.py:251", "esm2quinox/_esm2.py:123")]
    # The package was upgraded and one of its lines became two: not mappable, compiled afresh.
    upgraded = now[:4] + ["esm2quinox/_layer.py:67", "esm2quinox/_layer.py:69", "esm2quinox/_esm2.py:123", None]
    assert remap(stored, upgraded, needed=details.sources()) is None
    # A stored library line the lowered program does not name at all: not mappable either.
    assert remap(anchors({"train.py:250"}, sequence), now, needed=details.sources()) is None


def test_source_sequence_has_the_library_lines_after_the_users():
    text = frame_tables() + '''ENTRY %main.3 {
  p.1 = f32[4]{0} parameter(0)
  e.2 = f32[4]{0} exponential(p.1), metadata={op_name="jit(f)/exp" stack_frame_id=9}
  e.3 = f32[4]{0} exponential(e.2), metadata={op_name="jit(f)/exp" stack_frame_id=11}
}
'''
    assert source_sequence(text) == [None, "train.py:250", "model.py:40", None, "esm2quinox/_layer.py:67", None]


# --- A real compile of a packaged model ------------------------------------------------------------

@pytest.fixture(scope="module")
def esm2(tmp_path_factory):
    """ESM2 (esm2quinox, in site-packages) compiled on cpu-4 through the pipeline with a figures
    cache: the fresh measurement, then the cached one of a fresh lowering (one compile)."""
    am = _adapter_models()
    from aotcheck.pipeline.cache import FiguresCache
    from aotcheck.pipeline.case import Case
    from aotcheck.pipeline.stages import lower

    cache = FiguresCache(tmp_path_factory.mktemp("cache"))
    case = Case.of("esm2-8m", "train_step", "cpu-4")
    # ESM2's config at a small size (a few seconds to compile): the program runs every line of
    # esm2quinox's model that ESM2 8M's does.
    small = dict(num_layers=2, embed_size=64, num_heads=4, batch=8, seq=32)
    fresh = lower(case, am.esm2_config(**small)).measure(cache)
    cached = lower(case, am.esm2_config(**small)).measure(cache)
    return fresh, cached, am


@pytest.mark.heavy  # One real compile of ESM2 on cpu-4: 15-20 s on 2 cores.
def test_a_packaged_models_buffers_and_collectives_name_its_lines_and_the_call(esm2):
    fresh, _, am = esm2
    call = f"tests/adapter_models.py:{_loss_line(am)}"
    named = [b for b in fresh.details.peak_buffers if b.source == call]
    assert named, fresh.details.peak_buffers
    assert all(b.library and b.library.startswith("esm2quinox/") for b in named), named
    assert len({b.library for b in named}) > 1  # Different layers of the model, one call line.
    assert all(b.library is None for b in fresh.details.peak_buffers if b.source != call)  # Arguments, aotcheck's
    ops = [op for op in fresh.details.collectives if op.library]
    assert ops and all(op.source == call and op.library.startswith("esm2quinox/") for op in ops)
    assert f" via {call}" in buffers_table(fresh.details.peak_buffers)


@pytest.mark.heavy  # One real compile of ESM2 on cpu-4: 15-20 s on 2 cores.
def test_a_cache_hit_names_the_library_lines_a_fresh_compile_does(esm2):
    fresh, cached, _ = esm2
    assert not fresh.cached and cached.cached
    assert cached.details == fresh.details
    assert cached.details.to_json() == fresh.details.to_json()
    assert any("library" in b for b in cached.details.to_json()["peak_buffers"])


def _adapter_models():
    """tests/adapter_models.py as the ini's aot_config_modules loaded it (importing it again would
    register its configs twice), or imported here when this run's ini does not load it."""
    path = ROOT / "tests" / "adapter_models.py"
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
            return module
    import adapter_models

    return adapter_models


def _loss_line(am) -> int:
    """The line of the user's loss that calls the model (``jax.vmap(model)(...)``)."""
    import inspect

    lines, start = inspect.getsourcelines(am.esm2_config)
    return start + next(i for i, line in enumerate(lines) if "jax.vmap(model)" in line)
