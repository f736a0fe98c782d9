"""XLA's out-of-memory words, read once into an :class:`aotcheck.errors.Overflow` where the compile
raises them (:func:`aotcheck.programs.compile.compile_lowered`); nothing downstream reads the message.

The forms read (each tested on a real message in ``tests/unit/programs/test_oom.py``):

==========================  =====================================================================
form                        what XLA says
==========================  =====================================================================
TPU HBM, short              ``Ran out of memory on HBM, the total memory required for HLO temporaries
                            (20.00G) exceeds available HBM (15.75G)`` (deviceless compiles; E1000)
TPU, a space's capacity     ``Ran out of memory in memory space hbm. Used 63.80G of 30.75G hbm.``,
                            its totals (``reserved``, ``program``, ``arguments``, ``HLO temp``, ...) and
                            its largest allocations; the same words for ``smem``
TPU, scoped (E1001)         ``... memory space vmem while allocating on stack for %op = ... Scoped
                            allocation with size 128.00M and limit 16.00M exceeded ...``
TPU, one allocation         ``Allocation (size=N) would exceed memory (size=M) :: #allocation3 [...]``
GPU                         ``Out of memory while trying to allocate N bytes.``, its
                            ``BufferAssignment stats`` and peak buffers; ``Failed to allocate
                            request for 2.99GiB (3206250496B) on device ordinal 0``
==========================  =====================================================================

Example:
    >>> o = overflow_of("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory "
    ...                 "required for HLO temporaries (20.00G) exceeds available HBM (15.75G). HLO module: jit_f.")
    >>> o.space, o.size_bytes, o.limit_bytes, o.breakdown
    ('hbm', 21474836480, 16911433728, {'HLO temporaries': 21474836480})
"""

from __future__ import annotations

import re

from aotcheck.errors import Allocation, Overflow

_SIZE = r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?"
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _named(name: str) -> str:
    return _SIZE.replace("(", f"(?P<{name}>", 1)


# XLA's ways of saying a program overflowed a memory space (libtpu 0.0.42-0.0.50): a scoped allocation
# over its limit (E1001), the space's capacity with its totals and largest allocations listed, HBM's short
# form, one allocation larger than the memory itself; a GPU's buffer assignment or allocator.
_SCOPED = re.compile(
    r"Ran out of memory in memory space (?P<space>\w+) while allocating on stack for %?(?P<instruction>[\w.\-]+) = "
    r"(?P<shape>\([^)]*\)|\S+) (?P<opcode>[\w\-]+)\((?P<rest>.*?)\. Scoped allocation with size " + _named("size")
    + r" and limit " + _named("limit") + r" exceeded scoped \w+ limit by " + _named("excess"), re.S)
_CAPACITY = re.compile(
    r"Ran out of memory in memory space (?P<space>\w+)\. Used " + _named("size") + r" of " + _named("limit")
    + r" (?P=space)\.(?: Exceeded (?P=space) capacity by " + _named("excess") + ")?")
_HBM_SHORT = re.compile(
    r"Ran out of memory on HBM, the total memory required for (?P<what>.+?) \(" + _named("size")
    + r"\) exceeds available HBM \(" + _named("limit") + r"\)")
_ALLOCATION = re.compile(
    r"Allocation \(size=(?P<size>\d+)\) would exceed memory \(size=(?P<limit>\d+)\) :: #\S+ "
    r"\[shape = '(?P<shape>[^']*)', space=(?P<space>\w+), size = \S+, (?P<scoped>scoped, )?tag = '(?P<tag>[^']*)'\]"
    r"(?: :: (?P<instruction>[\w.\-]+))?")
_GPU_ASSIGNMENT = re.compile(r"Out of memory while trying to allocate (?P<size>\d+) bytes")
_GPU_ALLOCATOR = re.compile(r"Failed to allocate request for [^(]*\((?P<size>\d+)B\) on device")
_ANY_SPACE = re.compile(r"(?:Ran out of memory in memory space|space=)\s*(?P<space>\w+)")
# A line of XLA's totals (``    reserved        258.00M``, ``     parameter allocation:  372.76MiB``).
_TOTAL = re.compile(r"^\s+(?P<name>[A-Za-z][\w \-]*?):?\s+" + _named("size") + r"(?:\s|$)", re.M)


def _bytes(match: re.Match[str], name: str) -> int | None:
    number = match.group(name)
    if number is None:
        return None
    unit = match.group(match.re.groupindex[name] + 1)
    return round(float(number) * _UNIT[unit.upper()])


def _size(text: str) -> int | None:
    found = re.fullmatch(_named("n"), text.strip())
    return _bytes(found, "n") if found else None


def _shape(text: str | None) -> str | None:
    """``f32[4096,4096]{1,0:T(8,128)}`` -> ``f32[4096,4096]`` (the layout is XLA's business)."""
    return re.sub(r"\{[^}]*\}", "", text).strip() if text else None


def _op_name(text: str) -> str | None:
    found = re.search(r'op_name="([^"]*)"', text)
    return found[1] if found else None


def _source(text: str) -> str | None:
    file, line = re.search(r'source_file="([^"]+)"', text), re.search(r"source_line=(\d+)", text)
    return f"{file[1]}:{line[1]}" if file and line else None


def totals(block: str) -> dict[str, int]:
    """XLA's totals in a block of its message, in its words and order (``reserved``, ``HLO temp``, ...).

    Example:
        >>> totals("Total hbm usage >= 33.52G:\\n    reserved        258.00M\\n    program          32.63G\\n")
        {'reserved': 270532608, 'program': 35036195717}
    """
    return {m["name"].strip(): size for m in _TOTAL.finditer(block) if (size := _bytes(m, "size")) is not None}


def _field(entry: str, name: str) -> str | None:
    found = re.search(rf"^\s*{name}: ([^\n]*)", entry, re.M)
    return found[1].strip() if found else None


def allocations(listing: str) -> tuple[Allocation, ...]:
    """The allocations XLA lists (``1. Size: 4.00G`` on a TPU, ``Buffer 1:`` on a GPU), in its order."""
    entries = re.split(r"^\s*(?:\d+\.|Buffer \d+:)\s*(?=Size:|\n)", listing, flags=re.M)[1:]
    out = []
    for entry in entries:
        size = _field(entry, "Size")
        if size is None:
            continue
        operator, label = _field(entry, "Operator") or "", _field(entry, "XLA [Ll]abel")
        instruction = re.match(r"%?([\w.\-]+)", label) if label else None
        parameter = _field(entry, "Entry Parameter Subshape")
        out.append(Allocation(_size(size), _shape(_field(entry, "Shape") or parameter), _op_name(operator),
                              _source(operator), instruction[1] if instruction else None,
                              _field(entry, "Allocation type") or _field(entry, "Tag")
                              or ("parameter" if parameter else None)))
    return tuple(out)


def _capacity(found: re.Match[str], message: str) -> Overflow:
    size, limit, excess = _bytes(found, "size"), _bytes(found, "limit"), _bytes(found, "excess")
    if excess is not None and limit is not None:
        size = limit + excess  # XLA rounds both sizes ("Used 1.00M of 1.00M"): its excess is exact.
    after = message[found.end():]
    listed = after.split("Largest program allocations", 1)
    found_allocations = allocations(listed[1]) if len(listed) > 1 else ()
    breakdown = totals(listed[0])
    output = re.search(r"Output size " + _named("out"), listed[0])
    if output:
        breakdown["output"] = _bytes(output, "out") or 0
    if found["space"].lower() == "hbm":  # The program's: its allocations say what fills it, no one op.
        return Overflow("hbm", size, limit, "capacity", excess, breakdown=breakdown, allocations=found_allocations)
    first = after.split("\n\n  2.")[0]  # The largest allocation XLA lists: the op that overflows.
    top = found_allocations[0] if found_allocations else None
    tag = re.search(r"Tag: ([^\n]+)", first)  # What the op's buffer is ("scratch operand"), not its allocation type.
    return Overflow(
        found["space"], size, limit, "capacity", excess, instruction=top.instruction if top else None,
        op_name=_op_name(first), allocation_shape=top.shape if top else None,
        tag=tag[1].strip() if tag else top.kind if top else None,
        kernel='custom_call_target="tpu_custom_call"' in first, breakdown=breakdown, allocations=found_allocations)


def _gpu(found: re.Match[str], message: str) -> Overflow:
    after = message[found.end():]
    stats, _, peak = after.partition("Peak buffers:")
    return Overflow("hbm", int(found["size"]), None, "capacity", breakdown=totals(stats.split("BufferAssignment stats:")[-1])
                    if "BufferAssignment stats:" in stats else {}, allocations=allocations(peak))


def overflow_of(message: str) -> Overflow | None:
    """What XLA's out-of-memory ``message`` says, in any memory space, or None (words this reader does
    not know, naming no space: the error is then a plain :class:`aotcheck.errors.OutOfMemory`).

    Example (libtpu 0.0.50.1, v5e-1: a Pallas kernel's VMEM scratch, then SMEM scratch):
        >>> o = overflow_of('RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\\nRan out of memory in memory '
        ...     'space vmem while allocating on stack for %f.1 = f32[4096,4096]{1,0:T(8,128)} custom-call(%x_ref.1), '
        ...     'custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/pallas_call" stack_frame_id=3}. '
        ...     'Scoped allocation with size 128.00M and limit 16.00M exceeded scoped vmem limit by 112.00M.')
        >>> o.space, o.size_bytes, o.limit_bytes, o.limit, o.instruction, o.op_name, o.op_shape, o.kernel
        ('vmem', 134217728, 16777216, 'scoped', 'f.1', 'jit(f)/pallas_call', 'f32[4096,4096]', True)
        >>> o = overflow_of('RESOURCE_EXHAUSTED: Ran out of memory in memory space smem. Used 1.00M of 1.00M smem. '
        ...     'Exceeded smem capacity by 136B.\\n\\n  Largest program allocations in smem:\\n\\n  1. Size: 1.00M\\n'
        ...     '     Operator: op_name="jit(f)/pallas_call"\\n     Shape: f32[262144]{0:T(128)}\\n'
        ...     '     Tag: scratch operand\\n     XLA label: f.1 = custom-call(x_ref.1), custom_call_target="tpu_custom_call"')
        >>> o.space, o.size_bytes, o.limit_bytes, o.excess_bytes, o.limit, o.allocation_shape, o.tag, o.instruction
        ('smem', 1048712, 1048576, 136, 'capacity', 'f32[262144]', 'scratch operand', 'f.1')
        >>> o = overflow_of("RESOURCE_EXHAUSTED: Allocation (size=268435456) would exceed memory (size=134217728) :: "
        ...     "#allocation3 [shape = 'f32[16384,4096]{1,0:T(8,128)}', space=vmem, size = 0x10000000, scoped, "
        ...     "tag = 'scratch operand'] :: f.1")
        >>> o.space, o.size_bytes, o.limit_bytes, o.limit, o.allocation_shape, o.instruction
        ('vmem', 268435456, 134217728, 'capacity', 'f32[16384,4096]', 'f.1')
        >>> o = overflow_of("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.00G of 15.75G hbm.")
        >>> o.space, o.size_bytes, o.limit_bytes, o.hbm
        ('hbm', 21474836480, 16911433728, True)

    A kernel with several results prints a tuple type; words not known in full still name the space:
        >>> o = overflow_of('Ran out of memory in memory space vmem while allocating on stack for %f.1 = '
        ...     '(f32[8,128]{1,0}, f32[8,128]{1,0}) custom-call(%x), custom_call_target="tpu_custom_call". '
        ...     'Scoped allocation with size 32.00M and limit 16.00M exceeded scoped vmem limit by 16.00M.')
        >>> o.space, o.size_bytes, o.op_shape, o.kernel
        ('vmem', 33554432, '(f32[8,128], f32[8,128])', True)
        >>> o = overflow_of("RESOURCE_EXHAUSTED: Ran out of memory in memory space cmem in some new words")
        >>> o.space, o.size_bytes
        ('cmem', None)
        >>> overflow_of("RESOURCE_EXHAUSTED: something else ran short") is None
        True
    """
    found = _SCOPED.search(message)
    if found:
        rest = found["rest"]
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        return Overflow(
            found["space"], _bytes(found, "size"), _bytes(found, "limit"), "scoped", _bytes(found, "excess"),
            instruction=found["instruction"], op_name=_op_name(rest), op_shape=_shape(found["shape"]),
            kernel=bool(target and target[1] == "tpu_custom_call"), source=_source(rest))
    found = _CAPACITY.search(message)
    if found:
        return _capacity(found, message)
    found = _HBM_SHORT.search(message)
    if found:
        size = _bytes(found, "size")
        return Overflow("hbm", size, _bytes(found, "limit"), "capacity",
                        breakdown={found["what"].strip(): size} if size is not None else {})
    found = _ALLOCATION.search(message)
    if found:
        size, limit = int(found["size"]), int(found["limit"])
        return Overflow(
            found["space"], size, limit, "capacity", size - limit, instruction=found["instruction"],
            allocation_shape=_shape(found["shape"]), tag=found["tag"], kernel=found["tag"] == "scratch operand")
    found = _GPU_ASSIGNMENT.search(message) or _GPU_ALLOCATOR.search(message)
    if found:
        return _gpu(found, message)
    found = _ANY_SPACE.search(message)
    if found:  # Words this reader does not know in full: the space is still said.
        return Overflow(found["space"], None, None, "capacity", op_name=_op_name(message),
                        kernel='custom_call_target="tpu_custom_call"' in message)
    return None
