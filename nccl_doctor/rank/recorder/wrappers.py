"""The functions that replace torch.distributed's: the recorder's hot path.

``wrap`` builds the replacement for one collective. With the C ring (a default install) it is a
``Recorded`` of capture/_ring.c, which records the call in C (``Call``'s enter and leave) from the
recorder's caches; what it cannot do from them (a group, shape or callsite seen for the first
time, a call with no capture open) it leaves to the Python path, ``_recorded``, which writes the
same record and fills the caches. The Python path alone runs with the Python ring.

The Python path is written out long-hand (no helper calls, positions and constants bound as
closure locals) because it runs on every collective without the C ring. Both keep to the budget
of benchmarks/recorder_overhead.py. Whatever goes wrong inside them disables the recorder and the
user's call runs as if the recorder were not there.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from typing import Any, Callable, Protocol

from nccl_doctor.capture.format import EventFlag, EventKind, EventState
from nccl_doctor.rank.recorder.specs import Spec


class Recorder(Protocol):
    """What the wrappers use of the rank's recorder (nccl_doctor/rank/recorder/core.py): its
    state, the groups it knows, the calls in progress, and where a call's record goes."""

    enabled: bool
    writer: Any  # the capture's writer (None until the capture is open)
    describer: Any  # the tensor and call-path describer
    default_pg: Any
    groups: dict[Any, Any]  # process group -> its GroupRecord
    stacks: dict[int, list[int]]  # thread id -> indices of its calls in progress
    pending: dict[int, Any]  # async works awaiting their wait()

    def fail(self, err: BaseException, why: str | None = None) -> None: ...

    def fast_wrapper(self, call: BoundCall, fn: Callable,
                     python: Callable[[], Callable]) -> Any: ...

    def open(self) -> None: ...

    def joining(self, args: tuple, kwargs: dict) -> None: ...

    def group(self, pg: Any) -> Any: ...

    def finish(self, idx: int, grec: Any, seq: int, stack: list[int], flags: int,
               measure: bool, is_p2p: bool, state: int, result: Any) -> None: ...

    def wait_enter(self, work: Any, frame: Any) -> tuple | None: ...

    def wait_for(self, parent: int) -> tuple | None: ...

    def destroyed(self, pg: Any) -> None: ...

_NOWHERE = (1 << 30, "")  # the position of a parameter the function does not have


class BoundCall:
    """A spec with its parameter positions resolved against the real function's signature."""

    __slots__ = ("spec", "kind", "flags", "op_id", "group", "inp", "out", "roots", "async_",
                 "measure", "fast")

    def __init__(self, spec: Spec, fn: Callable, params: list[str] | None = None) -> None:
        if params is None:  # else: the parameters as the caller knows them (an op's schema)
            try:
                params = list(inspect.signature(fn).parameters)
            except (TypeError, ValueError):
                params = []

        def at(name: str | None) -> tuple[int, str] | None:
            if name is None:
                return None
            return (params.index(name), name) if name in params else (_NOWHERE[0], name)

        flags = spec.flags | (EventFlag.ASYNC if spec.always_async else EventFlag.NONE)
        self.spec, self.kind, self.flags, self.op_id = spec, int(spec.kind), int(flags), 0
        self.group, self.inp, self.out = at(spec.group), at(spec.inp), at(spec.out)
        self.roots = tuple(
            (at(r), r.startswith("group_")) for r in spec.roots if r in params
        )
        self.async_ = None if spec.always_async else at("async_op")
        # A plain collective advances its group's sequence number by exactly one (gloo and NCCL);
        # p2p, composite, coalesced and monitored calls are measured after they return.
        self.measure = bool(
            spec.kind != EventKind.COLLECTIVE or flags & ~EventFlag.ASYNC
            or spec.name == "monitored_barrier"
        )
        self.fast: Any = None  # its C fast path (capture/_ring.c's Call), when there is one


def _arg(args: tuple, kwargs: dict, where: tuple[int, str] | None, default: Any = None) -> Any:
    if where is None:
        return default
    pos, name = where
    if pos < len(args):
        return args[pos]
    return kwargs.get(name, default)


def wrap(rec: Recorder, call: BoundCall, fn: Callable) -> Callable:
    """``fn``, recorded: one ENTER record before it runs and its EXIT part after.

    With the C fast path, the replacement is a capture/_ring.c ``Recorded``: enter, ``fn``, leave
    in C, no Python frame of its own; the Python path (called by it, so one frame less above the
    caller) records what the C path declines. It is made the first time the C path declines
    (``functools.partial``: its closure is ~30 objects per function, kept for the process's life,
    enough to cost a short job one more full garbage collection of torch's objects)."""
    wrapper: Any = (rec.fast_wrapper(call, fn, functools.partial(_recorded, rec, call, fn))
                    or _recorded(rec, call, fn))
    functools.update_wrapper(wrapper, fn)
    wrapper.__nccl_doctor__ = True
    return wrapper


def _recorded(rec: Recorder, call: BoundCall, fn: Callable) -> Callable:
    """The Python path (called directly, or by a ``Recorded``: either way its caller is the
    caller of the API)."""
    getframe, get_ident = sys._getframe, threading.get_ident
    async_flag = int(EventFlag.ASYNC)
    returned, failed = int(EventState.RETURNED), int(EventState.FAILED)
    groups, stacks = rec.groups, rec.stacks
    g_pos, g_name = call.group or _NOWHERE
    i_pos, i_name = call.inp or _NOWHERE
    o_pos, o_name = call.out or _NOWHERE
    a_pos, a_name = call.async_ or _NOWHERE
    has_group, has_inp, has_out = call.group is not None, call.inp is not None, call.out is not None
    has_async, roots, measure = call.async_ is not None, call.roots, call.measure
    kind, base_flags, is_p2p = call.kind, call.flags, call.kind == EventKind.P2P
    # Every call goes on its thread's stack: its record is the ``parent`` of the recorded calls it
    # makes itself (which calls do that changes between torch versions: send calls isend and
    # wait, all_gather_into_tensor calls all_gather_single, ...).

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        w = rec.writer
        if w is None or not rec.enabled:
            return fn(*args, **kwargs)
        try:
            n = len(args)
            pg = None
            if has_group:
                pg = args[g_pos] if g_pos < n else kwargs.get(g_name) if kwargs else None
            if pg is None:
                pg = rec.default_pg
            grec = groups.get(pg) or rec.group(pg)
            if grec is None:  # not a member of the group: the call is a no-op on this rank
                return fn(*args, **kwargs)
            seq = grec.seq() + 1 if grec.seq is not None else -1
            d = rec.describer
            inp_id = nbytes = out_id = 0
            if has_inp:
                x = args[i_pos] if i_pos < n else kwargs.get(i_name) if kwargs else None
                if x is not None:
                    shape = getattr(x, "shape", None)
                    if shape is not None:  # Describer.tensor's cache, looked up in place
                        found = d.tensors.get((x.dtype, shape)) or d.tensor(x)
                    else:
                        found = d.tensor(x)
                    inp_id, nbytes = found
            if has_out:
                x = args[o_pos] if o_pos < n else kwargs.get(o_name) if kwargs else None
                if x is not None:
                    out_id = d.tensor(x)[0]
            peer = -1
            for where, relative in roots:
                r = _arg(args, kwargs, where)
                if r is not None:
                    peer = grec.ranks[r] if relative and 0 <= r < len(grec.ranks) else r
                    break
            flags = base_flags
            if has_async and (args[a_pos] if a_pos < n else kwargs.get(a_name, False)):
                flags |= async_flag
            frame = getframe(1)
            uf, ul, ufn, af, al, path = (
                d.direct.get((id(frame.f_code), frame.f_lasti)) or d.callsites(frame)
            )
            tid = get_ident()
            stack = stacks.get(tid)
            if stack is None:
                stack = stacks[tid] = []
            idx = w.events.begin(
                stack[-1] if stack else 0, 0, seq, nbytes, tid, call.op_id, grec.name_id, inp_id,
                out_id, uf, ul, ufn, af, al, path, peer, grec.size, grec.p2p_bumps, kind, flags, 0,
            )
            stack.append(idx)
        except Exception as err:
            rec.fail(err)
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            rec.finish(idx, grec, seq, stack, flags, measure, is_p2p, failed, None)
            raise
        if measure or (flags & async_flag and result is not None):
            rec.finish(idx, grec, seq, stack, flags, measure, is_p2p, returned, result)
            return result
        try:  # the common case (a plain collective that returned), Recorder.finish inlined
            if stack[-1] == idx:
                stack.pop()
            w.events.end(idx, returned, 1)
        except Exception as err:
            rec.fail(err)
        return result

    return wrapper


def forgetting(rec: Recorder, recorded: Callable) -> Callable:
    """destroy_process_group, recorded, after which the recorder lets go of the group."""

    @functools.wraps(recorded)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            return recorded(*args, **kwargs)
        finally:
            try:
                rec.destroyed(args[0] if args else kwargs.get("group"))
            except Exception as err:
                rec.fail(err)

    destroy_process_group.__nccl_doctor__ = True  # type: ignore[attr-defined]
    destroy_process_group.__wrapped__ = recorded.__wrapped__  # type: ignore[attr-defined]
    return destroy_process_group


def wrap_init(rec: Recorder, fn: Callable) -> Callable:
    """init_process_group, after which the recorder opens the rank's capture."""

    @functools.wraps(fn)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            rec.joining(args, kwargs)
        except Exception as err:
            rec.fail(err)
        result = fn(*args, **kwargs)
        try:
            rec.open()
        except Exception as err:
            rec.fail(err)
        return result

    init_process_group.__nccl_doctor__ = True  # type: ignore[attr-defined]
    return init_process_group


def patch_wait(rec: Recorder, work_cls: Any) -> None:
    """Record ``Work.wait()`` on the works of recorded async ops (as WAIT events)."""
    real_wait = work_cls.wait
    if getattr(real_wait, "__nccl_doctor__", False):
        return
    getframe = sys._getframe
    returned, failed = int(EventState.RETURNED), int(EventState.FAILED)

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = None
        if rec.writer is not None and rec.enabled and rec.pending:
            try:
                token = rec.wait_enter(self, getframe(1))
            except Exception as err:
                rec.fail(err)
        if token is None:
            return real_wait(self, *args, **kwargs)
        try:
            result = real_wait(self, *args, **kwargs)
        except BaseException:
            rec.finish(*token, failed, None)
            raise
        rec.finish(*token, returned, None)
        return result

    wait.__nccl_doctor__ = True  # type: ignore[attr-defined]
    wait.__doc__ = real_wait.__doc__
    work_cls.wait = wait
