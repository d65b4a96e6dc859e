"""The recorder inside a rank: wraps torch.distributed calls and writes them to the capture.

Rules it lives by: it never changes what a call does or returns, never raises into user code
(an internal error disables it with one line on stderr and the job goes on), issues no collective
of its own, and keeps its hot path free of system calls.
"""

from __future__ import annotations

import atexit
import errno
import faulthandler
import functools
import os
import re
import signal
import sys
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from nccl_doctor import env

from nccl_doctor import redact
from nccl_doctor._version import __version__
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture import ring as ring_mod
from nccl_doctor.capture.format import EventFlag, EventKind, EventState
from nccl_doctor.capture.joining import write_joining
from nccl_doctor.capture.unrecorded import write_unrecorded
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.rank.hooks import exception_fields
from nccl_doctor.rank.recorder import functional
from nccl_doctor.rank.recorder.arguments import Describer
from nccl_doctor.rank.recorder.specs import SPECS
from nccl_doctor.rank.recorder.wrappers import BoundCall, forgetting, patch_wait, wrap, wrap_init
from nccl_doctor.rank.recorder.group_making import making_groups

_FUNCTIONAL = int(EventFlag.FUNCTIONAL)
_ISSUING = (int(EventKind.COLLECTIVE), int(EventKind.P2P))
_MAX_PENDING = 4096  # async works awaiting wait(); older ones are forgotten
#: The functions that make process groups (their creation is noted: group_making.py).
GROUP_MAKERS = ("new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group")
EARLY_NOTES = 256  # silent-error notes held before the capture exists
SILENT_SHARE = 0.5  # of the string table, the most silent-error notes may fill


class GroupRecord:
    """What the recorder caches about one process group."""

    __slots__ = ("name_id", "size", "ranks", "seq", "p2p_bumps")

    def __init__(self, name_id: int, size: int, ranks: tuple[int, ...], seq: Callable | None):
        self.name_id, self.size, self.ranks, self.seq = name_id, size, ranks, seq
        self.p2p_bumps = 0


class Recorder:
    def __init__(self, directory: Path, *, capacity: int, strtab_bytes: int) -> None:
        self.directory = directory
        self.capacity = capacity
        self.strtab_bytes = strtab_bytes
        self.enabled = True
        # init_process_group returned here: what the rank raises is no early exit any more
        # (rank/early_exit.py), though its capture may not exist (unrecorded, disabled)
        self.joined = False
        self.writer: CaptureWriter | None = None
        self.describer: Describer | None = None
        self.c10d: Any = None
        self.default_pg: Any = None
        # The wrappers bind these dicts once: they are cleared, never replaced.
        self.groups: dict[Any, GroupRecord] = {}
        self.stacks: dict[int, list[int]] = {}  # thread id -> indices of its calls in progress
        self.pending: dict[int, tuple] = {}  # id(Work) -> the async op it came from
        self._calls: list[BoundCall] = []
        # what keeps the functional collectives' kernels (None: not installed yet)
        self._functional: list[Any] | None = None
        self._hooks_installed = False
        self._fault_file: Any = None
        self._pid = os.getpid()
        self._early: list[tuple[str, dict[str, Any]]] = []  # notes made before the capture exists
        self.group_calls = 0  # group-making calls so far (group_making.py numbers them)
        self.dropped = 0  # silent-error notes refused: the table's share for them is full
        # The C fast path (capture/_ring.c), when the C ring is in use: ``recording`` is what its
        # Calls read and write, kept in step with this recorder by ``_publish``.
        types = ring_mod.fast_path()
        self.recording: Any = None
        self._call_type: Any = None
        self._recorded_type: Any = None
        if types is not None:
            self.recording, self._call_type, self._recorded_type = types[0](), types[1], types[2]
            self.recording.groups, self.recording.stacks = self.groups, self.stacks

    # -- failure: one line, then out of the way ----------------------------------------------
    def fail(self, err: BaseException, why: str | None = None) -> None:
        """Disable the recorder with one line on stderr: ``why``, else an internal error."""
        if not self.enabled:
            return
        self.enabled = False
        try:
            self._publish()
        except Exception:
            pass
        try:
            sys.stderr.write(
                f"nccl-doctor: recorder disabled: {why or f'an internal error ({err!r})'}; "
                "the job continues unrecorded\n"
            )
        except Exception:
            pass

    def _unrecorded(self, err: OSError, stem: str, rank: int, world: int, host: str) -> None:
        """The capture cannot be made: one line, the recorder off, and - where a file can still
        be made there - its marker, by which the analysis knows the rank ran unseen."""
        reason = f"cannot create its capture in {self.directory} ({err.strerror or err})"
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            fix = "free space there or pass another --out"
        elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = "make it writable or pass another --out"
        else:
            fix = "pass another --out"
        self.fail(err, f"rank {rank} {reason}; {fix}")
        write_unrecorded(self.directory, stem, rank, world, host, f"it {reason}")

    # -- the C fast path ---------------------------------------------------------------------
    def fast_wrapper(self, call: BoundCall, fn: Callable, python: Callable[[], Callable]) -> Any:
        """``fn`` recorded by the C fast path (a capture/_ring.c Recorded, which leaves what it
        cannot record to the Python path, made by ``python()`` when first needed), or None: the
        Python path only."""
        if self._call_type is None:
            return None
        try:
            fast = self._call_type(
                self.recording, call.group, call.inp, call.out, call.async_, call.roots,
                call.kind, call.flags, call.measure, int(EventFlag.ASYNC),
                int(EventState.RETURNED),
            )
            fast.op_id = call.op_id
        except Exception:  # a signature the fast path cannot take: the Python path records it
            return None
        call.fast = fast
        return self._recorded_type(
            fast, fn, python, self.finish, self.fail, call.kind == EventKind.P2P,
            int(EventState.FAILED), int(EventState.RETURNED))

    def _publish(self) -> None:
        """Tell the fast path what to write to: the C ring of an open capture while the recorder
        is enabled, else nothing (every call then takes the Python path). Setting these bumps
        ``recording.epoch``, which makes its Calls forget what they read last."""
        r = self.recording
        if r is None:
            return
        w, d = self.writer, self.describer
        live = self.enabled and w is not None and d is not None and ring_mod.is_c_ring(w.events)
        r.ring = w.events if live else None
        r.default_pg = self.default_pg
        r.tensors = d.tensors if live else None
        r.positions = d.positions if live else None
        r.paths = d.paths if live else None

    def _install_functional(self) -> None:
        """Record the functional collectives too (rank/recorder/functional.py), once: when the
        first process group exists, as torch.distributed is patched during torch's own import,
        before the dispatcher's Python side is there."""
        if self._functional is not None:
            return
        self._functional = []
        if os.environ.get(env.FUNCTIONAL, "1") == "0":
            return
        try:
            self._functional, calls = functional.install(self)
            self._calls.extend(calls)
        except Exception as err:  # noqa: BLE001 - torch refused: record the Python API alone
            sys.stderr.write("nccl-doctor: the functional collectives (DTensor, compiled "
                             f"graphs) are not recorded: {err!r}\n")

    # -- the capture file --------------------------------------------------------------------
    def joining(self, args: tuple, kwargs: dict) -> None:
        """init_process_group begins: the rank's marker (capture/joining.py), by which the
        watchdog sees the ranks waiting in its rendezvous before any capture exists."""
        if not self.enabled or self.joined:
            return  # (init_process_group again after a destroy: the rank has a capture)
        rank, world = _arg(args, kwargs, 4, "rank"), _arg(args, kwargs, 3, "world_size")
        if not isinstance(rank, int) or rank < 0:
            rank = _env_int(env.LAUNCHER_RANK)
        if not isinstance(world, int) or world < 1:
            world = _env_int(env.LAUNCHER_WORLD_SIZE)
        if rank is None or world is None or not 0 <= rank < world:
            return  # who it is becomes known inside the call: nothing to say before it
        method = _arg(args, kwargs, 1, "init_method")
        if isinstance(method, str) and method and not method.startswith("env://"):
            address = method
        elif _arg(args, kwargs, 5, "store") is not None:
            address = "a store the program made"
        else:
            addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
            address = f"{addr}:{port}" if addr or port else ""
        backend = _arg(args, kwargs, 0, "backend")
        write_joining(self.directory, rank, world, env.host_name(),
                      local_world_size=_env_int(("LOCAL_WORLD_SIZE",)), address=address,
                      backend=str(backend or ""), time_ns=time.time_ns())

    def open(self) -> None:
        """Create the rank's capture once its process group exists (rank is known then)."""
        self.joined = True
        if not self.enabled:
            return
        self._install_functional()
        if self.writer is not None:  # init_process_group again, after a destroy
            self.default_pg = self.c10d._get_default_group()
            self.group(self.default_pg)
            self._publish()
            return
        c10d = self.c10d
        rank, world = c10d.get_rank(), c10d.get_world_size()
        host = env.host_name()
        safe_host = re.sub(r"[^A-Za-z0-9_-]", "_", host)[:64]
        stem = base = f"rank{rank:05d}.{safe_host}.{os.getpid()}"
        meta = {
            "rank": rank, "world_size": world, "host": host, "pid": os.getpid(),
            "local_rank": _env_int(env.LAUNCHER_LOCAL_RANK), "node_rank": _env_int(env.NODE_RANK),
            "started_ns": time.time_ns(), "run_id": os.environ.get(env.RUN_ID, ""),
            "argv": [a[:200] for a in _argv()[:32]],
            "versions": _versions(),
            # the interpreter's prefixes: console scripts below them are library code
            "prefixes": sorted({sys.prefix, sys.base_prefix, sys.exec_prefix}),
            "env": {k: os.environ[k][:200] for k in env.RECORDED_ENV if k in os.environ},
        }
        if "ray" in sys.modules:  # a Ray actor: which one (rank/ray_actor.py)
            from nccl_doctor.rank.ray_actor import actor_meta

            actor = actor_meta()
            if actor:
                meta["ray"] = actor
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            n = 0
            while (self.directory / f"{stem}{fmt.CAPTURE_SUFFIX}").exists():
                n += 1  # a previous job in the same directory reused this pid
                stem = f"{base}-{n}"
            writer = CaptureWriter(self.directory / f"{stem}{fmt.CAPTURE_SUFFIX}", meta,
                                   capacity=self.capacity, strtab_bytes=self.strtab_bytes,
                                   preallocate=True)
        except OSError as err:  # no room (the file is reserved whole), a size limit, no access
            self._unrecorded(err, stem, rank, world, host)
            return
        self.describer = Describer(writer.intern, writer.note)
        for call in self._calls:
            call.op_id = writer.intern(call.spec.name)
            if call.fast is not None:
                call.fast.op_id = call.op_id
        self._wait_op = writer.intern("wait")
        self._init_op = writer.intern("init_process_group")
        self.writer = writer
        self.default_pg = c10d._get_default_group()
        self.group(self.default_pg)
        self._publish()
        self._install_lifecycle_hooks(writer.path)
        early, self._early = self._early, []
        for kind, fields in early:
            self.observe(kind, fields)
        from nccl_doctor.rank import hooks
        hooks.mark_start()

    def observe(self, kind: str, fields: dict[str, Any]) -> bool:
        """A silent-error note (rng, gen, metrics). Before the capture exists (seeding usually
        precedes init_process_group) up to EARLY_NOTES are held and written at its creation."""
        if not self.enabled:
            return False
        w = self.writer
        fields.setdefault("time_ns", time.time_ns())
        if w is None:
            if len(self._early) < EARLY_NOTES:
                self._early.append((kind, fields))
                return True
            self.dropped += 1
            return False
        # an exception a library caught for the rank (hooks.note_exception) is its end: the whole
        # table is its to use, as for the exit notes
        if w.note(kind, share=1.0 if kind == "exception" else SILENT_SHARE, **fields):
            return True
        self.dropped += 1
        return False

    def group(self, pg: Any) -> GroupRecord | None:
        """The cached record of ``pg`` (None when this rank is not a member)."""
        grec = self.groups.get(pg)
        if grec is not None:
            return grec
        c10d, w = self.c10d, self.writer
        if pg is None or isinstance(pg, int) or w is None:
            return None  # NON_GROUP_MEMBER: the call is a no-op on this rank
        if isinstance(pg, str):  # a group's name: what the functional collectives pass
            try:
                resolved = c10d._resolve_process_group(pg)
            except Exception:  # a name torch does not know (any more): the call goes unrecorded
                return None
            grec = self.group(resolved)
            if grec is not None:
                self.groups[pg] = grec
            return grec
        name = c10d._get_process_group_name(pg)
        try:
            ranks = tuple(c10d.get_process_group_ranks(pg))
        except Exception:
            ranks = ()
        seq = getattr(pg, "_get_sequence_number_for_group", None)
        try:
            seq is not None and seq()
        except Exception:
            seq = None
        grec = GroupRecord(w.intern(name), pg.size(), ranks, seq)
        self.groups[pg] = grec
        try:
            backend = str(c10d.get_backend(pg))
        except Exception:
            backend = ""
        desc = getattr(pg, "group_desc", "")
        w.note("group", name=name, ranks=list(ranks), backend=backend, desc=str(desc))
        return grec

    # -- the end of a call (the common case is inlined in wrappers.wrap) ------------------------
    def finish(self, idx: int, grec: GroupRecord, seq: int, stack: list[int], flags: int,
               measure: bool, is_p2p: bool, state: int, result: Any) -> None:
        """Write the exit part of record ``idx``; ``result`` is the call's return value."""
        try:
            if stack and stack[-1] == idx:
                stack.pop()
            delta = 1
            if measure:
                delta = grec.seq() + 1 - seq if seq >= 0 and grec.seq is not None else 0
                if is_p2p and delta > 0 and not stack:
                    grec.p2p_bumps += delta  # keeps collectives aligned across ranks
            if result is not None and flags & EventFlag.ASYNC:
                state = EventState.ISSUED
                self._track(result, idx, grec)
            self.writer.end(idx, state, delta)
        except Exception as err:
            self.fail(err)

    def _track(self, result: Any, idx: int, grec: GroupRecord) -> None:
        works = result if isinstance(result, list) else (result,)
        pending = self.pending
        for work in works:
            if len(pending) >= _MAX_PENDING:
                pending.pop(next(iter(pending)))
            try:
                key = id(work)
                ref = weakref.ref(work, lambda _r, k=key: pending.pop(k, None))
            except TypeError:
                ref = None
            pending[id(work)] = (ref, idx, grec, self.writer.record(idx))

    def wait_enter(self, work: Any, frame: Any) -> tuple | None:
        entry = self.pending.pop(id(work), None)
        if entry is None:
            return None
        ref, parent, grec, f = entry
        if (ref is not None and ref() is not work) or f is None:
            return None
        return self._wait(parent, f, grec, frame)

    def wait_for(self, parent: int) -> tuple | None:
        """The WAIT record of a functional collective's wait_tensor (rank/recorder/functional.py)
        for its record ``parent``, at the collective's own callsite (no stack walked: a rank
        blocked in it shows where in its stack); None when the record is gone (a new capture,
        a lapped ring)."""
        w = self.writer
        f = w.record(parent) if w is not None else None
        # the parent must be a functional collective's record: the innermost call in progress
        # when its output was noted could be an outer one, had the recorder declined this one
        if f is None or not f[20] & _FUNCTIONAL or f[19] not in _ISSUING:
            return None
        return self._wait(parent, f, None, None)

    def _wait(self, parent: int, f: tuple, grec: GroupRecord | None, frame: Any) -> tuple:
        # f: the async op's ENTER fields (idx first); the wait inherits its group, seq and tensors,
        # whether it is a functional collective's (its source), and, without a frame, its
        # callsite and call path
        uf, ul, ufn, af, al, path = (self.describer.callsites(frame) if frame is not None
                                     else f[10:16])
        tid = threading.get_ident()
        stack = self.stacks.get(tid)
        if stack is None:
            stack = self.stacks[tid] = []
        idx = self.writer.begin((
            parent, time.time_ns(), f[3], f[4], tid, self._wait_op, f[7], f[8], f[9],
            uf, ul, ufn, af, al, path, f[16], f[17], f[18], int(EventKind.WAIT),
            f[20] & _FUNCTIONAL, 0,
        ))
        stack.append(idx)
        return idx, grec, -1, stack, 0, False, False

    # -- lifecycle ---------------------------------------------------------------------------
    def _install_lifecycle_hooks(self, path: Path) -> None:
        if self._hooks_installed:
            return
        self._hooks_installed = True
        w = self.writer
        atexit.register(self._on_exit)
        previous_hook = sys.excepthook

        def excepthook(tp: type, value: BaseException, tb: Any) -> None:
            try:
                with signals_deferred():
                    self._on_exception(tp, value, tb)
            finally:
                previous_hook(tp, value, tb)

        sys.excepthook = excepthook
        real_exit = sys.exit

        @functools.wraps(real_exit)
        def exit(status: Any = None) -> None:
            try:
                if self.writer is not None:
                    code = status if isinstance(status, int) else (0 if status is None else 1)
                    self.writer.note("sys_exit", code=code)
            except Exception:
                pass
            real_exit(status)

        sys.exit = exit
        if not faulthandler.is_enabled():  # never take over a faulthandler the user set up
            try:
                self._fault_file = open(path.with_suffix(fmt.FAULT_SUFFIX), "w")
                faulthandler.enable(self._fault_file, all_threads=True)
            except OSError:
                self._fault_file = None
        w.note("init", backend=str(self.c10d.get_backend()))
        run_id = os.environ.get(env.RUN_ID)
        if run_id:  # under `nccl-doctor run`: the agent answers the watchdog (stacks, FR dumps)
            from nccl_doctor.rank import agent as server
            server.start(run_id)

    def forget(self, pg: Any = None) -> None:
        """Drop references to destroyed process groups (``None``: all of them).

        Holding a ProcessGroup past destroy_process_group would keep its gloo/NCCL threads alive
        until interpreter teardown, where their destructors can abort the process.
        """
        if pg is None or pg is self.default_pg:
            self.groups.clear()
            self.default_pg = None
        else:
            grec = self.groups.pop(pg, None)
            for key in [k for k, v in self.groups.items() if v is grec]:
                del self.groups[key]  # its name, as the functional collectives knew it
        self.pending.clear()
        self._publish()  # what the fast path remembers of the group is stale

    def destroyed(self, pg: Any) -> None:
        """destroy_process_group(pg) returned: let go of the group; the default group's end is
        noted - the rank's distributed work is over, which says how it ended when its launcher
        never lets atexit run (Ray's workers, os._exit)."""
        whole = pg is None or pg is self.default_pg
        self.forget(pg)
        if whole and self.writer is not None and os.getpid() == self._pid:
            self.writer.note("destroyed")

    def _on_exit(self) -> None:
        if os.getpid() != self._pid:
            return
        self.forget()
        if self.writer is not None:
            try:
                with signals_deferred():
                    self.writer.note("exit")
            except Exception:
                pass

    def _on_exception(self, tp: type, value: BaseException, tb: Any) -> None:
        if self.writer is None or os.getpid() != self._pid:
            return
        self.writer.note("exception", **exception_fields(tp, value, tb))

    def after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) must not write into its parent's capture."""
        self.writer = None
        self.describer = None
        self.default_pg = None
        functional.after_fork()
        self.groups.clear()
        self.pending.clear()
        self.stacks.clear()
        self._hooks_installed = False
        self._early.clear()
        self.group_calls = 0
        self._pid = os.getpid()
        self._publish()

    # -- patching ----------------------------------------------------------------------------
    def patch(self, dist_module: Any) -> None:
        """Wrap torch.distributed's functions (in c10d and everywhere they were imported)."""
        c10d = sys.modules["torch.distributed.distributed_c10d"]
        self.c10d = c10d
        replaced: dict[int, Callable] = {}
        for spec in SPECS:
            fn = getattr(c10d, spec.name, None)
            if fn is None or getattr(fn, "__nccl_doctor__", False):
                continue
            call = BoundCall(spec, fn)
            self._calls.append(call)
            replaced[id(fn)] = wrap(self, call, fn)
        destroy = getattr(c10d, "destroy_process_group", None)
        if destroy is not None and id(destroy) in replaced:
            replaced[id(destroy)] = forgetting(self, replaced[id(destroy)])
        for name in GROUP_MAKERS:  # creation noted per rank (group_making.py)
            fn = getattr(c10d, name, None)
            if fn is not None and id(fn) in replaced:
                replaced[id(fn)] = making_groups(self, replaced[id(fn)], name)
        init = getattr(c10d, "init_process_group", None)
        if init is not None and not getattr(init, "__nccl_doctor__", False):
            replaced[id(init)] = wrap_init(self, init)
        for module in [c10d, dist_module] + [
            m for n, m in list(sys.modules.items())
            if n.startswith("torch.distributed.") and m is not None and m is not c10d
        ]:
            namespace = getattr(module, "__dict__", {})
            for name, value in list(namespace.items()):
                new = replaced.get(id(value))
                if new is not None and getattr(new, "__wrapped__", None) is value:
                    namespace[name] = new
        patch_wait(self, c10d.Work)
        if c10d.is_initialized():
            self.open()


def _argv() -> list[str]:
    """This process's command line as the capture keeps it: its secrets masked (the whole line
    first: a flag and its value may straddle any cut), unless `run --no-redact` said not to."""
    return redact.argv(sys.argv) if redact.wanted_here() else list(sys.argv)


def _arg(args: tuple, kwargs: dict, position: int, name: str) -> Any:
    """init_process_group's argument ``name`` (at ``position``), as the call passed it."""
    return args[position] if len(args) > position else kwargs.get(name)


def _env_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "nccl_doctor": __version__}
    for name in ("torch", "transformers", "trl", "accelerate", "deepspeed", "vllm", "swift",
                 "openrlhf"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if version is not None:
            out[name] = str(version)
    return out


#: Signals whose Python handler raises into the main thread (KeyboardInterrupt, torchrun's
#: SignalException): a second one often lands while the first one's exception is being noted.
_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold the Python-level handlers of SIGINT/SIGTERM/SIGHUP while a note is written, then
    deliver what arrived meanwhile. torchrun forwards the Ctrl-C its workers already got, and
    that second KeyboardInterrupt, raised inside the excepthook, used to cost the rank its
    exception note: it read as a clean exit. Signals left at their default (or ignored) are
    not touched; off the main thread nothing is."""
    held: dict[int, Any] = {}
    arrived: list[int] = []
    try:
        for sig in _DEFERRED:
            handler = signal.getsignal(sig)
            if callable(handler):
                held[sig] = handler
                signal.signal(sig, lambda signum, _frame: arrived.append(signum))
    except ValueError:  # not the main thread: Python runs no handler here anyway
        pass
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(arrived):
            signal.raise_signal(sig)  # the user's handler runs now, after the note
