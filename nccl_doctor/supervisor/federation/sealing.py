"""What only the job's doctors can find, write or replay on the coordinator's store
(docs/nodes.md, "Only the job's own doctors are heard").

Under the job's key K and the run's nonce N (the leader's, fresh each run), a key the doctors
use is not named as store.py writes it but ``ncd/`` + the first 32 hex digits of
``HMAC-SHA256(K_names, N NUL name)``, and its value is stored as ``HMAC-SHA256(K_values, N NUL
name NUL value)`` in hex, ``:``, the value. K_names and K_values are drawn from K apart, so that
a name - which anyone on the network may see - says nothing of a MAC. So a process without K
cannot tell which keys the doctors use, nor overwrite one, nor bump their counters; a value
moved to another name fails, and a value from an earlier run under the same K was sealed under
another N and fails too. Such a value reads as absent (``null``) and is counted in
``rejected``, never believed.

One record cannot depend on N: the leader's join record (``join``), which says N. It is named
and sealed under the empty nonce - K and the job's rendezvous only - so it may be an earlier
run's, replayed. A follower believes a nonce only once the leader has answered, under it, the
fresh challenge the follower wrote (transport.py): only a holder of K that runs now can.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

#: What the leader's join record is called (under the empty nonce), for the job ``job``.
JOIN = "ncd/join/{job}"


def _subkey(key: bytes, label: bytes) -> bytes:
    return hmac.new(key, b"nccl-doctor federation " + label, hashlib.sha256).digest()


def join_name(job: str) -> str:
    return JOIN.format(job=job)


class Sealed:
    """A store whose keys are named, and whose values sealed, under the job's key and the run's
    nonce (the docstring above); what fails reads as ``null`` and is counted in ``rejected``."""

    def __init__(self, store: Any, key: bytes, nonce: str) -> None:
        self.store, self.nonce = store, nonce
        self._names, self._values = _subkey(key, b"names"), _subkey(key, b"values")
        self._named: dict[str, str] = {}
        self.rejected = 0  # values that failed authentication, read so far

    def name(self, name: str) -> str:
        """The store's name for ``name`` (the doctors' own: see the module's docstring)."""
        out = self._named.get(name)
        if out is None:
            digest = hmac.new(self._names, f"{self.nonce}\0{name}".encode(), hashlib.sha256)
            out = self._named[name] = "ncd/" + digest.hexdigest()[:32]
        return out

    def _mac(self, name: str, value: bytes) -> bytes:
        text = f"{self.nonce}\0{name}\0".encode() + value
        return hmac.new(self._values, text, hashlib.sha256).hexdigest().encode()

    def seal(self, name: str, value: bytes) -> bytes:
        """``value`` as the store holds it under ``name``."""
        return self._mac(name, value) + b":" + value

    def open(self, name: str, raw: bytes) -> bytes:
        """The value ``raw`` holds under ``name`` (``null``, counted: one that fails)."""
        mac, sep, data = bytes(raw).partition(b":")
        if sep and len(mac) == 64 and hmac.compare_digest(mac, self._mac(name, data)):
            return data
        self.rejected += 1
        return b"null"

    def set(self, name: str, value: str) -> None:
        self.store.set(self.name(name), self.seal(name, value.encode()))

    def get(self, name: str) -> bytes:
        return self.open(name, self.store.get(self.name(name)))

    def multi_get(self, names: list[str]) -> list[bytes]:
        raw = self.store.multi_get([self.name(n) for n in names])
        return [self.open(n, value) for n, value in zip(names, raw)]

    def check(self, names: list[str]) -> bool:
        return self.store.check([self.name(n) for n in names])

    def add(self, name: str, amount: int) -> int:
        # (a counter cannot carry a MAC; its name is what nobody without the key can find)
        return self.store.add(self.name(name), amount)

    def delete_key(self, name: str) -> bool:
        return self.store.delete_key(self.name(name))

    def wait(self, names: list[str], timeout: Any) -> None:
        self.store.wait([self.name(n) for n in names], timeout)


def sealed(store: Any, key: bytes | None, nonce: str = "") -> Any:
    """``store`` under the job's key and the run's nonce (no key: as it is, unauthenticated)."""
    return store if key is None else Sealed(store, key, nonce)


def raw_store(store: Any) -> Any:
    """The TCPStore under ``store``."""
    return store.store if isinstance(store, Sealed) else store


def nonce_of(store: Any) -> str:
    """The run's nonce ``store`` names and seals under ("": unauthenticated)."""
    return store.nonce if isinstance(store, Sealed) else ""


def rejected(store: Any) -> int:
    """How many values read from ``store`` failed authentication."""
    return store.rejected if isinstance(store, Sealed) else 0
