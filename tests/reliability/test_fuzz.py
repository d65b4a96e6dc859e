"""Damaged input, fuzzed: seeded mutations of real capture directories (a clean job and a
stopped hang of the suite's own jobs, recorded here with small rings) and of real Flight
Recorder dumps (tests/fixtures/fr_dumps), each replayed in the three formats in this process.

Every mutant must give a report or one line with a documented exit status - never a
traceback, an internal error (70), a wait without end or memory without bound - and no finding
may blame a rank the undamaged input did not blame: a rank whose only fault is its damaged file
is never the culprit. (Flight Recorder dumps carry no checksum: bytes changed in place may leave
another valid dump, not a damaged one; such mutants are held to the first rules only.)

``NCCL_DOCTOR_FUZZ_MUTANTS`` (default 500) sets how many mutants a run makes and
``NCCL_DOCTOR_FUZZ_SEED`` which ones; a failure names the mutant and its seed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from nccl_doctor.capture import format as fmt
from nccl_doctor.cli.main import main
from nccl_doctor.errors import ExitStatus

from .conftest import JOBS, doctor

MUTANTS = int(os.environ.get("NCCL_DOCTOR_FUZZ_MUTANTS", "500"))
SEED = int(os.environ.get("NCCL_DOCTOR_FUZZ_SEED", "20261125"))
FR_DUMPS = Path(__file__).parents[1] / "fixtures" / "fr_dumps" / "gloo_skip_broadcast"
#: What a replay of damaged input may end with: a report (0), or one line saying the input is
#: missing, foreign, of another version, unreadable or refused.
ALLOWED = {ExitStatus.OK, ExitStatus.NOT_FOUND, ExitStatus.NOT_A_CAPTURE,
           ExitStatus.UNSUPPORTED_VERSION, ExitStatus.CORRUPT, ExitStatus.REFUSED}
SMALL_RINGS = {"NCCL_DOCTOR_RING_RECORDS": "64", "NCCL_DOCTOR_STRTAB_BYTES": "65536"}
REPLAY_TIMEOUT_S = 20
MEMORY_GROWTH_MB = 400


@dataclass
class Base:
    name: str
    path: Path  # the undamaged input
    blamed: frozenset[int]  # the ranks its own diagnosis blames


def blamed(report: dict) -> frozenset[int]:
    """The ranks the report's errors and warnings name as culprits."""
    return frozenset(r for f in report.get("findings", ())
                     if f.get("severity") in ("error", "warning") for r in f.get("ranks", ()))


class Overdue(BaseException):
    """A replay ran past ``REPLAY_TIMEOUT_S`` (a BaseException: no ``except Exception`` of the
    code under test swallows it)."""


def replay(path: Path, *args: str) -> tuple[int, str, str]:
    """``nccl-doctor replay PATH ARGS`` in this process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()

    def overdue(*_):
        raise Overdue(f"replay of {path} ran past {REPLAY_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, overdue)
    signal.alarm(REPLAY_TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["replay", str(path), *args])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> list[Base]:
    root = tmp_path_factory.mktemp("fuzz-bases")
    made = []
    for name, script, env, status in (("clean", "clean.py", {}, 0),
                                      ("hang", "skip_broadcast.py", {"SKIPPER": "1"},
                                       ExitStatus.HANG_STOPPED)):
        out = root / name
        proc = doctor("run", "--quiet", "--out", str(out), "--", sys.executable, "-m",
                      "nccl_doctor.testing.spawn", "--nproc", "2", str(JOBS / script),
                      env=dict(os.environ, **SMALL_RINGS, **env))
        assert proc.returncode == status, proc.stderr[-3000:]
        report = json.loads((out / "report.json").read_text())
        made.append(Base(name, out, blamed(report)))
    fr = root / "fr"
    shutil.copytree(FR_DUMPS, fr)
    status, text, err = replay(fr, "--format", "json")
    assert status == 0, err
    made.append(Base("fr", fr, blamed(json.loads(text))))
    assert [b.blamed for b in made] == [frozenset(), frozenset({1}), frozenset({1})]
    return made


# -- the mutations: each changes a copy of a base in place and says what it did ---------------

Mutation = Callable[[random.Random, Path], str]


def _pick(rng: random.Random, directory: Path, pattern: str) -> Path | None:
    files = sorted(p for p in directory.rglob(pattern) if p.is_file())
    return rng.choice(files) if files else None


def truncate(rng: random.Random, d: Path) -> str:
    f = _pick(rng, d, "*.ndcap") or _pick(rng, d, "*")
    size = f.stat().st_size
    cut = rng.choice([0, rng.randrange(1, 64), rng.randrange(0, fmt.HEADER_SIZE),
                      rng.randrange(0, max(1, size))])
    os.truncate(f, min(cut, size))
    return f"{f.name} truncated at {min(cut, size)} of {size} bytes"


def flip_bits(rng: random.Random, d: Path) -> str:
    f = _pick(rng, d, "*.ndcap") or _pick(rng, d, "*")
    data = bytearray(f.read_bytes())
    if not data:
        return f"{f.name} empty: nothing flipped"
    where = []
    for _ in range(rng.randint(1, 8)):
        region = rng.random()
        hi = len(data)
        at = (rng.randrange(0, min(hi, fmt.HEADER_SIZE)) if region < 0.3
              else rng.randrange(0, hi))
        data[at] ^= 1 << rng.randrange(8)
        where.append(at)
    f.write_bytes(bytes(data))
    return f"{f.name}: bits flipped at {where}"


def zero_range(rng: random.Random, d: Path) -> str:
    f = _pick(rng, d, "*.ndcap") or _pick(rng, d, "*")
    data = bytearray(f.read_bytes())
    start = rng.randrange(0, max(1, len(data)))
    length = rng.choice([8, 64, 128, 4096, rng.randrange(1, 65536)])
    data[start:start + length] = bytes(len(data[start:start + length]))
    f.write_bytes(bytes(data))
    return f"{f.name}: {length} bytes zeroed at {start}"


def absurd_header(rng: random.Random, d: Path) -> str:
    f = _pick(rng, d, "*.ndcap")
    if f is None:
        return truncate(rng, d)
    data = bytearray(f.read_bytes())
    if len(data) < fmt.HEADER.size + 16:
        return f"{f.name}: too short for a header field"
    # magic 8s | version I, header size I, record size I, capacity I | offsets and sizes Q x4
    fields = [(8, "<I"), (12, "<I"), (16, "<I"), (20, "<I"), (24, "<Q"), (32, "<Q"),
              (40, "<Q"), (48, "<Q"), (fmt.EVENTS_STARTED_OFFSET, "<Q"),
              (fmt.STRTAB_USED_OFFSET, "<Q")]
    at, form = rng.choice(fields)
    top = (1 << (8 * struct.calcsize(form))) - 1
    value = rng.choice([0, 1, 7, 1 << 20, top // 2, top])
    struct.pack_into(form, data, at, value)
    f.write_bytes(bytes(data))
    return f"{f.name}: header field at {at} set to {value}"


SIDE_FILES = ("manifest.json", "watchdog.json", "stacks.json", "report.json", "gpu.jsonl",
              "stragglers.jsonl", "rank_0.json", "rank_1.json", "*.json")


def _side_file(rng: random.Random, d: Path) -> Path | None:
    """One of the JSON files beside the captures (or of the dumps), picked at random."""
    for pattern in rng.sample(SIDE_FILES, len(SIDE_FILES)):
        f = _pick(rng, d, pattern)
        if f is not None:
            return f
    return None


def bad_json(rng: random.Random, d: Path) -> str:
    f = _side_file(rng, d)
    if f is None:
        return truncate(rng, d)
    text = f.read_bytes()
    how = rng.choice(["cut", "garbage", "line", "type"])
    if how == "cut":
        text = text[:rng.randrange(0, max(1, len(text)))]
    elif how == "garbage":
        text = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    elif how == "line":
        lines = text.split(b"\n")
        lines[rng.randrange(len(lines))] = b'{"kind": "sample", "t": [}'
        text = b"\n".join(lines)
    else:
        text = rng.choice([b"[]", b"42", b'"a string"', b"null", b'{"format": 7}'])
    f.write_bytes(text)
    return f"{f.relative_to(d)}: {how}"


def deep_json(rng: random.Random, d: Path) -> str:
    f = _side_file(rng, d) or d / "manifest.json"
    depth = rng.choice([101, 1000, 100_000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    f.write_bytes(opener * depth + b"1" + closer * depth)
    return f"{f.relative_to(d)}: nested {depth} deep"


def swap_ranks(rng: random.Random, d: Path) -> str:
    files = sorted(d.glob("*.ndcap")) or sorted(d.glob("rank_*.json"))
    if len(files) < 2:
        return truncate(rng, d)
    a, b = rng.sample(files, 2)
    tmp = a.with_name("swap.tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    return f"{a.name} and {b.name} swapped"


def duplicate_rank(rng: random.Random, d: Path) -> str:
    f = _pick(rng, d, "*.ndcap") or _pick(rng, d, "rank_*.json")
    if f is None:
        return truncate(rng, d)
    parts = f.name.split(".")
    copy = f.with_name(".".join([*parts[:-2], str(rng.randrange(10**6, 10**7)), parts[-1]])
                       if f.suffix == ".ndcap" else f"{f.stem}_copy{rng.randrange(10**6)}{f.suffix}")
    if f.suffix == ".ndcap" and rng.random() < 0.3:  # a stray file: a rank past the job's
        copy = f.with_name(f"rank{rng.choice([2, 99, 999_999, 10**12]):05d}.vm.7.ndcap")
    shutil.copyfile(f, copy)
    if rng.random() < 0.5:
        os.truncate(copy, rng.randrange(0, 4096))
        return f"{f.name} copied as {copy.name}, cut short"
    return f"{f.name} copied as {copy.name}"


def odd_entry(rng: random.Random, d: Path) -> str:
    name = rng.choice(["rank00002.vm.1.ndcap", "rank00000.vm.2.ndcap", "rank_2.json"])
    target = d / name
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    if rng.random() < 0.5:
        os.mkfifo(target)
        return f"a FIFO named {name}"
    target.mkdir()
    return f"a directory named {name}"


MUTATIONS: tuple[Mutation, ...] = (truncate, flip_bits, zero_range, absurd_header, bad_json,
                                   deep_json, swap_ranks, duplicate_rank, odd_entry)


def test_damaged_input_never_makes_a_culprit_a_traceback_or_a_hang(bases, tmp_path):
    rng = random.Random(SEED)
    grown_from = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    statuses: dict[int, int] = {}
    failures = []
    for n in range(MUTANTS):
        base = bases[n % len(bases)]
        mutation = MUTATIONS[(n // len(bases)) % len(MUTATIONS)]
        d = tmp_path / f"m{n}"
        shutil.copytree(base.path, d)
        what = mutation(rng, d)
        applied = {mutation}
        if rng.random() < 0.15:  # now and then, two things wrong at once
            second = rng.choice(MUTATIONS)
            what += "; " + second(rng, d)
            applied.add(second)
        # (Flight Recorder's JSON has no checksum: bytes changed in place may leave a valid dump
        # that says something else - another dump, not a damaged one)
        checkable = base.name != "fr" or not applied & {flip_bits, zero_range, swap_ranks}
        case = f"mutant {n} (seed {SEED}) of {base.name}: {what}"
        page = tmp_path / f"m{n}.html"
        for args in (("--format", "console"), ("--format", "json"), ("--format", "html", "-o",
                                                                   str(page), "--force")):
            try:
                status, out, err = replay(d, *args)
            except Overdue as late:
                failures.append(f"{case}: {' '.join(args)}: {late}")
                continue
            statuses[status] = statuses.get(status, 0) + 1
            if status not in ALLOWED or "Traceback" in out + err or "internal error" in err:
                failures.append(f"{case}: {' '.join(args)} -> {status}: {err.strip()[-500:]}")
                continue
            if status != 0:
                if len(err.strip().splitlines()) != 1 or not err.startswith("nccl-doctor: error:"):
                    failures.append(f"{case}: {' '.join(args)} -> {status} without one line: "
                                    f"{err[-500:]!r}")
                continue
            if args[1] == "json" and checkable:
                extra = blamed(json.loads(out)) - base.blamed
                if extra:
                    failures.append(f"{case}: blames {sorted(extra)}, which the undamaged "
                                    f"input did not")
        shutil.rmtree(d, ignore_errors=True)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - grown_from) / 1024
    print(f"{MUTANTS} mutants, exit statuses {dict(sorted(statuses.items()))}, "
          f"memory grew {grown:.0f} MB")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
    assert grown < MEMORY_GROWTH_MB
    assert statuses.get(0, 0) > 0 and len(statuses) > 1  # (the mutants did damage, and not all)
