"""The node doctors' values on the coordinator's store carry an HMAC under the job's key: a real
torch TCPStore, a value written by something without the key (or moved from another key) reads
as absent and is counted, never believed."""

from __future__ import annotations

import datetime
import json

import pytest
from torch.distributed import TCPStore

from nccl_doctor import env
from nccl_doctor.reproducers.nodes import free_port
from nccl_doctor.supervisor.federation import store as st


@pytest.fixture()
def raw():
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=5))
    client = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=5))
    yield server, client


def test_a_sealed_value_reads_back_and_a_forged_one_is_counted_not_believed(raw):
    server, rogue = raw
    doctors = st.Sealed(server, b"k" * 64)
    st.put(doctors, st.decision_key(1), {"kind": "hang", "stop_job": False})
    assert st.get(doctors, st.decision_key(1)) == {"kind": "hang", "stop_job": False}
    assert doctors.rejected == 0
    rogue.set(st.decision_key(2), json.dumps({"kind": "hang", "stop_job": True}))
    rogue.set(st.DECISION_N, "2")
    assert st.get_many(doctors, [st.DECISION_N, st.decision_key(1), st.decision_key(2)]) == [
        None, {"kind": "hang", "stop_job": False}, None]
    assert doctors.rejected == 2


def test_a_value_moved_to_another_key_or_sealed_with_another_key_fails(raw):
    server, rogue = raw
    doctors = st.Sealed(server, b"job-key")
    st.put(doctors, st.decision_key(1), {"kind": "hang", "stop_job": True})
    rogue.set(st.decision_key(7), rogue.get(st.decision_key(1)))  # replayed under another name
    assert st.get(doctors, st.decision_key(7)) is None
    other = st.Sealed(rogue, b"another-job-key")
    st.put(other, st.beat_key("n1"), {"n": 1})
    assert st.get(doctors, st.beat_key("n1")) is None
    assert doctors.rejected == 2 and st.rejected(doctors) == 2 and st.rejected(server) == 0


def test_the_key_comes_from_the_environment_or_a_file(tmp_path):
    assert st.key_from({}) is None
    assert st.key_from({env.FEDERATION_KEY: " s3cret \n"}) == b"s3cret"
    path = tmp_path / "key"
    path.write_text("from-a-file\n")
    assert st.key_from({env.FEDERATION_KEY_FILE: str(path)}) == b"from-a-file"
    with pytest.raises(st.FederationKeyError, match="cannot read .*missing"):
        st.key_from({env.FEDERATION_KEY_FILE: str(tmp_path / "missing")})
    with pytest.raises(st.FederationKeyError, match="is empty"):
        st.key_from({env.FEDERATION_KEY: "  "})
    assert len(st.new_key()) == 64 and st.new_key() != st.new_key()


def _link(port: int, key: bytes | None, leader: bool):
    from nccl_doctor.supervisor.federation.link import new_link
    from nccl_doctor.supervisor.federation.rendezvous import Rendezvous

    said: list[str] = []
    rdzv = Rendezvous("127.0.0.1", port, 2, 0 if leader else 1, "test", "job-1")
    link = new_link(rdzv, "leader" if leader else "follower", leader=leader, announce=said.append,
                answer=lambda *a: {}, summaries=lambda ended: {}, key=key,
                connect_within=20.0)
    link.start()
    return link, said


@pytest.mark.parametrize("follower_key, why", [
    (None, "authenticates what the nodes exchange and this node has no key"),
    (b"another-key", "is not this job's nccl-doctor coordinator (or its key differs"),
])
def test_a_node_without_the_jobs_key_is_refused_and_says_why(follower_key, why):
    """A follower reaching a leader that seals with a key it lacks (or another key) does not
    join: it diagnoses its node alone, and says why in one line."""
    import time

    port = free_port()
    leader, _ = _link(port, b"the-job-key", leader=True)
    leader.wait_started(30)
    follower, said = _link(port, follower_key, leader=False)
    try:
        deadline = time.monotonic() + 60
        while not follower.t.refused:
            assert time.monotonic() < deadline, follower.t.error
            time.sleep(0.1)
        assert why in follower.t.error
        follower.follow(_local())
        assert follower.t.state.value == "alone" and why in follower.t.problem
        assert any(why in line for line in said)
    finally:
        follower.close()
        leader.close()


def _local():
    from nccl_doctor.supervisor.federation.link import Local

    return Local({}, {}, (), False, 1)
