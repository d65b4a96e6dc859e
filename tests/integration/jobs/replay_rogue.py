"""A replay of an earlier run of a job under the same static key.

``record HOST:PORT JOB FILE`` stands in for an eavesdropper of one run: until that run's store
goes, it keeps the raw bytes of every value the doctors hold there, under their names, in FILE.
The doctors' names are hidden (nccl_doctor/supervisor/federation/sealing.py): an eavesdropper
would read them off the wire, which a test cannot; so it is given the key
(NCCL_DOCTOR_FEDERATION_KEY) to find the names, and only for that - it computes no MAC, and
what it keeps is what the wire carried.

``replay HOST:PORT FILE DURATION``, with no key: for DURATION seconds (or until that run's
store goes) it writes every recorded value back under its name into another run's store, over
and over - the earlier run's join
record (whose name is the same in every run of the job under that key), its decisions (a
stopping hang among them), beats, summaries and final report. Prints what it did."""

import base64
import datetime
import json
import os
import sys
import time

from torch.distributed import TCPStore


def connect(address: str) -> TCPStore:
    host, port = address.rsplit(":", 1)
    return TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=60))


def _value(raw: bytes):
    """The JSON after a sealed value's MAC (None: not JSON)."""
    try:
        return json.loads(raw.partition(b":")[2])
    except ValueError:
        return None


def record(address: str, job: str, path: str) -> None:
    from nccl_doctor.supervisor.federation import store as st
    from nccl_doctor.supervisor.federation.sealing import Sealed, join_name

    key = os.environ["NCCL_DOCTOR_FEDERATION_KEY"].encode()
    store = connect(address)
    join = Sealed(store, key, "").name(join_name(job))
    kept: dict[str, bytes] = {}
    stops, ended = 0, ""
    try:
        while True:
            if store.check([join]):
                kept[join] = store.get(join)
                nonce = (_value(kept[join]) or {}).get("nonce", "")
                names = Sealed(store, key, nonce)
                logical = [st.DECISION_N, st.ROSTER, st.FINAL, *map(st.decision_key, range(1, 9)),
                           *map(st.node_key, range(1, 9))]
                ids = [v.get("id") for n in map(st.node_key, range(1, 9))
                       if store.check([names.name(n)])
                       and isinstance(v := _value(store.get(names.name(n))), dict)]
                for node in filter(None, ids):
                    logical += [st.beat_key(node), st.summary_key(node), st.digest_key(node),
                                st.request_key(node), st.welcome_key(node)]
                for name in logical:
                    if store.check([names.name(name)]):
                        kept[names.name(name)] = store.get(names.name(name))
                stops = sum(1 for raw in kept.values()
                            if isinstance(v := _value(raw), dict) and v.get("stop_job"))
                with open(path, "w") as f:
                    json.dump({"values": {n: base64.b64encode(v).decode()
                                          for n, v in kept.items()}, "stops": stops}, f)
            time.sleep(0.3)
    except Exception as err:  # the run ended: its store went with its leader
        ended = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(json.dumps({"kept": len(kept), "stops": stops, "ended": ended}))


def replay(address: str, path: str, duration: float) -> None:
    with open(path) as f:
        values = {n: base64.b64decode(v) for n, v in json.load(f)["values"].items()}
    store = connect(address)
    writes = 0
    end = time.monotonic() + duration
    try:
        while time.monotonic() < end:
            for name, raw in values.items():
                store.set(name, raw)
                writes += 1
            time.sleep(0.3)
    except Exception:  # the run ended first: its store went with its leader
        pass
    print(json.dumps({"writes": writes, "names": len(values)}))


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        replay(sys.argv[2], sys.argv[3], float(sys.argv[4]))
