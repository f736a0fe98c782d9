"""``XLA_FLAGS``, read as XLA reads it in every compile process: TPU compiler flags that belong in
``LIBTPU_INIT_ARGS`` instead, and the flags a process's last words say XLA aborted on."""

from __future__ import annotations

import re
from collections.abc import Iterable


def xla_flags_problem(text: str | None) -> str | None:
    """What to say of TPU compiler flags (``--xla_tpu_*``) in ``XLA_FLAGS`` (its value, ``text``) that
    XLA aborted on as unknown, or None: libtpu takes them from ``LIBTPU_INIT_ARGS`` only. XLA reads
    ``XLA_FLAGS`` in every process that starts jax's CPU backend or the CUDA plugin and aborts on a
    flag it does not know, for TPU and GPU targets alike (a few ``--xla_tpu_*`` flags it knows,
    such as ``--xla_tpu_detect_nan``: those never reach here).

    Example:
        >>> xla_flags_problem("--xla_dump_to=/tmp/x --xla_gpu_enable_triton_gemm=false") is None
        True
        >>> print(xla_flags_problem("--xla_tpu_scoped_vmem_limit_kib=65536"))  # doctest: +ELLIPSIS
        XLA_FLAGS holds --xla_tpu_scoped_vmem_limit_kib=65536, a TPU compiler flag: ... aot_libtpu_init_args ...
    """
    flags = [token for token in (text or "").split()
             if re.match(r"^--(no)?xla_tpu_", token)]
    if not flags:
        return None
    one = len(flags) == 1
    return (f"XLA_FLAGS holds {' '.join(flags)}, {'a TPU compiler flag' if one else 'TPU compiler flags'}: "
            "XLA reads XLA_FLAGS in every compile process (jax's CPU backend, the CUDA plugin), does not know "
            f"{'it' if one else 'them'} there, and aborted the process, for TPU and GPU targets alike. libtpu takes TPU flags from "
            f"LIBTPU_INIT_ARGS: give {'it' if one else 'them'} to aotcheck in aot_libtpu_init_args (the [pytest] "
            "ini; or --aot-libtpu-init-args=..., --libtpu-init-args=..., a config's libtpu_init_args), and "
            f"remove {'it' if one else 'them'} from XLA_FLAGS.")


def unknown_xla_flags(lines: Iterable[str]) -> str | None:
    """The flags a process's last ``lines`` say XLA aborted on as unknown in ``XLA_FLAGS`` (its
    ``Unknown flag in XLA_FLAGS: --x=1``), in words; None when they say no such thing.

    Example:
        >>> print(unknown_xla_flags(["F1203 14:48:05.283311 19889 parse_flags_from_env.cc:234] Unknown flag in "
        ...                          "XLA_FLAGS: --xla_bogus_flag=1"]))  # doctest: +ELLIPSIS
        XLA_FLAGS holds --xla_bogus_flag=1, which XLA does not know: ...
    """
    flags: list[str] = []
    for line in lines:
        # A value that does not start with "--" is read as a file of flags (XLA's parse_flags_from_env).
        unreadable = re.search(r'Could not open file "(.*)" to read flags for environment variable "XLA_FLAGS"', line)
        if unreadable:
            return (f"XLA_FLAGS is {unreadable[1][:200]!r}: XLA reads a value that does not start with '--' as the name "
                    "of a file of flags, found no such file, and aborted the compile process before compiling "
                    "anything. Give flags as --name=value (XLA_FLAGS='--xla_dump_to=/tmp/dump'), or unset XLA_FLAGS.")
        match = re.search(r"Unknown flags? in XLA_FLAGS:\s*(.*)$", line)
        if match:
            flags += [f for f in match[1].split() if f.startswith("-") and f not in flags]
    if not flags:
        return None
    tpu = xla_flags_problem(" ".join(flags))
    if tpu is not None:
        return tpu
    one = len(flags) == 1
    return (f"XLA_FLAGS holds {' '.join(flags)}, which XLA does not know: the compile process aborted on "
            f"{'it' if one else 'them'} before compiling anything (XLA: 'Unknown flag in XLA_FLAGS'). Correct "
            f"the name or remove {'it' if one else 'them'}; a TPU compiler flag belongs in aot_libtpu_init_args "
            "(libtpu reads LIBTPU_INIT_ARGS), not XLA_FLAGS.")
