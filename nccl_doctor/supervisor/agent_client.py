"""The supervisor's side: ask one rank's agent, or many in parallel.

Failures come back as ``AgentUnavailable`` with a one-line reason (no such process, nothing
listening, timeout, malformed reply); a reply with ``"ok": false`` is returned, not raised: the
agent answered, the command could not be served.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nccl_doctor import agent_protocol as protocol
__all__ = ["AgentUnavailable", "request", "request_many"]

_MAX_WORKERS = 64


class AgentUnavailable(Exception):
    """No reply from an agent; ``str()`` is a one-line reason."""


def request(run_id: str, pid: int, cmd: str, *, timeout: float = 5.0,
            **fields: Any) -> dict[str, Any]:
    """Send ``cmd`` (with ``fields``) to the agent of ``pid`` in run ``run_id``; its reply.

    ``timeout`` bounds the whole exchange (connect, send, reading the reply).
    """
    who = f"agent of pid {pid}"
    try:
        name = protocol.address(run_id, pid)
        data = protocol.encode_request(cmd, **fields)
    except (TypeError, ValueError) as err:
        raise AgentUnavailable(f"{who}: bad request: {err}") from None
    deadline = time.monotonic() + timeout
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    except OSError as err:
        raise AgentUnavailable(f"{who}: cannot create a socket: {err.strerror or err}") from None
    try:
        sock.settimeout(max(timeout, 0.001))
        try:
            sock.connect(name)
        except ConnectionRefusedError:
            raise AgentUnavailable(f"{who}: {_refused_reason(pid)}") from None
        except (BlockingIOError, TimeoutError):
            # a full accept backlog: the agent is alive but not accepting (or far behind)
            raise AgentUnavailable(f"{who}: timeout connecting (agent busy)") from None
        protocol.send_all(sock, data, deadline)
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        raw = protocol.recv_until_eof(sock, protocol.MAX_RESPONSE, deadline)
        if not raw:
            raise AgentUnavailable(f"{who}: closed the connection without a reply")
        return protocol.decode_response(raw)
    except TimeoutError:
        raise AgentUnavailable(f"{who}: timeout after {timeout:g}s waiting for {cmd!r}") from None
    except protocol.ProtocolError as err:
        raise AgentUnavailable(f"{who}: {err}") from None
    except OSError as err:
        raise AgentUnavailable(f"{who}: {err.strerror or err}") from None
    finally:
        sock.close()


def _refused_reason(pid: int) -> str:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "no such process"
    except OSError as err:
        if err.errno != errno.EPERM:  # EPERM: it exists, owned by someone else
            return f"cannot check the process ({err.strerror})"
    return "no agent listening (connection refused)"


def request_many(run_id: str, pids: dict[int, int], cmd: str, *, timeout: float = 5.0,
                 **fields: Any) -> dict[int, dict[str, Any] | AgentUnavailable]:
    """``request`` to every ``rank -> pid`` at once; per rank the reply or the failure.

    Takes about ``timeout`` in all, however many ranks (one thread per rank, up to 64).
    """
    if not pids:
        return {}

    def one(pid: int) -> dict[str, Any] | AgentUnavailable:
        try:
            return request(run_id, pid, cmd, timeout=timeout, **fields)
        except AgentUnavailable as err:
            return err
        except Exception as err:  # noqa: BLE001 - one rank's surprise must not lose the others
            return AgentUnavailable(f"agent of pid {pid}: {err!r}")

    with ThreadPoolExecutor(max_workers=min(_MAX_WORKERS, len(pids)),
                            thread_name_prefix="nccl-doctor-client") as pool:
        futures = {rank: pool.submit(one, pid) for rank, pid in pids.items()}
        return {rank: future.result() for rank, future in futures.items()}
