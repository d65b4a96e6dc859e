"""How a rank ends, for comparing a forked rank with a fresh one (tests/integration/
test_fork_server.py): ``END`` = ``clean``, ``raise`` (rank 1 raises after its second all_reduce),
``kill`` (rank 1 is killed by SIGKILL there) or ``hang`` (rank 1 skips the third broadcast,
which rank 0 waits in while rank 1 waits in the next all_reduce).
Each rank first writes what it is to ``$SEEN/rank<R>.json``: its pid, argv, sys.path[0], cwd."""

import json
import os
import signal
import sys

import torch
import torch.distributed as dist


def proc_environ() -> dict:
    """This process's environment as the kernel shows it to others (/proc/PID/environ)."""
    with open("/proc/self/environ", "rb") as f:
        pairs = [e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e]
    return {k.decode(): v.decode() for k, v in pairs}


def main() -> None:
    rank = int(os.environ["RANK"])
    seen = {"pid": os.getpid(), "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
            "main": __file__, "rank_env": os.environ["RANK"], "proc_environ": proc_environ(),
            "environ": dict(os.environ)}
    path = os.path.join(os.environ["SEEN"], f"rank{rank}.json")
    with open(path + ".part", "w") as f:
        json.dump(seen, f)
    os.replace(path + ".part", path)  # whole when it appears
    # one write of the whole line: print's text and its newline are two writes where stdout is
    # unbuffered (PYTHONUNBUFFERED), and two ranks on one pipe interleaved them (seen under -n 4)
    sys.stdout.write(f"rank {rank} says hello\n")
    sys.stdout.flush()
    dist.init_process_group("gloo")
    end = os.environ.get("END", "clean")
    for step in range(4):
        if step == 2 and rank == 1:
            if end == "raise":
                raise ValueError("rank 1 gives up")
            if end == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(8))
        if not (step == 2 and rank == 1 and end == "hang"):
            dist.broadcast(torch.ones(8), src=0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
