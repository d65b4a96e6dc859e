"""A process that is not one of a job's doctors and has no key, flooding the doctors' store
(HOST:PORT) for DURATION seconds with everything it can guess: every name of the doctors'
table (nccl_doctor/supervisor/federation/store.py), with and without its ``ncd/`` prefix, for
node numbers and decision counters 0-16, and for the node ids it can guess - ``HOST-PID`` of
every ``nccl-doctor run`` it sees on this machine (their ``--out`` names the host). Each name
gets a forged value (a stopping hang decision, a beat that says every rank is gone, a final
report), counters are bumped, and every third round the names are deleted - until DURATION is
over or the job's store goes. Prints how many writes it made and the ids it guessed."""

import datetime
import json
import os
import sys
import time

import psutil
from torch.distributed import TCPStore

HANG = {"report": None, "kind": "hang", "announce": ["HANG (rogue-said)"], "stop_job": True,
        "stop_at": 0.0, "record": None}


def guessed_ids() -> list[str]:
    """``HOST-PID`` of each nccl-doctor run here: the ids its link would use."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "nccl_doctor" in cmd and "run" in cmd and "--out" in cmd:
            host = os.path.basename(cmd[cmd.index("--out") + 1].rstrip("/"))
            out.append(f"{host}-{proc.info['pid']}")
    return out


def names(job: str, ids: list[str]) -> dict[str, object]:
    """Every name it can guess -> the forged value it writes there."""
    beat = {"n": 10**6, "t": time.time(), "host": "rogue-host", "node_rank": 9,
            "counts": {"0": 1}, "notes": {}, "down": [0, 1, 2, 3], "ended": True,
            "summary": 10**6, "digest": 10**6, "rejected": 0}
    table: dict[str, object] = {
        "magic": {"format": "nccl-doctor-federation", "version": 2, "job": job,
                  "host": "rogue-host", "auth": None},
        "nodes": 99, "decision/n": 16, "roster": {"0": ["rogue-host", 9]},
        "final": {"verdict": "hang", "findings": [], "notes": ["rogue-said"]},
        "final/acks": 99, "join": {"nonce": "0" * 32}, f"join/{job}": {"nonce": "0" * 32}}
    for i in range(17):
        table[f"node/{i}"] = {"id": f"rogue-{i}", "challenge": "0" * 32}
        table[f"decision/{i}"] = HANG
    for node in ids + ["nodeA", "nodeB"]:
        table[f"beat/{node}"] = beat
        table[f"sum/{node}"] = {"v": 10**6, "ranks": [], "unrecorded": {}, "counts": {}}
        table[f"dig/{node}"] = {"v": 10**6, "ranks": [], "unrecorded": {}, "counts": {}}
        table[f"req/{node}"] = {"n": 10**6, "what": "stacks", "timeout": 30, "ranks": [0, 1]}
        table[f"welcome/{node}"] = {"challenge": "0" * 32}
        for k in range(5):
            table[f"resp/{node}/{k}"] = {"ranks": {"0": "rogue-said"}}
    return {prefix + name: value for name, value in table.items() for prefix in ("ncd/", "")}


def main() -> None:
    host, port = sys.argv[1].rsplit(":", 1)
    duration = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    job = f"{host}:{int(port) - 1000}"  # the job's rendezvous: the doctors' port - 1000
    def connect(wait: float = 30.0) -> TCPStore:
        return TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=wait))

    store = connect()
    writes, rounds, ids, scanned = 0, 0, [], 0.0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        rounds += 1
        if time.monotonic() - scanned > 2.0:  # (a scan of every process costs a round's time)
            ids, scanned = sorted(set(ids) | set(guessed_ids())), time.monotonic()
        for name, value in names(job, ids).items():
            try:
                if rounds % 3 == 0:
                    store.delete_key(name)
                elif name.endswith(("nodes", "acks")):
                    store.add(name, 1)
                else:
                    store.set(name, json.dumps(value))
                writes += 1
            except Exception:  # an add to a value it made text: the store drops the client
                try:
                    store = connect(5.0)
                except Exception:  # the job ended first: its store went with its leader
                    end = 0.0
                    break
        time.sleep(0.05)
    print(json.dumps({"writes": writes, "ids": ids}))


if __name__ == "__main__":
    main()
