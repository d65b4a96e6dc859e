"""Where the job's federation key comes from (docs/nodes.md, "Only the job's own doctors are
heard"): the user's (``NCCL_DOCTOR_FEDERATION_KEY``, or the file
``NCCL_DOCTOR_FEDERATION_KEY_FILE`` names), a fresh one where this run starts the node doctors
itself (``--ray``, Slurm), else the user's default key ``~/.nccl-doctor/federation.key`` - made
there on first use, as munge's key is, so that nodes sharing a home directory agree on it
without being told. A key file others can read or write is refused: it authenticates nothing.
"""

from __future__ import annotations

import enum
import os
import secrets
import socket
import stat
from dataclasses import dataclass
from typing import Mapping

from nccl_doctor import env

#: The user's default key: ``$HOME/`` + this.
DEFAULT_KEY = os.path.join(".nccl-doctor", "federation.key")
#: Permission bits that let someone other than the owner read or replace a key file.
_OTHERS = 0o066


class FederationKeyError(Exception):
    """The federation's key cannot be read (the message is one line, naming the fix)."""


class KeyKind(str, enum.Enum):
    ENV = "env"  # NCCL_DOCTOR_FEDERATION_KEY
    FILE = "file"  # the file NCCL_DOCTOR_FEDERATION_KEY_FILE names
    DEFAULT = "default"  # ~/.nccl-doctor/federation.key
    RUN = "run"  # made for this run (--ray, Slurm: handed to the node doctors)
    NONE = "none"  # unauthenticated


@dataclass(frozen=True)
class JobKey:
    """The job's federation key and where it came from (``where``: its file; without a secret,
    why there is none)."""

    secret: bytes | None
    kind: KeyKind
    where: str = ""
    created: bool = False  # the default key was made by this run

    def describe(self) -> str:
        """Which key authenticated the nodes, as the report says it."""
        if self.kind is KeyKind.ENV:
            return f"the key in {env.FEDERATION_KEY}"
        if self.kind is KeyKind.FILE:
            return f"the key in {self.where} ({env.FEDERATION_KEY_FILE})"
        if self.kind is KeyKind.DEFAULT:
            made = "made by this run" if self.created else "found there"
            return (f"the user's default key {self.where} ({made}; nodes that share this home "
                    "directory use the same)")
        if self.kind is KeyKind.RUN:
            return "a key made for this run and handed to its node doctors"
        return f"no key ({self.where})" if self.where else "no key"


def new_key() -> bytes:
    """A fresh per-job key (``--ray`` and Slurm runs: handed to their node doctors)."""
    return secrets.token_hex(32).encode()


def _read_private(path: str, what: str, *, own: bool) -> bytes:
    """The first 4 KB of ``path``, refused (``FederationKeyError``, ``what`` naming the setting)
    when someone other than its owner may read or replace it, or (``own``) when it is not this
    user's. Opened before it is looked at: what is checked is what is read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        raise FederationKeyError(
            f"{what}: cannot read {path} ({err.strerror}); give a readable file holding the "
            "job's key") from None
    try:
        info = os.fstat(fd)
        if own and info.st_uid != os.getuid():
            raise FederationKeyError(
                f"{what}: {path} belongs to uid {info.st_uid}, not to this user: remove it "
                "(a new one is made) or give the key in " + env.FEDERATION_KEY)
        if info.st_mode & _OTHERS:
            raise FederationKeyError(
                f"{what}: {path} may be read or replaced by others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}): make it the user's alone (chmod 600 "
                f"{path}); a key others can read authenticates nothing")
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _text(raw: bytes, what: str) -> bytes:
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        raise FederationKeyError(f"{what} is empty; give the job's key (any secret text, the "
                                 "same on every node), e.g. from `openssl rand -hex 32`")
    return text.encode()


def key_from(environ: Mapping[str, str]) -> bytes | None:
    """The federation's key from ``NCCL_DOCTOR_FEDERATION_KEY`` or the file
    ``NCCL_DOCTOR_FEDERATION_KEY_FILE`` names (None: neither is set); ``FederationKeyError``
    when the file cannot be read or others may read it, or either is empty."""
    text = environ.get(env.FEDERATION_KEY)
    if text is not None:
        return _text(text.encode(), env.FEDERATION_KEY)
    path = environ.get(env.FEDERATION_KEY_FILE)
    if not path:
        return None
    return _text(_read_private(path, env.FEDERATION_KEY_FILE, own=False), path)


def default_key(home: str) -> JobKey:
    """The user's default key, ``home``/.nccl-doctor/federation.key: read, or made (0600, in a
    directory 0700) when there is none. Nodes that share ``home`` race to make it: each writes
    its own beside it and links it into place, and the first link wins - every node reads the
    same key. ``FederationKeyError`` when others may read or replace it; a key-less ``JobKey``
    (and why) when ``home`` cannot hold one."""
    path = os.path.join(home, DEFAULT_KEY)
    what = "the default federation key"
    folder = os.path.dirname(path)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        return JobKey(None, KeyKind.NONE, f"no key was given, and no default key can be made: "
                                          f"cannot create {folder} ({err.strerror})")
    info = os.stat(folder)
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise FederationKeyError(
            f"{what}: {folder} may be changed by others (owner uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):04o}): make it the user's alone (chmod 700 {folder})")
    created = False
    if not os.path.lexists(path):
        try:
            created = _make(path)
        except OSError as err:
            return JobKey(None, KeyKind.NONE, f"no key was given, and no default key can be "
                                              f"made: cannot write {path} ({err.strerror})")
    secret = _text(_read_private(path, what, own=True), path)
    return JobKey(secret, KeyKind.DEFAULT, path, created)


def _make(path: str) -> bool:
    """A new key at ``path`` unless another node linked one there first (whether this one)."""
    mine = f"{path}.{socket.gethostname()}.{os.getpid()}"
    fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, new_key() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(mine, path)  # atomic, on NFS too: a reader never sees half a key
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(mine)


def job_key(environ: Mapping[str, str], *, own: bool, needed: bool) -> JobKey:
    """The job's key: the user's; else a fresh one where this run starts the node doctors itself
    (``own``); else, where the run meets other nodes (``needed``), the user's default key; else
    none. ``FederationKeyError`` for a key that cannot be used."""
    secret = key_from(environ)
    if secret is not None:
        if environ.get(env.FEDERATION_KEY) is not None:
            return JobKey(secret, KeyKind.ENV)
        return JobKey(secret, KeyKind.FILE, environ.get(env.FEDERATION_KEY_FILE, ""))
    if own:
        return JobKey(new_key(), KeyKind.RUN)
    if not needed:
        return JobKey(None, KeyKind.NONE)
    home = environ.get("HOME") or os.path.expanduser("~")
    if not home or home == "~":
        return JobKey(None, KeyKind.NONE, "no key was given, and no home directory holds a "
                                          "default key")
    return default_key(home)
