"""aotcheck.errors: every error crosses the compile worker's pipe as itself (its class, its message,
its fields), and a user's error as a UserCodeError that names its class."""

import importlib
import pkgutil

import pytest

import aotcheck
from aotcheck.pipeline.chip import RuntimeRefused
from aotcheck.pipeline.export import ExportMismatch, Mismatch
from aotcheck.errors import (AotcheckError, Overflow, OutOfMemory, OutOfMemorySpace, UserCodeError, WorkerCrashed,
                             error_from_json, error_to_json, error_type, out_of_memory)

for info in pkgutil.walk_packages(aotcheck.__path__, "aotcheck."):  # Every error class the package defines.
    if info.name != "aotcheck.__main__":
        importlib.import_module(info.name)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


VMEM = Overflow("vmem", 2**27, 2**24, "scoped", op_name="jit(f)/pallas_call", kernel=True)
# The classes whose constructor takes more than a message, each with its fields set.
SAMPLES = {
    OutOfMemory: OutOfMemory("RESOURCE_EXHAUSTED: Ran out of memory", details={"peak_buffers": [{"bytes": 1}]}),
    OutOfMemorySpace: OutOfMemorySpace("E1001: CompileTimeScopedVmemOom", overflow=VMEM, details={"x": 1}),
    WorkerCrashed: WorkerCrashed("the compile process died", signal_name="SIGKILL", tail=("last words",),
                                 log=("a", "b"), small_vmem_limit={"kib": 64, "default_kib": 16384}),
    UserCodeError: UserCodeError("mylib.Oops: no", type_name="Oops"),
    RuntimeRefused: RuntimeRefused("the runtime said no", where="compile"),
    ExportMismatch: ExportMismatch("another chip", mismatches=(Mismatch("device_kind", "TPU v5 lite", "cpu"),)),
}
CLASSES = sorted({AotcheckError, *_subclasses(AotcheckError)}, key=lambda c: f"{c.__module__}.{c.__qualname__}")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__qualname__)
def test_every_error_of_aotchecks_crosses_the_pipe_as_itself(cls):
    error = SAMPLES.get(cls) or cls("the message, which names the input and the fix")
    again = error_from_json(error_to_json(error))
    assert type(again) is cls and str(again) == str(error) and again.fields() == error.fields()
    assert bool(error.fields()) == (cls in SAMPLES)  # Each declared field crosses (FIELDS, records.py).
    assert error_type(again) == error_type(error)


def test_there_are_errors_to_check_and_each_is_a_class_of_the_hierarchy():
    assert len(CLASSES) >= 20, [c.__qualname__ for c in CLASSES]  # The walk found the package's errors.


@pytest.mark.parametrize("error", [KeyError("logits"), ValueError("bad"), ZeroDivisionError("division by zero")])
def test_pythons_own_errors_come_back_as_their_class(error):
    again = error_from_json(error_to_json(error))
    assert type(again) is type(error) and again.args == error.args


def test_a_users_error_class_is_named_not_imported():
    class Oops(Exception):
        pass

    again = error_from_json(error_to_json(Oops("not here")))
    assert isinstance(again, UserCodeError) and error_type(again) == "Oops" and str(again).endswith("Oops: not here")


@pytest.mark.parametrize("message, oom", [("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm", True),
                                          ("INVALID_ARGUMENT: bad sharding", False)])
def test_out_of_memory_is_told_from_xlas_words(message, oom):
    assert out_of_memory(message) is oom
