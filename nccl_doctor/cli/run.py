"""``nccl-doctor run [options] -- COMMAND...``: run a job under the doctor."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from typing import TYPE_CHECKING, TextIO, cast

from nccl_doctor.cli import serving
from nccl_doctor.cli.pipes import Guarded
from nccl_doctor.reporters.escape import visible
from nccl_doctor.capture import claim
from nccl_doctor.capture.names import REPORT_HTML, remove_own_files
from nccl_doctor import blas, paths
from nccl_doctor.env import COORDINATOR, COORDINATOR_JOB, LEADER_HOST, NO_REDACT, host_name
from nccl_doctor.errors import ExitStatus, OutDirInUse, OutputExists, UsageError, unwritable
from nccl_doctor.supervisor.federation import rendezvous
from nccl_doctor.supervisor.federation import keys as federation_keys
from nccl_doctor.supervisor.slurm import allocation as slurm
from nccl_doctor.supervisor.policy import (
    DEFAULT_HANG_AFTER, DEFAULT_ON_HANG, DEFAULT_STUCK_AFTER, HangPolicy, OnHang,
)

# The supervisor, the display, the reporters and the clusters' fleets are imported by the run
# that uses them: the parser of every command imports this module for its options.
if TYPE_CHECKING:
    from nccl_doctor.cli.status_bar import Display
    from nccl_doctor.supervisor.start import Launch
    from nccl_doctor.supervisor.supervisor import Supervisor
    from nccl_doctor.supervisor.ray.fleet import RayCluster, RayFleet
    from nccl_doctor.supervisor.slurm.fleet import SlurmFleet, SlurmRun

HELP = "run a launch command (torchrun, accelerate launch, deepspeed, python) under the doctor"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help=HELP, description=HELP[0].upper() + HELP[1:] + ". The command's output "
        "passes through unchanged; nccl-doctor exits with the command's own exit status.",
    )  # (its usage line is made from these options: cli/usage.py)
    add_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="the launch command, after --")
    p.set_defaults(func=run)


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of a supervised run (shared by ``run`` and ``demo``)."""
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="capture directory (default: a new nccl-doctor-out/run-YYYYmmdd-HHMMSS-HOST-PID; "
                        "a directory another live run is using is refused)")
    p.add_argument("--force", action="store_true",
                   help="reuse a non-empty --out DIR (its earlier captures and reports are removed)")
    p.add_argument("--quiet", action="store_true",
                   help="no live status and no summary (report.json is still written)")
    p.add_argument("--on-hang", choices=[o.value for o in OnHang], default=DEFAULT_ON_HANG.value,
                   help="on a diagnosed hang: write the report and stop the whole job (kill, the "
                        f"default; nccl-doctor then exits {ExitStatus.HANG_STOPPED}), write it "
                        "and keep watching (report), or write it and end the hung ranks only, "
                        "for a launcher that restarts failed workers (torchrun --max-restarts) "
                        "to start them again (restart)")
    p.add_argument("--hang-after", type=_seconds, default=DEFAULT_HANG_AFTER, metavar="SECONDS",
                   help="a wait longer than this is a hang whatever the stacks show (default "
                        f"{DEFAULT_HANG_AFTER:.0f}); certain deadlocks are called within seconds")
    p.add_argument("--stuck-after", type=_seconds, default=DEFAULT_STUCK_AFTER, metavar="SECONDS",
                   help="a rank others wait for that is idle with an unchanged stack this long is "
                        f"stuck: a hang (default {DEFAULT_STUCK_AFTER:.0f}; a stopped rank is "
                        "called at once)")
    p.add_argument("--fail-on", choices=["suspect"], default=None,
                   help=f"exit {ExitStatus.VERDICT_FAILED} when the job succeeded but the verdict "
                        "is not ok (e.g. identical completions across ranks): for CI")
    p.add_argument("--no-watch", action="store_true",
                   help="no live watchdog: diagnose only after the job ends")
    p.add_argument("--no-redact", action="store_true",
                   help="store the job's command line verbatim (manifest.json, report.json, each "
                        "rank's capture). By default the values of flags and NAME=VALUE "
                        "arguments named like a secret (token, secret, password, auth, "
                        "credential, api/access/private key: --hf-token X, --api-key=X, "
                        "HF_TOKEN=X) and URL passwords (https://user:***@host) are stored as "
                        f"***. Env twin: {NO_REDACT}=1")
    add_code_options(p)
    p.add_argument("--no-gpu", action="store_true",
                   help="do not sample the GPUs through NVML (by default every GPU of this host "
                        "is sampled: every 10 s, every 0.5 s once no call was recorded for 1 s)")
    nodes = p.add_argument_group(
        "several nodes", "one `nccl-doctor run` per node; their supervisors meet on a TCPStore "
        "that node 0's hosts, found from the launcher's rendezvous (torchrun --master-addr/"
        "--master-port or --rdzv-endpoint, accelerate --main_process_ip/--main_process_port, "
        "deepspeed --master_addr/--master_port, else MASTER_ADDR/MASTER_PORT) on the job's port "
        f"+ {rendezvous.PORT_OFFSET}")
    nodes.add_argument("--coordinator", default=os.environ.get(COORDINATOR) or None,
                       metavar="HOST:PORT",
                       help="where the nodes' supervisors meet, when the command does not say "
                            f"(node 0's host and a free port; env {COORDINATOR})")
    nodes.add_argument("--node-rank", type=_count(0), default=None, metavar="N",
                       help="this node's rank (default: the launcher's --node-rank)")
    nodes.add_argument("--nnodes", type=_count(1), default=None, metavar="N",
                       help="how many nodes the job has (default: the launcher's --nnodes)")
    p.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                   help="the command is the driver of a Ray job on a cluster started beforehand "
                        "(ray start) at ADDRESS (default: RAY_ADDRESS, else Ray's 'auto'): "
                        "every Ray worker of the job is recorded on every node, and Ray runs a "
                        "node doctor on each other node; their reports are this one's "
                        "(docs/ray.md)")
    p.add_argument("--slurm", action="store_true",
                   help="the command launches the job's steps with srun inside this Slurm "
                        "allocation (salloc, an sbatch script): Slurm runs a node doctor on each "
                        "other node of the allocation, and a hang stops the job's steps with "
                        "scancel; on by itself when the command is srun inside an allocation "
                        "(docs/slurm.md)")
    serving.add_options(p)


def add_code_options(p: argparse.ArgumentParser) -> None:
    """Which code is the user's (run, demo, replay): docs/who-is-wrong.md."""
    p.add_argument("--user-code", action="append", default=[], metavar="PATTERN",
                   type=code_pattern,
                   help="files matching PATTERN (an fnmatch pattern on the absolute path, * "
                        "spanning directories, or a directory) are your code even if installed "
                        "(e.g. your package in site-packages); repeatable. By default a file "
                        "is library code when it is installed (site-packages, dist-packages, "
                        f"the standard library), yours otherwise. Env twin: {paths.USER_CODE_ENV} "
                        "(patterns separated by ':')")
    p.add_argument("--library-code", action="append", default=[], metavar="PATTERN",
                   type=code_pattern,
                   help="files matching PATTERN are library code even if not installed (a "
                        "vendored framework, a source checkout); wins over --user-code; "
                        f"repeatable. Env twin: {paths.LIBRARY_CODE_ENV}")


def code_pattern(text: str) -> str:
    """A --user-code/--library-code pattern (argparse type)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty pattern: give a path pattern such as "
                                         "'*/mypackage/*' or a directory")
    if os.pathsep in text:
        raise argparse.ArgumentTypeError(f"{text!r} holds {os.pathsep!r}, which separates "
                                         "patterns: repeat the option for each pattern")
    return text


def _count(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: give a number >= {low}")
        return value
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value


def prepare_out_dir(out: Path | None, force: bool) -> Path:
    """The run's capture directory: ``out`` (empty, or emptied of an earlier run's files with
    ``force``; never a live run's), or a new one of its own."""
    if out is None:
        try:
            return claim.default_out()
        except OSError as err:
            raise unwritable("--out", claim.DEFAULT_PARENT, err) from None
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    live = claim.held(out) if out.is_dir() else None
    if live is not None:
        raise OutDirInUse(live)
    if out.is_dir() and any(out.iterdir()):
        from nccl_doctor.supervisor.slurm.allocation import requeue_of
        if not force and requeue_of(out, os.environ):
            return out  # a Slurm requeue: the earlier launch's captures stay, its attempt
        if not force:
            raise OutputExists(
                f"--out {out} is not empty: pass --force to replace its capture, or choose "
                "another directory"
            )
        remove_own_files(out)  # only our own files: never the user's
    return out


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command to run: put it after --, e.g. "
                         "nccl-doctor run -- torchrun --nproc-per-node 2 train.py")
    return supervise(args, command)


def supervise(args: argparse.Namespace, command: list[str]) -> int:
    """Run ``command`` under the doctor with the options of ``add_options``; the exit status."""
    # the job is never harmed by a closed terminal: once stderr's reader has gone, the run
    # writes nothing more there and goes on (cli/pipes.py)
    err = cast(TextIO, Guarded(sys.stderr, quiet=True))
    served = serving.Serving.listen(args, err)  # first: a taken port touches nothing
    try:
        return _supervise(args, command, served, err)
    finally:
        if served is not None:
            served.close()


def _supervise(args: argparse.Namespace, command: list[str], served: serving.Serving | None,
               err: TextIO) -> int:
    parent_was = claim.DEFAULT_PARENT.is_dir()
    out = prepare_out_dir(args.out, args.force)
    try:
        return _supervise_in(out, args, command, served, err)
    except BaseException:
        if args.out is None:  # a launch that failed leaves no empty run directory behind
            from nccl_doctor.supervisor.start import remove_empty
            remove_empty([out] if parent_was else [claim.DEFAULT_PARENT, out])
        raise


def _supervise_in(out: Path, args: argparse.Namespace, command: list[str],
                  served: serving.Serving | None, err: TextIO) -> int:
    from nccl_doctor.supervisor.start import Launch

    policy = None if args.no_watch else HangPolicy(on_hang=OnHang(args.on_hang),
                                                   hang_after=args.hang_after,
                                                   stuck_after=args.stuck_after)
    environ = dict(os.environ)  # the job's: what follows is for this process only
    cluster = _ray_cluster(args, environ)
    allocation = _slurm_run(args, command, environ, err)
    # --ray, Slurm: this supervisor hosts the node doctors' coordinator (--coordinator gives its
    # port); an allocation of this node alone has no other node to meet
    if cluster is not None:
        from nccl_doctor.supervisor.ray.fleet import leader_rendezvous
        meeting = leader_rendezvous(cluster)
    elif allocation is not None:
        from nccl_doctor.supervisor.slurm.fleet import leader_rendezvous as slurm_rendezvous
        meeting = slurm_rendezvous(allocation) if allocation.followers else None
    else:
        meeting = _meeting(args, command, err)
    key = _federation_key(environ, own=cluster is not None or allocation is not None,
                          needed=meeting is not None)
    if args.no_redact:  # the ranks (their argv) and the supervisor (the manifest) read it
        environ[NO_REDACT] = "1"
    # which code is the user's: the ranks' recorders read it, and so does this analysis
    environ = paths.with_patterns(environ, args.user_code, args.library_code)
    paths.configure_from(environ)
    fleet: RayFleet | SlurmFleet | None = None
    if cluster is not None:
        from nccl_doctor.supervisor.ray import fleet as ray_fleet
        environ = ray_fleet.job_environment(environ, host_name())
        fleet = ray_fleet.RayFleet(cluster, out, host_name(), environ, key.secret)
    elif allocation is not None:
        from nccl_doctor.supervisor.slurm import fleet as slurm_fleet
        environ[LEADER_HOST] = allocation.leader_host  # the other nodes' ranks: their directory
        fleet = slurm_fleet.SlurmFleet(allocation, out, key.secret)
    if meeting is not None:
        # torch's C++ log would print every retry of a store connection on the user's terminal
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    launch = Launch(command, out, environ)
    if meeting is None and fleet is None:
        # a single-node job starts first, the supervisor is built while its ranks start: a
        # multi-node leader listens, and a cluster's node doctors are prepared, before then
        launch.begin()
    try:
        supervisor, display = _supervisor(args, launch, policy, meeting, fleet, key, served,
                                          err)
    except Exception as error:  # noqa: BLE001 - the job runs on, unwatched, never harmed
        if launch.job is None:
            launch.undo()
            raise
        err.write(f"nccl-doctor: could not watch the job ({visible(repr(error))}); it runs "
                  "on unwatched\n")
        return launch.unwatched()
    try:
        result = supervisor.run()
    except KeyboardInterrupt:  # a second Ctrl-C once the job had ended: the post mortem too
        err.write(f"\nnccl-doctor: interrupted again: stopped without a report; `nccl-doctor "
                  f"replay {out}` diagnoses what was recorded\n")
        return 128 + signal.SIGINT
    finally:
        if display is not None:
            display.close()
    if result.stopped_orphans:
        err.write("nccl-doctor: processes of the job outlived its launcher; they were stopped\n")
    if result.analysis_error is not None:
        err.write(f"nccl-doctor: could not analyse the capture: "
                  f"{visible(result.analysis_error)}\n")
    elif result.diagnosis is not None and not args.quiet:
        from nccl_doctor.reporters.console import ConsoleReporter
        err.write("\n")
        ConsoleReporter().render(result.diagnosis, err, color=err.isatty())
    if result.report_path is not None and not args.quiet:
        page = result.report_path.with_name(REPORT_HTML)
        err.write(f"Wrote {result.report_path}" + (f" and {page}" if page.is_file() else "")
                  + "\n")
    if served is not None:  # the report is on the terminal first; after Ctrl-C, no wait
        served.linger(wait=not result.by_user)
    from nccl_doctor.cli.output import verdict_status
    return verdict_status(result.diagnosis, result.exit_status, args.fail_on)


def _supervisor(args: argparse.Namespace, launch: Launch, policy: HangPolicy | None,
                meeting: rendezvous.Rendezvous | None, fleet: RayFleet | SlurmFleet | None,
                key: federation_keys.JobKey, served: serving.Serving | None, err: TextIO,
                ) -> tuple[Supervisor, Display | None]:
    """The supervisor of ``launch``'s job and its live display (None: ``--quiet``)."""
    blas.import_numpy()  # before the supervisor's modules import it
    from nccl_doctor.cli.status_bar import make_display
    from nccl_doctor.cli.output import PageFile
    from nccl_doctor.supervisor.gpu.nvml import Nvml
    from nccl_doctor.supervisor.supervisor import Supervisor

    page_file = PageFile(launch.out_dir / REPORT_HTML)
    supervisor = Supervisor(launch.command, launch.out_dir, policy=policy,
                            gpu=None if args.no_gpu else Nvml.open, rendezvous=meeting,
                            on_report=page_file, cluster=fleet, federation_key=key,
                            launch=launch)
    if served is not None:
        served.watch(supervisor, lambda: page_file.text)
    display = None
    if not args.quiet:
        display = make_display(err, supervisor.watchdog.view if supervisor.watchdog else None)
        supervisor.attach(display, announce=display.announce)
    page_file.prepare(console=not args.quiet)  # while the job starts
    return supervisor, display


def _ray_cluster(args: argparse.Namespace, environ: dict[str, str]) -> RayCluster | None:
    """``--ray``: the cluster, and the options each node doctor runs with (this run's own)."""
    if args.ray is None:
        return None
    address = args.ray if args.ray != "auto" else environ.get("RAY_ADDRESS") or "auto"
    if address.startswith("ray://"):
        raise UsageError(f"--ray {address}: a Ray Client address; run the driver on a node of "
                         "the cluster (give the cluster's HOST:PORT, or nothing for 'auto')")
    from nccl_doctor.supervisor.ray.fleet import RayCluster
    follower = _follower_args(args)
    return RayCluster(address, _coordinator_port(args), tuple(follower))


def _coordinator_port(args: argparse.Namespace) -> int:
    """The port this supervisor hosts its node doctors' coordinator on: --coordinator's, else a
    free one."""
    from nccl_doctor.supervisor.ray.fleet import free_port
    if args.coordinator:
        return rendezvous.split_address(args.coordinator, "--coordinator")[1]
    return free_port()


def _follower_args(args: argparse.Namespace) -> list[str]:
    """The options of each node doctor's run (this run's own)."""
    follower = ["--force", "--quiet", "--on-hang", args.on_hang,
                "--hang-after", str(args.hang_after), "--stuck-after", str(args.stuck_after)]
    follower += [flag for flag, on in (("--no-gpu", args.no_gpu), ("--no-redact", args.no_redact),
                                       ("--no-watch", args.no_watch)) if on]
    follower += [x for p in args.user_code for x in ("--user-code", p)]
    follower += [x for p in args.library_code for x in ("--library-code", p)]
    return follower


def _slurm_run(args: argparse.Namespace, command: list[str], environ: dict[str, str],
               err) -> SlurmRun | None:
    """``srun`` inside an allocation (or ``--slurm``): the allocation, and the options each
    node doctor runs with."""
    if args.slurm and args.ray is not None:
        raise UsageError("--slurm and --ray: give one (the cluster that starts the node doctors)")
    if args.ray is not None or (not args.slurm and not slurm.is_srun(command)):
        return None
    try:
        found = slurm.Allocation.of(environ)
    except slurm.SlurmError as e:
        err.write(f"nccl-doctor: cannot read the Slurm allocation ({visible(str(e))}); "
                  "diagnosing this node alone\n")
        return None
    if found is None:
        if args.slurm:
            raise UsageError("--slurm: not inside a Slurm allocation (no SLURM_JOB_ID): run "
                             "it in salloc or an sbatch script")
        err.write("nccl-doctor: srun outside an allocation: the other nodes go unwatched; run "
                  "it inside salloc or an sbatch script (docs/slurm.md)\n")
        return None
    from nccl_doctor.supervisor.slurm.fleet import SlurmRun
    return SlurmRun(found, _coordinator_port(args), tuple(_follower_args(args)), host_name())


def _federation_key(environ: dict[str, str], own: bool, needed: bool) -> federation_keys.JobKey:
    """The job's key for the nodes' federation: the user's, else one of its own where this run
    starts the node doctors itself (``own``), else, where it meets other nodes (``needed``),
    the user's default key (made on first use), else none (unauthenticated)."""
    try:
        return federation_keys.job_key(environ, own=own, needed=needed)
    except federation_keys.FederationKeyError as e:
        raise UsageError(str(e)) from None


def _meeting(args: argparse.Namespace, command: list[str], err) -> rendezvous.Rendezvous | None:
    """Where this node meets the job's other nodes (None: one node, or nowhere to meet)."""
    explicit = args.coordinator
    try:
        found = rendezvous.find(command, os.environ, coordinator=explicit,
                                node_rank=args.node_rank, nnodes=args.nnodes)
    except rendezvous.RendezvousError as e:
        if explicit:
            raise UsageError(f"--coordinator: {e}") from None
        err.write(f"nccl-doctor: cannot tell where the nodes meet ({visible(str(e))}); "
                  "diagnosing this node alone: pass --coordinator HOST:PORT\n")
        return None
    job = os.environ.get(COORDINATOR_JOB)
    if found is not None and explicit and job:  # a node doctor of a --ray run
        found = replace(found, job=job)
    if found is None and rendezvous.several_nodes(command, os.environ, args.nnodes):
        err.write("nccl-doctor: a multi-node job, but the command names no rendezvous address; "
                  "diagnosing this node alone: pass --coordinator HOST:PORT\n")
    return found
