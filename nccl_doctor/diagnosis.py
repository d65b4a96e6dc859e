"""The typed result of an analysis: a ``Diagnosis`` made of ``Finding``s and ``RankSummary``s.

Reporters render it; ``to_json`` is ``report.json`` (schema_version 1, docs/report-json.md).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from nccl_doctor import paths
from nccl_doctor._version import __version__

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
    # the call's frames outside torch, innermost first: {path, line, function, package, version}
    call_path: tuple[Mapping[str, Any], ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
    root_cause: bool = False
    time_ns: int | None = None  # when the divergence happened (orders findings)
    # the branch on the rank that split the ranks (analysis/blame.py): {path, line, text, kind,
    # function, ranks (the side that took it), skips, library, names, culprit}; None: none found
    branch: Mapping[str, Any] | None = None

    @property
    def absent(self) -> tuple[int, ...]:
        """A ``missing_collective``'s ranks that never entered the collective (its culprits may
        be the ranks that did, once the branch on the rank says so); else its culprits."""
        if self.kind is FindingKind.MISSING_COLLECTIVE:
            raw = self.evidence.get("missing_ranks")
            if isinstance(raw, list):
                return tuple(int(r) for r in raw)
        return self.ranks

    @property
    def branch_line(self) -> str | None:
        """The branch as reports print it: ``train.py:28  if batch_idx == 3 and
        trainer.is_global_zero:`` (its else branch, a jump, the library, said after)."""
        b = self.branch
        if not b:
            return None
        where = f"{paths.short_path(str(b.get('path', '?')))}:{b.get('line', '?')}"
        text = f"{where}  {b.get('text', '')}"
        if b.get("kind") == "else":
            text += "  (its else branch)"
        if b.get("skips"):
            ranks = [str(r) for r in b.get("ranks") or ()]
            who = (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}"
                   if ranks else "the odd ranks")
            text += f"  (it kept {who} out of the call the others made)"
        if b.get("library"):
            text += f"  (in {b['library']})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value, "severity": self.severity.value, "title": self.title,
            "detail": self.detail, "ranks": list(self.ranks), "hint": self.hint,
            "group": self.group, "seq": self.seq, "op": self.op, "callsite": self.callsite,
            "entry_callsite": self.entry_callsite,
            "call_path": [dict(frame) for frame in self.call_path],
            "branch": dict(self.branch) if self.branch else None,
            "root_cause": self.root_cause, "evidence": dict(self.evidence),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Finding | None:
        """The finding ``to_json`` wrote (None for anything else: a kept record is input)."""
        try:
            ranks = raw.get("ranks", [])
            seq = raw.get("seq")
            return cls(
                kind=FindingKind(raw["kind"]), severity=Severity(raw["severity"]),
                title=str(raw["title"]), detail=str(raw.get("detail", "")),
                ranks=tuple(int(r) for r in ranks), hint=str(raw.get("hint", "")),
                group=None if raw.get("group") is None else str(raw["group"]),
                seq=None if seq is None else int(seq),
                op=None if raw.get("op") is None else str(raw["op"]),
                callsite=None if raw.get("callsite") is None else str(raw["callsite"]),
                entry_callsite=(None if raw.get("entry_callsite") is None
                                else str(raw["entry_callsite"])),
                call_path=tuple(dict(x) for x in raw.get("call_path") or () if isinstance(x, dict)),
                evidence=dict(raw.get("evidence") or {}),
                root_cause=bool(raw.get("root_cause", False)),
                branch=dict(raw["branch"]) if isinstance(raw.get("branch"), dict) else None,
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
    last_collective: Mapping[str, Any] | None
    stack_summary: str | None
    capture: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "host": self.host, "pid": self.pid, "state": self.state,
            "exit_code": self.exit_code, "signal": self.signal, "exit_detail": self.exit_detail,
            "last_collective": dict(self.last_collective) if self.last_collective else None,
            "stack_summary": self.stack_summary, "capture": dict(self.capture),
        }


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
    findings: tuple[Finding, ...]  # root cause first
    ranks: tuple[RankSummary, ...]
    world_size: int
    command: tuple[str, ...] = ()
    exit_status: int | None = None
    notes: tuple[str, ...] = ()  # what the analysis could not see (incomplete captures, ...)
    groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    source: str = ""
    # Live diagnoses only: the ranks' stacks grouped STAT-style ({ranks, odd, frames root-first,
    # sources}), and how the watchdog came to its verdict ({situation, waited_s, policy, action}).
    stack_classes: tuple[Mapping[str, Any], ...] = ()
    watchdog: Mapping[str, Any] = field(default_factory=dict)
    # Multi-node jobs: which node diagnosed the job, the nodes and what became of each
    nodes: Mapping[str, Any] = field(default_factory=dict)
    # why the diagnosis is partial ("": it is not): ranks whose captures are damaged
    partial: str = ""
    # A job of Ray actors: which actor holds each rank, and what each group is between them
    # ({"actors": {rank: {class, id, name, host}}, "groups": {name: {ranks, role}}})
    ray: Mapping[str, Any] = field(default_factory=dict)

    @property
    def root_cause(self) -> Finding | None:
        return next((f for f in self.findings if f.root_cause), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "tool_version": __version__,
            "command": list(self.command), "verdict": self.verdict.value,
            "exit_status": self.exit_status, "world_size": self.world_size,
            "ranks": [r.to_json() for r in self.ranks],
            "findings": [f.to_json() for f in self.findings],
            "groups": {name: list(ranks) for name, ranks in self.groups.items()},
            "notes": list(self.notes), "source": self.source,
            "stack_classes": [dict(c) for c in self.stack_classes],
            "watchdog": dict(self.watchdog), **({"nodes": dict(self.nodes)} if self.nodes else {}),
            **({"partial": self.partial} if self.partial else {}),
            **({"ray": dict(self.ray)} if self.ray else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Diagnosis | None:
        """The diagnosis ``to_json`` wrote (another node's report: None for anything else)."""
        try:
            findings = tuple(f for f in (Finding.from_json(x) for x in raw.get("findings", []))
                             if f is not None)
            ranks = tuple(RankSummary(
                rank=int(r["rank"]), host=str(r.get("host", "")), pid=int(r.get("pid") or 0),
                state=str(r.get("state", "")), exit_code=r.get("exit_code"),
                signal=r.get("signal"), exit_detail=str(r.get("exit_detail", "")),
                last_collective=r.get("last_collective"), stack_summary=r.get("stack_summary"),
                capture=dict(r.get("capture") or {})) for r in raw.get("ranks", []))
            return cls(
                verdict=Verdict(raw["verdict"]), findings=findings, ranks=ranks,
                world_size=int(raw.get("world_size") or 0),
                command=tuple(str(c) for c in raw.get("command", [])),
                exit_status=raw.get("exit_status"),
                notes=tuple(str(n) for n in raw.get("notes", [])),
                groups={str(k): tuple(v) for k, v in (raw.get("groups") or {}).items()},
                source=str(raw.get("source", "")),
                stack_classes=tuple(raw.get("stack_classes") or ()),
                watchdog=dict(raw.get("watchdog") or {}), nodes=dict(raw.get("nodes") or {}),
                ray=dict(raw.get("ray") or {}),
                partial=str(raw.get("partial") or ""))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def to_json_text(self) -> str:
        """``report.json``'s text."""
        return json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n"
