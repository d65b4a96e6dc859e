"""The pure and in-process parts of `--ray`: the runtime-env hook Ray calls in the driver, the
worker hook's choice of directory, the actors' and groups' names, and the root cause of a rank
that skipped one group's collective while its peers wait in their own order (the real cluster:
tests/upstream/test_ray_cluster.py)."""

from __future__ import annotations

import functools
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

from nccl_doctor import env
from nccl_doctor.analysis.who import actors
from nccl_doctor.analysis import analyze
from nccl_doctor.capture.names import node_dir
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.model import EventState
from nccl_doctor.rank import ray_env
from nccl_doctor.rank.ray_actor import actor_meta

ENTERED, RETURNED = EventState.ENTERED, EventState.RETURNED


def test_the_hook_adds_the_doctors_settings_and_keeps_the_users(monkeypatch):
    monkeypatch.setenv(env.CAPTURE_DIR, "/runs/out")
    monkeypatch.setenv(env.RUN_ID, "r1")
    monkeypatch.setenv(env.HOSTNAME, "nodeA")  # names this host, not the workers'
    monkeypatch.delenv(env.RAY_USER_HOOK, raising=False)
    user_env = {"env_vars": {"NCCL_DOCTOR_RUN_ID": "theirs", "HF_HOME": "/h"},
                "pip": ["x"]}
    out = ray_env.runtime_env_hook(user_env)
    assert out["pip"] == ["x"] and out["env_vars"]["HF_HOME"] == "/h"
    assert out["env_vars"][env.CAPTURE_DIR] == "/runs/out"
    assert out["env_vars"][env.RUN_ID] == "theirs"  # what the user set wins
    assert env.HOSTNAME not in out["env_vars"]
    assert out["worker_process_setup_hook"] == ray_env.SETUP_WORKER
    assert user_env["env_vars"] == {"NCCL_DOCTOR_RUN_ID": "theirs", "HF_HOME": "/h"}  # a copy
    # no runtime_env at all: one is made
    assert ray_env.runtime_env_hook(None)["worker_process_setup_hook"] == ray_env.SETUP_WORKER


def test_the_users_hooks_run_too(monkeypatch):
    calls = []
    mod = types.ModuleType("users_ray_hooks")
    mod.amend = lambda renv: {**(renv or {}), "env_vars": {"FROM_USER": "1"}}
    mod.setup = lambda: calls.append("theirs")
    monkeypatch.setitem(sys.modules, "users_ray_hooks", mod)
    monkeypatch.setenv(env.RAY_USER_HOOK, "users_ray_hooks.amend")
    monkeypatch.setenv(env.ENABLE, "0")  # the worker hook then arms nothing in this process
    out = ray_env.runtime_env_hook({"worker_process_setup_hook": "users_ray_hooks.setup"})
    assert out["env_vars"]["FROM_USER"] == "1"  # their runtime-env hook ran first
    hook = out["worker_process_setup_hook"]
    assert isinstance(hook, functools.partial) and hook.args == ("users_ray_hooks.setup",)
    hook()  # ours, then theirs
    assert calls == ["theirs"]


def test_a_broken_user_hook_leaves_the_runtime_env_as_it_was(monkeypatch, capsys):
    monkeypatch.setenv(env.RAY_USER_HOOK, "no_such_module_here.amend")
    given = {"env_vars": {"A": "1"}}
    assert ray_env.runtime_env_hook(given) is given
    assert "Ray's workers will run unrecorded" in capsys.readouterr().err


@pytest.mark.parametrize("host, expected", [("nodeA", "out"), ("nodeB", "out.nodeB"),
                                            ("node/B 2", "out.node_B_2")])
def test_a_worker_writes_into_its_hosts_directory(monkeypatch, tmp_path, host, expected):
    monkeypatch.setenv(env.CAPTURE_DIR, str(tmp_path / "out"))
    monkeypatch.setenv(env.LEADER_HOST, "nodeA")
    monkeypatch.setenv(env.HOSTNAME, host)
    monkeypatch.setenv(env.ENABLE, "0")
    ray_env.setup_worker()
    import os

    assert os.environ[env.CAPTURE_DIR] == str(tmp_path / expected)
    assert node_dir(tmp_path / "out", host) == (tmp_path / expected if host != "nodeA"
                                                else tmp_path / "out.nodeA")


def test_outside_a_ray_actor_there_is_no_actor():
    assert actor_meta() == {}


def _as_actor(trace, cls: str, actor: str):
    return replace(trace, meta=replace(trace.meta, ray={"actor_class": cls, "actor_id": actor}))


def weight_sync_skipped(tb):
    """Trainers 0, 1 and engines 2, 3 in one world ("0"), the trainers' group ("1") and the
    weight-sync group ("2": trainer 0 broadcasts to the engines). At step 2 engine 3 skips the
    broadcast and goes on to the world's barrier; trainer 0 waits in the broadcast. Trainer 1
    enters the barrier first, so the finding that names rank 0 is the oldest."""
    def ev(idx, op, group, seq, state=RETURNED, t=None):
        return tb.event(idx, op, group, seq, state=state, t_enter_ns=t, line=50 + idx)

    late = tb.T0 + 100 * tb.STEP
    ranks = {
        0: [ev(1, "all_reduce", "1", 1), ev(2, "broadcast", "2", 1), ev(3, "barrier", "0", 1),
            ev(4, "all_reduce", "1", 2), ev(5, "broadcast", "2", 2, ENTERED, late + 3)],
        1: [ev(1, "all_reduce", "1", 1), ev(2, "barrier", "0", 1), ev(3, "all_reduce", "1", 2),
            ev(4, "barrier", "0", 2, ENTERED, late)],
        2: [ev(1, "broadcast", "2", 1), ev(2, "barrier", "0", 1),
            ev(3, "broadcast", "2", 2, t=late + 4),
            ev(4, "barrier", "0", 2, ENTERED, late + 5)],
        3: [ev(1, "broadcast", "2", 1), ev(2, "barrier", "0", 1),
            ev(3, "barrier", "0", 2, ENTERED, late + 1)],
    }
    classes = {0: "Trainer", 1: "Trainer", 2: "Engine", 3: "Engine"}
    hosts = {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
    traces = [_as_actor(tb.trace(r, es, world_size=4, host=hosts[r]), classes[r],
                        f"{r}a{r}b{r}c{r}d0000") for r, es in ranks.items()]
    return tb.traceset(traces, {"0": (0, 1, 2, 3), "1": (0, 1), "2": (0, 2, 3)},
                         exit_status=124)


def test_groups_are_named_by_the_actors_in_them(tb):
    traces = weight_sync_skipped(tb)
    assert actors.group_roles(traces) == {
        "0": "the world (Trainer ranks 0, 1 + Engine ranks 2, 3)",
        "1": "Trainer group (ranks 0, 1)",
        "2": "weight-sync group (Trainer rank 0 -> Engine ranks 2, 3)"}
    summary = actors.summary(traces)
    assert summary.to_json()["actors"]["3"] == {"class": "Engine", "id": "3a3b3c3d0000",
                                                "name": "", "host": "nodeB"}
    assert summary.actors[3].label == "Engine 3a3b3c3d"
    # a group with a rank outside any actor has no role; a job without actors, no summary
    plain = tb.traceset([tb.trace(r) for r in (0, 1)])
    assert actors.group_roles(plain) == {} and actors.summary(plain) is None


def test_the_rank_that_broke_its_order_is_the_root_cause_not_the_one_waiting_in_it(tb):
    d = analyze(weight_sync_skipped(tb))
    missing = {f.ranks: f for f in d.findings if f.kind is FindingKind.MISSING_COLLECTIVE}
    assert set(missing) == {(0,), (3,)}  # both are said, each missing from the other's call
    root = d.root_cause
    assert root is missing[(3,)] and root.group == "2" and root.op == "broadcast"
    assert root.evidence["group_role"] == \
        "weight-sync group (Trainer rank 0 -> Engine ranks 2, 3)"
    assert root.evidence["actors"] == {"3": "Engine 3a3b3c3d"}
    assert root.title.endswith("[rank 3 (Engine 3a3b3c3d) on nodeB; group 2: weight-sync group "
                               "(Trainer rank 0 -> Engine ranks 2, 3)]")
    assert d.ray.groups["2"].ranks == (0, 2, 3)


def test_without_actors_the_order_still_decides(tb):
    """The same job as plain ranks (torchrun): the same root cause, hosts only in its title."""
    traces = weight_sync_skipped(tb)
    plain = replace(traces, ranks={r: replace(t, meta=replace(t.meta, ray={}))
                                   for r, t in traces.ranks.items()})
    root = analyze(plain).root_cause
    assert root.ranks == (3,) and root.title.endswith("[rank 3 on nodeB]")
    assert "actors" not in root.evidence and "group_role" not in root.evidence


def test_the_cli_refuses_a_ray_client_address(tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "nccl_doctor", "run", "--ray", "ray://h:10001",
                           "--out", str(tmp_path / "o"), "--", "true"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Ray Client address" in proc.stderr and not Path(tmp_path / "o").exists()


def test_every_report_says_which_actor_holds_each_rank(tb):
    """The console and the page render the ``ray`` section the analysis computed."""
    import io

    import html5lib

    from nccl_doctor.analysis.page_builder import page as page_of
    from nccl_doctor.reporters.console import ConsoleReporter
    from nccl_doctor.reporters.html import render

    traces = weight_sync_skipped(tb)
    d = analyze(traces)
    out = io.StringIO()
    ConsoleReporter().render(d, out)
    text = out.getvalue()
    assert "Ray actors rank 0: Trainer 0a0b0c0d on nodeA;" in text
    assert "group 2: weight-sync group (Trainer rank 0 -> Engine ranks 2, 3)" in text
    tree = html5lib.parse(render(d, page_of(traces, d)), namespaceHTMLElements=False)
    rows = [[td.text or "" for td in tr.findall("td")] for tr in tree.iter("tr")]
    assert ["3", "nodeB", "Engine 3a3b3c3d"] == next(r for r in rows if r[:1] == ["3"])[:3]
    groups = [li.text for li in tree.iter("li") if (li.text or "").startswith("group ")]
    assert "group 1: Trainer group (ranks 0, 1)" in groups


def test_the_leaders_host_is_kept_on_its_own_host_and_forgotten_once_used_elsewhere(
        monkeypatch, tmp_path):
    """A Ray driver on the leader's host hands the leader's host on to every worker (Ray's
    runtime_env copies it from the driver's environment); a rank elsewhere rewrites its directory
    once, and its children inherit the result."""
    import os

    from nccl_doctor.rank import bootstrap

    monkeypatch.setenv(env.CAPTURE_DIR, str(tmp_path / "out"))
    monkeypatch.setenv(env.LEADER_HOST, "nodeA")
    monkeypatch.setenv(env.HOSTNAME, "nodeA")
    bootstrap.this_hosts_directory()
    assert os.environ[env.LEADER_HOST] == "nodeA"
    assert os.environ[env.CAPTURE_DIR] == str(tmp_path / "out")
    monkeypatch.setenv(env.HOSTNAME, "nodeB")
    bootstrap.this_hosts_directory()
    bootstrap.this_hosts_directory()  # a child: nothing more
    assert env.LEADER_HOST not in os.environ
    assert os.environ[env.CAPTURE_DIR] == str(tmp_path / "out.nodeB")
