"""How does a Ray worker process end? Each scenario starts Ray workers that register every
end-of-process hook a library could use, then ends them the way the scenario says, and prints
which hooks ran and (with --strace, when strace is installed) how the process died: the signals
it received (and who sent them), whether it called exit_group, or was killed.

    python ray_exit_probe.py --scenario actor_shutdown   # actor alive at ray.shutdown()
    python ray_exit_probe.py --scenario actor_kill       # ray.kill(actor)
    python ray_exit_probe.py --scenario actor_exit       # ray.actor.exit_actor() in the actor
    python ray_exit_probe.py --scenario actor_del        # the last handle dropped
    python ray_exit_probe.py --scenario task             # a task's worker, then ray.shutdown()
    python ray_exit_probe.py --scenario train            # TorchTrainer's 2 workers (gloo)
    python ray_exit_probe.py --scenario all

Hooks each worker registers (a marker file per hook that ran, under --dir):
  atexit            atexit.register
  threading_atexit  threading._register_atexit (runs in threading._shutdown, before atexit)
  finalize          weakref.finalize on a module-level object (atexit=True)
  sys_exit          sys.exit wrapped (Ray's Worker.main_loop calls sys.exit(0) after its loop)
  os__exit          os._exit wrapped (a Python-level os._exit; C++'s _exit/quick_exit bypass it)
  sigterm           SIGTERM handler wrapped (main thread only: actors, tasks; Ray's own handler
                    is still called after)
  destroy           torch.distributed.destroy_process_group wrapped (train scenario)
  ray_shutdown_method  the actor's __ray_shutdown__ method (actor scenarios)
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

from ray_driver import quiet_ray  # noqa: E402

quiet_ray()  # before ray is imported

SCENARIOS = ("actor_shutdown", "actor_kill", "actor_exit", "actor_del", "task", "train")


def install_probes(directory: str, tag: str) -> int:
    """Runs inside the worker. Returns its pid."""
    import atexit
    import signal
    import threading
    import weakref

    pid = os.getpid()
    stem = os.path.join(directory, f"{tag}.{pid}")

    def mark(what: str, detail: str = "") -> None:
        try:
            with open(f"{stem}.{what}", "a") as f:
                f.write(f"{time.time():.3f} {detail}\n")
        except Exception:
            pass

    mark("alive", f"thread={threading.current_thread().name}")
    atexit.register(mark, "atexit")
    threading._register_atexit(mark, "threading_atexit")  # noqa: SLF001
    global _KEEP
    _KEEP = _Obj()
    weakref.finalize(_KEEP, mark, "finalize")

    real_sys_exit = sys.exit

    def sys_exit(status=None):
        mark("sys_exit", repr(status))
        real_sys_exit(status)

    sys.exit = sys_exit
    real_os_exit = os._exit

    def os_exit(code):
        mark("os__exit", repr(code))
        real_os_exit(code)

    os._exit = os_exit
    if threading.current_thread() is threading.main_thread():
        prev = signal.getsignal(signal.SIGTERM)
        mark("sigterm_handler_before", repr(prev))

        def on_term(signum, frame):
            mark("sigterm")
            if callable(prev):
                prev(signum, frame)
            else:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
    try:
        import torch.distributed as dist

        real_destroy = dist.destroy_process_group

        def destroy(*a, **k):
            import traceback
            mark("destroy", f"thread={threading.current_thread().name} from "
                 + " <- ".join(f"{f.filename}:{f.lineno}" for f in
                               reversed(traceback.extract_stack()[:-1][-4:])))
            return real_destroy(*a, **k)

        dist.destroy_process_group = destroy
        import torch.distributed.distributed_c10d as c10d
        c10d.destroy_process_group = destroy
    except Exception:
        pass
    return pid


class _Obj:
    pass


_KEEP = None


class Tracer:
    """strace attached from the driver (a worker's own children are SIGKILLed by its core worker
    as it exits, so a tracer it started would die first): each worker with signals and its end,
    and its parent, the raylet, with the kill() calls it makes."""

    def __init__(self, directory: str, tag: str, enabled: bool) -> None:
        self.directory, self.tag = directory, tag
        self.enabled = enabled and shutil.which("strace") is not None
        self.procs: list = []
        self.seen: set = set()

    def attach(self, pid: int) -> None:
        if not self.enabled or pid in self.seen:
            return
        self.seen.add(pid)
        self._strace(pid, f"{self.tag}.{pid}.strace",
                     ["-e", "trace=exit_group,kill,tgkill", "-e", "signal=all"])
        try:
            ppid = int(open(f"/proc/{pid}/stat").read().split(")")[-1].split()[1])
        except (OSError, ValueError, IndexError):
            return
        if ppid not in self.seen:
            self.seen.add(ppid)
            self._strace(ppid, f"{self.tag}.raylet{ppid}.kills",
                         ["-e", "trace=kill,tgkill", "-e", "signal=none"])

    def _strace(self, pid: int, name: str, what: list) -> None:
        self.procs.append(subprocess.Popen(
            ["strace", "-f", "-tt", "-qq", *what, "-o", os.path.join(self.directory, name),
             "-p", str(pid)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
            proc.wait()


def report(directory: str, pids: list) -> None:
    for pid in pids:
        files = sorted(glob.glob(os.path.join(directory, f"*.{pid}.*")))
        ran = [f.rsplit(".", 1)[1] for f in files if not f.endswith(".strace")]
        print(f"  pid {pid}: hooks that ran: {ran}")
        for f in files:
            if f.endswith((".sigterm_handler_before", ".destroy", ".sys_exit", ".os__exit")):
                print(f"    {f.rsplit('.', 1)[1]}: {open(f).read().strip()}")
        st = [f for f in files if f.endswith(".strace")]
        if st:
            lines = open(st[0]).read().splitlines()
            keep = [ln for ln in lines if ("---" in ln and "SIGCHLD" not in ln)
                    or "exit_group" in ln or ("kill(" in ln and ", 0)" not in ln)]
            ends = [ln for ln in lines if "+++" in ln]
            for ln in keep[-6:] + ends[-1:]:
                print(f"    strace (worker): {ln}")
        for log in glob.glob(os.path.join(directory, "*.raylet*.kills")):
            if not os.path.basename(log).startswith(files[0].split("/")[-1].split(".")[0] + "."):
                continue
            for ln in open(log).read().splitlines():
                if f"({pid}," in ln and ", 0)" not in ln:
                    print(f"    strace ({os.path.basename(log).split('.')[1]}): {ln}")


def run(scenario: str, directory: str, use_strace: bool) -> None:
    import ray

    print(f"== {scenario}", flush=True)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=True)
    pids: list = []
    tracer = Tracer(directory, scenario, use_strace)
    if scenario.startswith("actor"):
        @ray.remote(num_cpus=1)
        class Probe:
            def __init__(self, d, t):
                self.pid = install_probes(d, t)

            def pid_(self):
                return self.pid

            def exit(self):
                ray.actor.exit_actor()

            def __ray_shutdown__(self):  # Ray's hook on an actor's graceful end
                with open(os.path.join(directory, f"{scenario}.{self.pid}.ray_shutdown_method"),
                          "a") as f:
                    f.write(f"{time.time():.3f}\n")

        actor = Probe.remote(directory, scenario)
        pids.append(ray.get(actor.pid_.remote()))
        tracer.attach(pids[-1])
        if scenario == "actor_kill":
            ray.kill(actor)
        elif scenario == "actor_exit":
            try:
                ray.get(actor.exit.remote())
            except Exception as err:
                print(f"  exit(): {type(err).__name__}", flush=True)
        elif scenario == "actor_del":
            del actor
        time.sleep(3)
        print(f"  before ray.shutdown: alive={[_alive(p) for p in pids]}", flush=True)
    elif scenario == "task":
        @ray.remote(num_cpus=1)
        def probe(d, t):
            return install_probes(d, t)

        pids.append(ray.get(probe.remote(directory, scenario)))
        tracer.attach(pids[-1])
        time.sleep(3)
        print(f"  before ray.shutdown: alive={[_alive(p) for p in pids]}", flush=True)
    elif scenario == "train":
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer

        def train_func(config):
            import torch
            import torch.distributed as dist
            install_probes(config["dir"], "train")
            time.sleep(3)  # the driver attaches its tracer
            t = torch.ones(2)
            dist.all_reduce(t)

        def attach_when_seen() -> None:
            while not stop.is_set():
                for f in glob.glob(os.path.join(directory, "train.*.alive")):
                    tracer.attach(int(f.split(".")[-2]))
                time.sleep(0.1)

        import threading
        stop = threading.Event()
        watcher = threading.Thread(target=attach_when_seen, daemon=True)
        watcher.start()
        TorchTrainer(
            train_func, train_loop_config={"dir": directory, "strace": use_strace},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            torch_config=TorchConfig(backend="gloo"),
            run_config=RunConfig(name="ray_exit_probe",
                                 storage_path=os.path.join(tempfile.gettempdir(), "ray-results")),
        ).fit()
        stop.set()
        pids = sorted({int(f.split(".")[-2]) for f in glob.glob(os.path.join(directory, "train.*.alive"))})
        print(f"  after fit(), before ray.shutdown: alive={[_alive(p) for p in pids]}", flush=True)
    ray.shutdown()
    deadline = time.time() + 15
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    time.sleep(1.5)  # strace writes its last line
    tracer.close()
    print(f"  after ray.shutdown: alive={[_alive(p) for p in pids]}", flush=True)
    report(directory, pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", choices=SCENARIOS + ("all",), default="all")
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "ray-exit-probe"))
    p.add_argument("--strace", action="store_true")
    args = p.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    for scenario in SCENARIOS if args.scenario == "all" else (args.scenario,):
        run(scenario, args.dir, args.strace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
