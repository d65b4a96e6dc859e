"""The agent's server: a daemon thread in a rank that answers the supervisor, one request at a time.

It must never hurt the job it lives in: it issues no collective, lets no exception out (a failing
handler becomes ``{"ok": false, "error": ...}``), runs on a daemon thread, leaves no file behind (an
abstract socket), writes nothing on stdout/stderr except one line when it cannot start, and imports
no torch of its own (the Flight Recorder command uses torch only if the rank already imported it).
The thread sleeps in ``poll`` between requests: no polling, no CPU while idle. Only a client of
the rank's own user (or root) is answered: an abstract socket has no file permissions, so the
peer's credentials (``SO_PEERCRED``) are checked on every connection.

Its commands (ping, stacks, quiet, exit, flight_recorder) and how a rank leaves: agent_commands.py.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any

from nccl_doctor import agent_protocol as protocol
from nccl_doctor.rank.agent_commands import HANDLERS, leave
__all__ = ["HANDLERS", "THREAD_NAME", "Agent", "after_fork_in_child", "current", "start"]

THREAD_NAME = "nccl-doctor-agent"
#: Longest time one connection may take, reading the request and writing the reply together.
CONNECTION_DEADLINE_S = 10.0
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
        self.leave_with: int | None = None  # set by ``exit``: leave once the reply is sent
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
                if self.leave_with is not None:
                    leave(self.leave_with)
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
