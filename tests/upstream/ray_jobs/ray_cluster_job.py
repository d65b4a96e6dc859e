"""An RLHF-shaped Ray job for a cluster started beforehand (`ray start` on each node): two
`Trainer` actors and two `Engine` actors, placed by the custom resources the nodes were started
with (`--trainers nodeA,nodeA --engines nodeB,nodeB`). They form one gloo world (trainers ranks
0-1, engines 2-3) with two groups in it, OpenRLHF's and verl's layout: the trainers' group
(ranks 0, 1) and the weight-sync group (trainer rank 0 and the engines: ranks 0, 2, 3), over
which trainer rank 0 broadcasts its weights each step.

  --fault none            three steps, exit 0
  --fault skip_broadcast  engine rank 3 skips the weight broadcast of step 1 and goes on to the
                          world barrier: a hang
  --fault sync_shape      engine rank 3 receives the weights into a tensor of another shape: a
                          mismatch inside the weight-sync group
  --fault stall           every rank waits in the world barrier of step 1 but rank 3, which sleeps
                          (a node killed meanwhile is the test's doing)
  --address ADDR          the cluster (default: RAY_ADDRESS, else "auto")
"""

import argparse
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ray_driver import quiet_ray  # noqa: E402

quiet_ray()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    def setup(self, rank: int, world: int, addr: str, port: int) -> dict:
        import torch.distributed as dist

        self.rank = rank
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=world)
        self.trainers = dist.new_group([0, 1])
        self.sync = dist.new_group([0, 2, 3])
        return {"rank": rank, "pid": os.getpid(), "host": socket.gethostname()}

    def step(self, n: int, fault: str) -> float:
        import torch
        import torch.distributed as dist

        rank = self.rank
        weights = torch.full((8,), float(n))
        if rank in (0, 1):
            grad = torch.ones(8)
            dist.all_reduce(grad, group=self.trainers)  # the trainers' step
        if rank in (0, 2, 3):
            if rank == 3 and n == 1 and fault == "skip_broadcast":
                pass  # the culprit: engine rank 3 never joins this weight sync
            elif rank == 3 and n == 1 and fault == "sync_shape":
                weights = torch.zeros(4)
                dist.broadcast(weights, src=0, group=self.sync)
            else:
                dist.broadcast(weights, src=0, group=self.sync)  # the weight sync
        if rank == 3 and n == 1 and fault == "stall":
            time.sleep(3600)
        dist.barrier()  # the step's end
        return float(weights.sum())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=("none", "skip_broadcast", "sync_shape", "stall"),
                   default="none")
    p.add_argument("--trainers", default="nodeA,nodeA")
    p.add_argument("--engines", default="nodeB,nodeB")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or "auto")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()

    import ray

    ray.init(address=args.address, log_to_driver=True)
    Trainer = ray.remote(num_cpus=0)(type("Trainer", (Rank,), {}))
    Engine = ray.remote(num_cpus=0)(type("Engine", (Rank,), {}))
    placed = ([(Trainer, node) for node in args.trainers.split(",")]
              + [(Engine, node) for node in args.engines.split(",")])
    actors = [cls.options(resources={node: 1}).remote() for cls, node in placed]
    port = free_port()
    info = ray.get([a.setup.remote(r, len(actors), "127.0.0.1", port)
                    for r, a in enumerate(actors)], timeout=120)
    print(f"[driver] ranks {info}", flush=True)
    rc = 0
    try:
        for n in range(args.steps):
            out = ray.get([a.step.remote(n, args.fault) for a in actors], timeout=900)
            print(f"[driver] step {n}: {out}", flush=True)
    except Exception as err:  # noqa: BLE001 - an actor lost with its node, a timeout
        print(f"[driver] the step failed: {type(err).__name__}: {str(err)[:300]}", flush=True)
        rc = 1
    ray.shutdown()
    return rc


if __name__ == "__main__":
    sys.exit(main())
