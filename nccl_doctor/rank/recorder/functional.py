"""The functional collectives, recorded at the dispatcher: what DTensor, tensor parallel,
``torch.distributed._functional_collectives`` and compiled graphs (``torch.compile``) issue
without calling torch.distributed's Python functions.

They all end in the ``torch.ops._c10d_functional`` operators, issued from C++ by the
dispatcher. Each operator gets a kernel at the ``ADInplaceOrView`` dispatch key - a key every
real tensor carries outside ``torch.inference_mode``, passed after autograd and before the
backend's kernel - that records the call and passes it on below itself (``redispatch``): what
the call does and returns is the operator's own. A compiled graph calls the same operators, so
one mechanism sees eager and compiled calls alike (docs/recording.md says why this one, with
the cost of each option measured).

What is not recorded: a call on a tensor subclass that carries the Python dispatch key
(FakeTensor and FunctionalTensor while torch.compile traces; DTensor itself, whose local
tensors' calls are the real ones) or on the meta device; a call made under
``torch.inference_mode``, which leaves the key out - it still takes its group's sequence
number, which the analysis reads as a call the doctor did not see (analysis/calls/align.py's gaps),
never as a missing one; and every call when ``NCCL_DOCTOR_FUNCTIONAL=0``. A dispatch mode that
calls the operator again makes a nested record (the outer one its parent), as the Python API's
wrappers do: the analysis counts the innermost.

A record is the Python API's: op, group, PyTorch's sequence number, the input tensor, the
callsite and call path from the Python frames (every torch frame skipped, so DTensor's
machinery is passed over and the user's line is the one that touched the tensor), flagged
``FUNCTIONAL``; ``wait_tensor`` writes a WAIT record for the collective it completes.

Two kernels write these records, the same ones: the C++ kernel (_functional_kernel.cpp, through
the recorder's C fast path, with the Python path below for what that declines), where make
install built it for this torch, and the Python one here (the dispatcher boxes each call into
Python for it: ~3.5x the C++ one's cost on the issue, ~10x on the wait).
functional_kernel.py says which a process uses (NCCL_DOCTOR_FUNCTIONAL_KERNEL).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Callable

from nccl_doctor.capture.format import EventFlag, EventKind, EventState
from nccl_doctor.rank.recorder import functional_kernel
from nccl_doctor.rank.recorder.specs import Spec
from nccl_doctor.rank.recorder.wrappers import BoundCall, Recorder, wrap

NAMESPACE = "_c10d_functional"
DISPATCH_KEY = "ADInplaceOrView"
C, P = EventKind.COLLECTIVE, EventKind.P2P
_F = EventFlag.FUNCTIONAL
_FC = EventFlag.FUNCTIONAL | EventFlag.COALESCED
_G = "group_name"

#: operator (of ``NAMESPACE`` unless named ``namespace::name``) -> its record (named as the
#: Python API names the collective, so that a rank that called dist.all_gather_into_tensor and
#: one whose DTensor gathered compare as the same op).
#: ``measure``: the call's sequence numbers are counted after it returns (a coalesced or
#: batched call takes one per member on some backends).
OPERATORS: dict[str, Spec] = {
    "all_reduce": Spec("all_reduce", C, inp="input", group=_G, flags=_F),
    "all_reduce_": Spec("all_reduce", C, inp="input", group=_G, flags=_F),
    "all_reduce_coalesced": Spec("all_reduce_coalesced", C, inp="inputs", group=_G, flags=_FC),
    "all_reduce_coalesced_": Spec("all_reduce_coalesced", C, inp="inputs", group=_G, flags=_FC),
    "all_gather_into_tensor": Spec("all_gather_into_tensor", C, inp="input", group=_G, flags=_F),
    "all_gather_into_tensor_out": Spec("all_gather_into_tensor", C, inp="input", out="out",
                                       group=_G, flags=_F),
    "all_gather_into_tensor_coalesced": Spec("all_gather_into_tensor_coalesced", C,
                                             inp="inputs", group=_G, flags=_FC),
    "reduce_scatter_tensor": Spec("reduce_scatter_tensor", C, inp="input", group=_G, flags=_F),
    "reduce_scatter_tensor_out": Spec("reduce_scatter_tensor", C, inp="input", out="out",
                                      group=_G, flags=_F),
    "reduce_scatter_tensor_coalesced": Spec("reduce_scatter_tensor_coalesced", C, inp="inputs",
                                            group=_G, flags=_FC),
    "all_to_all_single": Spec("all_to_all_single", C, inp="input", group=_G, flags=_F),
    "broadcast": Spec("broadcast", C, inp="input", roots=("src",), group=_G, flags=_F),
    "broadcast_": Spec("broadcast", C, inp="input", roots=("src",), group=_G, flags=_F),
    "isend": Spec("isend", P, inp="tensor", roots=("dst",), group=_G, flags=_F),
    "irecv": Spec("irecv", P, inp="tensor", roots=("src",), group=_G, flags=_F),
    "batch_p2p_ops": Spec("batch_isend_irecv", P, inp="tensors", group=_G, flags=_FC),
    # DTensor's Shard(i) -> Shard(j) redistribute: an all_to_all its C++ kernel issues itself
    "_dtensor::shard_dim_alltoall": Spec("all_to_all_single", C, inp="input", group=_G, flags=_F),
}
_MEASURED = {"batch_p2p_ops", "all_reduce_coalesced", "all_reduce_coalesced_",
             "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced"}
_INSTALLED: list[Any] = []  # the Libraries (or _CppKernels) holding this process's kernels
#: the kernel installed last: "cpp", "python" or "" (none); KERNEL_WHY: why not the C++ one
KERNEL = ""
KERNEL_WHY = ""
# id(output tensor) -> (its weakref, record index): the recorded collectives whose wait_tensor is
# still to come (emptied in a forked child: its indices are the parent's capture's)
_ISSUED: dict[int, tuple[Any, int]] = {}
_MAX_ISSUED = 4096  # collectives whose wait_tensor is still to come; older ones are forgotten


def install(rec: Recorder) -> tuple[list[Any], list[BoundCall]]:
    """Register the recording kernels: the C++ ones where they are built for this torch, else
    the Python ones (functional_kernel.py chooses). Returns what must stay alive for them to stay
    and the calls recorded (the recorder names their ops when its capture opens). Nothing (and no
    error) where torch has no functional collectives. Raises what torch raises while
    registering, and KernelUnavailable when the C++ kernel was asked for and cannot be had: the
    caller records the Python API alone."""
    import torch

    global KERNEL
    namespace = getattr(torch.ops, NAMESPACE, None)
    c_keys = getattr(torch._C, "_after_ADInplaceOrView_keyset", None)
    if namespace is None or c_keys is None:
        return [], []
    kernel = _cpp_kernel(rec, torch)
    uninstall()  # a recorder made before this one in the process (a test's): its kernels go
    _ISSUED.clear()
    ops = []
    for qualified, spec in OPERATORS.items():
        space, _, name = qualified.rpartition("::")
        packet = getattr(getattr(torch.ops, space or NAMESPACE, None), name, None)
        op = getattr(packet, "default", None) if packet is not None else None
        if op is not None:
            ops.append((space or NAMESPACE, name, spec, op))
    wait = getattr(getattr(namespace, "wait_tensor", None), "default", None)
    if kernel is not None:
        try:
            calls = _install_cpp(rec, kernel, ops, wait)
            KERNEL = "cpp"
            return list(_INSTALLED), calls
        except Exception as err:  # noqa: BLE001 - torch refused it: the Python kernel, unless
            if functional_kernel.wanted() == "cpp":  # the C++ one alone was asked for
                raise
            uninstall()
            _unavailable(f"its kernels could not be registered ({err!r})", say=True)
    calls = _install_python(rec, torch, ops, wait, c_keys)
    KERNEL = "python"
    return list(_INSTALLED), calls


def _cpp_kernel(rec: Recorder, torch: Any) -> Any:
    """The C++ kernel's module when it is to be used, else None (the Python kernel); raises
    KernelUnavailable when it was asked for and cannot be."""
    global KERNEL_WHY
    choice = functional_kernel.wanted()
    if choice == "python":
        KERNEL_WHY = f"{functional_kernel.KERNEL_ENV}=python"
        return None
    try:
        if getattr(rec, "recording", None) is None:
            raise functional_kernel.KernelUnavailable(
                "the recorder's C fast path, which it records through, is not in use (the Python "
                "ring: NCCL_DOCTOR_PURE_PYTHON=1, or nccl_doctor.capture._ring not built)")
        module = functional_kernel.load(torch)
    except functional_kernel.KernelUnavailable as err:
        if choice == "cpp":
            KERNEL_WHY = str(err)
            raise functional_kernel.KernelUnavailable(
                f"{functional_kernel.KERNEL_ENV}=cpp, but the C++ kernel cannot be used: {err}"
            ) from None
        _unavailable(str(err), say=err.stale)
        return None
    KERNEL_WHY = ""
    return module


def _unavailable(why: str, say: bool) -> None:
    """The Python kernel records, as the C++ one cannot (``why``); ``say``: on stderr too (a rank
    installs its kernels once), where make install would mend it or something went wrong."""
    global KERNEL_WHY
    KERNEL_WHY = why
    if say:
        sys.stderr.write("nccl-doctor: the functional collectives are recorded by the Python "
                         f"kernel, at a higher cost a call: the C++ kernel cannot be used: {why}\n")


def _bound(spec: Spec, fn: Callable, params: list[str], name: str) -> BoundCall:
    call = BoundCall(spec, fn, params=params)
    if name not in _MEASURED:
        call.measure = False
    # a root or peer is a rank of the group (turned global, as group_src is)
    call.roots = tuple((where, True) for where, _relative in call.roots)
    return call


def _install_python(rec: Recorder, torch: Any, ops: list, wait: Any,
                    c_keys: Any) -> list[BoundCall]:
    """The kernels written in Python: the dispatcher boxes each call into Python objects."""
    dispatch_key = torch._C.DispatchKey
    skip = (dispatch_key.Python, dispatch_key.Meta, (torch.Tensor, torch.nn.Parameter))
    libs: dict[str, Any] = {}
    issued = _ISSUED
    calls: list[BoundCall] = []
    for space, name, spec, op in ops:
        lib = libs.get(space)
        if lib is None:  # one library per namespace
            lib = libs[space] = torch.library.Library(space, "IMPL")
            _INSTALLED.append(lib)
        params = ["keyset"] + [a.name for a in op._schema.arguments]
        redispatch = _redispatch(op)
        noted = _noting(rec, redispatch, c_keys, issued)
        call = _bound(spec, noted, params, name)
        calls.append(call)
        lib.impl(name, _gate(wrap(rec, call, noted), redispatch, c_keys, skip), DISPATCH_KEY,
                 with_keyset=True)
    if wait is not None:
        lib = libs.get(NAMESPACE) or torch.library.Library(NAMESPACE, "IMPL")
        if NAMESPACE not in libs:
            _INSTALLED.append(lib)
        lib.impl("wait_tensor", _waiting(rec, _redispatch(wait), c_keys, issued, skip),
                 DISPATCH_KEY, with_keyset=True)
    return calls


class _CppKernels:
    """The C++ kernels, as _INSTALLED holds them (``_destroy`` takes them out, as a Library's)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def _destroy(self) -> None:
        self.module.uninstall()


def _install_cpp(rec: Recorder, kernel: Any, ops: list, wait: Any) -> list[BoundCall]:
    """The kernels written in C++ (_functional_kernel.cpp): each records through a capture/
    _ring.c Recorded - the recorder's C fast path, with its Python path for what the fast path
    declines (that path's frame, ``record``, stands where the Python kernel's frame stood)."""
    noted = _noting_cpp(rec, kernel.run, kernel.note)
    entries, calls = [], []
    for space, name, spec, op in ops:
        call = _bound(spec, noted, [a.name for a in op._schema.arguments], name)
        recorded = wrap(rec, call, noted)
        if call.fast is None:
            raise functional_kernel.KernelUnavailable(f"the C fast path declined {name}")
        calls.append(call)
        entries.append((space, name, recorded, _python_path(recorded), _read(call)))
    waiting = None
    if wait is not None:
        enter, leave = _wait_python_path(rec)
        kinds = (1 << int(C)) | (1 << int(P))
        waiting = (NAMESPACE, rec.recording, rec, enter, leave, int(_F), kinds,
                   int(EventKind.WAIT), int(EventState.RETURNED), int(EventState.FAILED))
    kernel.install(entries, waiting, _MAX_ISSUED)
    _INSTALLED.append(_CppKernels(kernel))
    return calls


def _read(call: BoundCall) -> tuple[int, ...]:
    """The positions of the arguments the fast path reads (the C++ kernel converts no other)."""
    wheres = [call.group, call.inp, call.out, call.async_] + [w for w, _rel in call.roots]
    return tuple(sorted({w[0] for w in wheres if w is not None and w[0] < 1 << 30}))


def _python_path(recorded: Callable) -> Callable:
    """What the C++ kernel calls when the fast path declines: the Python path, under a frame of
    this file (skipped as nccl-doctor's own, as the Python kernel's is)."""

    def record(*args: Any) -> Any:
        return recorded(*args)

    return record


def _noting_cpp(rec: Recorder, run: Callable, note: Callable) -> Callable:
    """The ``fn`` of the C++ kernels' Python path: the call, passed on by the kernel (``run``),
    and its record (the innermost call in progress on this thread) given to the kernel, which
    notes the call's outputs with it for the wait_tensor that completes it."""
    stacks, get_ident = rec.stacks, threading.get_ident

    def noted(*args: Any) -> None:
        run()
        try:
            stack = stacks.get(get_ident())
            if stack and rec.writer is not None and rec.enabled:
                note(stack[-1])
        except Exception as err:  # noqa: BLE001 - the recorder's own: disable it, keep the call
            rec.fail(err)

    return noted


def _wait_python_path(rec: Recorder) -> tuple[Callable, Callable]:
    """The C++ wait_tensor kernel's Python path (when its C record declines): the WAIT record's
    token for a recorded collective (None: none), and its end."""
    returned, failed = int(EventState.RETURNED), int(EventState.FAILED)

    def enter(parent: int) -> tuple | None:
        try:
            return rec.wait_for(parent) if rec.enabled else None
        except Exception as err:  # noqa: BLE001 - the recorder's own: disable it, keep the call
            rec.fail(err)
            return None

    def leave(token: tuple, failed_call: bool) -> None:
        rec.finish(*token, failed if failed_call else returned, None)

    return enter, leave


def _redispatch(op: Any) -> Callable:
    """The operator's call from a kernel, given the keys below the kernel's."""
    handle = getattr(op, "_handle", None)
    return getattr(handle, "redispatch_boxed", None) or op.redispatch


def _gate(recorded: Callable, redispatch: Callable, after: Any, skip: tuple) -> Callable:
    """The kernel: a call on real tensors is recorded, any other passes straight on. The Python
    key alone does not tell: a real tensor carries it while a dispatch mode is active (a
    compiled graph's first run); the input's type does (FakeTensor, FunctionalTensor)."""
    py_key, meta_key, plain = skip

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if keyset.has(meta_key) or (keyset.has(py_key) and not _plain(args, plain)):
            return redispatch(keyset & after, *args, **kwargs)
        return recorded(keyset, *args, **kwargs)

    return kernel


def _plain(args: tuple, plain: tuple) -> bool:
    """The call's first tensor (the first of a list of them; batch_p2p_ops's come after its
    lists of op names and peers) is a torch.Tensor or Parameter, not a subclass."""
    for x in args:
        if type(x) is list:
            x = x[0] if x else None
        if x is not None and hasattr(x, "dtype"):
            return type(x) in plain
    return False


def _noting(rec: Recorder, redispatch: Callable, after: Any,
            issued: dict[int, tuple[Any, int]]) -> Callable:
    """The operator's call passed on below the kernel's key, and its output tensor noted with
    its record (the innermost call in progress on this thread: the recorder pushed it) for the
    wait_tensor that completes it."""
    stacks, get_ident, ref = rec.stacks, threading.get_ident, weakref.ref

    def noted(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        result = redispatch(keyset & after, *args, **kwargs)
        try:
            stack = stacks.get(get_ident())
            if stack and rec.writer is not None and rec.enabled:
                if len(issued) >= _MAX_ISSUED:  # (another thread may evict the same one)
                    issued.pop(next(iter(issued), None), None)
                if type(result) is list:  # a coalesced call's outputs
                    for out in result:
                        issued[id(out)] = (ref(out), stack[-1])
                else:
                    issued[id(result)] = (ref(result), stack[-1])
        except Exception as err:  # noqa: BLE001 - the recorder's own: disable it, keep the call
            rec.fail(err)
        return result

    return noted


def _waiting(rec: Recorder, redispatch: Callable, after: Any,
             issued: dict[int, tuple[Any, int]], skip: tuple) -> Callable:
    """The wait_tensor kernel: a WAIT record (the collective's group, sequence number and
    tensors) around the wait for a recorded collective's output; anything else passes on."""
    py_key, meta_key, plain = skip
    returned, failed = int(EventState.RETURNED), int(EventState.FAILED)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if not issued or keyset.has(meta_key) or (keyset.has(py_key)
                                                 and not _plain(args, plain)):
            return redispatch(keyset & after, *args, **kwargs)
        token = None
        try:
            tensor = args[0] if args else kwargs.get("tensor")
            found = issued.pop(id(tensor), None)
            if found is not None and found[0]() is tensor and rec.enabled:
                token = rec.wait_for(found[1])
        except Exception as err:  # noqa: BLE001 - the recorder's own: disable it, keep the call
            rec.fail(err)
        if token is None:
            return redispatch(keyset & after, *args, **kwargs)
        try:
            result = redispatch(keyset & after, *args, **kwargs)
        except BaseException:
            rec.finish(*token, failed, None)
            raise
        rec.finish(*token, returned, None)
        return result

    return kernel


def after_fork() -> None:
    """In a forked child: the parent's collectives are not its own to wait for."""
    _ISSUED.clear()
    for kernels in _INSTALLED:
        if isinstance(kernels, _CppKernels):
            kernels.module.forget()


def uninstall() -> None:
    """Take this process's recording kernels out (the benchmark's bare rounds; tests)."""
    global KERNEL
    KERNEL = ""
    while _INSTALLED:
        destroy = getattr(_INSTALLED.pop(), "_destroy", None)
        if destroy is not None:
            destroy()
