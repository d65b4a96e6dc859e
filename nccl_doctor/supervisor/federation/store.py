"""The meeting point: a ``torch.distributed.TCPStore`` that the leader's supervisor hosts on its
own port, and the names of its keys. torch is imported here only, on first use: a single-node
run never loads it into the supervisor.

What each key holds (JSON unless said; ``<id>`` is a node's id, ``<k>`` a counter):

| key | written by | holds |
|---|---|---|
| ``ncd/magic`` | leader, first | format, version, the job's rendezvous, the leader's host |
| ``ncd/nodes`` | each follower (``add``) | how many nodes registered (an integer) |
| ``ncd/node/<i>`` | the i-th follower | its id |
| ``ncd/beat/<id>`` | each follower, every look | progress counters, notes, ranks down, ended |
| ``ncd/sum/<id>`` | each follower, when quiet | its ranks in brief (capture/summary.py) |
| ``ncd/req/<id>`` | leader | a request for stacks or Flight Recorder pulls |
| ``ncd/resp/<id>/<k>`` | the follower | the answer to request k |
| ``ncd/decision/n``, ``ncd/decision/<k>`` | leader | the watches' decisions, in order |
| ``ncd/roster`` | leader | every rank's host and node (who was lost with the leader) |
| ``ncd/final``, ``ncd/final/acks`` | leader; followers (``add``) | the final report; who read it |

With a per-job key (``Sealed``), every value above is stored as ``HMAC-SHA256(key, name NUL
value) hex``, ``:``, the value: a value whose MAC fails (written by a process that is not one of
the job's doctors, or moved from another key) reads as absent (``null``) and is counted, never
believed. The two counters (``ncd/nodes``, ``ncd/final/acks``) are plain integers: a forged count
only makes the leader look for node ids that do not exist, or stop waiting for a final read.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import secrets
from typing import Any

from nccl_doctor import bounded_json, env

FORMAT = "nccl-doctor-federation"
VERSION = 1

MAGIC = "ncd/magic"
NODES = "ncd/nodes"
DECISION_N = "ncd/decision/n"
ROSTER = "ncd/roster"
FINAL = "ncd/final"
FINAL_ACKS = "ncd/final/acks"


def node_key(index: int) -> str:
    return f"ncd/node/{index}"


def beat_key(node: str) -> str:
    return f"ncd/beat/{node}"


def summary_key(node: str) -> str:
    return f"ncd/sum/{node}"


def digest_key(node: str) -> str:
    return f"ncd/dig/{node}"


def request_key(node: str) -> str:
    return f"ncd/req/{node}"


def response_key(node: str, n: int) -> str:
    return f"ncd/resp/{node}/{n}"


def decision_key(n: int) -> str:
    return f"ncd/decision/{n}"


class StoreError(Exception):
    """The store cannot be hosted or reached (the message is one line)."""


class FederationKeyError(Exception):
    """The federation's key cannot be read (the message is one line, naming the fix)."""


def new_key() -> bytes:
    """A fresh per-job key (``--ray`` and Slurm runs: handed to their node doctors)."""
    return secrets.token_hex(32).encode()


def key_from(environ: dict[str, str] | os._Environ) -> bytes | None:
    """The federation's key from ``NCCL_DOCTOR_FEDERATION_KEY`` or the file
    ``NCCL_DOCTOR_FEDERATION_KEY_FILE`` names (None: neither is set, the federation is
    unauthenticated); ``FederationKeyError`` when the file cannot be read or either is empty."""
    text = environ.get(env.FEDERATION_KEY)
    if text is None and environ.get(env.FEDERATION_KEY_FILE):
        path = environ[env.FEDERATION_KEY_FILE]
        try:
            with open(path, "rb") as f:
                raw = f.read(4096)
        except OSError as err:
            raise FederationKeyError(
                f"{env.FEDERATION_KEY_FILE}: cannot read {path} ({err.strerror}); give a "
                "readable file holding the job's key") from None
        text = raw.decode("utf-8", "replace").strip()
    if text is None:
        return None
    if not text.strip():
        raise FederationKeyError(f"{env.FEDERATION_KEY} is empty; give the job's key (any "
                                 "secret text, the same on every node), e.g. from `openssl rand "
                                 "-hex 32`")
    return text.strip().encode()


class Sealed:
    """A store whose values carry an HMAC-SHA256 under the job's key (the table above); what
    fails it reads as ``null`` and is counted in ``rejected``."""

    def __init__(self, store: Any, key: bytes) -> None:
        self.store, self._key = store, key
        self.rejected = 0  # values that failed authentication, read so far

    def _mac(self, name: str, value: bytes) -> bytes:
        mac = hmac.new(self._key, name.encode() + b"\0" + value, hashlib.sha256)
        return mac.hexdigest().encode()

    def set(self, name: str, value: str) -> None:
        data = value.encode()
        self.store.set(name, self._mac(name, data) + b":" + data)

    def _open(self, name: str, raw: bytes) -> bytes:
        mac, sep, data = bytes(raw).partition(b":")
        if sep and len(mac) == 64 and hmac.compare_digest(mac, self._mac(name, data)):
            return data
        self.rejected += 1
        return b"null"

    def get(self, name: str) -> bytes:
        return self._open(name, self.store.get(name))

    def multi_get(self, names: list[str]) -> list[bytes]:
        return [self._open(n, raw) for n, raw in zip(names, self.store.multi_get(names))]

    def check(self, names: list[str]) -> bool:
        return self.store.check(names)

    def add(self, name: str, amount: int) -> int:
        return self.store.add(name, amount)

    def delete_key(self, name: str) -> bool:
        return self.store.delete_key(name)

    def wait(self, names: list[str], timeout: Any) -> None:
        self.store.wait(names, timeout)


def sealed(store: Any, key: bytes | None) -> Any:
    """``store`` under the job's key (None: as it is, unauthenticated)."""
    return store if key is None else Sealed(store, key)


def rejected(store: Any) -> int:
    """How many values read from ``store`` failed authentication."""
    return store.rejected if isinstance(store, Sealed) else 0


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def load() -> Any:
    """``torch.distributed.TCPStore``, loaded (seconds of CPU: minutes on a host the job keeps
    busy); ``StoreError`` if torch cannot give it."""
    try:
        from torch.distributed import TCPStore  # noqa: PLC0415 (loaded only for multi-node)
    except ImportError as err:  # torch is a dependency; a broken install still must not crash
        raise StoreError(f"torch.distributed is not available ({err})") from None
    return TCPStore


def open_store(host: str, port: int, *, leader: bool, timeout: float) -> Any:
    """Host (``leader``) or reach the TCPStore at ``host:port``; ``StoreError`` if it fails."""
    TCPStore = load()
    try:
        return TCPStore(host, port, is_master=leader, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=timeout))
    except Exception as err:  # DistNetworkError, RuntimeError, OSError: torch's own types vary
        raise StoreError(_first_line(err)) from None


def put(store: Any, key: str, value: Any) -> None:
    try:
        store.set(key, json.dumps(value, separators=(",", ":")))
    except Exception as err:
        raise StoreError(_first_line(err)) from None


def get(store: Any, key: str) -> Any:
    try:
        return bounded_json.loads(store.get(key))
    except ValueError as err:
        raise StoreError(f"{key} is not JSON ({err})") from None
    except Exception as err:
        raise StoreError(_first_line(err)) from None


def get_many(store: Any, keys: list[str]) -> list[Any]:
    """Several keys in one round trip (each must exist)."""
    if not keys:
        return []
    try:
        raw = store.multi_get(keys)
    except Exception as err:
        raise StoreError(_first_line(err)) from None
    out = []
    for value in raw:
        try:
            out.append(bounded_json.loads(value))
        except ValueError:
            out.append(None)
    return out


def delete(store: Any, key: str) -> None:
    try:
        store.delete_key(key)
    except Exception as err:
        raise StoreError(_first_line(err)) from None


def has(store: Any, key: str) -> bool:
    return has_all(store, [key])


def has_all(store: Any, keys: list[str]) -> bool:
    """Whether every one of ``keys`` exists (one round trip)."""
    try:
        return bool(store.check(keys))
    except Exception as err:
        raise StoreError(_first_line(err)) from None


def add(store: Any, key: str, amount: int) -> int:
    try:
        return int(store.add(key, amount))
    except Exception as err:
        raise StoreError(_first_line(err)) from None


def wait(store: Any, key: str, timeout: float) -> bool:
    """Whether ``key`` appeared within ``timeout`` seconds."""
    try:
        store.wait([key], datetime.timedelta(seconds=timeout))
        return True
    except Exception as err:
        if "timeout" in str(err).lower() or "timed out" in str(err).lower():
            return False
        raise StoreError(_first_line(err)) from None
