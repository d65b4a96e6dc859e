"""The typed sections of a ``Diagnosis``: a finding's call path and branch, the stack classes, a
rank's last collective and capture, the nodes and the Ray actors. Each is a frozen dataclass
with its JSON form (``to_json`` / ``from_json``) here, in one place; report.json's shape is
docs/report-json.md. ``from_json`` reads what ``to_json`` wrote (another node's report, a kept
record) and says ``None`` (or raises ``ValueError`` inside a larger parse) for anything else.

A finding's evidence, one class per finding kind, is in ``finding_evidence.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from nccl_doctor import paths
from nccl_doctor.location import Location


def _ranks(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"ranks must be a list, not {type(raw).__name__}")
    return tuple(int(r) for r in raw)


def _opt_str(raw: Any) -> str | None:
    return None if raw is None else str(raw)


def _opt_int(raw: Any) -> int | None:
    return None if raw is None else int(raw)


def _mapping(raw: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{what} must be a JSON object, not {type(raw).__name__}")
    return raw


@dataclass(frozen=True)
class CallFrame:
    """One frame of a finding's call path (innermost first): where, and the package and its
    recorded version when the file is a library's."""

    path: str
    line: int
    function: str = ""
    package: str | None = None
    version: str | None = None
    passes_on: bool = False  # a frame that only passes the call on (a decorator's wrapper)
    from_torch: bool = False  # torch called it back (a module hook)

    def to_json(self) -> dict[str, Any]:
        """The frame's place as a ``Location`` writes it, then its package and version."""
        out = Location(self.path, self.line, self.function, self.passes_on,
                       self.from_torch).to_json()
        out.update(package=self.package, version=self.version)
        return out

    @classmethod
    def from_json(cls, raw: Any) -> CallFrame:
        raw = _mapping(raw, "a call path's frame")
        return cls(path=str(raw.get("path") or "?"), line=int(raw.get("line") or 0),
                   function=str(raw.get("function") or ""), package=_opt_str(raw.get("package")),
                   version=_opt_str(raw.get("version")),
                   passes_on=bool(raw.get("passes_on", False)),
                   from_torch=bool(raw.get("from_torch", False)))


def call_path_from_json(raw: Any) -> tuple[CallFrame, ...]:
    """A call path's frames (a frame that is not one is left out)."""
    if not isinstance(raw, (list, tuple)):
        return ()
    out = []
    for frame in raw:
        try:
            out.append(frame if isinstance(frame, CallFrame) else CallFrame.from_json(frame))
        except (TypeError, ValueError):
            continue
    return tuple(out)


@dataclass(frozen=True)
class Branch:
    """The branch on the rank that split the ranks (analysis/who/blame.py)."""

    path: str
    line: int
    text: str  # the branch's source line
    kind: str  # if | else | elif | while | for | return | break | continue | ...
    function: str
    ranks: tuple[int, ...]  # the side that took it
    skips: bool = False  # it kept ``ranks`` out of the call the others made
    library: str | None = None  # the package it lies in (None: the user's code)
    names: tuple[str, ...] = ()  # the rank-dependent names it reads
    culprit: bool = False  # the culprit's branch (not only the side it was read on)

    @property
    def where(self) -> str:
        """``train.py:28``: the path shortened as reports print it."""
        return f"{paths.short_path(self.path)}:{self.line}"

    @property
    def line_text(self) -> str:
        """The branch as reports print it: ``train.py:28  if batch_idx == 3 and
        trainer.is_global_zero:`` (its else branch, a jump, the library, said after)."""
        text = f"{self.where}  {self.text}"
        if self.kind == "else":
            text += "  (its else branch)"
        if self.skips:
            ranks = [str(r) for r in self.ranks]
            who = (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}"
                   if ranks else "the odd ranks")
            text += f"  (it kept {who} out of the call the others made)"
        if self.library:
            text += f"  (in {self.library})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "text": self.text, "kind": self.kind,
                "function": self.function, "ranks": list(self.ranks), "skips": self.skips,
                "library": self.library, "names": list(self.names),
                **({"culprit": True} if self.culprit else {})}

    @classmethod
    def from_json(cls, raw: Any) -> Branch:
        raw = _mapping(raw, "a branch")
        return cls(path=str(raw.get("path") or "?"), line=int(raw.get("line") or 0),
                   text=str(raw.get("text") or ""), kind=str(raw.get("kind") or ""),
                   function=str(raw.get("function") or ""),
                   ranks=_ranks(raw.get("ranks") or []), skips=bool(raw.get("skips", False)),
                   library=_opt_str(raw.get("library")),
                   names=tuple(str(n) for n in raw.get("names") or ()),
                   culprit=bool(raw.get("culprit", False)))


@dataclass(frozen=True)
class StackClass:
    """Ranks whose collective-making threads had the same stack (STAT-style)."""

    ranks: tuple[int, ...]
    odd: bool  # the odd one out
    frames: tuple[str, ...]  # root first, each "path:line function"
    tail: str = ""  # the class in one line (stacks/summary.class_tail)
    sources: tuple[str, ...] = ()  # how the stacks were taken (py-spy, the in-rank agent)

    @property
    def shown(self) -> str:
        """The class in one line: its tail, else its innermost frames."""
        return self.tail or " -> ".join(self.frames[-3:]) or "no stack"

    def to_json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "odd": self.odd, "frames": list(self.frames),
                "tail": self.tail, "sources": list(self.sources)}

    @classmethod
    def from_json(cls, raw: Any) -> StackClass:
        raw = _mapping(raw, "a stack class")
        return cls(ranks=_ranks(raw.get("ranks") or []), odd=bool(raw.get("odd", False)),
                   frames=tuple(str(f) for f in raw.get("frames") or ()),
                   tail=str(raw.get("tail") or ""),
                   sources=tuple(str(s) for s in raw.get("sources") or ()))


@dataclass(frozen=True)
class LastCollective:
    """A rank's last collective (its innermost: a coalesced call's last part)."""

    group: str
    seq: int | None
    op: str
    state: str  # entered | in_flight | completed | failed | ...
    callsite: str | None = None
    input: str | None = None  # shapes and dtypes, as recorded
    source: str = ""  # how it was recorded: c10d | functional | flight_recorder | ...

    @property
    def text(self) -> str:
        """``all_gather #3 g0 (completed)``."""
        via = " functional" if self.source == "functional" else ""
        return f"{self.op} #{self.seq} g{self.group} ({self.state}{via})"

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "seq": self.seq, "op": self.op, "state": self.state,
                "callsite": self.callsite, "input": self.input, "source": self.source}

    @classmethod
    def from_json(cls, raw: Any) -> LastCollective:
        raw = _mapping(raw, "a last collective")
        return cls(group=str(raw.get("group", "")), seq=_opt_int(raw.get("seq")),
                   op=str(raw.get("op", "")), state=str(raw.get("state", "")),
                   callsite=_opt_str(raw.get("callsite")), input=_opt_str(raw.get("input")),
                   source=str(raw.get("source") or ""))


@dataclass(frozen=True)
class CaptureInfo:
    """A rank's capture file: its name, its records and whether it is whole."""

    file: str
    events: int
    complete: bool
    integrity: str  # what a damaged or partial capture lacks, in words

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "events": self.events, "complete": self.complete,
                "integrity": self.integrity}

    @classmethod
    def from_json(cls, raw: Any) -> CaptureInfo | None:
        """None for ``{}`` (a rank with no capture)."""
        raw = _mapping(raw, "a capture")
        if not raw:
            return None
        return cls(file=str(raw.get("file", "")), events=int(raw.get("events") or 0),
                   complete=bool(raw.get("complete", False)),
                   integrity=str(raw.get("integrity", "")))


@dataclass(frozen=True)
class NodeState:
    """One node of a multi-node job, as the leader last saw it."""

    host: str
    node_rank: int | None
    ranks: tuple[int, ...]
    role: str  # leader | follower
    state: str  # ok | ended | lost

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "node_rank": self.node_rank, "ranks": list(self.ranks),
                "role": self.role, "state": self.state}

    @classmethod
    def from_json(cls, raw: Any) -> NodeState:
        raw = _mapping(raw, "a node")
        return cls(host=str(raw.get("host", "")), node_rank=_opt_int(raw.get("node_rank")),
                   ranks=_ranks(raw.get("ranks") or []), role=str(raw.get("role", "")),
                   state=str(raw.get("state", "")))


@dataclass(frozen=True)
class Nodes:
    """A multi-node job: which node diagnosed it, how the nodes met, and what became of each."""

    diagnosed_by_host: str
    diagnosed_by_node_rank: int | None
    coordinator: str
    rendezvous: str  # where the coordinator's address came from
    expected: int | None  # nodes the job was launched on (None: not known)
    nodes: tuple[NodeState, ...]
    authenticated: bool = False  # the nodes sealed what they exchanged with a key
    key: str = ""  # which key it was, as said ("the key in NCCL_DOCTOR_FEDERATION_KEY")
    problem: str = ""  # why the nodes did not (all) meet
    rejected: int = 0  # values on the store that failed authentication
    missing: int = 0  # expected nodes that never joined

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "diagnosed_by": {"host": self.diagnosed_by_host,
                             "node_rank": self.diagnosed_by_node_rank},
            "coordinator": self.coordinator, "rendezvous": self.rendezvous,
            "expected": self.expected, "nodes": [n.to_json() for n in self.nodes]}
        if self.problem:
            out["problem"] = self.problem
        out["authenticated"] = self.authenticated
        if self.key:
            out["key"] = self.key
        if self.rejected:
            out["rejected"] = self.rejected
        if self.missing:
            out["missing"] = self.missing
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Nodes | None:
        """None for ``{}`` (a job of one node)."""
        raw = _mapping(raw, "nodes")
        if not raw:
            return None
        by = _mapping(raw.get("diagnosed_by") or {}, "diagnosed_by")
        return cls(diagnosed_by_host=str(by.get("host", "")),
                   diagnosed_by_node_rank=_opt_int(by.get("node_rank")),
                   coordinator=str(raw.get("coordinator", "")),
                   rendezvous=str(raw.get("rendezvous", "")),
                   expected=_opt_int(raw.get("expected")),
                   nodes=tuple(NodeState.from_json(n) for n in raw.get("nodes") or ()),
                   authenticated=bool(raw.get("authenticated", False)),
                   key=str(raw.get("key") or ""),
                   problem=str(raw.get("problem") or ""), rejected=int(raw.get("rejected") or 0),
                   missing=int(raw.get("missing") or 0))


@dataclass(frozen=True)
class RayActor:
    """The Ray actor that holds a rank."""

    class_name: str  # the actor's class
    id: str
    name: str
    host: str

    @property
    def label(self) -> str:
        """"Engine 1a2b3c4d" (or the actor's name when it has one)."""
        return f"{self.class_name} {self.name or self.id[:8]}"

    def to_json(self) -> dict[str, Any]:
        return {"class": self.class_name, "id": self.id, "name": self.name, "host": self.host}

    @classmethod
    def from_json(cls, raw: Any) -> RayActor:
        raw = _mapping(raw, "a Ray actor")
        return cls(class_name=str(raw.get("class") or "actor"), id=str(raw.get("id") or ""),
                   name=str(raw.get("name") or ""), host=str(raw.get("host") or ""))


@dataclass(frozen=True)
class RayGroup:
    """A process group between Ray actors, and what it is between them."""

    ranks: tuple[int, ...]
    role: str  # "weight-sync group (Trainer rank 0 -> Engine ranks 1-4)", ...

    def to_json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "role": self.role}

    @classmethod
    def from_json(cls, raw: Any) -> RayGroup:
        raw = _mapping(raw, "a Ray group")
        return cls(ranks=_ranks(raw.get("ranks") or []), role=str(raw.get("role") or ""))


@dataclass(frozen=True)
class Ray:
    """A job of Ray actors: which actor holds each rank, and each group between them."""

    actors: Mapping[int, RayActor]
    groups: Mapping[str, RayGroup]

    def held(self) -> dict[str, list[int]]:
        """"Engine 1a2b3c4d on host" -> the ranks it holds, in rank order."""
        out: dict[str, list[int]] = {}
        for rank, a in sorted(self.actors.items()):
            out.setdefault(f"{a.label} on {a.host}" if a.host else a.label, []).append(rank)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"actors": {str(r): a.to_json() for r, a in sorted(self.actors.items())},
                "groups": {name: g.to_json() for name, g in sorted(self.groups.items())}}

    @classmethod
    def from_json(cls, raw: Any) -> Ray | None:
        """None for ``{}`` (no Ray actor)."""
        raw = _mapping(raw, "ray")
        if not raw:
            return None
        actors = _mapping(raw.get("actors") or {}, "ray.actors")
        groups = _mapping(raw.get("groups") or {}, "ray.groups")
        return cls(actors={int(r): RayActor.from_json(a) for r, a in actors.items()},
                   groups={str(n): RayGroup.from_json(g) for n, g in groups.items()})


@dataclass(frozen=True)
class Attempt:
    """One launch of a job its launcher restarted (torchrun's ``--max-restarts``, a Slurm
    requeue): which it was, its ranks, and what ended it, diagnosed apart from the others."""

    number: int  # 1: the first launch
    restart: int  # the elastic launcher's restart count (TORCHELASTIC_RESTART_COUNT)
    requeue: int  # the scheduler's requeue count (SLURM_RESTART_COUNT)
    ranks: tuple[int, ...]
    verdict: str  # the attempt's own verdict (Verdict's value)
    summary: str  # its root cause's title, or that no problem was found
    started_ns: int | None = None  # its first rank's start

    @property
    def label(self) -> str:
        """``attempt 1`` (``attempt 2 (requeue 1)`` for a scheduler's requeue)."""
        return f"attempt {self.number}" + (f" (requeue {self.requeue})" if self.requeue else "")

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "restart": self.restart, "requeue": self.requeue,
                "ranks": list(self.ranks), "verdict": self.verdict, "summary": self.summary,
                "started_ns": self.started_ns}

    @classmethod
    def from_json(cls, raw: Any) -> Attempt:
        raw = _mapping(raw, "attempt")
        return cls(number=int(raw["number"]), restart=int(raw.get("restart") or 0),
                   requeue=int(raw.get("requeue") or 0), ranks=_ranks(raw.get("ranks", [])),
                   verdict=str(raw.get("verdict", "")), summary=str(raw.get("summary", "")),
                   started_ns=_opt_int(raw.get("started_ns")))


def stack_classes_from_json(raw: Sequence[Any]) -> tuple[StackClass, ...]:
    return tuple(c if isinstance(c, StackClass) else StackClass.from_json(c) for c in raw)
