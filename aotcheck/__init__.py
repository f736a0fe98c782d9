"""aotcheck: AOT-compile JAX programs for TPU topologies and NVIDIA GPU hosts on a CPU, and gate their figures.

Public surface::

    from aotcheck import (
        register, REGISTRY,                              # named configs
        TrainerConfig, InferenceConfig, FunctionConfig, MeshSpec,
        ServingConfig, Bucketed, Limits, doubling, padded,  # a server over its shape buckets
        compile_trainer_programs, compile_inference_programs, compile_function,
        get_devices_for_topology, parse_topology,
        fsdp, replicate,                                 # partition rules for unannotated models
        program_figures,                                 # memory / FLOP figures of a Compiled
        Case, lower, Measurement,                        # the pipeline's stages, one case at a time
        GateSettings, GateSession, check_case,           # the gate, without pytest
        Outcome, Verdict, Report,                        # what it decides, typed
    )
"""

from aotcheck import _runtime  # noqa: F401  (sets libtpu's environment first)
from aotcheck.errors import Allocation, CompileError, ConfigError, OutOfMemory, OutOfMemorySpace, Overflow, WorkerCrashed
from aotcheck.figures import known_kernels  # noqa: F401  (the costs of the kernels jax ships)
from aotcheck.figures.kernels import KernelCall, KernelCostError, kernel_cost
from aotcheck.figures.program import program_figures
from aotcheck.gate.check import check_case
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.export import ExportError, ExportMismatch, Manifest, load
from aotcheck.pipeline.measurement import Measurement
from aotcheck.pipeline.stages import lower
from aotcheck.programs.compile import (
    compile_function,
    compile_inference_programs,
    compile_trainer_programs,
    lower_inference_programs,
    lower_trainer_programs,
)
from aotcheck.programs.config import FunctionConfig, InferenceConfig, TrainerConfig
from aotcheck.programs.knob import Knob
from aotcheck.programs.options import OptionsError, default_compiler_options, parse_libtpu_init_args
from aotcheck.programs.serving import BucketError, Bucketed, Limits, ServingConfig, doubling, padded
from aotcheck.programs.registry import REGISTRY, ConfigNotFound, ProgramNotFound, Registry, RegistryError, register
from aotcheck.session import GateSession
from aotcheck.settings import GateSettings
from aotcheck.targets.mesh import MeshError, MeshSpec, build_mesh
from aotcheck.targets.partition import PartitionError, fsdp, replicate
from aotcheck.targets.devices import get_devices_for_topology
from aotcheck.targets.topology import TopologyError, parse_topology

from aotcheck.programs import reads as _reads

# From here on, what a project's code reads besides its code (variables, data files) is recorded: the
# inputs index answers a case only where none of it changed (aotcheck.programs.reads).
_reads.install()

__version__ = "0.1.0"

__all__ = [
    "REGISTRY",
    "BucketError",
    "Bucketed",
    "Limits",
    "ServingConfig",
    "doubling",
    "padded",
    "Case",
    "Allocation",
    "CompileError",
    "ConfigError",
    "ConfigNotFound",
    "FunctionConfig",
    "GateSession",
    "GateSettings",
    "InferenceConfig",
    "KernelCall",
    "KernelCostError",
    "Knob",
    "kernel_cost",
    "load",
    "ExportError",
    "ExportMismatch",
    "Manifest",
    "Measurement",
    "MeshError",
    "MeshSpec",
    "OptionsError",
    "OutOfMemory",
    "OutOfMemorySpace",
    "Outcome",
    "Overflow",
    "PartitionError",
    "ProgramNotFound",
    "Registry",
    "RegistryError",
    "Report",
    "TopologyError",
    "TrainerConfig",
    "Verdict",
    "WorkerCrashed",
    "build_mesh",
    "check_case",
    "compile_function",
    "compile_inference_programs",
    "compile_trainer_programs",
    "default_compiler_options",
    "fsdp",
    "get_devices_for_topology",
    "lower",
    "lower_inference_programs",
    "lower_trainer_programs",
    "parse_libtpu_init_args",
    "parse_topology",
    "program_figures",
    "register",
    "replicate",
]
