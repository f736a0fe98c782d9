"""MaxText's own train step through ``aotcheck[maxtext]``, installed for real in a fresh venv (marker
``toolchains``: run by CI's test command, see DEVELOPING.md).

The venv holds the lock (``requirements.lock``), then ``pip install -e .[maxtext]`` constrained by the lock
and ``requirements-maxtext.lock``. A user module of five lines registers two small MaxText configs
(MaxText's packaged ``base.yml`` with smaller sizes), and then:

- on v5e-16 and v4-8, with aotcheck's presets off, the adapter's memory figures equal, to the byte,
  what MaxText's own ``train_compile`` prints for the same config (argument, output, alias, temp,
  generated code), and so does XLA's raw FLOP count: the same program;
- pytest gates them (goldens written, then a second, uncached run passes against them), the summary
  names MaxText's files as the source lines, and nothing of MaxText's chatter reaches the terminal;
- flags MaxText reads that ``adapt`` was not given are an error naming where to give them;
- ``aotcheck fit`` finds the largest per-device batch, and MaxText's own OOM check
  (``train_compile.is_oom``) agrees: that batch compiles, one more does not;
- JAX's persistent compilation cache, which MaxText's config setup turns on, holds nothing after
  aotcheck's runs (``$HOME/jax_cache``; ``train_compile`` itself writes there).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from venvs import clean_env, shared_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.toolchains

SMALL = dict(base_emb_dim=256, base_num_query_heads=4, base_num_kv_heads=4, base_mlp_dim=512,
             base_num_decoder_layers=2, head_dim=64, max_target_length=256, vocab_size=1024)
LONG = {**SMALL, "max_target_length": 8192}
# A slice that is a torus (v5p-128, 4x4x4 chips, wraparound on every axis): d 1024, 4 layers, 2048 tokens.
MID = dict(base_emb_dim=1024, base_num_query_heads=8, base_num_kv_heads=8, base_mlp_dim=4096,
           base_num_decoder_layers=4, head_dim=128, max_target_length=2048, vocab_size=32000)
# MaxText's own Kimi K2 (1T parameters, 384 experts) on v5p-1024, one 4096-token sequence per device.
KIMI = dict(model_name="kimi-k2-1t", per_device_batch_size=1, max_target_length=4096)
# Mixtral-style (8 experts, top 2, dropless megablox), d 1024, 2 layers, 1024 tokens, 2 per device.
MOE = dict(model_name="mixtral-8x7b", override_model_config=True, base_emb_dim=1024, base_num_query_heads=8,
           base_num_kv_heads=8, head_dim=128, base_mlp_dim=2048, base_moe_mlp_dim=2048, base_num_decoder_layers=2,
           num_experts=8, num_experts_per_tok=2, vocab_size=32000, max_target_length=1024, sparse_matmul=True)

# The user's module: what docs/adapters.md's MaxText section shows.
CONFTEST = f'''import json, os
import aotcheck
from aotcheck.adapters import maxtext
SMALL, LONG, MOE, MID, KIMI = {SMALL!r}, {LONG!r}, {MOE!r}, {MID!r}, {KIMI!r}
# A job that evaluates (MaxText's own eval step too), and overrides a test gives through the environment.
aotcheck.register("llama-eval", lambda: maxtext.adapt(maxtext.packaged(), per_device_batch_size=2, eval_interval=100,
                                                      **SMALL).trainer())
aotcheck.register("llama-knobs", lambda: maxtext.adapt(maxtext.packaged(), per_device_batch_size=2, **SMALL,
                                                       **json.loads(os.environ.get("AOT_TEST_OVERRIDES", "{{}}"))).trainer())
aotcheck.register("kimi", lambda: maxtext.adapt(maxtext.packaged(), **KIMI).trainer())
aotcheck.register("llama-small", lambda: maxtext.adapt(maxtext.packaged(), per_device_batch_size=2, **SMALL).trainer())
aotcheck.register("llama-mid", lambda: maxtext.adapt(maxtext.packaged(), per_device_batch_size=2, **MID).trainer())
aotcheck.register("llama-long", lambda: maxtext.adapt(maxtext.packaged(), per_device_batch_size=2, **LONG).trainer())
for attention in ("autoselected", "dot_product"):  # One 8192-token sequence per device, splash or XLA's attention.
    aotcheck.register(f"llama-long-{{attention}}", lambda attention=attention: maxtext.adapt(
        maxtext.packaged(), per_device_batch_size=1, attention=attention, **LONG).trainer())
for ep in (1, 4):  # All 16 devices FSDP, or FSDP 4 x expert parallelism 4 (tokens moved by ragged all-to-all).
    aotcheck.register(f"mixtral-ep{{ep}}", lambda ep=ep: maxtext.adapt(
        maxtext.packaged(), per_device_batch_size=2, ici_fsdp_parallelism=16 // ep, ici_expert_parallelism=ep,
        **MOE).trainer())
'''
INI = "[pytest]\naot_topologies = v5e-16 v4-8\naot_configs = llama-small\naot_default_options = none\n"
MEMORY = {"argument_bytes": "argument_size_in_bytes", "output_bytes": "output_size_in_bytes",
          "alias_bytes": "alias_size_in_bytes", "temp_bytes": "temp_size_in_bytes",
          "generated_code_bytes": "generated_code_size_in_bytes"}


@pytest.fixture(scope="module")
def maxtext_env(tmp_path_factory) -> dict[str, str]:
    """The venv's python, a project holding the user module, and a HOME of its own."""
    # The venv is built once for the run, whichever xdist worker asks first; each worker has its own project.
    py = shared_env(tmp_path_factory, "maxtext", "3.12", "requirements.lock",
                    install=("-e", ".[maxtext]", "-c", "requirements.lock", "-c", "requirements-maxtext.lock"))
    where = tmp_path_factory.mktemp("maxtext")
    check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    project, home = where / "project", where / "home"
    project.mkdir()
    home.mkdir()
    (project / "conftest.py").write_text(CONFTEST)
    (project / "pytest.ini").write_text(INI)
    return {"py": py, "project": str(project), "home": str(home)}


def run(env: dict[str, str], *args: str, home: str | None = None, timeout: int = 1200,
        extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {**clean_env(), "HOME": home or env["home"], **(extra or {})}
    return subprocess.run([env["py"], *args], cwd=env["project"], capture_output=True, text=True, timeout=timeout,
                          env=environment)


def train_compile_memory(env: dict[str, str], topology: str, overrides: dict, tmp_path: Path) -> dict[str, float]:
    """What MaxText's own tool prints: its memory analysis and XLA's raw FLOPs (HOME apart: it writes a cache)."""
    out = run(env, "-c", "import maxtext, os, sys; from absl import app; "
                         "from maxtext.trainers.pre_train.train_compile import main; "
                         "sys.argv = ['train_compile', os.path.join(os.path.dirname(maxtext.__file__), 'configs', "
                         "'base.yml'), *sys.argv[1:]]; app.run(main)",
              f"compile_topology={topology}", "compile_topology_num_slices=1",
              *(f"{k}={v}" for k, v in {"per_device_batch_size": 2, **overrides}.items()), home=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    memory = re.search(r"Memory analysis: CompiledMemoryStats\((.*)\)", out.stdout)[1]
    found = {k: float(v) for k, v in re.findall(r"(\w+)=(\d+)", memory)}
    found["flops"] = float(re.search(r"'flops': ([0-9.e+]+)", out.stdout)[1])
    return found


@pytest.mark.parametrize("topology, config, sizes", [("v5e-16", "llama-small", SMALL), ("v4-8", "llama-small", SMALL),
                                                     ("v5p-128", "llama-mid", MID), ("v5p-1024", "kimi", KIMI)])
def test_the_adapters_memory_is_train_compiles_to_the_byte(maxtext_env, topology, config, sizes, tmp_path):
    """v5p-128 and v5p-1024 are tori: compiled without their wraparound, the same lowered program's
    temp was 1.170x (the d-1024 step) and 1.274x (Kimi K2 1T: 21 GB per device) train_compile's
    (the d-1024 step's FSDP parameters gathered by 17 all-reduces, no all-gather; with the torus: 58
    all-gathers, 8 all-reduces). Kimi: ~100 s per compile here."""
    theirs = train_compile_memory(maxtext_env, topology, sizes, tmp_path)
    out = run(maxtext_env, "-m", "aotcheck", "compile", config, "--topology", topology,
              "--default-options", "none", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    ours = json.loads(out.stdout)["train_step"]["figures"]  # stdout is the JSON alone: MaxText's prints held back.
    for figure, field in MEMORY.items():
        assert ours[figure] == theirs[field], (topology, figure, ours[figure], theirs[field])
    assert ours["flops_xla"] == theirs["flops"]
    assert ours["peak_params_bytes"] > 0 and ours["peak_opt_state_bytes"] > ours["peak_params_bytes"]


TABLES = """
import json
from maxtext.utils.accelerator_to_spec_map import UserFacingNameToSystemCharacteristics as theirs
from aotcheck.targets.platform import TPU
from aotcheck.targets.topology import topologies
ours = {t.name: t for t in topologies(TPU)}
rows = {}
for name, spec in theirs.items():
    name = name.replace("tpu7x-", "7x-").replace("v5litepod-", "v5e-")
    if spec.platform == "tpu" and name in ours:
        t = ours[name]
        rows[name] = [[spec.topology_name, spec.chip_config_name, list(spec.chips_per_host_bounds), spec.devices_per_slice,
                       list(spec.wrap)],
                      [t.libtpu_name, t.hardware.chip_config, list(t.chips_per_host_bounds), t.num_devices,
                       list(t.wraparound)]]
print(json.dumps(rows))
"""


def test_every_slice_is_described_as_maxtexts_table_describes_it(maxtext_env):
    """Topology, chip config, chips per host, devices per slice and torus wraparound: every TPU size
    both tables list (MaxText's accelerator_to_spec_map, the one its train_compile builds devices from)."""
    out = run(maxtext_env, "-c", TABLES)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) >= 200 and any(r[0][4] == [True, True, True] for r in rows.values())
    differ = {name: pair for name, pair in rows.items() if pair[0] != pair[1]}
    assert not differ, differ


LEAK_CHECK = """
import json, os, sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import aotcheck
import conftest  # noqa: F401 (registers llama-small)
from aotcheck.programs.lowering import lower_config
from aotcheck.targets.topology import Target

def make_args(mesh):
    return (jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)

toy = aotcheck.FunctionConfig(fn=lambda x: jax.random.normal(jax.random.key(0), x.shape) * x, make_args=make_args)
target = Target.of("v5e-16")
before = (dict(jax.config.values), dict(os.environ), lower_config(toy, target)["step"].as_text())
maxtext_step = lower_config(aotcheck.REGISTRY.get("llama-small").program("train_step"), target)["train_step"]
after = (dict(jax.config.values), dict(os.environ), lower_config(toy, target)["step"].as_text())
changed = sorted(k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k))
environ = sorted(k for k in set(before[1]) | set(after[1]) if before[1].get(k) != after[1].get(k)
                 and (k in before[1] or k in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")))
print(json.dumps({"flags": changed, "environ": environ, "same_program": before[2] == after[2]}))
"""


def test_no_flag_of_maxtexts_leaks_into_the_next_program(maxtext_env):
    """MaxText sets jax flags (its PRNG, size-one mesh axes, a compilation cache) and XLA_FLAGS while its step
    is made and lowered; the next program in the same process is lowered as if MaxText had never run (a
    random program: the PRNG flag would change it), and no variable that was set, nor XLA_FLAGS or
    LIBTPU_INIT_ARGS, is left changed (variables its imports add, such as HF_DATASETS_DISABLE_DILL, stay)."""
    out = run(maxtext_env, "-c", LEAK_CHECK)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {"flags": [], "environ": [], "same_program": True}, found


def test_the_user_module_gates_and_names_maxtexts_lines(maxtext_env):
    first = run(maxtext_env, "-m", "pytest", "-p", "no:cacheprovider", "--update-golden", "--aot-no-cache")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    golden = Path(maxtext_env["project"], "golden", "llama-small")
    assert sorted(p.name for p in golden.iterdir()) == ["train_step@v4-8x1.json", "train_step@v5e-16x1.json"]
    record = json.loads((golden / "train_step@v5e-16x1.json").read_text())
    assert record["compiler_options"] == {"xla_tpu_spmd_rng_bit_generator_unsafe": "true"}  # MaxText's flag.
    sources = {b.get("source") for b in record["details"]["peak_buffers"]} - {None}
    assert sources and all(s.startswith("maxtext/") for s in sources), sources
    # Splash attention: counted over its mask's blocks (aotcheck.figures.known_kernels), nothing left out.
    kernels = record["details"]["kernels"]
    assert kernels and all(k["name"].startswith("splash_mha") and k["basis"] == "registered" for k in kernels)
    assert not record["details"].get("uncounted"), record["details"]["uncounted"]
    terminal = first.stdout + first.stderr
    assert "[NO-OP]" not in terminal and "base_output_directory" not in terminal and "Traceback" not in terminal
    project = Path(maxtext_env["project"])  # MaxText's output directory (maxtext_output) is never made there.
    assert {p.name for p in project.iterdir()} <= {"conftest.py", "pytest.ini", "golden", ".aotcheck-cache"}
    second = run(maxtext_env, "-m", "pytest", "-p", "no:cacheprovider", "--aot-no-cache")
    assert second.returncode == 0 and "2 passed" in second.stdout, second.stdout[-3000:]
    assert not Path(maxtext_env["home"], "jax_cache").exists()  # Never written by aotcheck's compiles.


def test_splash_counts_the_blocks_its_mask_visits_against_xlas_dense_attention(maxtext_env):
    """MaxText at 8192 tokens (d 256, 4 heads of 64, 2 layers, one sequence per device, v5e-16): its
    splash kernels (512-blocks, a causal mask: 136 of 256 block pairs) against the same step with
    dot-product attention, which computes every pair. The block grid puts the step at about 0.77 of
    the dense one (docs/adapters.md); it must fall in [0.68, 0.85], and splash's kernels are counted, not named."""
    flops, results = {}, {}
    for attention in ("autoselected", "dot_product"):
        out = run(maxtext_env, "-m", "aotcheck", "compile", f"llama-long-{attention}", "--topology", "v5e-16",
                  "--default-options", "none", "--json")
        assert out.returncode == 0, out.stderr[-3000:]
        results[attention] = json.loads(out.stdout)["train_step"]
        flops[attention] = results[attention]["figures"]["flops"]
        assert not results[attention]["details"].get("uncounted"), results[attention]["details"]["uncounted"]
    kernels = {k["name"].split("_segmented")[0]: k["basis"] for k in results["autoselected"]["details"]["kernels"]}
    assert kernels == {"splash_mha_fwd": "registered", "splash_mha_dq": "registered",
                       "splash_mha_dkv": "registered"}, kernels
    ratio = flops["autoselected"] / flops["dot_product"]
    print(f"splash / dot-product FLOPs: {ratio:.4f} ({flops})")
    assert 0.68 <= ratio <= 0.85, flops


def test_megablox_under_expert_parallelism_counts_its_buffer_and_says_so(maxtext_env):
    """Megablox's gmm declares its cost over its static buffer. Without expert parallelism that buffer
    is exactly the routed rows (T·k: 2048 tokens x top 2 per device), so gmm's count is the analytic
    2·T·k·d·f per matmul (12 per step: 3 matmuls x 2 layers x forward and remat). Under dropless
    expert parallelism 4 the buffer is sized for the worst case, 4x the rows a device receives on
    average (the same tokens, spread over 4 devices): the declared count is 4.000x, kept, marked as
    a bound (a note on the case says so). Splash's kernels, read through the scan's memory-space copies of
    their mask, are counted in both."""
    runs = {}
    for ep in (1, 4):
        out = run(maxtext_env, "-m", "aotcheck", "compile", f"mixtral-ep{ep}", "--topology", "v5e-16",
                  "--default-options", "none", "--json")
        assert out.returncode == 0, out.stderr[-3000:]
        details = json.loads(out.stdout)["train_step"]["details"]
        assert not details.get("uncounted"), details["uncounted"]
        runs[ep] = details["kernels"]
        assert {k["basis"] for k in runs[ep] if k["name"].startswith("splash")} == {"registered"}
    gmm = {ep: [k for k in runs[ep] if k["name"] in ("gmm", "tgmm")] for ep in runs}
    assert all(k["basis"] == "declared" and k["bound"] for ep in gmm for k in gmm[ep])
    per_matmul = 2 * 2048 * 2 * 1024 * 2048
    forward = [k for k in gmm[1] if k["name"] == "gmm" and k["count"] == 12]
    assert len(forward) == 1 and forward[0]["flops"] == 12 * per_matmul
    ratio = sum(k["flops"] for k in gmm[4]) / sum(k["flops"] for k in gmm[1])
    print(f"megablox declared under EP 4 / EP 1 (= routed): {ratio:.4f}")
    assert ratio == 4.0


def test_flags_maxtext_reads_that_adapt_was_not_given_are_a_clear_error(maxtext_env):
    """MaxText also reads compile_xla_flags from M_COMPILE_XLA_FLAGS (and its file): aotcheck would not send
    them, so the case is an error naming where to give them, without a traceback or MaxText's chatter."""
    out = subprocess.run([maxtext_env["py"], "-m", "aotcheck", "compile", "llama-small", "--topology", "v5e-16",
                          "--default-options", "none"], cwd=maxtext_env["project"], capture_output=True, text=True,
                         timeout=600, env={**clean_env(), "HOME": maxtext_env["home"],
                                           "M_COMPILE_XLA_FLAGS": "--xla_tpu_enable_latency_hiding_scheduler=true"})
    assert out.returncode != 0
    assert ("MaxText's config sets compile_xla_flags='--xla_tpu_enable_latency_hiding_scheduler=true' (from its file "
            "or M_COMPILE_XLA_FLAGS)") in out.stderr and "pass compile_xla_flags=... to adapt" in out.stderr
    assert "Traceback" not in out.stderr and "[NO-OP]" not in out.stderr, out.stderr[-2000:]


def test_the_fit_is_maxtexts_own_oom_boundary(maxtext_env):
    out = run(maxtext_env, "-m", "aotcheck", "fit", "llama-long", "--topology", "v5e-16", "--default-options",
              "none", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    fit = json.loads(out.stdout)["fit"]
    found = fit["max_size"]
    assert fit["knob"] == "per_device_batch_size" and found > 2 and not fit["upper_bound"]
    check = run(maxtext_env, "-c", "import maxtext, os, sys\n"
                "from maxtext.trainers.pre_train.train_compile import is_oom\n"
                "base = os.path.join(os.path.dirname(maxtext.__file__), 'configs', 'base.yml')\n"
                "for n in (int(sys.argv[1]), int(sys.argv[1]) + 1):\n"
                "    argv = ['x', base, 'compile_topology=v5e-16', 'compile_topology_num_slices=1',\n"
                "            f'per_device_batch_size={n}', *sys.argv[2:]]\n"
                "    print('OOM', n, is_oom(argv), flush=True)\n",
                str(found), *(f"{k}={v}" for k, v in LONG.items()), home=str(Path(maxtext_env["home"]).parent))
    assert check.returncode == 0, check.stderr[-3000:]
    assert re.findall(r"^OOM (\d+) (\w+)$", check.stdout, re.M) == [(str(found), "False"), (str(found + 1), "True")]


def test_maxtexts_eval_step_where_the_job_evaluates_and_overrides_its_code_never_reads(maxtext_env, tmp_path):
    """MaxText's own eval_step (train_utils.jit_eval_step's: nothing donated, the eval batch) where the config
    evaluates (eval_interval > 0): its FLOPs the forward's, a quarter of the train step's under
    remat_policy full (forward, its recompute, the backward's two). Then Hunyuan3's case: with remat_policy
    full, mlpwi and qkv_proj (read only by remat_policy custom) leave the lowered module as it was, and the
    case says so by name; remat_policy minimal changes it, and no such note is said."""
    def check(configs: str, *args: str, overrides: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
        out = run(maxtext_env, "-m", "aotcheck", "check", "--configs", configs, "--topologies", "v5e-16", "--slices", "1",
                  "--no-cache", "--golden-dir", str(tmp_path / "golden"), "--report", str(tmp_path / "r.json"),
                  *args, extra={"AOT_TEST_OVERRIDES": json.dumps(overrides or {})})
        assert out.returncode in (0, 1), out.stdout[-3000:] + out.stderr[-3000:]
        return out, {c["case"]: c for c in json.loads((tmp_path / "r.json").read_text())["cases"]}

    out, cases = check("llama-eval,llama-knobs", "--update-golden")
    assert out.returncode == 0 and set(cases) == {"llama-eval/train_step@v5e-16x1", "llama-eval/eval_step@v5e-16x1",
                                                  "llama-knobs/train_step@v5e-16x1"}, out.stdout[-3000:]
    assert out.stdout.count("llama-knobs has a train step and no eval step") == 1 and "llama-eval has" not in out.stdout
    train, evaluate = (cases[f"llama-eval/{p}@v5e-16x1"]["measured"]["figures"] for p in ("train_step", "eval_step"))
    assert evaluate["alias_bytes"] == 0 and train["alias_bytes"] > 0  # The eval keeps the state; the train donates it.
    assert 0.24 < evaluate["flops"] / train["flops"] < 0.27, (evaluate["flops"], train["flops"])  # 0.2545 measured.
    golden = json.loads((tmp_path / "golden/llama-knobs/train_step@v5e-16x1.json").read_text())
    assert golden["settings"]["per_device_batch_size"] == 2 and len(golden["program"]) == 16

    out, cases = check("llama-knobs", overrides={"mlpwi": "device", "qkv_proj": "device"})
    (case,) = cases.values()
    note = ("llama-knobs/train_step@v5e-16x1: mlpwi (unset -> 'device'), qkv_proj (unset -> 'device') changed, and "
            "the program did not: the lowered module is the golden's, so the code never read them")
    assert case["verdict"] == "pass" and note in case["notes"] and note in out.stdout, out.stdout[-3000:]

    out, cases = check("llama-knobs", overrides={"remat_policy": "minimal"})
    (case,) = cases.values()
    assert case["verdict"] != "pass" and "the program did not" not in out.stdout, out.stdout[-3000:]
