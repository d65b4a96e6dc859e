"""The meeting point: a ``torch.distributed.TCPStore`` that the leader's supervisor hosts on its
own port, and the names of its keys. torch is imported here only, on first use: a single-node
run never loads it into the supervisor.

What each key holds (JSON unless said; ``<id>`` is a node's id, ``<k>`` a counter):

| key | written by | holds |
|---|---|---|
| ``ncd/magic`` | leader, first | format, version, the job's rendezvous, its host, key or not |
| ``ncd/join/<job>`` | leader (with a key) | the run's nonce, the leader's host (sealing.py) |
| ``ncd/nodes`` | each follower (``add``) | how many nodes registered (an integer) |
| ``ncd/node/<i>`` | the i-th follower | its id (with a key: and its challenge) |
| ``ncd/welcome/<id>`` | leader (with a key) | the follower's challenge, answered under the nonce |
| ``ncd/beat/<id>`` | each follower, every look | progress counters, notes, ranks down, ended |
| ``ncd/sum/<id>``, ``ncd/dig/<id>`` | each follower, when quiet | its ranks in brief, in digest |
| ``ncd/req/<id>`` | leader | a request for stacks or Flight Recorder pulls |
| ``ncd/resp/<id>/<k>`` | the follower | the answer to request k |
| ``ncd/decision/n``, ``ncd/decision/<k>`` | leader | the watches' decisions, in order |
| ``ncd/roster`` | leader | every rank's host and node (who was lost with the leader) |
| ``ncd/final``, ``ncd/final/acks`` | leader; followers (``add``) | the final report; who read it |

Without a key these are the store's names, and anyone who reaches the port may read or write
them: a node then believes none of it as evidence (federation/node.py). With the job's key
(sealing.py) each name but ``ncd/magic`` is hidden and each value sealed under the run's nonce;
``ncd/magic`` stays readable for a node that comes without the key (it says why it cannot
join), and the leader keeps the names anyone can guess (``PUBLIC``) holding what it wrote
there: what it finds overwritten or deleted is counted as rejected and written back.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from nccl_doctor import bounded_json

FORMAT = "nccl-doctor-federation"
VERSION = 2  # 2: with a key, hidden names and values bound to the run (sealing.py)

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


def welcome_key(node: str) -> str:
    return f"ncd/welcome/{node}"


#: The names anyone can guess (this table's, without a node's id): with a key, the leader
#: writes them itself and watches them (the announcement in ``MAGIC``, ``0`` in the counters,
#: ``null`` elsewhere).
PUBLIC = (MAGIC, NODES, DECISION_N, decision_key(1), ROSTER, FINAL, FINAL_ACKS)


class StoreError(Exception):
    """The store cannot be hosted or reached (the message is one line)."""


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
