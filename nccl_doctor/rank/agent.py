"""The agent's server: a daemon thread in a rank that answers the supervisor, one request at a time.

It must never hurt the job it lives in: it issues no collective, lets no exception out (a failing
handler becomes ``{"ok": false, "error": ...}``), runs on a daemon thread, leaves no file behind (an
abstract socket), writes nothing on stdout/stderr except one line when it cannot start, and imports
no torch of its own (the Flight Recorder command uses torch only if the rank already imported it).
The thread sleeps in ``poll`` between requests: no polling, no CPU while idle. Only a client of
the rank's own user (or root) is answered: an abstract socket has no file permissions, so the
peer's credentials (``SO_PEERCRED``) are checked on every connection.

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
    recorded: the dump leaves the key out then). Else ``{"ok": false, "error": ...}``.

What the Flight Recorder dump holds (verified on real 2-rank gloo jobs, torch 2.13.0+cpu):

- top level: ``version`` ("2.10"), ``entries``, ``pg_status``, ``pg_config``, ``nccl_comm_state``
  and ``comm_lib_version`` (the last two empty on gloo). On gloo ``pg_config`` has one entry
  keyed "" with empty name and desc (``ranks`` "[]" or "[0, 1]" depending on the launch): use
  the entries' ``process_group`` for names. ``pg_status`` is keyed by ``pg_id`` as a string,
  only for groups that ran a collective, and holds
  ``{"last_enqueued_collective", "last_completed_collective", "last_started_collective"}`` as
  strings, counted in ``op_id`` units (see below); on gloo ``last_started_collective`` stays
  "-1", and ``last_completed_collective`` is unreliable: usually the last finished op_id, but in
  about 1 run of 15 it stayed behind for good ("3" while op 5 had long finished, its entry
  retired), likely gloo's worker threads overwriting each other. Use the entries' ``retired``.
- an entry: ``record_id`` (index in the ring, per process), ``pg_id``, ``process_group``
  ``[name, desc]`` (e.g. ``["0", "default_pg"]``; ``desc`` is ``new_group(group_desc=)``, else
  "undefined"), ``collective_seq_id``, ``p2p_seq_id``, ``op_id``, ``profiling_name`` (e.g.
  "gloo:all_reduce", "gloo:broadcast", "gloo:barrier", "gloo:all_gather"), ``is_p2p``,
  ``input_sizes``/``output_sizes`` (lists of shapes), ``input_dtypes``/``output_dtypes`` (e.g.
  "Float", "Long"), ``state``, ``retired``, ``time_created_ns`` (epoch ns),
  ``time_discovered_started_ns``/``time_discovered_completed_ns`` (0 on gloo), ``timeout_ms``,
  ``thread_id``/``thread_name`` of the issuing thread. No stack frames in the JSON form.
- state on gloo: ``state`` is "scheduled" for every entry, finished or not; completion shows as
  ``retired`` (true once the work finished, false for a collective still pending, e.g. rank 0
  blocked in a broadcast its peer never joins; ``pg_status.last_enqueued_collective`` is then that
  collective's op_id). ``only_active=true`` filters nothing on gloo (it keys on state).
- Collectives issued from C++ are there: DDP's construction (``gloo:all_gather`` of the parameter
  count, two ``gloo:broadcast``s of the module state) and its gradient bucket ``gloo:all_reduce``.
- Enabled by default in torch 2.13 (``TORCH_FR_BUFFER_SIZE`` defaults to 2000 entries);
  ``TORCH_FR_BUFFER_SIZE=0`` (or the older ``TORCH_NCCL_TRACE_BUFFER_SIZE=0``) turns it off. The
  C++ recorder is a process-wide singleton that reads the variable once, when first used (the
  first collective, or a dump): set it before ``init_process_group``. The dump leaves out
  ``entries`` when none were recorded, disabled or not, hence the env check below.

Sequence numbers (probe: all_reduce x3, send/recv, barrier, all_reduce on a new group,
async all_reduce, broadcast, then DDP; compared with ``pg._get_sequence_number_for_group()``):

- ``pg._get_sequence_number_for_group()`` starts at 0 after ``init_process_group`` and counts every
  operation of the group, collectives *and* p2p (send, recv, isend, irecv, each op of
  ``batch_isend_irecv``), including those issued from C++ (DDP). After the k-th operation it is k.
- ``op_id`` is exactly that number for the operation (1-based: the first operation has op_id 1).
- ``collective_seq_id`` counts only the group's collectives, 1-based (first collective = 1); it
  equals ``op_id`` until the group's first p2p operation and lags it by the number of p2p ops since.
- On gloo, p2p operations are not recorded at all: no entry, ``p2p_seq_id`` stays 0 everywhere,
  ``collective_seq_id`` is not bumped, but ``op_id``/the group sequence number are.
- All three are per process group (a new group starts again at 1).
So to merge Flight Recorder with sequence numbers taken from ``_get_sequence_number_for_group()``
match on (``process_group[0]``, ``op_id``), not on ``collective_seq_id``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from nccl_doctor import agent_protocol as protocol
__all__ = ["HANDLERS", "THREAD_NAME", "Agent", "after_fork_in_child", "current", "start"]

THREAD_NAME = "nccl-doctor-agent"
#: Longest time one connection may take, reading the request and writing the reply together.
CONNECTION_DEADLINE_S = 10.0
_MAX_FRAMES = 2000  # per thread: a runaway recursion must not make a reply of hundreds of MiB
_BACKLOG = 16


class Agent:
    """A running agent. Create it with ``start``; ``stop`` ends it."""

    def __init__(self, run_id: str, sock: socket.socket) -> None:
        self.run_id = run_id
        self.pid = os.getpid()
        self._sock = sock
        self._wake_r, self._wake_w = os.pipe()  # close-on-exec by default (PEP 446)
        self._stopping = False
        self._conn: socket.socket | None = None  # the connection being answered, if any
        self._leave_with: int | None = None  # set by ``exit``: leave once the reply is sent
        self._fd_lock = threading.Lock()  # stop() writes the wake pipe, the thread closes it
        self._thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)

    @property
    def address(self) -> str:
        return protocol.address(self.run_id, self.pid)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread_ident(self) -> int | None:
        return self._thread.ident

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close the socket (its name is free again once this returns)."""
        global _AGENT
        try:
            if _AGENT is self:
                _AGENT = None
            self._stopping = True
            with self._fd_lock:
                if self._wake_w >= 0:
                    try:
                        os.write(self._wake_w, b"x")
                    except OSError:
                        pass
            if threading.current_thread() is not self._thread and self._thread.is_alive():
                self._thread.join(timeout)
            if not self._thread.is_alive():
                with self._fd_lock:
                    self._close_fds()
        except Exception:  # noqa: BLE001, S110 - called from user code: must not raise
            pass

    # -- the thread ---------------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            # poll, not select: a big rank easily holds descriptors above select's FD_SETSIZE
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            while not self._stopping:
                try:
                    ready = poller.poll()
                except InterruptedError:
                    continue
                if self._stopping or any(fd == self._wake_r for fd, _ in ready):
                    return
                try:
                    conn, _ = self._sock.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError:
                    return
                self._conn = conn
                try:
                    self._answer(conn)
                finally:
                    self._conn = None
                if self._leave_with is not None:
                    leave(self._leave_with)
        except BaseException:  # noqa: BLE001, S110 - a daemon thread dies quietly
            pass
        finally:
            with self._fd_lock:
                self._close_fds()

    def _answer(self, conn: socket.socket) -> None:
        try:
            deadline = time.monotonic() + CONNECTION_DEADLINE_S
            unread = False
            try:
                if not _same_user(conn):
                    return  # closed unanswered: another user has no business with this rank
                line = protocol.recv_line(conn, protocol.MAX_REQUEST, deadline)
                reply = self.handle(protocol.decode_request(line))
            except protocol.ProtocolError as err:
                reply = {"ok": False, "error": str(err)}
                unread = isinstance(err, protocol.RequestTooLarge)
            data = _encode(reply)
            protocol.send_all(conn, data, deadline)
            if unread:
                _drain(conn, min(deadline, time.monotonic() + 1.0))
        except Exception:  # noqa: BLE001, S110 - a client hung up or stalled: drop it
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reply to one decoded request; never raises."""
        cmd = request.get("cmd")
        handler = HANDLERS.get(cmd) if isinstance(cmd, str) else None
        if handler is None:
            known = ", ".join(sorted(HANDLERS))
            return {"ok": False, "error": f"unknown command {cmd!r} (known: {known})"}
        try:
            reply = handler(self, request)
        except Exception as err:  # noqa: BLE001 - the job must not notice a failing handler
            return {"ok": False, "error": f"{cmd}: {err!r}"}
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            return {"ok": False, "error": f"{cmd}: handler returned {type(reply).__name__}"}
        return reply

    def _close_fds(self) -> None:
        """Close the socket and the wake pipe, once (the caller holds ``_fd_lock``, or is alone)."""
        try:
            self._sock.close()
        except OSError:
            pass
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        # a second os.close of the same number could hit a reused descriptor: forget them
        self._wake_r = self._wake_w = -1


_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer runs as this process's user, or as root."""
    try:
        _pid, uid, _gid = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except (OSError, AttributeError, struct.error):
        return False
    return uid in (os.getuid(), 0)


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


def _drain(conn: socket.socket, deadline: float, limit: int = 4 << 20) -> None:
    """Read and drop what the client is still sending (bounded in time and bytes).

    A unix socket closed with unread input resets the connection, and the peer's next ``recv``
    then fails with ECONNRESET before it sees the reply already queued for it.
    """
    try:
        conn.shutdown(socket.SHUT_WR)
        dropped = 0
        while dropped < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            conn.settimeout(left)
            chunk = conn.recv(65536)
            if not chunk:
                return
            dropped += len(chunk)
    except OSError:
        pass


def _encode(reply: dict[str, Any]) -> bytes:
    try:
        data = protocol.encode_response(reply)
    except (TypeError, ValueError) as err:
        return protocol.encode_response({"ok": False, "error": f"reply is not JSON: {err!r}"})
    if len(data) > protocol.MAX_RESPONSE:
        return protocol.encode_response(
            {"ok": False, "error": f"reply of {len(data)} bytes is over {protocol.MAX_RESPONSE}"})
    return data


# -- handlers -------------------------------------------------------------------------------------

def _dist() -> Any:
    """``torch.distributed`` if this process already imported it, else None (never imports)."""
    return sys.modules.get("torch.distributed")


def _ping(agent: Agent, request: dict[str, Any]) -> dict[str, Any]:
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


def _quiet(agent: Agent, request: dict[str, Any]) -> dict[str, Any]:
    if _handles_sigterm():
        return {"ok": False, "error": "quiet: the job handles SIGTERM itself"}
    sys.excepthook = _end_silently
    return {"ok": True}


def _end_silently(tp: type, value: BaseException, tb: Any) -> None:
    """The main thread's exception while the rank is being stopped (a peer that left first broke
    its collective): no traceback, status 0 - the stop's doing, not the job's failure."""
    leave(0)


def _exit(agent: Agent, request: dict[str, Any]) -> dict[str, Any]:
    code = request.get("code", 0)
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        return {"ok": False, "error": f"exit: code must be an integer 0-255, got {code!r}"}
    if _handles_sigterm():
        return {"ok": False, "error": "exit: the job handles SIGTERM itself"}
    agent._leave_with = code
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


def _stacks(agent: Agent, request: dict[str, Any]) -> dict[str, Any]:
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


def _flight_recorder(agent: Agent, request: dict[str, Any]) -> dict[str, Any]:
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
    if not isinstance(include, bool) or not isinstance(only_active, bool):
        return {"ok": False, "error": "include_collectives and only_active must be booleans"}
    trace: dict[str, Any] | None = None
    seen: set[tuple] = set()
    for dump in dumps:
        part = json.loads(dump(include, only_active))
        if not isinstance(part, dict):
            return {"ok": False, "error": f"Flight Recorder dump is a JSON {type(part).__name__}"}
        entries = part.get("entries") if isinstance(part.get("entries"), list) else []
        if trace is None:
            trace = {**part, "entries": []}
        for entry in entries:  # the recorders may be one (newer torch) or two: never twice
            key = _entry_key(entry)
            if key not in seen:
                seen.add(key)
                trace["entries"].append(entry)
    assert trace is not None
    return {"ok": True, "trace": trace}


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


Handler = Callable[[Agent, dict[str, Any]], dict[str, Any]]
#: The commands: name -> handler(agent, request) -> reply.
HANDLERS: dict[str, Handler] = {
    "ping": _ping,
    "stacks": _stacks,
    "flight_recorder": _flight_recorder,
    "exit": _exit,
    "quiet": _quiet,
}


# -- lifecycle ------------------------------------------------------------------------------------

_AGENT: Agent | None = None
_FORK_HOOK_REGISTERED = False


def current() -> Agent | None:
    """The agent running in this process, if any."""
    return _AGENT


def start(run_id: str) -> Agent | None:
    """Start this process's agent for ``run_id`` (or return the one already running for it).

    Returns None, after one line on stderr, when it cannot start (e.g. the name is taken); never
    raises. A running agent of another run is stopped first: one agent per process.
    """
    global _AGENT, _FORK_HOOK_REGISTERED
    sock = None
    try:
        running = _AGENT
        if running is not None and running.pid == os.getpid():
            if running.run_id == run_id and running.alive:
                return running
            running.stop()
        name = protocol.address(run_id, os.getpid())
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.bind(name)
        sock.listen(_BACKLOG)
        sock.setblocking(False)  # accept() after a spurious wake-up must not block the thread
        agent = Agent(run_id, sock)
        if not _FORK_HOOK_REGISTERED:
            os.register_at_fork(after_in_child=after_fork_in_child)
            _FORK_HOOK_REGISTERED = True
        agent._thread.start()
        _AGENT = agent
        return agent
    except Exception as err:  # noqa: BLE001 - the job goes on without its agent
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        try:
            sys.stderr.write(f"nccl-doctor: in-rank agent not started (pid {os.getpid()}): "
                             f"{err!r}\n")
        except Exception:  # noqa: BLE001, S110 - stderr closed: stay silent
            pass
        return None


def after_fork_in_child() -> None:
    """In a forked child (a DataLoader worker, say): close the inherited listening socket.

    The serving thread does not survive ``fork``; left open, the child's copy of the descriptor
    would keep the name bound after the parent is gone, and a client would then wait for its
    timeout instead of being refused at once. Registered with ``os.register_at_fork`` by ``start``.
    """
    global _AGENT
    agent, _AGENT = _AGENT, None
    if agent is None:
        return
    agent._stopping = True
    try:
        # no _fd_lock: the parent's agent thread may have held it at fork time, and the child has
        # no other thread. These are the child's copies only; the parent's agent goes on serving.
        agent._close_fds()
        conn = agent._conn  # a request in flight at fork: the client must still see EOF
        if conn is not None:
            conn.close()
    except Exception:  # noqa: BLE001, S110 - the child goes on regardless
        pass
