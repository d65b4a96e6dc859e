"""A process that is not one of a job's doctors, on a shared network: it reaches the job's
coordinator store (the doctors' TCPStore, HOST:PORT) as any client can, and for DURATION seconds
writes forged values there - a "hang" decision that stops the job, beats that say every rank is
gone, summaries, a final report, a bumped node count - then prints how many it wrote."""

import datetime
import json
import sys
import time

from torch.distributed import TCPStore


def main() -> None:
    host, port = sys.argv[1].rsplit(":", 1)
    duration = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    store = TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=30))
    forged = 0
    hang = json.dumps({"report": None, "kind": "hang", "announce": ["HANG (rogue-said)"],
                       "stop_job": True, "stop_at": time.time(), "record": None})
    end = time.monotonic() + duration
    n = 0
    while time.monotonic() < end:
        n += 1
        ids = []
        for i in range(1, 4):  # the followers' ids, as they registered them (readable by anyone)
            if store.check([f"ncd/node/{i}"]):
                raw = store.get(f"ncd/node/{i}").decode(errors="replace")
                ids.append(raw.split(":", 1)[-1].strip('"'))
        for k in range(1, 4):
            store.set(f"ncd/decision/{k}", hang)
        store.set("ncd/decision/n", json.dumps(3 + n))
        for node in ids:
            store.set(f"ncd/beat/{node}", json.dumps({
                "n": 10_000 + n, "t": time.time(), "host": "rogue-host", "node_rank": 9,
                "counts": {"0": 1, "1": 1}, "notes": {}, "down": [0, 1, 2, 3], "ended": True,
                "summary": 10_000 + n}))
            store.set(f"ncd/sum/{node}", json.dumps({"v": 10_000 + n, "ranks": [],
                                                     "unrecorded": {}, "counts": {}}))
        store.set("ncd/final", json.dumps({"verdict": "hang", "findings": []}))
        forged += 5 + 2 * len(ids)
        time.sleep(0.3)
    print(json.dumps({"forged": forged}))


if __name__ == "__main__":
    main()
