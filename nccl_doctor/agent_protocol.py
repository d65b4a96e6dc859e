"""The agent's wire protocol, shared by the in-rank server and the supervisor's client.

Transport: a Linux abstract-namespace AF_UNIX stream socket named
``"\\0nccl-doctor/<run_id>/<pid>"`` (no filesystem entry: nothing to clean up, no path-length
trouble in deep temp dirs, and the name disappears with the process).

One request per connection: the client sends one line of JSON ``{"cmd": "...", ...}\\n``; the
server replies with one JSON document and closes the connection, so the client reads until EOF.
Both directions are bounded: a request over ``MAX_REQUEST`` bytes is refused, a reply over
``MAX_RESPONSE`` bytes is not read.
"""

from __future__ import annotations

import json
import socket
import time
from nccl_doctor import bounded_json
from typing import Any

__all__ = [
    "MAX_REQUEST", "MAX_RESPONSE", "NAMESPACE", "ProtocolError", "RequestTooLarge", "address",
    "decode_request", "decode_response", "encode_request", "encode_response", "recv_line",
    "recv_until_eof", "send_all",
]

#: Largest request line (a request is a command and a few small fields).
MAX_REQUEST = 64 * 1024
#: Largest reply read back (a Flight Recorder dump of a few thousand entries is a few MiB).
MAX_RESPONSE = 64 * 1024 * 1024
#: First component of every agent's socket name.
NAMESPACE = "nccl-doctor"

_SUN_PATH_MAX = 107  # bytes of sun_path usable by an abstract name (108 minus the leading NUL)


class ProtocolError(ValueError):
    """A request or reply that is not what the protocol allows; ``str()`` is one line."""


class RequestTooLarge(ProtocolError):
    """A request line over the limit (its tail is still unread on the connection)."""


def address(run_id: str, pid: int) -> str:
    """The abstract socket name of the agent of process ``pid`` in run ``run_id``."""
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
    if "\0" in run_id or "/" in run_id:
        raise ValueError(f"run_id must not contain NUL or '/', got {run_id!r}")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ValueError(f"pid must be a positive integer, got {pid!r}")
    name = f"\0{NAMESPACE}/{run_id}/{pid}"
    if len(name.encode()) - 1 > _SUN_PATH_MAX:
        raise ValueError(f"run_id {run_id!r} is too long for a socket name")
    return name


def encode_request(cmd: str, **fields: Any) -> bytes:
    """One request line. ``fields`` must be JSON-serialisable and may not be named ``cmd``."""
    if not isinstance(cmd, str) or not cmd:
        raise ValueError(f"cmd must be a non-empty string, got {cmd!r}")
    data = (json.dumps({"cmd": cmd, **fields}, separators=(",", ":")) + "\n").encode()
    if len(data) > MAX_REQUEST:
        raise ValueError(f"request of {len(data)} bytes is over the {MAX_REQUEST}-byte limit")
    return data


def decode_request(data: bytes) -> dict[str, Any]:
    """The request object of one line (with or without its newline)."""
    try:
        obj = bounded_json.loads(data)
    except ValueError as err:
        raise ProtocolError(f"malformed request: not a line of JSON ({err})") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"malformed request: a JSON {type(obj).__name__}, expected an object")
    if not isinstance(obj.get("cmd"), str):
        raise ProtocolError("malformed request: no string 'cmd'")
    return obj


def encode_response(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_response(data: bytes) -> dict[str, Any]:
    """The reply object; a reply that is not a JSON object with a boolean ``ok`` is malformed."""
    try:
        obj = bounded_json.loads(data)
    except ValueError as err:
        raise ProtocolError(f"malformed reply: not JSON ({err})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        raise ProtocolError("malformed reply: expected a JSON object with a boolean 'ok'")
    return obj


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def recv_line(sock: socket.socket, limit: int, deadline: float) -> bytes:
    """Bytes up to the first newline (or EOF), at most ``limit``; ``ProtocolError`` past it.

    Raises ``TimeoutError`` once ``deadline`` (``time.monotonic()``) passes: a client that drips
    one byte at a time cannot hold the reader longer than that.
    """
    buf = bytearray()
    while True:
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(min(65536, limit + 1 - len(buf)))
        if not chunk:
            return bytes(buf)
        newline = chunk.find(b"\n")
        if newline >= 0:
            buf += chunk[:newline]
            if len(buf) > limit:
                break
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            break
    raise RequestTooLarge(f"request larger than {limit} bytes")


def recv_until_eof(sock: socket.socket, limit: int, deadline: float) -> bytes:
    """Everything the peer sends before closing, at most ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ProtocolError(f"reply larger than {limit} bytes")
        chunks.append(chunk)


def send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    """``sendall`` bounded by ``deadline`` as a whole, not per call."""
    view = memoryview(data)
    while view:
        sock.settimeout(_remaining(deadline))
        sent = sock.send(view[: 1 << 20])
        view = view[sent:]
