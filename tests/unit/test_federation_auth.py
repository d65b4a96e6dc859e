"""Only the job's doctors are heard on the coordinator's store (federation/sealing.py, keys.py),
on a real torch TCPStore: names nobody without the key can find, values sealed under the run's
nonce (a forged one, one moved to another name and one from an earlier run under the same key
read as absent and are counted), the leader's nonce believed only once it answers a follower's
challenge, and where the key comes from - the user's default key file above all."""

from __future__ import annotations

import datetime
import json
import os
import re
import stat
import subprocess
import sys
import time

import pytest
from torch.distributed import TCPStore

from nccl_doctor import env
from nccl_doctor.reproducers.nodes import free_port
from nccl_doctor.supervisor.federation import keys, sealing
from nccl_doctor.supervisor.federation import store as st


@pytest.fixture()
def raw():
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=5))
    client = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=5))
    yield server, client


# -- names and values ----------------------------------------------------------------------------
def test_names_are_hidden_and_belong_to_one_key_and_one_run():
    store = object()  # (naming needs no store)
    run = sealing.Sealed(store, b"job-key", "nonce-1")
    name = run.name(st.DECISION_N)
    assert re.fullmatch(r"ncd/[0-9a-f]{32}", name) and st.DECISION_N not in name
    # the same in every process that has the key and the nonce ...
    assert sealing.Sealed(store, b"job-key", "nonce-1").name(st.DECISION_N) == name
    # ... and another for another run, another key, another logical name
    assert sealing.Sealed(store, b"job-key", "nonce-2").name(st.DECISION_N) != name
    assert sealing.Sealed(store, b"other-key", "nonce-1").name(st.DECISION_N) != name
    assert run.name(st.decision_key(1)) != name
    # a name (seen on the wire) is not a MAC of anything: the two keys are drawn apart
    assert name[4:] not in run.seal(st.DECISION_N, b"0").decode()


def test_a_sealed_value_reads_back_and_a_forged_one_is_counted_not_believed(raw):
    server, rogue = raw
    doctors = sealing.Sealed(server, b"k" * 64, "n1")
    st.put(doctors, st.decision_key(1), {"kind": "hang", "stop_job": False})
    assert st.get(doctors, st.decision_key(1)) == {"kind": "hang", "stop_job": False}
    assert doctors.rejected == 0
    # what a rogue writes under the names of the table lands where no doctor reads
    rogue.set(st.decision_key(1), json.dumps({"kind": "hang", "stop_job": True}))
    rogue.set(st.DECISION_N, "2")
    assert st.get(doctors, st.decision_key(1)) == {"kind": "hang", "stop_job": False}
    assert not st.has(doctors, st.DECISION_N)
    # and written under a doctor's name (had it found one), it fails
    rogue.set(doctors.name(st.decision_key(2)), json.dumps({"kind": "hang", "stop_job": True}))
    assert st.get_many(doctors, [st.decision_key(1), st.decision_key(2)]) == [
        {"kind": "hang", "stop_job": False}, None]
    assert doctors.rejected == 1 and sealing.rejected(doctors) == 1
    assert sealing.rejected(server) == 0


def test_a_value_moved_to_another_name_another_key_or_another_run_fails(raw):
    server, rogue = raw
    run1 = sealing.Sealed(server, b"job-key", "run-1")
    st.put(run1, st.decision_key(1), {"kind": "hang", "stop_job": True})
    recorded = rogue.get(run1.name(st.decision_key(1)))
    rogue.set(run1.name(st.decision_key(7)), recorded)  # moved to another name, same run
    assert st.get(run1, st.decision_key(7)) is None and run1.rejected == 1
    # the next run under the same static key: the earlier run's value, replayed under this
    # run's name for the very same decision, was sealed under another nonce
    run2 = sealing.Sealed(server, b"job-key", "run-2")
    rogue.set(run2.name(st.decision_key(1)), recorded)
    assert st.get(run2, st.decision_key(1)) is None and run2.rejected == 1
    other = sealing.Sealed(rogue, b"another-job-key", "run-2")  # another key, same nonce
    rogue.set(run2.name(st.beat_key("n1")), other.seal(st.beat_key("n1"), b'{"n":1}'))
    assert st.get(run2, st.beat_key("n1")) is None and run2.rejected == 2


def test_the_counters_live_under_hidden_names(raw):
    server, rogue = raw
    doctors = sealing.Sealed(server, b"job-key", "n1")
    assert st.add(doctors, st.NODES, 1) == 1
    rogue.add(st.NODES, 5)  # a rogue bumps the counter it can guess: not the doctors'
    assert st.add(doctors, st.NODES, 0) == 1 and int(rogue.get(st.NODES)) == 5


# -- the join: a nonce believed once the leader proves it --------------------------------------
def _link(port: int, key: bytes | None, leader: bool, **options):
    from nccl_doctor.supervisor.federation.link import new_link
    from nccl_doctor.supervisor.federation.rendezvous import Rendezvous

    said: list[str] = []
    rdzv = Rendezvous("127.0.0.1", port, 2, 0 if leader else 1, "test", "job-1")
    link = new_link(rdzv, "leader" if leader else "follower", leader=leader, announce=said.append,
                    answer=lambda *a: {}, summaries=lambda ended: {}, key=key,
                    connect_within=20.0, **options)
    link.start()
    return link, said


def test_a_replayed_join_record_alone_never_lets_a_follower_in():
    """A store that holds an earlier run's join record, sealed under the job's key (as a replay
    leaves it), but no leader that knows its nonce now: the follower registers its challenge
    under that nonce, nobody answers, and it never joins - nor gives up, nor is refused."""
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=5))
    old = sealing.Sealed(server, b"the-job-key", "")
    st.put(old, sealing.join_name("job-1"), {"format": st.FORMAT, "version": st.VERSION,
                                             "job": "job-1", "host": "earlier",
                                             "nonce": "an-earlier-runs-nonce"})
    follower, _ = _link(port, b"the-job-key", leader=False)
    try:
        earlier = sealing.Sealed(server, b"the-job-key", "an-earlier-runs-nonce")
        deadline = time.monotonic() + 60
        while not st.has(earlier, st.node_key(1)):  # its entry, under the replayed nonce
            assert time.monotonic() < deadline, follower.t.error
            time.sleep(0.1)
        entry = st.get(earlier, st.node_key(1))
        assert entry["id"] == follower.t.id and re.fullmatch(r"[0-9a-f]{32}", entry["challenge"])
        time.sleep(3.0)
        assert follower.t.pending is None and not follower.t.refused
        # only the leader's answer under the nonce, to this challenge, lets it in
        st.put(earlier, st.welcome_key(follower.t.id), {"challenge": "not-the-challenge"})
        time.sleep(1.0)
        assert follower.t.pending is None
        st.put(earlier, st.welcome_key(follower.t.id), {"challenge": entry["challenge"]})
        deadline = time.monotonic() + 30
        while follower.t.pending is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert sealing.nonce_of(follower.t.pending) == "an-earlier-runs-nonce"
    finally:
        follower.close()


@pytest.mark.parametrize("follower_key, why", [
    (None, "authenticates what the nodes exchange and this node has no key"),
    (b"another-key", "is not this job's nccl-doctor coordinator (or its key differs"),
])
def test_a_node_without_the_jobs_key_is_refused_and_says_why(follower_key, why):
    """A follower reaching a leader that seals with a key it lacks (or another key) does not
    join: it diagnoses its node alone, and says why in one line."""
    port = free_port()
    leader, _ = _link(port, b"the-job-key", leader=True)
    leader.wait_started(30)
    follower, said = _link(port, follower_key, leader=False)
    try:
        deadline = time.monotonic() + 60
        while not follower.t.refused:
            assert time.monotonic() < deadline, follower.t.error
            leader.gather()  # (the leader keeps its join record: a replay cannot hide it)
            time.sleep(0.1)
        assert why in follower.t.error
        follower.follow(_local())
        assert follower.t.state.value == "alone" and why in follower.t.problem
        assert any(why in line for line in said)
    finally:
        follower.close()
        leader.close()


def test_a_keyed_node_meeting_a_leader_without_a_key_says_so():
    port = free_port()
    leader, _ = _link(port, None, leader=True)
    leader.wait_started(30)
    follower, _ = _link(port, b"a-key", leader=False)
    try:
        deadline = time.monotonic() + 60
        while not follower.t.refused:
            assert time.monotonic() < deadline, follower.t.error
            time.sleep(0.1)
        assert "does not authenticate what the nodes exchange and this node has a key" in \
            follower.t.error
    finally:
        follower.close()
        leader.close()


def test_the_leader_keeps_the_names_anyone_can_guess_and_counts_what_overwrote_them():
    port = free_port()
    leader, _ = _link(port, b"the-job-key", leader=True, every=0.05)
    leader.wait_started(30)
    rogue = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=5))
    try:
        leader.gather()
        assert leader.rejected() == 0
        magic = json.loads(rogue.get(st.MAGIC))
        assert magic["auth"] == "hmac-sha256" and "nonce" not in magic
        rogue.set(st.DECISION_N, "7")
        rogue.set(st.FINAL, json.dumps({"verdict": "hang"}))
        rogue.delete_key(st.MAGIC)
        time.sleep(0.1)
        leader.gather()
        assert leader.rejected() == 3  # the two overwritten, and a look that found one gone
        time.sleep(0.1)
        leader.gather()
        assert leader.rejected() == 3  # (each written back: the next look finds them as they were)
        assert rogue.get(st.DECISION_N) == b"null" and json.loads(rogue.get(st.MAGIC)) == magic
    finally:
        leader.close()


def _local():
    from nccl_doctor.supervisor.federation.link import Local

    return Local({}, {}, (), False, 1)


# -- where the key comes from ------------------------------------------------------------------
def _private(path, text: str, mode: int = 0o600):
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_key_comes_from_the_environment_or_a_private_file(tmp_path):
    assert keys.key_from({}) is None
    assert keys.key_from({env.FEDERATION_KEY: " s3cret \n"}) == b"s3cret"
    path = _private(tmp_path / "key", "from-a-file\n")
    assert keys.key_from({env.FEDERATION_KEY_FILE: str(path)}) == b"from-a-file"
    with pytest.raises(keys.FederationKeyError, match="cannot read .*missing"):
        keys.key_from({env.FEDERATION_KEY_FILE: str(tmp_path / "missing")})
    with pytest.raises(keys.FederationKeyError, match="is empty"):
        keys.key_from({env.FEDERATION_KEY: "  "})
    assert len(keys.new_key()) == 64 and keys.new_key() != keys.new_key()


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_key_file_others_may_read_or_replace_is_refused(tmp_path, mode):
    path = _private(tmp_path / "key", "s3cret", mode)
    with pytest.raises(keys.FederationKeyError) as err:
        keys.key_from({env.FEDERATION_KEY_FILE: str(path)})
    text = str(err.value)
    assert f"mode {mode:04o}" in text and f"chmod 600 {path}" in text and "\n" not in text


def test_the_default_key_is_made_private_once_and_read_after(tmp_path):
    made = keys.default_key(str(tmp_path))
    path = tmp_path / ".nccl-doctor" / "federation.key"
    assert made.kind is keys.KeyKind.DEFAULT and made.created and made.where == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(made.secret) == 64 and path.read_bytes().strip() == made.secret
    again = keys.default_key(str(tmp_path))
    assert again.secret == made.secret and not again.created
    assert os.listdir(path.parent) == ["federation.key"]  # no half-made file left beside it
    assert "made by this run" in made.describe() and str(path) in made.describe()


def test_nodes_sharing_a_home_make_one_default_key(tmp_path):
    """Eight processes race to make the default key in one home directory (nodes sharing it
    over NFS start together): each reads the same key."""
    code = ("import sys; from nccl_doctor.supervisor.federation.keys import default_key; "
            "print(default_key(sys.argv[1]).secret.decode())")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True) for _ in range(8)]
    got = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert len(got) == 1 and len(got.pop()) == 64


def test_a_default_key_others_may_read_is_refused(tmp_path):
    keys.default_key(str(tmp_path))
    path = tmp_path / ".nccl-doctor" / "federation.key"
    path.chmod(0o644)
    with pytest.raises(keys.FederationKeyError, match=r"mode 0644\): make it the user's alone"):
        keys.default_key(str(tmp_path))
    path.chmod(0o600)
    path.parent.chmod(0o777)
    with pytest.raises(keys.FederationKeyError, match="may be changed by others"):
        keys.default_key(str(tmp_path))


def test_without_a_home_for_it_there_is_no_default_key_and_it_says_why(tmp_path):
    got = keys.default_key(str(tmp_path / "no" / "home"))
    assert got.secret is None and got.kind is keys.KeyKind.NONE
    assert "cannot create" in got.where and "No such file or directory" in got.where


def test_which_key_a_run_takes(tmp_path):
    home = {"HOME": str(tmp_path)}
    path = _private(tmp_path / "k", "from-file")
    given = keys.job_key({**home, env.FEDERATION_KEY: "given", env.FEDERATION_KEY_FILE: str(path)},
                         own=True, needed=True)
    assert (given.secret, given.kind) == (b"given", keys.KeyKind.ENV)
    from_file = keys.job_key({**home, env.FEDERATION_KEY_FILE: str(path)}, own=True, needed=True)
    assert (from_file.secret, from_file.kind, from_file.where) == (
        b"from-file", keys.KeyKind.FILE, str(path))
    own = keys.job_key(home, own=True, needed=True)  # --ray, Slurm: a fresh key every run
    assert own.kind is keys.KeyKind.RUN and own.secret != keys.job_key(
        home, own=True, needed=True).secret
    assert not (tmp_path / ".nccl-doctor").exists()
    alone = keys.job_key(home, own=False, needed=False)  # one node: nothing to meet
    assert alone.secret is None and not (tmp_path / ".nccl-doctor").exists()
    default = keys.job_key(home, own=False, needed=True)
    assert default.kind is keys.KeyKind.DEFAULT and default.created
