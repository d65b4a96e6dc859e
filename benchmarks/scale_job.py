"""The synthetic job of benchmarks/replay_scale.py, written twice: as nccl-doctor capture files
(through the project's own CaptureWriter and its event ring, byte for byte what the recorder
writes) and as the NCCL Flight Recorder pickle dumps of the same calls (shaped like
benchmarks/fr_replay.py's: torch 2.10 dumps, protocol 2).

The job: N ranks, 8 per host, a Megatron-like 2-D parallel run. Tensor-parallel groups of
``tp`` consecutive ranks and data-parallel groups of the ranks ``tp`` apart, made with two
``new_subgroups_by_enumeration`` calls (names "1".."N/tp" then the data-parallel ones, as torch
numbers them; descs "tensor_parallel", "data_parallel"). Every rank records those calls (and the
``new_group`` calls inside them) first, then a few data-parallel parameter broadcasts, then
training steps of 26 collectives:

    broadcast (tp, the batch from the group's first rank), 8 all_reduce (tp, forward),
    2 all_reduce (tp, vocab-parallel cross-entropy), 8 all_reduce (tp, backward),
    2 reduce_scatter (dp, gradient buckets), broadcast (world, rank 0's step flags),
    all_reduce (world, grad norm), 2 all_gather (dp, parameter buckets), all_reduce (dp, loss)

Each group keeps its own PyTorch sequence number (``seq``, ``seq_delta`` 1 per collective, 0 for
the group-creation calls), callsites are the first frame outside torch as the recorder takes
it, tensors are described as the recorder describes them ("bfloat16[1,4096,4096]",
"16*bfloat16[131072]"). All calls returned but the last one of each rank, left ENTERED: the job
hangs because the culprit rank skips the world broadcast of the last step and calls the grad-norm
all_reduce instead, which the others, waiting in the broadcast, never join. In the dumps every
entry is "completed" but that last one, still "scheduled".
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pickle
import random
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

from nccl_doctor._version import __version__
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.model import EventKind, EventState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fr_replay import C10D, LOGGER, _frame, fr_entry  # noqa: E402  (the same torch frames)

T0 = 1_795_373_000_000_000_000  # ns: when the ranks start
RANKS_PER_HOST = 8
HIDDEN, SEQ_LEN, LAYERS = 4096, 4096, 4
STEP_LEN = 26  # collectives per training step
HANG_AT = 21  # index in the step of the world broadcast the culprit skips
RUN_ID = "replay-scale"

# -- callsites: the user's frames (innermost first); the recorder keeps the first one ----------
JOB = "/srv/jobs/pretrain"
MAPPINGS, DATA, XENT = f"{JOB}/megalite/mappings.py", f"{JOB}/megalite/data.py", \
    f"{JOB}/megalite/cross_entropy.py"
OPTIM, CLIP, STATE = f"{JOB}/megalite/optimizer.py", f"{JOB}/megalite/clip_grads.py", \
    f"{JOB}/megalite/parallel_state.py"
MODEL, TRAIN = f"{JOB}/megalite/model.py", f"{JOB}/train.py"
_STEP, _MAIN = ("train_step", TRAIN, 142), ("main", TRAIN, 231)
SITES: dict[str, list[tuple[str, str, int]]] = {
    "tp_groups": [("initialize_model_parallel", STATE, 88), ("main", TRAIN, 204)],
    "dp_groups": [("initialize_model_parallel", STATE, 95), ("main", TRAIN, 204)],
    "init_params": [("broadcast_params", f"{JOB}/megalite/distributed.py", 31),
                    ("setup_model", TRAIN, 118), ("main", TRAIN, 212)],
    "batch": [("get_batch", DATA, 77), _STEP, _MAIN],
    **{f"fwd{i}": [("_reduce", MAPPINGS, 31), ("forward", MAPPINGS, 58),
                   ("forward", MODEL, 212 + 56 * (i % 2)), ("forward", MODEL, 340), _STEP, _MAIN]
       for i in range(2)},
    "xent_max": [("forward", XENT, 41), ("vocab_parallel_cross_entropy", XENT, 112), _STEP, _MAIN],
    "xent_sum": [("forward", XENT, 58), ("vocab_parallel_cross_entropy", XENT, 112), _STEP, _MAIN],
    "bwd": [("_reduce", MAPPINGS, 31), ("backward", MAPPINGS, 72)],
    "grad_rs": [("reduce_gradients", OPTIM, 310), ("step", OPTIM, 401), _STEP, _MAIN],
    "flags": [("sync_step_flags", TRAIN, 57), _STEP, _MAIN],
    "grad_norm": [("clip_grad_norm", CLIP, 77), ("step", OPTIM, 405), _STEP, _MAIN],
    "param_ag": [("gather_params", OPTIM, 355), ("step", OPTIM, 431), _STEP, _MAIN],
    "loss": [("reduce_loss", TRAIN, 88), _STEP, _MAIN],
}
# the torch frames above the user's, per op, as Flight Recorder stacks show them
_TORCH_LINES = {"all_reduce": 3068, "broadcast": 2968, "all_gather": 3934, "reduce_scatter": 4451}
_FR_DTYPES = {"bfloat16": "BFloat16", "float32": "Float", "int64": "Long", "int32": "Int"}
_ITEMSIZE = {"bfloat16": 2, "float32": 4, "int64": 8, "int32": 4}


@dataclass(frozen=True)
class Call:
    """One kind of collective in the program. ``shape``: one rank's tensor (all_gather: its input
    shard; reduce_scatter: its output shard), lists of ``group size`` tensors on the other side."""

    op: str
    group: str  # "world", "tp" or "dp"
    site: str
    dtype: str
    shape: tuple[int, ...]
    from_first: bool = False  # a broadcast from the group's first rank


def _step_calls(dp: int) -> list[Call]:
    h = (1, SEQ_LEN, HIDDEN)
    buckets = [(1 << 25) // dp, (3 << 23) // dp]  # gradient / parameter bucket shards
    fwd = [Call("all_reduce", "tp", f"fwd{i % 2}", "bfloat16", h) for i in range(2 * LAYERS)]
    bwd = [Call("all_reduce", "tp", "bwd", "bfloat16", h) for _ in range(2 * LAYERS)]
    step = [Call("broadcast", "tp", "batch", "int64", (1, SEQ_LEN), True), *fwd,
            Call("all_reduce", "tp", "xent_max", "float32", (1, SEQ_LEN)),
            Call("all_reduce", "tp", "xent_sum", "float32", (1, SEQ_LEN)), *bwd,
            *[Call("reduce_scatter", "dp", "grad_rs", "bfloat16", (n,)) for n in buckets],
            Call("broadcast", "world", "flags", "int32", (4,), True),
            Call("all_reduce", "world", "grad_norm", "float32", (1,)),
            *[Call("all_gather", "dp", "param_ag", "bfloat16", (n,)) for n in buckets],
            Call("all_reduce", "dp", "loss", "float32", (1,))]
    assert len(step) == STEP_LEN and step[HANG_AT].group == "world"
    return step


@dataclass
class Job:
    ranks: int
    tp: int
    collectives: int  # per rank
    culprit: int
    calls: list[Call]  # one step's calls, then the parameter broadcasts
    program: list[int]  # index into ``calls`` of each collective, in order, as all but the culprit
    seqs: list[int]  # each collective's sequence number in its group (the same on every rank)
    hang_seq: int  # the world group's sequence number of the skipped broadcast
    starts: list[int]  # ns on the job's common clock: when each collective starts...
    durations: list[int]  # ... and how long it takes once every member is in

    @property
    def dp(self) -> int:
        return self.ranks // self.tp

    @property
    def group_calls(self) -> int:
        """Records of group creation per rank: two new_subgroups_by_enumeration, and the
        new_group call inside them for every group."""
        return 2 + self.dp + self.tp

    def group_name(self, kind: str, rank: int) -> str:
        if kind == "world":
            return "0"
        if kind == "tp":
            return str(1 + rank // self.tp)
        return str(1 + self.dp + rank % self.tp)

    def group_ranks(self, kind: str, rank: int) -> list[int]:
        if kind == "world":
            return list(range(self.ranks))
        if kind == "tp":
            first = rank - rank % self.tp
            return list(range(first, first + self.tp))
        return list(range(rank % self.tp, self.ranks, self.tp))

    def group_desc(self, kind: str) -> str:
        return {"world": "default_pg", "tp": "tensor_parallel", "dp": "data_parallel"}[kind]

    def group_size(self, kind: str) -> int:
        return {"world": self.ranks, "tp": self.tp, "dp": self.dp}[kind]

    def program_of(self, rank: int) -> list[int]:
        """The culprit calls the grad-norm all_reduce where the others broadcast."""
        if rank != self.culprit:
            return self.program
        return self.program[:-1] + [HANG_AT + 1]

    def host(self, rank: int) -> str:
        return f"gpu{rank // RANKS_PER_HOST:04d}"


def make_job(ranks: int, collectives: int, tp: int, seed: int) -> Job:
    """``collectives`` per rank: a few parameter broadcasts, then steps; each rank's last call
    is the world broadcast of the last step (the culprit's: the all_reduce after it)."""
    dp = ranks // tp
    step = _step_calls(dp)
    lead = (collectives - (HANG_AT + 1)) % STEP_LEN
    params = [(HIDDEN * 3 // tp, HIDDEN), (HIDDEN,), (HIDDEN, 11008 // tp), (11008 // tp, HIDDEN)]
    calls = step + [Call("broadcast", "dp", "init_params", "bfloat16", s, True) for s in params]
    program = [STEP_LEN + i % len(params) for i in range(lead)]
    while len(program) < collectives:
        program.append((len(program) - lead) % STEP_LEN)
    seqs, counters = [], {"world": 0, "tp": 0, "dp": 0}
    for k in program:
        counters[calls[k].group] += 1
        seqs.append(counters[calls[k].group])
    # never rank 0: torchfrtrace blames the side that differs from the lowest rank
    culprit = random.Random(seed).randrange(1, ranks)
    starts, durations = _timeline(calls, program)
    return Job(ranks=ranks, tp=tp, collectives=collectives, culprit=culprit, calls=calls,
               program=program, seqs=seqs, hang_seq=seqs[-1], starts=starts,
               durations=durations)


def _sig(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def _describe(call: Call, g: int) -> tuple[str, str, int]:
    """(input, output, input bytes) as the recorder describes them."""
    one, nbytes = _sig(call.dtype, call.shape), math.prod(call.shape) * _ITEMSIZE[call.dtype]
    if call.op == "all_gather":  # all_gather(tensor_list, tensor)
        return one, f"{g}*{one}", nbytes
    if call.op == "reduce_scatter":  # reduce_scatter(output, input_list)
        return f"{g}*{one}", one, nbytes * g
    return one, "", nbytes


def _timeline(calls: list[Call], program: list[int]) -> tuple[list[int], list[int]]:
    """(starts, durations) in ns of the collectives of ``program``."""
    gaps = {"batch": 4_000_000, "fwd0": 900_000, "fwd1": 1_300_000, "bwd": 1_800_000,
            "grad_rs": 600_000, "param_ag": 200_000, "init_params": 50_000}
    starts, durations, t = [], [], T0 + 20_000_000_000
    for k in program:
        call = calls[k]
        t += gaps.get(call.site, 150_000)
        d = 300_000 + math.prod(call.shape) // 64  # a bandwidth-ish term
        starts.append(t)
        durations.append(d)
        t += d
    return starts, durations


# -- capture files --------------------------------------------------------------------------

def capture_name(job: Job, rank: int) -> str:
    return f"rank{rank:05d}.{job.host(rank)}.{_pid(rank)}{fmt.CAPTURE_SUFFIX}"


def _pid(rank: int) -> int:
    return 41_000 + rank % RANKS_PER_HOST


def _intern_site(w: CaptureWriter, site: str) -> tuple[int, int, int]:
    func, path, line = SITES[site][0]
    return w.intern(path), line, w.intern(func)


def write_capture(directory: Path, job: Job, rank: int, seed: int) -> None:
    """Rank ``rank``'s capture file, as the recorder leaves it when the rank hangs."""
    rng = random.Random(seed * 1_000_003 + rank)
    host, world = job.host(rank), job.ranks
    started = T0 + rng.randrange(2_000_000_000)
    meta = {
        "rank": rank, "world_size": world, "host": host, "pid": _pid(rank),
        "local_rank": rank % RANKS_PER_HOST, "node_rank": rank // RANKS_PER_HOST,
        "started_ns": started, "run_id": RUN_ID, "argv": ["train.py", "--tp", str(job.tp)],
        "versions": {"python": "3.12.3", "nccl_doctor": __version__, "torch": "2.11.0+cu130"},
        "env": {"LOCAL_WORLD_SIZE": str(RANKS_PER_HOST), "MASTER_ADDR": job.host(0),
                "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": RUN_ID},
    }
    w = CaptureWriter(directory / capture_name(job, rank), meta)
    begin, end = w.events.begin, w.events.end
    tid = 139_800_000_000_000 + 4096 * (rank % RANKS_PER_HOST)
    returned, group_kind, collective = (int(EventState.RETURNED), int(EventKind.GROUP),
                                        int(EventKind.COLLECTIVE))
    t = started + 900_000_000
    w.note("group", name="0", ranks=list(range(world)), backend="nccl", desc="default_pg",
           time_ns=t)
    w.note("init", backend="nccl", time_ns=t + 1_000)
    world_id = w.intern("0")

    # new_subgroups_by_enumeration: every rank creates every group (torch requires it)
    sub, new_group = w.intern("new_subgroups_by_enumeration"), w.intern("new_group")
    for kind, count in (("tp", job.dp), ("dp", job.tp)):
        uf, ul, ufn = _intern_site(w, f"{kind}_groups")
        t += 5_000_000
        outer = begin(0, t, 1, 0, tid, sub, world_id, 0, 0, uf, ul, ufn, uf, ul, 0, -1, world,
                      0, group_kind, 0, 0)
        for _ in range(count):
            t += 2_000_000
            inner = begin(outer, t, 1, 0, tid, new_group, world_id, 0, 0, uf, ul, ufn, uf, ul,
                          0, -1, world, 0, group_kind, 0, 0)
            end(inner, returned, 0, t + 1_500_000)
        t += 2_000_000
        end(outer, returned, 0, t)
    for kind in ("tp", "dp"):
        w.note("group", name=job.group_name(kind, rank), ranks=job.group_ranks(kind, rank),
               backend="nccl", desc=job.group_desc(kind), time_ns=t)

    # each distinct call, interned once: op, group, in, out, callsite, peer, group size, bytes
    fields = []
    for call in job.calls:
        g = job.group_size(call.group)
        inp, out, nbytes = _describe(call, g)
        uf, ul, ufn = _intern_site(w, call.site)
        peer = job.group_ranks(call.group, rank)[0] if call.from_first else -1
        fields.append((w.intern(call.op), w.intern(job.group_name(call.group, rank)),
                       w.intern(inp), w.intern(out), uf, ul, ufn, peer, g, nbytes))
    starts, durations = job.starts, job.durations
    jitter = array("H", rng.randbytes(2 * len(starts)))  # 0..65535 ns x 4: enter skew
    program = job.program_of(rank)
    last = len(program) - 1
    for i, (k, seq, start, dur, skew) in enumerate(zip(program, job.seqs, starts, durations,
                                                      jitter)):
        op, gid, inp, out, uf, ul, ufn, peer, g, nbytes = fields[k]
        idx = begin(0, start + 4 * skew, seq, nbytes, tid, op, gid, inp, out, uf, ul, ufn, uf,
                    ul, 0, peer, g, 0, collective, 0, 0)
        if i != last:  # the last call never returns: the hang
            end(idx, returned, 1, start + 262_144 + dur + (skew & 0xFFF))
    w.close()


def write_manifest(directory: Path, job: Job, node: dict | None) -> None:
    """The manifest of a job still running (hung): no end time, no exit status yet."""
    Manifest(
        command=("torchrun", f"--nnodes={-(-job.ranks // RANKS_PER_HOST)}",
                 f"--nproc-per-node={RANKS_PER_HOST}", "train.py", "--tp", str(job.tp)),
        started_at=T0 / 1e9, run_id=RUN_ID,
        extra={"node": node} if node else {},
    ).write(directory)


# -- Flight Recorder dumps ------------------------------------------------------------------

def _fr_sizes(call: Call, g: int) -> tuple[list[list[int]], list[list[int]]]:
    one = list(call.shape)
    whole = [call.shape[0] * g, *call.shape[1:]]
    if call.op == "all_gather":
        return [one], [whole]
    if call.op == "reduce_scatter":
        return [whole], [one]
    return [one], [one]


def _fr_stack(call: Call) -> list[dict]:
    return [_frame(call.op, C10D, _TORCH_LINES[call.op]), _frame("wrapper", LOGGER, 83)] + [
        _frame(*f) for f in SITES[call.site]]


def rank_dump(job: Job, rank: int) -> dict:
    """Rank ``rank``'s Flight Recorder dump: the same collectives, the last one "scheduled"
    (NCCL timing off, as by default: no start times)."""
    kinds = ("world", "tp", "dp")
    pg_config = {job.group_name(k, rank): {"name": job.group_name(k, rank),
                                           "desc": job.group_desc(k),
                                           "ranks": str(job.group_ranks(k, rank))} for k in kinds}
    stacks = [_fr_stack(c) for c in job.calls]  # shared: torch's pickler memoizes frames too
    sizes = [_fr_sizes(c, job.group_size(c.group)) for c in job.calls]
    starts, durations = job.starts, job.durations
    thread_id = str(139_800_000_000_000 + 4096 * (rank % RANKS_PER_HOST))
    program = job.program_of(rank)
    op_ids = {k: 0 for k in kinds}
    entries = []
    for i, (k, seq, start, dur) in enumerate(zip(program, job.seqs, starts, durations)):
        call = job.calls[k]
        done = i < len(program) - 1
        op_ids[call.group] += 1
        (ins, outs), dtype = sizes[k], _FR_DTYPES[call.dtype]
        entries.append(fr_entry(
            frames=stacks[k], record_id=i, pg_id=kinds.index(call.group),
            group=(job.group_name(call.group, rank), job.group_desc(call.group)),
            thread=("pt_main_thread", thread_id), seq=seq, op_id=op_ids[call.group],
            op=call.op, created=start, sizes=(ins, outs), dtype=dtype,
            completed=start + 262_144 + dur if done else None))
    status = {}
    for kind in kinds:
        last = max((e["collective_seq_id"] for e in entries
                    if e["process_group"][1] == job.group_desc(kind)), default=0)
        hung = entries[-1]["process_group"][1] == job.group_desc(kind)
        status[str(kinds.index(kind))] = {"last_enqueued_collective": last,
                                          "last_started_collective": -1,
                                          "last_completed_collective": last - 1 if hung else last}
    return {"version": "2.10", "pg_config": pg_config, "comm_lib_version": "2.28.9",
            "pg_status": status, "entries": entries}


def write_dump(directory: Path, job: Job, rank: int) -> None:
    with open(directory / f"rank_{rank}", "wb") as f:
        pickle.dump(rank_dump(job, rank), f, protocol=2)


# -- writing many ranks at once ---------------------------------------------------------------

def _write_ranks(task: tuple[str, Path, Job, int, bool, list[int]]) -> None:
    what, directory, job, seed, per_node, ranks = task
    for rank in ranks:
        if what == "dumps":
            write_dump(directory, job, rank)
        else:
            write_capture(directory / job.host(rank) if per_node else directory, job, rank, seed)


def write_all(what: str, directory: Path, job: Job, seed: int, jobs: int,
              per_node: bool = False) -> None:
    """Every rank's capture file (``what`` "capture", with the manifest: one directory, or one
    per host under ``directory`` when ``per_node``, as a multi-node run leaves them) or dump
    ("dumps"), in ``jobs`` processes."""
    directory.mkdir(parents=True)
    if what == "capture" and per_node:
        for n, host in enumerate(sorted({job.host(r) for r in range(job.ranks)})):
            (directory / host).mkdir()
            write_manifest(directory / host, job, {"role": "leader" if n == 0 else "follower",
                                                   "state": "joined", "node_rank": n,
                                                   "host": host})
    elif what == "capture":
        write_manifest(directory, job, None)
    jobs = max(1, min(jobs, job.ranks))
    tasks = [(what, directory, job, seed, per_node, list(range(i, job.ranks, jobs)))
             for i in range(jobs)]
    if jobs == 1:
        _write_ranks(tasks[0])
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        pool.map(_write_ranks, tasks, chunksize=1)


def _stamp(what: str, job: Job, seed: int, per_node: bool) -> str:
    """What a written directory holds, in one line (``written``)."""
    return json.dumps({"what": what, "ranks": job.ranks, "collectives": job.collectives,
                       "tp": job.tp, "seed": seed, "per_node": per_node,
                       "nccl_doctor": __version__}, sort_keys=True)


def written(what: str, directory: Path, job: Job, seed: int, jobs: int,
            per_node: bool = False) -> bool:
    """``write_all``, unless ``directory`` already holds exactly that (written by an earlier run
    with ``--keep``: a stamp beside it, left once every file was written). Whether it was
    reused."""
    stamp = directory.parent / f".{directory.name}.scale_job"
    want = _stamp(what, job, seed, per_node)
    if directory.is_dir() and stamp.is_file() and stamp.read_text() == want:
        return True
    if directory.exists():
        raise FileExistsError(f"{directory} exists and holds another job (or an unfinished "
                              "write): pass a new or empty --keep directory")
    write_all(what, directory, job, seed, jobs, per_node)
    stamp.write_text(want)
    return False


def disk_usage(path: Path) -> tuple[int, int]:
    """(bytes allocated on disk, apparent size) of everything under ``path``."""
    used = apparent = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(root, name))
            used += st.st_blocks * 512
            apparent += st.st_size
    return used, apparent
