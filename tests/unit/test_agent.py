"""The in-rank agent's server and client, in this test process (no torch job)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from nccl_doctor import agent_protocol as protocol

from nccl_doctor.rank import agent as server
from nccl_doctor.supervisor.agent_client import AgentUnavailable, request, request_many


@pytest.fixture
def run_id() -> str:
    return "test-" + uuid.uuid4().hex[:12]


@pytest.fixture
def agent(run_id):
    a = server.start(run_id)
    assert a is not None
    yield a
    a.stop()


def raw_exchange(run_id: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` as is to this process's agent and read the reply until EOF."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(protocol.address(run_id, os.getpid()))
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        return protocol.recv_until_eof(s, protocol.MAX_RESPONSE, time.monotonic() + timeout)


def test_address_is_abstract_and_validated():
    assert protocol.address("abc", 42) == "\0nccl-doctor/abc/42"
    for bad in ("", "a/b", "a\0b", "x" * 200):
        with pytest.raises(ValueError):
            protocol.address(bad, 42)
    with pytest.raises(ValueError):
        protocol.address("abc", 0)


def test_request_round_trip_encoding():
    line = protocol.encode_request("stacks", depth=3)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.decode_request(line) == {"cmd": "stacks", "depth": 3}
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_request(b"[1, 2]")
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_response(b'{"no": "ok"}')


def test_ping(agent, run_id):
    reply = request(run_id, os.getpid(), "ping")
    assert reply["ok"] is True
    assert reply["pid"] == os.getpid()
    assert reply["run_id"] == run_id
    assert "rank" in reply  # None here: no process group in this test process


def test_start_twice_returns_the_running_agent(agent, run_id):
    assert server.start(run_id) is agent
    assert server.current() is agent


def test_agent_thread_is_a_daemon_named_for_us(agent):
    threads = [t for t in threading.enumerate() if t.ident == agent.thread_ident]
    assert len(threads) == 1
    assert threads[0].daemon and threads[0].name == server.THREAD_NAME


def _parked(event: threading.Event) -> None:
    event.wait(30)


def test_stacks_have_pyspy_shape(agent, run_id):
    stop = threading.Event()
    worker = threading.Thread(target=_parked, args=(stop,), name="parked-worker", daemon=True)
    worker.start()
    try:
        reply = request(run_id, os.getpid(), "stacks")
    finally:
        stop.set()
        worker.join()
    assert reply["ok"] is True
    threads = reply["threads"]
    by_name = {t["thread_name"]: t for t in threads}
    assert server.THREAD_NAME not in by_name  # the agent leaves itself out
    main = by_name["MainThread"]
    assert main["is_main"] is True and main["os_thread_id"] == os.getpid()
    assert sum(t["is_main"] for t in threads) == 1
    # innermost first: the main thread is inside the client, called from this test
    names = [f["name"] for f in main["frames"]]
    assert names.index("request") < names.index("test_stacks_have_pyspy_shape")
    parked = by_name["parked-worker"]
    assert parked["frames"][-1]["name"] == "_bootstrap"  # outermost: threading's entry point
    assert "_parked" in [f["name"] for f in parked["frames"]]
    for t in threads:
        assert isinstance(t["thread_id"], int)
        for f in t["frames"]:
            assert set(f) == {"name", "filename", "line"}
            assert isinstance(f["filename"], str)


def test_stacks_parse_with_the_stack_model(agent, run_id):
    model = pytest.importorskip("nccl_doctor.stacks.rank_stack")
    reply = request(run_id, os.getpid(), "stacks")
    stack = model.parse_stack_json(reply["threads"], rank=0, pid=os.getpid(), source="agent")
    assert stack.main is not None and stack.main.name == "MainThread"


def test_unknown_command(agent, run_id):
    reply = request(run_id, os.getpid(), "reboot")
    assert reply["ok"] is False
    assert reply["error"].startswith("unknown command 'reboot'")


@pytest.mark.parametrize("data", [b"not json\n", b"[1,2,3]\n", b'{"cmd": 7}\n', b"\xff\xfe\n", b""])
def test_malformed_request_gets_an_error_reply(agent, run_id, data):
    reply = json.loads(raw_exchange(run_id, data))
    assert reply["ok"] is False and "malformed request" in reply["error"]
    assert request(run_id, os.getpid(), "ping")["ok"]  # and the agent goes on


def test_oversized_request_is_refused(agent, run_id):
    data = b'{"cmd": "ping", "pad": "' + b"x" * (protocol.MAX_REQUEST + 10) + b'"}\n'
    reply = json.loads(raw_exchange(run_id, data))
    assert reply["ok"] is False and "larger than" in reply["error"]
    assert request(run_id, os.getpid(), "ping")["ok"]
    with pytest.raises(AgentUnavailable, match="bad request"):  # the client will not send one
        request(run_id, os.getpid(), "ping", pad="x" * protocol.MAX_REQUEST)


def test_handler_exception_is_a_reply_not_a_dead_thread(agent, run_id, monkeypatch):
    def boom(agent, req):
        raise RuntimeError("kaputt")

    monkeypatch.setitem(server.HANDLERS, "boom", boom)
    for _ in range(3):
        reply = request(run_id, os.getpid(), "boom")
        assert reply == {"ok": False, "error": "boom: RuntimeError('kaputt')"}
    assert agent.alive
    assert request(run_id, os.getpid(), "ping")["ok"]


def test_flight_recorder_without_torch_dist(agent, run_id):
    reply = request(run_id, os.getpid(), "flight_recorder")
    if "torch.distributed" not in sys.modules:
        assert reply["ok"] is False and "torch" in reply["error"]
    else:  # another test imported torch: the dump has no process group, hence no entries
        assert reply["ok"] is False or reply["trace"]["entries"] == []


def test_a_stalled_client_does_not_wedge_the_agent(agent, run_id, monkeypatch):
    monkeypatch.setattr(server, "CONNECTION_DEADLINE_S", 0.5)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stalled:
        stalled.connect(protocol.address(run_id, os.getpid()))
        stalled.sendall(b'{"cmd": "pi')  # ... and never the rest
        assert request(run_id, os.getpid(), "ping", timeout=5)["ok"]


def test_stop_closes_the_socket(run_id):
    a = server.start(run_id)
    assert a is not None and request(run_id, os.getpid(), "ping")["ok"]
    a.stop()
    assert not a.alive
    assert server.current() is None
    with pytest.raises(AgentUnavailable, match="refused"):
        request(run_id, os.getpid(), "ping", timeout=2)
    a.stop()  # twice is harmless
    again = server.start(run_id)  # and the name can be taken again
    assert again is not None
    again.stop()


def test_start_reports_one_line_when_the_name_is_taken(run_id, capsys):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squatter:
        squatter.bind(protocol.address(run_id, os.getpid()))
        assert server.start(run_id) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "agent not started" in err


def test_client_times_out_on_a_socket_that_never_answers(run_id):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(protocol.address(run_id, os.getpid()))
        mute.listen(1)  # never accepts: the connection waits in the backlog
        t0 = time.monotonic()
        with pytest.raises(AgentUnavailable, match="timeout"):
            request(run_id, os.getpid(), "ping", timeout=0.3)
        assert time.monotonic() - t0 < 3


def test_client_times_out_on_an_accepted_but_silent_connection(run_id):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(protocol.address(run_id, os.getpid()))
        mute.listen(1)
        accepted: list[socket.socket] = []
        t = threading.Thread(target=lambda: accepted.append(mute.accept()[0]), daemon=True)
        t.start()
        try:
            with pytest.raises(AgentUnavailable, match="timeout"):
                request(run_id, os.getpid(), "ping", timeout=0.3)
        finally:
            t.join(2)
            for c in accepted:
                c.close()


def test_malformed_reply_is_unavailable(run_id):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as fake:
        fake.bind(protocol.address(run_id, os.getpid()))
        fake.listen(1)

        def answer() -> None:
            conn, _ = fake.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"<html>")

        t = threading.Thread(target=answer, daemon=True)
        t.start()
        with pytest.raises(AgentUnavailable, match="malformed reply"):
            request(run_id, os.getpid(), "ping", timeout=2)
        t.join(2)


def test_request_many(agent, run_id):
    replies = request_many(run_id, {0: os.getpid(), 1: 2**22 + 12345}, "ping", timeout=2)
    assert replies[0]["ok"] is True and replies[0]["pid"] == os.getpid()
    assert isinstance(replies[1], AgentUnavailable)
    assert "no such process" in str(replies[1]) or "refused" in str(replies[1])
    assert request_many(run_id, {}, "ping") == {}


def test_request_many_runs_in_parallel(run_id):
    # four silent "agents": the pid is only part of the socket's name, so any number will do
    pids = {rank: 10_000_000 + rank for rank in range(4)}
    mutes = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in pids]
    try:
        for s, pid in zip(mutes, pids.values()):
            s.bind(protocol.address(run_id, pid))
            s.listen(1)
        t0 = time.monotonic()
        replies = request_many(run_id, pids, "ping", timeout=0.5)
        elapsed = time.monotonic() - t0
        assert sorted(replies) == [0, 1, 2, 3]
        assert all(isinstance(r, AgentUnavailable) and "timeout" in str(r)
                   for r in replies.values())
        assert elapsed < 1.5  # not 4 x 0.5 s
    finally:
        for s in mutes:
            s.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_releases_the_listening_socket(run_id):
    a = server.start(run_id)
    assert a is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the at-fork hook already ran
        status = 1
        try:
            os.close(r)
            ok = server.current() is None
            os.write(w, b"1" if ok else b"0")
            time.sleep(3)  # outlive the parent's agent
            status = 0
        finally:
            os._exit(status)
    try:
        os.close(w)
        assert os.read(r, 1) == b"1"
        assert request(run_id, os.getpid(), "ping")["ok"]  # the parent still serves
        a.stop()
        # had the child kept its copy of the listening socket, this would wait for the timeout
        t0 = time.monotonic()
        with pytest.raises(AgentUnavailable, match="refused"):
            request(run_id, os.getpid(), "ping", timeout=2)
        assert time.monotonic() - t0 < 1
    finally:
        os.close(r)
        a.stop()
        os.kill(pid, 9)
        os.waitpid(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_during_a_request_does_not_hold_the_reply(agent, run_id, monkeypatch):
    entered, release = threading.Event(), threading.Event()

    def slow(agent, req):
        entered.set()
        release.wait(10)
        return {"ok": True}

    monkeypatch.setitem(server.HANDLERS, "slow", slow)
    replies: list[object] = []

    def ask() -> None:
        try:
            replies.append(request(run_id, os.getpid(), "slow", timeout=2))
        except AgentUnavailable as err:
            replies.append(err)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    assert entered.wait(5)
    pid = os.fork()  # the child inherits the connection being answered
    if pid == 0:
        try:
            time.sleep(3)
        finally:
            os._exit(0)
    try:
        release.set()
        asker.join(5)
        assert replies == [{"ok": True}]  # EOF came from the parent, not after the child's exit
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_flight_recorder_reads_both_recorders_once(agent, run_id, monkeypatch):
    """NCCL builds have a second recorder (``_dump_nccl_trace_json``); newer torch may serve the
    same entries from both. This CPU wheel has no NCCL: the second dump is stood in for."""
    import json as _json

    import torch
    import torch.distributed  # noqa: F401  (the agent never imports it itself)

    c10d = torch._C._distributed_c10d
    shared = {"process_group": ["0", "default_pg"], "profiling_name": "nccl:all_reduce",
              "op_id": 1, "collective_seq_id": 1, "p2p_seq_id": 0, "time_created_ns": 5}
    mine = {**shared, "op_id": 2, "collective_seq_id": 2, "time_created_ns": 6}
    monkeypatch.setattr(c10d, "_dump_fr_trace_json",
                        lambda inc, act: _json.dumps({"version": "2.10", "entries": [shared]}))
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json",
                        lambda inc, act: _json.dumps({"entries": [shared, mine]}), raising=False)
    reply = request(run_id, os.getpid(), "flight_recorder")
    assert reply["ok"], reply
    assert reply["trace"]["entries"] == [shared, mine] and reply["trace"]["version"] == "2.10"


# -- exit: the supervisor's quiet stop ------------------------------------------------------------

_RANK = r'''
import signal, sys, time
from nccl_doctor.rank import agent
if sys.argv[2] == "handler":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
if sys.argv[2] == "child":  # an engine process of its own, which must not be orphaned
    import subprocess
    child = subprocess.Popen(["sleep", "60"])
    print(child.pid, file=sys.stderr, flush=True)
agent.start(sys.argv[1])
print("kept in the buffer")  # no flush: the exit must not lose it
print("ready", file=sys.stderr, flush=True)
time.sleep(60)
'''


def _rank(run_id: str, sigterm: str = "default") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _RANK, run_id, sigterm], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr.readline() == "ready\n"
    return proc


def test_exit_replies_then_leaves_with_the_code_and_its_output_flushed(run_id):
    proc = _rank(run_id)
    try:
        assert request(run_id, proc.pid, "exit", code=0) == {"ok": True, "children": []}
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "kept in the buffer\n"


def test_exit_takes_the_rank_s_children_with_it(run_id):
    proc = subprocess.Popen([sys.executable, "-c", _RANK, run_id, "child"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child = int(proc.stderr.readline())
    assert proc.stderr.readline() == "ready\n"
    try:
        assert request(run_id, proc.pid, "exit", code=0) == {"ok": True, "children": [child]}
        proc.communicate(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _running(child):
            time.sleep(0.1)
        assert not _running(child), "the rank's child outlived it"
    finally:
        proc.kill()
        if _running(child):
            os.kill(child, 9)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_exit_leaves_a_job_that_handles_sigterm_to_its_handler(run_id):
    proc = _rank(run_id, "handler")
    try:
        reply = request(run_id, proc.pid, "exit", code=0)
        assert reply == {"ok": False, "error": "exit: the job handles SIGTERM itself"}
        assert proc.poll() is None
        assert request(run_id, proc.pid, "exit", code=300)["ok"] is False  # not a code
        proc.terminate()
        proc.communicate(timeout=10)
        assert proc.returncode == 3  # the job's own handler ran
    finally:
        proc.kill()


_BROKEN = r'''
import os, sys, time
from nccl_doctor.rank import agent
agent.start(sys.argv[1])
print("ready", file=sys.stderr, flush=True)
while not os.path.exists(sys.argv[2]):  # blocked, as in a collective
    time.sleep(0.01)
raise RuntimeError("Connection closed by peer")  # what gloo raises once a peer has left
'''


@pytest.mark.parametrize("told", [True, False])
def test_a_rank_told_of_the_stop_ends_silently_when_its_call_breaks(run_id, tmp_path, told):
    """Ranks are asked to exit one by one: a rank still blocked in a collective when its peer
    has left gets an exception from the backend. Once told (``quiet``), it ends at once with
    status 0 and no traceback; untold, it would print one and exit 1 (torchrun's
    ChildFailedError)."""
    broken = tmp_path / "peer-left"
    proc = subprocess.Popen([sys.executable, "-c", _BROKEN, run_id, str(broken)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr.readline() == "ready\n"
        if told:
            assert request(run_id, proc.pid, "quiet") == {"ok": True}
        broken.touch()
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    if told:
        assert proc.returncode == 0 and "Traceback" not in err, err
    else:
        assert proc.returncode == 1 and "Connection closed by peer" in err


def test_quiet_is_refused_by_a_job_that_handles_sigterm(run_id):
    proc = _rank(run_id, "handler")
    try:
        assert request(run_id, proc.pid, "quiet") == {
            "ok": False, "error": "quiet: the job handles SIGTERM itself"}
    finally:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
def test_another_user_is_not_answered(agent, run_id):
    """An abstract socket has no file permissions: the agent checks who connects."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # another user knocks
        try:
            os.setuid(65534)
            try:
                said = str(request(run_id, os.getppid(), "ping"))
            except AgentUnavailable as err:
                said = str(err)
            os.write(write, said.encode()[:4000])
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as f:
        said = f.read()
    # refused unanswered: the client sees its connection closed (or its request cut off)
    assert said.startswith(f"agent of pid {os.getpid()}: ") and "'ok'" not in said, said
    assert request(run_id, os.getpid(), "ping")["ok"] is True  # its own user still is
