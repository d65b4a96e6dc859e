"""The commands the in-rank agent (nccl_doctor/rank/agent.py) answers, and how a rank leaves when
the supervisor asks it to. A handler takes the agent and the decoded request and returns the
reply; it never imports torch (it uses torch only if the rank already imported it).

Commands (see ``protocol`` for the framing):

``ping``
    ``{"ok": true, "pid": int, "rank": int | null, "world_size": int | null, "run_id": str}``;
    rank and world size come from ``torch.distributed`` once it is initialised.
``stacks``
    ``{"ok": true, "threads": [...]}`` in the shape of ``py-spy dump --json``: per thread
    ``thread_id`` (the pthread id, as py-spy), ``thread_name`` (null for threads ``threading`` does
    not know), ``os_thread_id`` (the kernel tid), ``is_main`` and ``frames``, innermost first, each
    ``{"name", "filename", "line"}`` (``line`` may be null for a frame caught between lines).
    The agent's own thread is left out.
``quiet``
    The first step of the supervisor's quiet stop, sent to every rank before any is asked to
    ``exit``: ``{"ok": true}``, after which an exception that reaches the top of the rank's main
    thread ends it at once, silently, with status 0 (``leave(0)``). Ranks are asked to exit one
    by one; without this, a rank still blocked in a collective when its peer has left gets
    "Connection closed by peer", prints a traceback and exits 1, and torchrun reports a
    ``ChildFailedError`` - the noise the quiet stop is there to spare. Refused, like ``exit``,
    by a rank whose SIGTERM has a handler of the job's own.
``exit`` (field ``code=0``)
    The supervisor's quiet stop of a job it diagnosed as hung (``--on-hang kill``): the reply
    ``{"ok": true, "children": [pid, ...]}`` is sent, then the rank sends SIGTERM to its
    descendants (which torchrun's SIGTERM reached through the rank's process group), flushes its
    stdout/stderr and leaves with ``os._exit(code)``. A launcher whose workers all leave this way
    ends by itself, without the ``SignalException`` traceback torchrun prints when it is
    signalled, and without restarting them (``--max-restarts``), which a failing exit status
    would. A rank whose SIGTERM has a handler of the job's own (a checkpoint on preemption,
    say) answers ``{"ok": false, "error": ...}``: that handler is the job's way to stop, and the
    supervisor sends SIGTERM instead.
``flight_recorder`` (fields ``include_collectives=true``, ``only_active=false``)
    ``{"ok": true, "trace": {...}}``: the parsed JSON of
    ``torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives, onlyActive) -> bytes``
    (the signature in torch 2.13), with ``entries`` always present (``[]`` when nothing was
    recorded: the dump leaves the key out then). With ``stacks=true`` the newest entries
    (``STACKED_ENTRIES``) carry ``frames``, their Python stack when the call was made, from the
    pickled twin of the dump (``_dump_fr_trace(includeCollectives, includeStackTraces,
    onlyActive)``), which the JSON one leaves out: what places a call issued from C++. Asked
    only of a job the watchdog is confirming as hung: symbolising the stacks while a healthy
    gloo job runs on was seen to leave a rank aborting at its teardown ("terminate called
    without an active exception"). Else ``{"ok": false, "error": ...}``.

What a Flight Recorder dump holds, field by field, and how its sequence numbers line up with
the recorder's: docs/flight-recorder.md ("What a dump holds").
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol

_MAX_FRAMES = 2000  # per thread: a runaway recursion must not make a reply of hundreds of MiB


class Served(Protocol):
    """What a handler sees of the agent serving it."""

    run_id: str
    leave_with: int | None  # set by ``exit``: the rank leaves with it once the reply is sent


def leave(code: int) -> None:
    """Flush this process's stdout and stderr and end it at once with ``code`` (the ``exit``
    command, after its reply went out). A flush that blocks (a reader that stopped reading)
    gets two seconds."""
    timer = threading.Timer(2.0, os._exit, (code,))
    timer.daemon = True
    timer.start()
    for child in _descendants():
        try:
            child.terminate()
        except Exception:  # noqa: BLE001, S110 - already gone
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stream has nothing to keep
            pass
    os._exit(code)



def _dist() -> Any:
    """``torch.distributed`` if this process already imported it, else None (never imports)."""
    return sys.modules.get("torch.distributed")


def _ping(agent: Served, request: dict[str, Any]) -> dict[str, Any]:
    rank = world_size = None
    dist = _dist()
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001, S110 - a process group torn down: rank unknown
        pass
    return {"ok": True, "pid": os.getpid(), "rank": rank, "world_size": world_size,
            "run_id": agent.run_id}


def _handles_sigterm() -> bool:
    """A Python handler of the job's own, or one set outside Python (None): its way to stop."""
    return signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)


def _quiet(agent: Served, request: dict[str, Any]) -> dict[str, Any]:
    if _handles_sigterm():
        return {"ok": False, "error": "quiet: the job handles SIGTERM itself"}
    sys.excepthook = _end_silently
    return {"ok": True}


def _end_silently(tp: type, value: BaseException, tb: Any) -> None:
    """The main thread's exception while the rank is being stopped (a peer that left first broke
    its collective): no traceback, status 0 - the stop's doing, not the job's failure."""
    leave(0)


def _exit(agent: Served, request: dict[str, Any]) -> dict[str, Any]:
    code = request.get("code", 0)
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        return {"ok": False, "error": f"exit: code must be an integer 0-255, got {code!r}"}
    if _handles_sigterm():
        return {"ok": False, "error": "exit: the job handles SIGTERM itself"}
    agent.leave_with = code
    # its own children (an inference engine, a data worker) would outlive it: torchrun's SIGTERM
    # reached them through the rank's process group, the exit must not orphan them. They get
    # SIGTERM as it leaves; the supervisor, told their pids, makes sure they are gone.
    return {"ok": True, "children": [p.pid for p in _descendants()]}


def _descendants() -> list[Any]:
    try:
        import psutil

        return psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001 - no psutil, or the process table moved: none known
        return []


def thread_stacks(skip: set[int] | None = None) -> list[dict[str, Any]]:
    """Every thread's Python stack in ``py-spy dump --json``'s shape (frames innermost first)."""
    skip = skip or set()
    known = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        if ident in skip:
            continue
        frames = []
        f = frame
        while f is not None and len(frames) < _MAX_FRAMES:
            code = f.f_code
            frames.append({"name": code.co_name, "filename": code.co_filename,
                           "line": f.f_lineno})
            f = f.f_back
        thread = known.get(ident)
        threads.append({
            "thread_id": ident,
            "thread_name": thread.name if thread is not None else None,
            "os_thread_id": getattr(thread, "native_id", None),
            "is_main": ident == main_ident,
            "frames": frames,
        })
    threads.sort(key=lambda t: (not t["is_main"], t["thread_id"]))
    return threads


def _stacks(agent: Served, request: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "threads": thread_stacks({threading.get_ident()})}


def _buffer_size_setting() -> int | None:
    """The Flight Recorder size the environment asks for, or None when it does not say."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name)
        if value is not None and value.strip():
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _flight_recorder(agent: Served, request: dict[str, Any]) -> dict[str, Any]:
    if "torch" not in sys.modules:
        return {"ok": False, "error": "torch is not imported in this process"}
    dist = _dist()
    if dist is None or not dist.is_available():
        return {"ok": False, "error": "torch.distributed is not available in this process"}
    size = _buffer_size_setting()
    if size is not None and size <= 0:
        return {"ok": False, "error": "Flight Recorder is disabled (TORCH_FR_BUFFER_SIZE="
                f"{size}; set it > 0 before init_process_group)"}
    c10d = getattr(sys.modules["torch"]._C, "_distributed_c10d", None)
    dumps = [d for d in (getattr(c10d, name, None) for name in _DUMPS) if d is not None]
    if not dumps:
        version = getattr(sys.modules["torch"], "__version__", "?")
        return {"ok": False, "error": f"torch {version} has no Flight Recorder JSON dump"}
    include = request.get("include_collectives", True)
    only_active = request.get("only_active", False)
    stacks = request.get("stacks", False)
    if not all(isinstance(x, bool) for x in (include, only_active, stacks)):
        return {"ok": False,
                "error": "include_collectives, only_active and stacks must be booleans"}
    trace: dict[str, Any] | None = None
    seen: set[tuple] = set()
    for dump in dumps:
        part = json.loads(dump(include, only_active))
        if not isinstance(part, dict):
            return {"ok": False, "error": f"Flight Recorder dump is a JSON {type(part).__name__}"}
        entries = part.get("entries") if isinstance(part.get("entries"), list) else []
        if stacks:
            _add_stacks(entries, _stacks_of(c10d, dump, include, only_active))
        if trace is None:
            trace = {**part, "entries": []}
        for entry in entries:  # the recorders may be one (newer torch) or two: never twice
            key = _entry_key(entry)
            if key not in seen:
                seen.add(key)
                trace["entries"].append(entry)
    assert trace is not None
    return {"ok": True, "trace": trace}


#: The pickled dumps beside the JSON ones (same recorder, same record ids): they carry each
#: entry's Python stack as it was when the call was made - what describes a call issued from C++
#: (DDP's broadcast of buffers during forward; its all_reduce during backward on the CPU: on
#: CUDA, backward runs on autograd's threads, which have no Python stack) - which the JSON dumps
#: leave out.
_PICKLED = {"_dump_fr_trace_json": "_dump_fr_trace", "_dump_nccl_trace_json": "_dump_nccl_trace"}
#: The newest entries whose stacks the reply keeps (a hang is about the last calls: a reply of
#: every entry's stack would be megabytes), and the frames kept per stack (innermost first).
STACKED_ENTRIES = 256
STACK_FRAMES = 64


def _stacks_of(c10d: Any, dump: Any, include: bool, only_active: bool) -> dict[tuple, list]:
    """The Python stacks of the newest entries of ``dump``'s recorder, from its pickled twin
    (read as plain data by capture/fr_dump.py's unpickler: torch's own bytes, yet nothing in
    them is ever imported or called), by (record id, profiling name); {} when there is no such
    dump or it fails."""
    name = _PICKLED.get(getattr(dump, "__name__", ""), "")
    pickled = getattr(c10d, name, None)
    if pickled is None:
        return {}
    try:
        from nccl_doctor.capture.fr_dump import loads

        entries = loads(pickled(include, True, only_active), "flight recorder").get("entries")
        out: dict[tuple, list] = {}
        for entry in (entries if isinstance(entries, list) else [])[-STACKED_ENTRIES:]:
            frames = entry.get("frames") if isinstance(entry, dict) else None
            if isinstance(frames, (list, tuple)):
                out[_stack_key(entry)] = [
                    {"name": str(f.get("name", "")), "filename": str(f.get("filename", "")),
                     "line": f.get("line") if isinstance(f.get("line"), int) else 0}
                    for f in list(frames)[:STACK_FRAMES] if isinstance(f, dict)]
        return out
    except Exception:  # noqa: BLE001 - the JSON dump still answers, without stacks
        return {}


def _stack_key(entry: dict) -> tuple:
    return str(entry.get("record_id")), str(entry.get("profiling_name"))


def _add_stacks(entries: list, stacks: dict[tuple, list]) -> None:
    """Each JSON entry with its stack from the pickled dump (the JSON dumps leave stacks out)."""
    if not stacks:
        return
    for entry in entries:
        if isinstance(entry, dict) and "frames" not in entry:
            frames = stacks.get(_stack_key(entry))
            if frames is not None:
                entry["frames"] = frames


#: NCCL builds keep NCCL's entries in their own recorder (FlightRecorder<CUDAEvent>), dumped by
#: ``_dump_nccl_trace_json`` only (reported measured on an H100: 8 NCCL all_reduces there, none in
#: ``_dump_fr_trace_json``); newer torch may serve both from one. Both are read and de-duplicated.
_DUMPS = ("_dump_fr_trace_json", "_dump_nccl_trace_json")


def _entry_key(entry: Any) -> tuple:
    if not isinstance(entry, dict):
        return (id(entry),)
    group = entry.get("process_group")
    return (repr(group), entry.get("profiling_name"), entry.get("op_id"),
            entry.get("collective_seq_id"), entry.get("p2p_seq_id"), entry.get("time_created_ns"))


Handler = Callable[[Served, dict[str, Any]], dict[str, Any]]
#: The commands: name -> handler(agent, request) -> reply.
HANDLERS: dict[str, Handler] = {
    "ping": _ping,
    "stacks": _stacks,
    "flight_recorder": _flight_recorder,
    "exit": _exit,
    "quiet": _quiet,
}
