"""A fork server for distributed tests: ranks that start in milliseconds instead of importing
torch each (about 1.7 s of CPU a rank).

One server per test process (per pytest-xdist worker), started on first use and stopped at the
end of the session (``shutdown``). It imports torch, torch.distributed, nccl-doctor's rank side
and pytest, runs no torch op and initialises nothing (no CUDA, no process group, no recorder),
and forks one process per rank on request. The launched command stays the launcher the
supervisor starts (testing/spawn.py ``--zygote SOCKET``, run with ``python -S``): a client that
imports no torch, asks the server for its ranks and waits for them as it would for its own
children.

A forked rank becomes what ``python TARGET`` would have been before its first line runs: the
client's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, the NCCL_DOCTOR_* variables; shown in
/proc/PID/environ too, ``_show_environment``), cwd,
stdin/stdout/stderr (the client's own descriptors, passed over the socket), ``sys.argv``,
``sys.path`` (the target's directory, then PYTHONPATH, then the interpreter's own), and then the
``sitecustomize`` that PYTHONPATH names runs - under the doctor, nccl-doctor's bootstrap, which
arms the recorder exactly as in a fresh process (rank/_bootstrap/sitecustomize.py). The target
runs as ``__main__``; an uncaught exception goes through ``sys.excepthook`` with the
traceback a fresh process would print, and the process ends as a fresh one would (non-daemon
threads joined, atexit, exit status, SIGINT for an unhandled KeyboardInterrupt) but without the
interpreter's teardown of every module (``become``).

Process ancestry. A rank is the server's child, in a session of its own (as torchrun's
workers): a signal to the launched command's process group does not reach it. The supervisor
finds and stops it as it does torchrun's workers - by the pid in its capture's header
(``Job.adopt``, the reaper) - and the client, which knows its ranks' pids from the start, forwards
SIGTERM and SIGINT to them (through pidfds: never a reused pid) and stops the others when one
fails, as spawn.py does. If the client dies (a SIGKILL of the job's process group), the server
sees its connection close and SIGKILLs that client's ranks; if the server dies, its ranks get
SIGKILL (PR_SET_PDEATHSIG); if the test process dies, the server sees its lifeline pipe close
(or gets SIGTERM, its own death signal), kills what is left, removes its socket and exits.

Where fork is unsafe the client starts fresh processes instead (``spawn``'s own path): not Linux,
CUDA initialised in the server, or ``NCCL_DOCTOR_FORK_SERVER=0`` in the test process's
environment. Variables that torch reads once at import (``TORCH_*`` logging settings, say) take
the test process's value, not the rank's: a test that sets them for its ranks opts out.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

#: "0" (in the test process's environment): every rank is a fresh process (spawn.py's own path).
OPT_OUT = "NCCL_DOCTOR_FORK_SERVER"
#: What the server imports once for every rank it forks.
PRELOAD = ("torch", "torch.distributed", "nccl_doctor.rank.bootstrap",
           "nccl_doctor.rank.recorder.core", "nccl_doctor.rank.hooks",
           "nccl_doctor.rank.early_exit", "nccl_doctor.rank.agent", "pytest")
# (not a target a rank runs as ``-m``, as testing/worker.py: runpy warns of a module imported
# before it runs as __main__)
MESSAGE = 1 << 20  # bytes: a request (argv and environment) is far smaller
#: Bytes of room the server's own environment block keeps for its ranks' (_show_environment).
ROOM_BYTES = 32768
_ROOM = "NCCL_DOCTOR_FORK_SERVER_ROOM"
_PR_SET_PDEATHSIG = 1
_START_TIMEOUT = 60.0


def supported() -> str | None:
    """Why ranks cannot be forked here (None: they can)."""
    if not sys.platform.startswith("linux"):
        return f"fork server: {sys.platform} (Linux only)"
    if os.environ.get(OPT_OUT, "1") == "0":
        return f"fork server: {OPT_OUT}=0"
    if not hasattr(socket, "send_fds") or not hasattr(os, "pidfd_open"):
        return "fork server: needs Python 3.9+"
    return None


# -- the test process's end ------------------------------------------------------------------


class Server:
    """The server process, seen from the test process that started it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nccl-doctor-zygote-"))  # 0700: ours alone
        self.address = str(self.dir / "s")
        self.log = self.dir / "server.log"
        read, self._lifeline = os.pipe()
        here = str(Path(__file__).resolve().parent.parent.parent)
        environ = _server_environment(os.environ, here)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nccl_doctor.testing.zygote", self.address, str(read),
                 str(os.getpid() if threading.current_thread() is threading.main_thread()
                     else 0)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                pass_fds=(read,), env=environ, start_new_session=True)
        os.close(read)

    def ready(self, timeout: float = _START_TIMEOUT) -> bool:
        """Whether the server answers (it imports torch first: seconds)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if hello(self.address) is None:
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        """Stop the server (it kills any rank still running) and remove its socket."""
        try:
            os.close(self._lifeline)  # end of file: the server exits
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_server: Server | None = None
_owner = 0  # the pid that started _server (a forked test process starts its own)
_ready = False
_failed: str | None = None


def start() -> None:
    """Start this process's server in the background, if it has none (``address`` then waits
    for it): the server imports torch while the tests are collected and set up."""
    global _server, _owner, _ready
    if supported() is not None or _failed is not None:
        return
    if _server is not None and _owner == os.getpid():
        return
    if _owner == 0:
        atexit.register(shutdown)
    _server, _owner, _ready = Server(), os.getpid(), False


def address() -> str | None:
    """This process's fork server's socket, the server started on first use (None: ranks start
    as fresh processes; ``why_not`` says why)."""
    global _server, _ready, _failed
    if supported() is not None:
        return None
    start()
    if _server is None or _owner != os.getpid():
        return None
    if _ready and _server.proc.poll() is None:
        return _server.address
    if not _ready and _server.ready():
        _ready = True
        return _server.address
    log = _server.log.read_text(errors="replace")[-2000:] if _server.log.exists() else ""
    _server.close()
    _server, _failed = None, f"the fork server stopped: {log.strip() or 'no output'}"
    return None


def why_not() -> str | None:
    """Why ranks start as fresh processes in this process (None: they are forked)."""
    return supported() or _failed


def shutdown() -> None:
    """Stop this process's server, if it started one."""
    global _server
    if _server is not None and _owner == os.getpid():
        _server.close()
    _server = None


def _server_environment(environ: dict[str, str] | os._Environ, here: str) -> dict[str, str]:
    """The test process's environment without the doctor's (the server arms no recorder: each
    rank arms its own, from its own environment) and with no OMP_NUM_THREADS (read once, at
    load, by the OpenMP runtime: each rank sets its own torch threads)."""
    from nccl_doctor import env

    out = {k: v for k, v in environ.items()
           if not k.startswith("NCCL_DOCTOR_") and k != "OMP_NUM_THREADS"}
    bootstrap = environ.get(env.BOOTSTRAP_PATH)
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != bootstrap]
    out["PYTHONPATH"] = os.pathsep.join([here, *paths])
    out[_ROOM] = "x" * ROOM_BYTES  # (see _show_environment)
    return out


def hello(path: str) -> str | None:
    """Ask the server at ``path`` whether it forks: None if it does, else why not."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(5)
            s.connect(path)
            s.send(json.dumps({"hello": True}).encode())
            reply = json.loads(s.recv(MESSAGE) or b"{}")
    except (OSError, ValueError) as err:
        return f"fork server at {path}: {err}"
    return None if reply.get("ok") else str(reply.get("refused", "no answer"))


# -- the server ------------------------------------------------------------------------------


@dataclass
class Launch:
    """What a forked rank runs: ``python ARGV``, ARGV a script or ``-m MODULE`` and its args."""

    argv: list[str]
    module: str | None


def serve(path: str, lifeline: int, parent: int) -> Launch | None:
    """The server's loop. Returns None in the server when it should exit, a ``Launch`` in each
    forked rank (which then runs it at the bottom of its stack: ``become``)."""
    import selectors

    if parent:  # SIGTERM (the server then ends as at the lifeline's end) when it dies
        _die_with_parent(parent, signal.SIGTERM)
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    base_path = _interpreter_path()
    server = os.getpid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the test process's
    ending: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: ending.append(signum))
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(lifeline, selectors.EVENT_READ, "parent")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    owners: dict[int, socket.socket] = {}  # a live rank's pid -> its client's connection
    clients: list[socket.socket] = []

    def kill(conn: socket.socket | None) -> None:
        for pid, owner in owners.items():
            if conn is None or owner is conn:
                try:
                    os.kill(pid, signal.SIGKILL)  # unreaped: the pid is still this rank's
                except OSError:
                    pass

    def reap() -> None:
        while owners:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = owners.pop(pid, None)
            if conn is not None and conn.fileno() >= 0:
                _send(conn, {"exit": pid, "status": status})

    while not ending:
        for key, _ in sel.select(timeout=1.0):
            what = key.data
            if ending or what == "parent" and not os.read(lifeline, 512):
                ending.append(0)  # the test process is gone (or done)
                break
            if what == "parent":
                continue
            elif what == "child":
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            elif what == "accept":
                conn, _ = listener.accept()
                clients.append(conn)
                sel.register(conn, selectors.EVENT_READ, conn)
            else:
                conn = what
                try:
                    data, fds, _flags, _addr = socket.recv_fds(conn, MESSAGE, 3)
                except OSError:
                    data, fds = b"", []
                if not data:  # the client is gone: its ranks go with it
                    kill(conn)
                    sel.unregister(conn)
                    clients.remove(conn)
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                try:
                    request = json.loads(data)
                except ValueError:
                    request = {}
                if "hello" in request:
                    refused = _unsafe()
                    _send(conn, {"ok": True} if refused is None else {"refused": refused})
                    continue
                refused = (_unsafe() if len(fds) == 3 and "argv" in request
                           else "a fork request takes argv, env, cwd and three descriptors")
                if refused is not None:
                    _send(conn, {"refused": refused})
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    try:
                        sel.close()
                        for c in clients:
                            c.close()
                        listener.close()
                        signal.set_wakeup_fd(-1)
                        for fd in (wake_r, wake_w, lifeline):
                            os.close(fd)
                        return _become_rank(request, fds, base_path, server)
                    except BaseException:  # never back into the server's loop
                        import traceback

                        traceback.print_exc()
                        os._exit(70)
                for fd in fds:
                    os.close(fd)
                owners[pid] = conn
                _send(conn, {"pid": pid})
        reap()
    kill(None)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return None


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass


def _unsafe() -> str | None:
    """Why forking this server is unsafe now (None: safe)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "fork server: CUDA is initialised in the server"
    return None


def _die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """``sig`` when the parent dies (the server's: besides the lifeline pipe, which also says
    it; a rank's: its server)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(0)


def _interpreter_path() -> list[str]:
    """The server's sys.path less its first entry and its PYTHONPATH: what any ``python`` of
    this interpreter puts after the target's directory and PYTHONPATH (stdlib, site-packages,
    .pth entries)."""
    given = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return [p for p in sys.path[1:] if os.path.abspath(p) not in given]


def _become_rank(request: dict, fds: list[int], base_path: list[str], server: int) -> Launch:
    """In the forked child: everything a fresh ``python ARGV`` would be before its first line."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it
    os.setsid()  # a session of its own, as torchrun's workers
    _die_with_parent(server)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _show_environment()
    argv = list(request["argv"])
    module = argv[1] if argv[0] == "-m" else None
    first = os.getcwd() if module else os.path.dirname(os.path.realpath(argv[0]))
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *base_path]
    sys.argv[:] = ["-m", *argv[2:]] if module else argv
    sys.orig_argv[:] = [sys.executable, *argv]
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=unbuffered or os.isatty(1), write_through=unbuffered)
    sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    if "nccl_doctor.paths" in sys.modules:  # it read the code patterns at import
        sys.modules["nccl_doctor.paths"].configure_from(os.environ)
    _sitecustomize()
    return Launch(argv, module)


def _show_environment() -> None:
    """Write the rank's environment where the kernel shows it (/proc/PID/environ: what the GPU
    sampler and ``ps e`` read), over the server's own block, which it inherited.

    The block lies at the top of the stack, where the kernel put the server's environment at its
    exec; ``os.environ.clear()`` has unset every variable in it (libc's ``environ`` now points at
    copies), so nothing reads it any more - the same relocation setproctitle makes before it
    writes over that memory. The server's environment carries ``ROOM_BYTES`` of padding so that
    a rank's, a few variables longer, fits; one that does not leaves the block as it was."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50, 51)
    except (OSError, ValueError, IndexError):
        return
    block = b"".join(k + b"=" + v + b"\0" for k, v in os.environb.items())
    if not start or len(block) >= end - start:
        return
    ctypes.memmove(start, block + b"\0" * (end - start - len(block)), end - start)


def _sitecustomize() -> None:
    """Import the sitecustomize the rank's sys.path finds first, as site.py does at start (under
    the doctor: its bootstrap, which arms the recorder and chains to the one it shadows)."""
    import importlib
    import importlib.machinery

    ran = sys.modules.pop("sitecustomize", None)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or (ran is not None and getattr(ran, "__file__", None) == spec.origin):
        if ran is not None:
            sys.modules["sitecustomize"] = ran
        return
    try:
        importlib.import_module("sitecustomize")
    except Exception as err:  # as site.py: report, go on
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                         f"{type(err).__name__}: {err}\n")


def become(launch: Launch) -> NoReturn:
    """Run the rank's target as ``__main__`` (at the bottom of the forked child's stack) and end
    the process as the interpreter ends a fresh one: an uncaught exception through
    ``sys.excepthook`` (the traceback starting at the target), ``SystemExit``'s status, the
    non-daemon threads joined, the atexit handlers run (the recorder's among them), stdio
    flushed, SIGINT for an unhandled KeyboardInterrupt. Then ``os._exit``: without the
    interpreter's teardown of every module (half a second of a forked torch process's CPU, its
    pages copied one by one), as multiprocessing's forked children end."""
    import runpy
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    code, interrupted = 0, False
    try:
        if launch.module is not None:
            runpy._run_module_as_main(launch.module)  # what ``python -m`` calls
        else:
            import builtins
            import importlib.machinery

            path = launch.argv[0]
            main.__dict__.update(
                __file__=path, __cached__=None, __builtins__=builtins, __package__=None,
                __spec__=None, __loader__=importlib.machinery.SourceFileLoader("__main__", path))
            with open(path, "rb") as f:
                compiled = compile(f.read(), path, "exec")
            exec(compiled, main.__dict__)
    except SystemExit as err:
        code = _exit_code(err.code)
    except BaseException as err:  # what the interpreter would print and end with
        interrupted, code = isinstance(err, KeyboardInterrupt), 1
        tb = err.__traceback__
        while tb is not None and _ours(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next  # the traceback a fresh process prints starts at the target
        try:
            sys.excepthook(type(err), err.with_traceback(tb), tb)  # (it prints err's own)
        except BaseException:
            pass
        del err, tb
    _end(code, interrupted)


def _exit_code(status: object) -> int:
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    try:
        sys.stderr.write(f"{status}\n")
    except BaseException:
        pass
    return 1


def _end(code: int, interrupted: bool) -> NoReturn:
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()  # (prints a failing handler's traceback itself)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            code = code or 120  # as the interpreter, when it cannot flush
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _ours(filename: str) -> bool:
    return filename in (__file__, getattr(sys.modules.get("runpy"), "__file__", None))


if __name__ == "__main__":
    from nccl_doctor.testing import zygote as _zygote  # (not __main__: a rank's __main__ is its own)

    _launch = _zygote.serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    if _launch is not None:
        _zygote.become(_launch)
