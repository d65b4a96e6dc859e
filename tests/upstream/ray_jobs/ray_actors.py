"""Two plain Ray actors that form a gloo process group themselves (rank, world size and the
master's address passed in by the driver) and make matching collectives; exits 0. With
--mismatch they desync: after a matching all_reduce, rank 0 calls all_reduce while rank 1 calls
all_gather at the same point; both wait until torch's gloo timeout (30 min) or the driver's
ray.get timeout (--timeout, 900 s); under `nccl-doctor run` the watchdog diagnoses the mismatch
and stops the job.

Standalone: `python ray_actors.py [--mismatch] [--end shutdown|kill|exit_actor] [--destroy]`
  --end shutdown    the driver calls ray.shutdown() with the actors alive (default)
  --end kill        the driver ray.kill()s each actor, then ray.shutdown()
  --end exit_actor  each actor calls ray.actor.exit_actor() itself, then ray.shutdown()
  --destroy         each actor calls dist.destroy_process_group() after its collectives
  --address ADDR    join an existing cluster (e.g. "auto" after `ray start --head`)
  --propagate-doctor-env  pass the driver's NCCL_DOCTOR_* and PYTHONPATH to the actors through
                    runtime_env (the workers of a cluster started beforehand do not inherit them)
"""

import argparse
import os
import socket
import sys
import time

from ray_driver import quiet_ray  # noqa: E402

quiet_ray()  # before ray is imported

T0 = time.time()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_actor(ray):
    @ray.remote(num_cpus=1)
    class Rank:
        def setup(self, rank: int, world: int, addr: str, port: int) -> dict:
            import threading

            import torch.distributed as dist

            self.rank = rank
            dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                                    world_size=world)
            return {"rank": rank, "pid": os.getpid(),
                    "thread": threading.current_thread().name,
                    "ident": threading.get_ident(), "main": threading.main_thread().ident}

        def step(self, mismatch: bool) -> list:
            import torch
            import torch.distributed as dist

            t = torch.full((4,), float(self.rank + 1))
            dist.all_reduce(t)  # both ranks
            if mismatch and self.rank == 1:
                out = [torch.zeros(4) for _ in range(dist.get_world_size())]
                dist.all_gather(out, t)  # the desync: rank 0 makes an all_reduce here
                return [x.tolist() for x in out]
            dist.all_reduce(t)
            dist.barrier()
            return t.tolist()

        def destroy(self) -> None:
            import torch.distributed as dist

            dist.destroy_process_group()

        def exit(self) -> None:
            import ray.actor

            ray.actor.exit_actor()

    return Rank


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mismatch", action="store_true", help="rank 1 calls all_gather instead")
    p.add_argument("--end", choices=("shutdown", "kill", "exit_actor"), default="shutdown")
    p.add_argument("--destroy", action="store_true")
    p.add_argument("--address", default=None)
    p.add_argument("--timeout", type=float, default=900, help="the driver's ray.get timeout")
    p.add_argument("--propagate-doctor-env", action="store_true")
    args = p.parse_args()
    mismatch = args.mismatch
    runtime_env = None
    if args.propagate_doctor_env:
        runtime_env = {"env_vars": {k: v for k, v in os.environ.items()
                                    if k.startswith("NCCL_DOCTOR_") or k == "PYTHONPATH"}}

    import ray

    t_import = time.time()
    if args.address:
        ray.init(address=args.address, runtime_env=runtime_env)
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
                 runtime_env=runtime_env)
    t_init = time.time()
    Rank = make_actor(ray)
    actors = [Rank.remote() for _ in range(2)]
    port = free_port()
    info = ray.get([a.setup.remote(r, 2, "127.0.0.1", port) for r, a in enumerate(actors)],
                   timeout=args.timeout)
    print(f"[driver] actors {info}", flush=True)
    rc = 0
    try:
        out = ray.get([a.step.remote(mismatch) for a in actors], timeout=args.timeout)
        print(f"[driver] results {out}", flush=True)
    except Exception as err:  # GetTimeoutError, RayActorError
        print(f"[driver] collectives failed: {err!r}"[:2000], flush=True)
        rc = 1
    if rc == 0 and args.destroy:
        ray.get([a.destroy.remote() for a in actors], timeout=60)
    if args.end == "kill":
        for a in actors:
            ray.kill(a)
    elif args.end == "exit_actor":
        for a in actors:
            try:
                ray.get(a.exit.remote(), timeout=60)
            except Exception as err:  # exit_actor's call ends with the actor
                print(f"[driver] exit_actor: {type(err).__name__}", flush=True)
    t_work = time.time()
    ray.shutdown()
    print(f"[driver] import {t_import - T0:.2f}s ray.init {t_init - t_import:.2f}s "
          f"work {t_work - t_init:.2f}s shutdown {time.time() - t_work:.2f}s "
          f"total {time.time() - T0:.2f}s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
