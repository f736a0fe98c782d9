"""Helpers of the end-to-end fault tests: configs that fail in every way a run must survive, and the
check that no traceback of aotcheck's own code reached the user."""

from toy import CONFTEST


def no_aotcheck_traceback(text):
    assert "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]


FAULTS = CONFTEST + '''
import signal, sys

def crash_while_tracing(kind):
    def fn(x, w):
        print(f"about to die by {kind}", file=sys.stderr, flush=True)
        if kind == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if kind == "kill":  # What the host's OOM killer sends.
            os.kill(os.getpid(), signal.SIGKILL)
        os.abort()
    return fn

aotcheck.register("segv", aotcheck.FunctionConfig(fn=crash_while_tracing("segv"), make_args=make_args))
aotcheck.register("abort", aotcheck.FunctionConfig(fn=crash_while_tracing("abort"), make_args=make_args))
aotcheck.register("oomkilled", aotcheck.FunctionConfig(fn=crash_while_tracing("kill"), make_args=make_args))
# A launch flag that kills libtpu: a scoped VMEM limit too small for the all-reduce's emitter.
aotcheck.register("smallvmem", aotcheck.FunctionConfig(fn=lambda x, w: jnp.sum(x @ w), make_args=make_args,
                                                       libtpu_init_args="--xla_tpu_scoped_vmem_limit_kib=1024"))
aotcheck.register("typeerror", aotcheck.FunctionConfig(fn=lambda x, w: x @ x, make_args=make_args))
aotcheck.register("keyerror", aotcheck.FunctionConfig(fn=lambda x, w: {}["logits"], make_args=make_args))

def bad_args(mesh):
    raise ValueError("make_args does not like this mesh")

aotcheck.register("badargs", aotcheck.FunctionConfig(fn=lambda x: x, make_args=bad_args))
aotcheck.register("badmesh", aotcheck.FunctionConfig(fn=lambda x, w: x @ w, make_args=make_args,
                                                     mesh=aotcheck.MeshSpec(("data",), (3,))))
'''
