"""PyTorch Flight Recorder entries as events, merged with the recorder's by (group, sequence).

Collectives issued from C++ (DDP's gradient all_reduce buckets, its construction broadcasts) never
pass through the Python API the recorder wraps; Flight Recorder sees them. The in-rank agent
dumps it (``torch._C._distributed_c10d._dump_fr_trace_json``); see nccl_doctor/rank/agent.py for
what an entry holds. Facts this relies on (torch 2.13, gloo): an entry's ``op_id`` is the group's
sequence number of the operation, the number the recorder records, and ``collective_seq_id``
counts the group's collectives only; on gloo ``retired`` says the work finished (``state`` stays
"scheduled"); on NCCL ``state`` moves "scheduled" -> "started" -> "completed" as the watchdog
thread finds the work's CUDA events done (torch's FlightRecorder.hpp: "a retired but not
completed event has timed out").

Completion: on NCCL a collective returns on the CPU as soon as it is enqueued on the GPU stream,
long before it completes (the same holds for any ``async_op=True`` work that is not waited on).
A call the recorder saw return whose Flight Recorder entry is neither retired nor completed is
still in flight: ``merge`` turns it back into a call the rank is inside (``Event.in_flight``), so
the watchdog sees that rank waiting on its peers instead of computing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from nccl_doctor import paths
from nccl_doctor.model import (
    Event, EventFlag, EventKind, EventSource, EventState, Location, TraceSet,
)

IDX_BASE = 10**12  # Flight Recorder events get idx IDX_BASE + record_id: never a recorder idx

_DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
    "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
    "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128",
}


def _tensors_cached(sizes: Any, dtypes: Any, cache: dict[str, str]) -> str:
    """``_tensors``, once per distinct description (a dump repeats a handful thousands of
    times)."""
    key = f"{sizes!r}|{dtypes!r}"
    text = cache.get(key)
    if text is None:
        text = cache[key] = _tensors(sizes, dtypes)
    return text


def _tensors(sizes: Any, dtypes: Any) -> str:
    if not isinstance(sizes, list) or not isinstance(dtypes, list):
        return ""
    parts = []
    for shape, dtype in zip(sizes, dtypes):
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return ""
        parts.append(f"{_DTYPES.get(str(dtype), str(dtype).lower())}[{','.join(map(str, shape))}]")
    return ";".join(parts)


def events_from_dump(trace: Mapping[str, Any]) -> list[Event]:
    """The collectives of one rank's Flight Recorder dump, as events (p2p entries are skipped).

    Each is placed by the entry's Python stack, when it has one (torch's pickled dumps, the
    agent's pulls): the stack of the thread that made the call when it was made - for a call
    issued from C++ (DDP's), the Python code that led to it. With no stack it has no place (no
    placeholder is ever made one): the reports then describe it from the rank's stack sample.

    Sequence numbers are the recorder's (``_get_sequence_number_for_group``): on gloo that counts
    every operation (``op_id``); ProcessGroupNCCL returns its collective count
    (``collective_seq_id``). Malformed entries are skipped: the dump comes from a live process,
    never trusted blindly."""
    out = []
    entries = trace.get("entries") if isinstance(trace, Mapping) else None
    entries = entries if isinstance(entries, list) else []
    done_up_to = _done_up_to(entries)
    sites: dict[Any, Any] = {}
    tensors: dict[str, str] = {}
    for entry in entries:
        try:
            at = position(entry)
            if at is None:
                continue
            group, seq = at
            coll, _ = int(entry["collective_seq_id"]), int(entry["op_id"])
            name = str(entry["profiling_name"]).rpartition(":")[2] or "?"
            created = int(entry.get("time_created_ns", 0))
            record = int(entry.get("record_id", 0))
            done = completed(entry) or record < done_up_to.get(group, -1)
            callsite, api, path, context = _callsites(entry.get("frames"), sites)
            if not context and "autograd" in str(entry.get("thread_name", "")):
                # CUDA's backward runs on autograd's own threads (pt_autograd_N), which hold no
                # Python stack: DDP's gradient all_reduce there has none, its thread says when
                context = "issued from C++ during backward"
            out.append(Event(
                idx=IDX_BASE + record, parent=0,
                kind=EventKind.COLLECTIVE, op=name, group=group, seq=seq,
                seq_offset=seq - coll, seq_delta=1 if done else None,
                state=EventState.RETURNED if done else EventState.ENTERED,
                flags=EventFlag.NONE, t_enter_ns=created, t_exit_ns=None,
                thread=int(entry.get("thread_id", 0) or 0),
                input=_tensors_cached(entry.get("input_sizes"), entry.get("input_dtypes"),
                                      tensors),
                output=_tensors_cached(entry.get("output_sizes"), entry.get("output_dtypes"),
                                       tensors),
                nbytes=0, peer=-1, group_size=0, callsite=callsite, api_callsite=api, path=path,
                source=EventSource.FLIGHT_RECORDER, t_gpu_start_ns=_gpu_start(entry),
                t_gpu_end_ns=_gpu_end(entry),
                context=context,
            ))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            continue
    return out


def _gpu_start(entry: Mapping[str, Any]) -> int | None:
    """When the entry's kernel started on the GPU: NCCL with timing on; 0/None elsewhere."""
    value = entry.get("time_discovered_started_ns")
    return value if isinstance(value, int) and value > 0 else None


def _gpu_end(entry: Mapping[str, Any]) -> int | None:
    """When the entry's kernel completed on the GPU, if its start is known too (a completion
    alone, without timing, says nothing of the time inside the collective): its start plus the
    kernel's own duration (``duration_ms``, CUDA events, with TORCH_NCCL_ENABLE_TIMING=1) where
    the dump has it, else when the completion was discovered (the watchdog's polling bounds
    that one's resolution)."""
    start = _gpu_start(entry)
    if not start:
        return None
    duration = entry.get("duration_ms")
    if isinstance(duration, (int, float)) and not isinstance(duration, bool) and duration >= 0:
        return start + int(duration * 1e6)
    value = entry.get("time_discovered_completed_ns")
    return value if isinstance(value, int) and value > 0 else None


def position(entry: Any) -> tuple[str, int] | None:
    """(process group, sequence number) of a collective entry, numbered as the recorder numbers
    calls (``_get_sequence_number_for_group``): NCCL's collective count, gloo's op id. None for
    p2p and malformed entries."""
    try:
        if entry.get("is_p2p"):
            return None
        name = entry["profiling_name"]
        seq = entry["collective_seq_id"] if str(name).startswith("nccl:") else entry["op_id"]
        return str(entry["process_group"][0]), int(seq)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None


#: Frames a call path keeps (as the recorder's: rank/recorder/arguments.PATH_FRAMES).
PATH_FRAMES = 16


def _callsites(frames: Any, cache: dict) -> tuple[Location | None, Location | None,
                                                   tuple[Location, ...], str]:
    """(first frame outside library code, first frame outside torch, the call path: the frames
    outside torch from the latter out to the former, what torch's own frames say made the call)
    of an entry's stack (innermost first); no place at all when the entry has no stack (JSON
    dumps carry none; torch's pickles and the agent's pulls do). ``cache`` keeps each file's
    class and each frame's ``Location`` (a dump repeats a few stacks thousands of times)."""
    if not isinstance(frames, list) or not frames:
        return None, None, (), ""
    user = api = None
    chain: list[Location] = []
    torch_between = False
    context: list[str] = []
    for f in frames:
        if type(f) is not dict:
            continue
        path = f.get("filename")
        kind = cache.get(path)
        if kind is None:
            if not isinstance(path, str):
                continue
            kind = cache[path] = (paths.is_library_file(path), paths.is_internal_file(path))
        library, internal = kind
        if internal:
            torch_between = bool(chain)
            what = _made_by(path, str(f.get("name", "")))
            if what and what not in context:
                context.append(what)
            continue
        key = (path, f.get("line"), f.get("name"))
        where = cache.get(key)
        if where is None:
            line = key[1]
            where = cache[key] = Location(path, line if type(line) is int else 0, str(key[2] or ""))
        if api is None:
            api = where
        if len(chain) < PATH_FRAMES:
            if torch_between:  # the frame kept last was called by torch (a hook, autograd)
                chain[-1] = replace(chain[-1], from_torch=True)
            chain.append(where)
        torch_between = False
        if not library:
            user = where
            break
    return user, api, tuple(chain), context[0] if context else ""


ISSUED_FROM_CPP = "issued from C++"
#: torch's frames that say what issued a call from C++: (file ending, function) -> words
_MADE_BY = (
    ("autograd/graph.py", "_engine_run_backward", "issued from C++ during backward"),
    ("nn/parallel/distributed.py", "__init__", "issued from C++ by DDP's constructor"),
    ("nn/parallel/distributed.py", "_pre_forward", "issued from C++ by DDP during forward"),
    ("nn/parallel/distributed.py", "forward", "issued from C++ by DDP during forward"),
    ("nn/parallel/distributed.py", "_post_forward", "issued from C++ by DDP during forward"),
)


def _made_by(path: str, name: str) -> str:
    norm = path.replace("\\", "/")
    return next((words for end, fn, words in _MADE_BY
                 if norm.endswith(end) and name.rpartition(".")[2] == fn), "")


def _done_up_to(entries: list) -> dict[str, int]:
    """Per group, the newest record id of a completed NCCL entry: a group's NCCL work runs in
    order on one stream, so every older entry is done too (coalesced ops' own entries carry no
    CUDA events and never show "completed" themselves)."""
    out: dict[str, int] = {}
    for entry in entries:
        try:
            if str(entry["profiling_name"]).startswith("nccl:") and completed(entry):
                group, record = str(entry["process_group"][0]), int(entry["record_id"])
                out[group] = max(out.get(group, -1), record)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            continue
    return out


def completed(entry: Mapping[str, Any]) -> bool:
    """Whether a Flight Recorder entry's work finished. NCCL: ``state`` "completed" (its end CUDA
    event was seen done; an NCCL entry retired but not completed timed out). Other backends
    (gloo) never move ``state``: ``retired`` says the work finished."""
    if entry.get("state") == "completed":
        return True
    nccl = str(entry.get("profiling_name", "")).startswith("nccl:")
    return not nccl and bool(entry.get("retired"))


def merge(traces: TraceSet, dumps: Mapping[int, Mapping[str, Any]]) -> TraceSet:
    """``traces`` plus the Flight Recorder collectives the recorder did not see (by group and
    sequence number), each rank's events in time order; a recorded call that returned on the CPU
    but whose work is not completed becomes the call the rank is inside (the earliest such call
    per group: a stream runs its collectives in order)."""
    ranks = dict(traces.ranks)
    for rank, dump in dumps.items():
        trace = ranks.get(rank)
        if trace is None:
            continue
        fr = events_from_dump(dump)
        in_flight = _in_flight(trace.events, fr)
        started = {(e.group, e.seq): (e.t_gpu_start_ns, e.t_gpu_end_ns) for e in fr
                   if e.t_gpu_start_ns}
        seen = {(e.group, e.seq) for e in trace.events if e.seq >= 0}
        # the recorder saw every Python call: what only Flight Recorder saw was issued from C++
        extra = [e if e.context else replace(e, context=ISSUED_FROM_CPP)
                 for e in fr if (e.group, e.seq) not in seen]
        timed = started and any((e.t_gpu_start_ns is None or e.t_gpu_end_ns is None)
                                and (e.group, e.seq) in started
                                for e in trace.events)
        if extra or in_flight or timed:
            events = [_merged(e, e.idx in in_flight, started) for e in trace.events]
            events = sorted(events + extra, key=lambda e: e.t_enter_ns)
            ranks[rank] = replace(trace, events=tuple(events))
    if all(ranks[r] is t for r, t in traces.ranks.items()):
        return traces  # nothing to add: the same object (the watchdog's analysis is kept on it)
    return replace(traces, ranks=ranks)


def _merged(e: Event, in_flight: bool,
            started: Mapping[tuple[str, int], tuple[int | None, int | None]]) -> Event:
    """A recorded event with what Flight Recorder adds: still in flight, its GPU start and
    completion."""
    fr = started.get((e.group, e.seq), (None, None))
    gpu, end = e.t_gpu_start_ns or fr[0], e.t_gpu_end_ns or fr[1]
    if not in_flight and gpu == e.t_gpu_start_ns and end == e.t_gpu_end_ns:
        return e
    if in_flight:
        return replace(e, state=EventState.ENTERED, in_flight=True, t_gpu_start_ns=gpu,
                       t_gpu_end_ns=None)
    return replace(e, t_gpu_start_ns=gpu, t_gpu_end_ns=end)


def _in_flight(recorded: tuple[Event, ...], fr: list[Event]) -> set[int]:
    """idx of the recorded calls that returned (or were issued async) but whose Flight Recorder
    entry is not completed: the earliest per group."""
    pending = {(e.group, e.seq) for e in fr if e.state is EventState.ENTERED}
    out: dict[str, Event] = {}
    for e in recorded:
        if (e.state in (EventState.RETURNED, EventState.ISSUED) and e.kind is EventKind.COLLECTIVE
                and (e.group, e.seq) in pending):
            first = out.get(e.group)
            if first is None or e.seq < first.seq:
                out[e.group] = e
    return {e.idx for e in out.values()}


def has_nccl(dumps: Mapping[int, Any]) -> bool:
    """Whether any rank's dump holds NCCL work."""
    for trace in dumps.values():
        entries = trace.get("entries") if isinstance(trace, Mapping) else None
        for e in entries if isinstance(entries, list) else ():
            if isinstance(e, Mapping) and str(e.get("profiling_name", "")).startswith("nccl:"):
                return True
    return False


def progress_signature(dumps: Mapping[int, Any]) -> tuple:
    """Per rank: entries recorded, the newest record id, entries completed. Two pulls with
    different signatures mean collectives were issued or completed in between (progress)."""
    out = []
    for rank in sorted(dumps):
        trace = dumps[rank]
        entries = trace.get("entries") if isinstance(trace, Mapping) else None
        entries = entries if isinstance(entries, list) else []
        ids = [e.get("record_id") for e in entries if isinstance(e, Mapping)]
        newest = max((i for i in ids if isinstance(i, int)), default=-1)
        done = sum(1 for e in entries if isinstance(e, Mapping) and completed(e))
        out.append((rank, len(entries), newest, done))
    return tuple(out)


def entry_fate(dump: Mapping[str, Any], group: str, seq: int) -> str | None:
    """What became of collective ``seq`` of ``group`` in one rank's dump: "completed",
    "timed_out" (an NCCL entry retired without completing: its watchdog gave up on it),
    "pending", or None when the dump does not hold it."""
    entries = dump.get("entries") if isinstance(dump, Mapping) else None
    entries = entries if isinstance(entries, list) else []
    for entry in entries:
        if position(entry) != (group, seq):
            continue
        record = entry.get("record_id")
        if completed(entry) or (isinstance(record, int)
                                and record < _done_up_to(entries).get(group, -1)):
            return "completed"
        nccl = str(entry.get("profiling_name", "")).startswith("nccl:")
        return "timed_out" if nccl and entry.get("retired") else "pending"
    return None
