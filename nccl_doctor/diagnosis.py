"""The typed result of an analysis: a ``Diagnosis`` made of ``Finding``s and ``RankSummary``s.

Reporters render it; ``to_json`` is ``report.json`` (schema_version 1, docs/report-json.md).
In a notebook a ``Diagnosis`` or a ``Finding`` shows as report.html's fragment (``_repr_html_``,
reporters/html.py ``fragment``); its ``repr`` is one short line.
Its sections are typed: a finding's evidence (one class per kind, finding_evidence.py), its
call path and branch, the stack classes, each rank's last collective and capture, the nodes and
the Ray actors (sections.py), each with its JSON form beside it.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from nccl_doctor import words
from nccl_doctor._version import __version__
from nccl_doctor.capture.roles import Role
from nccl_doctor.finding_evidence import Evidence, MissingEvidence, evidence_for
from nccl_doctor.sections import (
    Attempt, Branch, CallFrame, CaptureInfo, LastCollective, Nodes, Ray, StackClass, call_path_from_json,
    stack_classes_from_json)
from nccl_doctor.watch_account import WatchAccount

SCHEMA_VERSION = 1


class Verdict(str, enum.Enum):
    OK = "ok"
    SUSPECT = "suspect"
    HANG = "hang"
    CRASH = "crash"
    # replay of a run whose end is not recorded (still running, or its supervisor was lost):
    # what is certain is reported, a hang is not called
    UNFINISHED = "unfinished"
    # no rank of the job was recorded (none joined a process group under the recorder):
    # nothing is known, which is never "ok"
    NOT_RECORDED = "not_recorded"
    # a signal from outside ended the job (the user's Ctrl-C, a scheduler's time limit or
    # preemption, a kill) before it finished, and nothing had failed before it
    INTERRUPTED = "interrupted"


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class FindingKind(str, enum.Enum):
    MISSING_COLLECTIVE = "missing_collective"
    COLLECTIVE_MISMATCH = "collective_mismatch"
    RANK_EXITED = "rank_exited"
    STALL = "stall"
    GPU_BUSY_HANG = "gpu_busy_hang"
    STRAGGLER = "straggler"
    SHARED_RNG_STATE = "shared_rng_state"
    IDENTICAL_COMPLETIONS = "identical_completions"
    DEGENERATE_SIGNAL = "degenerate_signal"
    NODE_LOST = "node_lost"  # a host's ranks and supervisor vanished (multi-node jobs)
    # a send/receive channel (src, dst, group) whose two ends disagree: one end sent fewer
    # messages than the other waits for, or a message's shape/dtype differs (analysis: p2p)
    P2P_MISMATCH = "p2p_mismatch"
    # the ranks made process groups differently (a new_group made by some ranks only, or in a
    # different order): from then on the same group has different names on different ranks
    GROUP_MISMATCH = "group_mismatch"
    # a rank blocked outside any collective (a store wait, the rendezvous, communicator init,
    # data loading, a lock) while its peers wait for it; or every rank blocked in such waits
    BLOCKED_WAIT = "blocked_wait"
    # a pipeline stage slower than the others (info: the cost per step of the imbalance)
    PIPELINE_IMBALANCE = "pipeline_imbalance"
    # the ranks still pair their calls, but from different steps: a rank skipped one step's
    # call and made the next's (a silent desync; analysis/silent/step_skew.py)
    STEP_SKEW = "step_skew"


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    severity: Severity
    title: str  # one line: what went wrong, where
    detail: str  # a few lines: both sides, what each rank did
    ranks: tuple[int, ...]  # the culprit rank(s)
    hint: str = ""  # how to fix it
    group: str | None = None
    seq: int | None = None  # sequence number within the group (collectives only)
    op: str | None = None
    callsite: str | None = None  # "path:line" of the culprit's call: the line that issued it
    # the user's line that led to ``callsite`` when a library issued the call ("path:line")
    entry_callsite: str | None = None
    # the call's frames outside torch, innermost first
    call_path: tuple[CallFrame, ...] = ()
    # the kind's evidence (finding_evidence.BY_KIND); a JSON mapping given is parsed into it
    evidence: Evidence = field(default_factory=Evidence)
    root_cause: bool = False
    time_ns: int | None = None  # when the divergence happened (orders findings)
    # the branch on the rank that split the ranks (analysis/who/blame.py); None: none found
    branch: Branch | None = None
    # an earlier launch attempt's root cause (its number, 1 the first: Diagnosis.attempts);
    # None: a finding of the attempt the verdict is about
    attempt: int | None = None

    def __post_init__(self) -> None:
        # Annotators written against report.json's shape hand back mappings (docs/plugins.md):
        # parsed here, once, into the typed sections.
        evidence = evidence_for(self.kind.value, self.evidence)
        if evidence is not self.evidence:
            object.__setattr__(self, "evidence", evidence)
        if any(not isinstance(frame, CallFrame) for frame in self.call_path):
            object.__setattr__(self, "call_path", call_path_from_json(self.call_path))
        if self.branch is not None and not isinstance(self.branch, Branch):
            object.__setattr__(self, "branch", Branch.from_json(self.branch))

    def same_call(self, other: Finding) -> bool:
        """Whether ``other`` names the same divergence (kind, group, sequence number)."""
        return (self.kind, self.group, self.seq) == (other.kind, other.group, other.seq)

    @property
    def absent(self) -> tuple[int, ...]:
        """A ``missing_collective``'s ranks that never entered the collective (its culprits may
        be the ranks that did, once the branch on the rank says so); else its culprits."""
        ev = self.evidence
        if isinstance(ev, MissingEvidence) and ev.waiting_ranks:
            return ev.missing_ranks
        return self.ranks

    @property
    def branch_line(self) -> str | None:
        """The branch as reports print it: ``train.py:28  if batch_idx == 3 and
        trainer.is_global_zero:`` (its else branch, a jump, the library, said after)."""
        return self.branch.line_text if self.branch is not None else None

    def __repr__(self) -> str:
        """One line: ``<Finding error collective_mismatch (root cause) rank 1: all_reduce /
        broadcast #6 of group 0: ops differ (...) at train.py:15>``."""
        listed = _cut(words.ranges(self.ranks, ","), 24)
        ranks = f" {'rank' if len(self.ranks) == 1 else 'ranks'} {listed}" if self.ranks else ""
        return (f"<Finding {self.severity.value} {self.kind.value}"
                f"{' (root cause)' if self.root_cause else ''}{ranks}: {_cut(self.title, 64)}"
                f"{_at(self.callsite)}>")

    def _repr_html_(self) -> str | None:
        """The finding as report.html shows it, alone (a notebook's output: ``notebook_html``)."""
        return notebook_html(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value, "severity": self.severity.value, "title": self.title,
            "detail": self.detail, "ranks": list(self.ranks), "hint": self.hint,
            "group": self.group, "seq": self.seq, "op": self.op, "callsite": self.callsite,
            "entry_callsite": self.entry_callsite,
            "call_path": [frame.to_json() for frame in self.call_path],
            "branch": self.branch.to_json() if self.branch is not None else None,
            "root_cause": self.root_cause, "evidence": self.evidence.to_json(),
            **({"attempt": self.attempt} if self.attempt is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Finding | None:
        """The finding ``to_json`` wrote (None for anything else: a kept record is input)."""
        try:
            ranks = raw.get("ranks", [])
            seq = raw.get("seq")
            kind = FindingKind(raw["kind"])
            return cls(
                kind=kind, severity=Severity(raw["severity"]),
                title=str(raw["title"]), detail=str(raw.get("detail", "")),
                ranks=tuple(int(r) for r in ranks), hint=str(raw.get("hint", "")),
                group=None if raw.get("group") is None else str(raw["group"]),
                seq=None if seq is None else int(seq),
                op=None if raw.get("op") is None else str(raw["op"]),
                callsite=None if raw.get("callsite") is None else str(raw["callsite"]),
                entry_callsite=(None if raw.get("entry_callsite") is None
                                else str(raw["entry_callsite"])),
                call_path=call_path_from_json(raw.get("call_path")),
                evidence=evidence_for(kind.value, _object(raw.get("evidence") or {})),
                root_cause=bool(raw.get("root_cause", False)),
                branch=Branch.from_json(raw["branch"]) if raw.get("branch") else None,
                attempt=None if raw.get("attempt") is None else int(raw["attempt"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass(frozen=True)
class RankSummary:
    rank: int
    host: str
    pid: int
    state: str  # exited | exception | signal | vanished | running | blocked | no_capture
    exit_code: int | None
    signal: str | None
    exit_detail: str
    last_collective: LastCollective | None
    stack_summary: str | None
    capture: CaptureInfo | None  # None: the rank left no capture
    # its coordinates (mesh, pipeline stage, groups: analysis/who/roles.py); None when nothing was
    # noted or inferred beyond its groups
    role: Role | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "host": self.host, "pid": self.pid, "state": self.state,
            "exit_code": self.exit_code, "signal": self.signal, "exit_detail": self.exit_detail,
            "last_collective": (self.last_collective.to_json()
                                if self.last_collective is not None else None),
            "stack_summary": self.stack_summary,
            "capture": self.capture.to_json() if self.capture is not None else {},
            **({"role": self.role.to_json()} if self.role is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RankSummary:
        """The summary ``to_json`` wrote (raises ``KeyError``/``ValueError``/``TypeError`` for
        anything else)."""
        code, last = raw.get("exit_code"), raw.get("last_collective")
        return cls(
            rank=int(raw["rank"]), host=str(raw.get("host", "")), pid=int(raw.get("pid") or 0),
            state=str(raw.get("state", "")), exit_code=None if code is None else int(code),
            signal=None if raw.get("signal") is None else str(raw["signal"]),
            exit_detail=str(raw.get("exit_detail", "")),
            last_collective=LastCollective.from_json(last) if last else None,
            stack_summary=(None if raw.get("stack_summary") is None
                           else str(raw["stack_summary"])),
            capture=CaptureInfo.from_json(raw.get("capture") or {}),
            role=Role.from_json(raw["role"]) if raw.get("role") else None)


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
    findings: tuple[Finding, ...]  # root cause first
    ranks: tuple[RankSummary, ...]
    world_size: int
    command: tuple[str, ...] = ()
    exit_status: int | None = None
    notes: tuple[str, ...] = ()  # what the analysis could not see (incomplete captures, ...)
    # what is said for the record only (report.json, the HTML page; not the console): what
    # changes nothing in a healthy run (calls issued from C++, which the recorder does not see)
    details: tuple[str, ...] = ()
    groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    source: str = ""
    # Live diagnoses only: the ranks' stacks grouped STAT-style, and how the watchdog came to
    # its verdict.
    stack_classes: tuple[StackClass, ...] = ()
    watchdog: WatchAccount = field(default_factory=WatchAccount)
    # Multi-node jobs: which node diagnosed the job, the nodes and what became of each
    nodes: Nodes | None = None
    # why the diagnosis is partial ("": it is not): ranks whose captures are damaged
    partial: str = ""
    # A job of Ray actors: which actor holds each rank, and what each group is between them
    ray: Ray | None = None
    # A job its launcher restarted: every launch attempt, the first first; the verdict, the
    # ranks and the findings but those marked with an ``attempt`` are the last one's
    attempts: tuple[Attempt, ...] = ()

    @property
    def root_cause(self) -> Finding | None:
        return next((f for f in self.findings if f.root_cause), None)

    def __repr__(self) -> str:
        """One line: ``<Diagnosis hang: all_reduce / broadcast #6 of group 0: ops differ (...)
        at train.py:15 - 2 findings, 4 ranks>`` (the root cause's title, where it ran)."""
        root = self.root_cause
        what = f": {_cut(root.title, 64)}{_at(root.callsite)}" if root is not None else ""
        n = len(self.findings)
        return (f"<Diagnosis {self.verdict.value}{what} - {n} finding{'' if n == 1 else 's'}, "
                f"{self.world_size} rank{'' if self.world_size == 1 else 's'}>")

    def _repr_html_(self) -> str | None:
        """report.html's content (a notebook's output: ``notebook_html``), with the stacks'
        tree; the timeline is drawn from the captures (``Job``'s display)."""
        return notebook_html(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "tool_version": __version__,
            "command": list(self.command), "verdict": self.verdict.value,
            "exit_status": self.exit_status, "world_size": self.world_size,
            "ranks": [r.to_json() for r in self.ranks],
            "findings": [f.to_json() for f in self.findings],
            "groups": {name: list(ranks) for name, ranks in self.groups.items()},
            "notes": list(self.notes), "source": self.source,
            **({"details": list(self.details)} if self.details else {}),
            "stack_classes": [c.to_json() for c in self.stack_classes],
            "watchdog": self.watchdog.to_json(),
            **({"nodes": self.nodes.to_json()} if self.nodes is not None else {}),
            **({"partial": self.partial} if self.partial else {}),
            **({"ray": self.ray.to_json()} if self.ray is not None else {}),
            **({"attempts": [a.to_json() for a in self.attempts]} if self.attempts else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Diagnosis | None:
        """The diagnosis ``to_json`` wrote (another node's report: None for anything else)."""
        try:
            findings = tuple(f for f in (Finding.from_json(x) for x in raw.get("findings", []))
                             if f is not None)
            ranks = tuple(RankSummary.from_json(_object(r)) for r in raw.get("ranks", []))
            return cls(
                verdict=Verdict(raw["verdict"]), findings=findings, ranks=ranks,
                world_size=int(raw.get("world_size") or 0),
                command=tuple(str(c) for c in raw.get("command", [])),
                exit_status=raw.get("exit_status"),
                notes=tuple(str(n) for n in raw.get("notes", [])),
                details=tuple(str(n) for n in raw.get("details") or []),
                groups={str(k): tuple(v) for k, v in (raw.get("groups") or {}).items()},
                source=str(raw.get("source", "")),
                stack_classes=stack_classes_from_json(raw.get("stack_classes") or ()),
                watchdog=WatchAccount.from_json(raw.get("watchdog")),
                nodes=Nodes.from_json(raw.get("nodes") or {}),
                ray=Ray.from_json(raw.get("ray") or {}),
                partial=str(raw.get("partial") or ""),
                attempts=tuple(Attempt.from_json(a) for a in raw.get("attempts") or ()))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def to_json_text(self) -> str:
        """``report.json``'s text."""
        return json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n"


def notebook_html(obj: Diagnosis | Finding) -> str | None:
    """``obj`` as a notebook shows it: the first renderer of the plugin group
    ``nccl_doctor.notebook`` that draws it - nccl-doctor's own is report.html's fragment
    (data/notebook.py) - or None (the notebook shows ``repr``)."""
    from nccl_doctor.entry_points import NOTEBOOK, load

    for _name, render, _error in load(NOTEBOOK):
        drawn = render(obj) if callable(render) else None
        if drawn is not None:
            return str(drawn)
    return None


def _cut(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, its control characters shown
    (reporters/escape.py: it comes from the job)."""
    from nccl_doctor.reporters.escape import visible

    text = visible(" ".join(text.split()))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _at(callsite: str | None) -> str:
    """`` at train.py:15``: a callsite as the reports print it (short), at most 40 characters
    (its end kept: the file's name and line)."""
    if not callsite:
        return ""
    from nccl_doctor.paths import short_path
    from nccl_doctor.reporters.escape import visible

    place = visible(short_path(callsite))
    return f" at {place if len(place) <= 40 else '...' + place[-37:]}"


def _object(raw: Any) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected a JSON object, not {type(raw).__name__}")
    return raw
