"""A finding's evidence: one frozen dataclass per finding kind, with its JSON form here (report.json's
``findings[].evidence``, docs/report-json.md).

Each class names the keys its passes write (analysis/*.py: missing, mismatch, exited, hang,
gpu_hang, straggler, sampling, degenerate, lost) and the annotations any finding may get
(``Evidence``: analysis/diagnose.py, analysis/who/blame.py and the known-issue plugins). A key no
class names (another package's annotator) is kept, as it came, in ``extra``. The JSON is
written key by key as before: a key a producer writes is written, one it leaves out is left out
(``always``: the keys written even when empty or null).

Evidence is also a read-only ``Mapping`` of that JSON form, for known-issue annotators written
against report.json's shape (docs/plugins.md: ``{**f.evidence, "known_issue": ...}``, handed
back as a mapping, is parsed into the kind's class). nccl-doctor's own code reads the fields.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

Json = Any  # a JSON value, as the pass wrote it (nested records not typed further here)


@dataclass(frozen=True)
class _Codec:
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _rank_list(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, (list, tuple)):
        raise ValueError("not a list of ranks")
    return tuple(int(r) for r in raw)


def _by_rank(inner: _Codec) -> _Codec:
    def decode(raw: Any) -> dict[int, Any]:
        if not isinstance(raw, Mapping):
            raise ValueError("not a JSON object keyed by rank")
        return {int(k): inner.decode(v) for k, v in raw.items()}
    return _Codec(lambda m: {str(k): inner.encode(v) for k, v in m.items()}, decode)


def _scalar(kind: type) -> _Codec:
    def decode(raw: Any) -> Any:
        if raw is None:
            return None
        if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        if not isinstance(raw, kind) or (kind is int and isinstance(raw, bool)):
            raise ValueError(f"not a {kind.__name__}")
        return raw
    return _Codec(_same, decode)


RAW = _Codec(_same, _same)
STR, INT, FLOAT, BOOL = _scalar(str), _scalar(int), _scalar(float), _scalar(bool)
RANKS = _Codec(list, _rank_list)


def _ev(codec: _Codec = RAW, *, key: str | None = None, default: Any = None,
        factory: Callable[[], Any] | None = None) -> Any:
    """A field of evidence: its JSON key (the field's name unless said) and codec."""
    meta = {"codec": codec, "key": key}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class KnownIssue:
    """What a known-issue rule said of the finding (plugins/known_issues.py)."""

    rule: str  # docs/bugs.md's letter or the rule's id
    mechanism: str
    fix: str
    upstream: str | None = None  # the upstream library's bug, when its version matched
    library: str | None = None  # "transformers 4.46.0"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "mechanism": self.mechanism}
        if self.upstream is not None:
            out["upstream"] = self.upstream
        if self.library is not None:
            out["library"] = self.library
        out["fix"] = self.fix
        return out

    @classmethod
    def from_json(cls, raw: Any) -> KnownIssue:
        if not isinstance(raw, Mapping):
            raise ValueError("a known issue is a JSON object")
        return cls(rule=str(raw.get("rule", "")), mechanism=str(raw.get("mechanism", "")),
                   fix=str(raw.get("fix", "")),
                   upstream=None if raw.get("upstream") is None else str(raw["upstream"]),
                   library=None if raw.get("library") is None else str(raw["library"]))


@dataclass(frozen=True)
class SpinWindow:
    """A GPU whose NCCL kernel spun while its rank waited (analysis/what/gpu_hang.py)."""

    gpu: int
    since: float  # unix seconds
    placed_by: str  # how the rank's GPU was told
    util: float | None
    power_w: float | None
    power_limit_w: float | None
    power_share: float | None
    link_kbs: float | None
    samples: int
    span_s: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> SpinWindow:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("gpu"), int):
            raise ValueError("a spin window is a JSON object with its gpu")
        return cls(**{f.name: raw.get(f.name) for f in dataclasses.fields(cls)})


def _section(cls: Any) -> _Codec:
    return _Codec(lambda v: v.to_json(), cls.from_json)


@dataclass(frozen=True, kw_only=True)
class Evidence(Mapping):
    """What any finding may carry besides its kind's own keys (annotations)."""

    #: rank -> calls of the finding's group nothing recorded just before its call (diagnose)
    unseen: Mapping[int, Json] = _ev(_by_rank(RAW), factory=dict)
    hosts: Mapping[int, str] = _ev(_by_rank(STR), factory=dict)  # the culprits' hosts
    actors: Mapping[int, str] = _ev(_by_rank(STR), factory=dict)  # their Ray actors
    group_role: str | None = _ev(STR)  # what the group is between Ray actors
    consequences: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)  # the cascade
    unanswered: Json = _ev()  # {group, seq, op}: the call a rank that left did not answer
    known_issue: KnownIssue | None = _ev(_section(KnownIssue))
    collective_calls: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)  # plugins
    #: ranks that wait for ranks that wait, through several groups (analysis/what/wait_chain.py):
    #: each link {rank, op, group, group_ranks, seq, waits_for}, then {rank, ends: words}
    wait_chain: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)
    #: the rule ``nccl-doctor check`` finds this root cause by: {code, path, line, column}
    check_rule: Json = _ev()
    extra: Mapping[str, Json] = field(default_factory=dict)  # keys no field names

    def always(self) -> tuple[str, ...]:
        """The keys written even when empty or null (the others: when they hold a value)."""
        return ()

    def to_json(self) -> dict[str, Any]:
        keep = set(self.always())
        out: dict[str, Any] = {}
        own = [f for f in dataclasses.fields(self) if f.metadata.get("codec") is not None]
        shared = {f.name for f in dataclasses.fields(Evidence)}
        for f in sorted(own, key=lambda f: f.name in shared):  # the kind's keys first
            key = f.metadata["key"] or f.name
            value = getattr(self, f.name)
            default = (f.default if f.default is not dataclasses.MISSING
                       else f.default_factory())  # type: ignore[misc]
            if key not in keep and (value is None or (type(value) is type(default)
                                                       and value == default)):
                continue  # (left out, as its pass leaves it out)
            out[key] = None if value is None else f.metadata["codec"].encode(value)
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Evidence:
        """The evidence ``to_json`` wrote; a key no field names, or whose value is not what
        the field holds, is kept as it came in ``extra``."""
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        by_key = {(f.metadata.get("key") or f.name): f for f in dataclasses.fields(cls)
                  if f.metadata.get("codec") is not None}
        for key, value in raw.items():
            f = by_key.get(str(key))
            if f is None:
                extra[str(key)] = value
                continue
            try:
                kwargs[f.name] = (None if value is None
                                  else f.metadata["codec"].decode(value))
            except (TypeError, ValueError, AttributeError, KeyError):
                extra[str(key)] = value
        if "your_line" in raw and "lines_read" in {f.name for f in dataclasses.fields(cls)}:
            kwargs["lines_read"] = True
        return cls(**kwargs, extra=extra)

    # -- the read-only JSON view (annotators written against report.json) --------------------
    @functools.cached_property
    def _json(self) -> dict[str, Any]:
        return self.to_json()

    def __getitem__(self, key: str) -> Any:
        return self._json[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)


@dataclass(frozen=True, kw_only=True)
class DesyncEvidence(Evidence):
    """What the branch on the rank (analysis/who/blame.py) adds to a desync."""

    blame: str | None = _ev(STR)  # missing | branch | both_branched
    branches: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)  # each side's branch
    not_analysed: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)  # {path, why}
    loop: Json = _ev()  # a loop the sides ran a different number of times
    your_line: str | None = _ev(STR)  # the waiting side's line in the user's code
    your_code: str | None = _ev(STR)  # its source text
    #: the blame pass looked for ``your_line`` (written then, null when not readable)
    lines_read: bool = False


@dataclass(frozen=True, kw_only=True)
class MissingEvidence(DesyncEvidence):
    """missing_collective: some ranks wait in a call the others never made."""

    waiting_ranks: tuple[int, ...] = _ev(RANKS, factory=tuple)
    missing_ranks: tuple[int, ...] = _ev(RANKS, factory=tuple)
    input: str | None = _ev(STR)  # the call's shapes and dtypes
    #: rank -> where an absent rank was instead ({category, detail, call_path, your_line})
    instead: Mapping[str, Json] = _ev(factory=dict)
    waiting_states: Mapping[int, str] = _ev(_by_rank(STR), factory=dict)
    stuck: Mapping[int, str] = _ev(_by_rank(STR), factory=dict)  # rank -> why it never came

    def always(self) -> tuple[str, ...]:
        read = ("your_line",) if self.lines_read else ()
        if not self.waiting_ranks:
            return read  # (a hang's missing call, from the stacks: only ``stuck``)
        return ("waiting_ranks", "missing_ranks", "input", "instead", "waiting_states") + read


@dataclass(frozen=True, kw_only=True)
class MismatchEvidence(DesyncEvidence):
    """collective_mismatch: the ranks made different calls at the same number."""

    aspect: str = _ev(STR, default="")  # op | shape | dtype | group | ...
    sides: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)  # each side's call
    majority: Json = _ev()
    why: str = _ev(STR, default="")

    def always(self) -> tuple[str, ...]:
        return ("aspect", "sides", "majority", "why", "blame")


@dataclass(frozen=True, kw_only=True)
class ExitEvidence(Evidence):
    """rank_exited: a rank ended while its peers needed it, raised before joining, or was
    torn down."""

    exit: str = _ev(STR, default="")  # analysis's ExitKind value
    exit_code: int | None = _ev(INT)
    signal: str | None = _ev(STR)
    exception: str | None = _ev(STR)
    last_collective: str | None = _ev(STR)  # "all_gather #3 (group 0)"
    needed_in: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)  # [{group, seq}]
    before_joining: bool = _ev(BOOL, default=False)
    in_init_process_group: bool = _ev(BOOL, default=False)
    pids: Mapping[int, int] = _ev(_by_rank(INT), factory=dict)
    traceback: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)
    teardown: bool = _ev(BOOL, default=False)

    def always(self) -> tuple[str, ...]:
        if self.teardown:
            return ("exit", "signal", "teardown")
        if self.before_joining:
            return ("exit", "exception", "before_joining", "in_init_process_group", "pids",
                    "traceback")
        return ("exit", "exit_code", "signal", "exception", "last_collective", "needed_in")


@dataclass(frozen=True, kw_only=True)
class StallEvidence(Evidence):
    """stall: nothing moves, in a collective (comm) or outside one (compute)."""

    cls: str = _ev(STR, key="class", default="")  # comm | compute
    idle: bool = _ev(BOOL, default=False)  # every rank idle outside collectives
    waited_s: float = _ev(FLOAT, default=0.0)
    stuck: Mapping[int, str] = _ev(_by_rank(STR), factory=dict)

    def always(self) -> tuple[str, ...]:
        return ("class", "waited_s")


@dataclass(frozen=True, kw_only=True)
class GpuBusyEvidence(Evidence):
    """gpu_busy_hang: NCCL kernels spin at ~100% while their ranks wait."""

    waiting_for: tuple[int, ...] = _ev(RANKS, factory=tuple)
    spinning: Mapping[int, SpinWindow] = _ev(_by_rank(_section(SpinWindow)), factory=dict)

    def always(self) -> tuple[str, ...]:
        return ("waiting_for", "spinning")


@dataclass(frozen=True, kw_only=True)
class StragglerEvidence(Evidence):
    """straggler: ranks (or a node) consistently last to arrive (analysis/slow/straggler.py)."""

    median_ms: float = _ev(FLOAT, default=0.0)
    p95_ms: float = _ev(FLOAT, default=0.0)
    last: Mapping[int, int] = _ev(_by_rank(INT), factory=dict)  # collectives it was last to
    considered: int = _ev(INT, default=0)  # collectives compared
    chance: Mapping[int, float] = _ev(_by_rank(FLOAT), factory=dict)
    noise_ms: Mapping[int, float] = _ev(_by_rank(FLOAT), factory=dict)
    doing: Mapping[str, Json] = _ev(factory=dict)  # rank -> its stack samples' frames
    across_hosts: bool = _ev(BOOL, default=False)
    lateness: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)  # lateness table rows
    node: Json = _ev()  # a slow node: {host, ranks, last, chance, per_step_s, ...}

    def always(self) -> tuple[str, ...]:
        return ("median_ms", "p95_ms", "last", "considered", "chance", "noise_ms", "doing",
                "across_hosts", "lateness")


@dataclass(frozen=True, kw_only=True)
class SamplingEvidence(Evidence):
    """identical_completions and shared_rng_state: ranks whose generations match."""

    classes: tuple[tuple[int, ...], ...] = _ev(
        _Codec(lambda cs: [list(c) for c in cs], lambda raw: tuple(_rank_list(c) for c in raw)),
        factory=tuple)
    generations: int = _ev(INT, default=0)
    seeding: Mapping[str, Json] = _ev(factory=dict)  # rank -> how it was seeded
    identical: int | None = _ev(INT)  # identical_completions: generations that matched
    sampling: Json = _ev()
    same_prompts: bool | None = _ev(BOOL)
    source: str | None = _ev(STR)
    shared: int | None = _ev(INT)  # shared_rng_state: generations from the same state

    def always(self) -> tuple[str, ...]:
        if self.shared is not None:
            return ("classes", "generations", "shared", "seeding")
        return ("classes", "generations", "identical", "sampling", "same_prompts", "source",
                "seeding")


@dataclass(frozen=True, kw_only=True)
class DegenerateEvidence(Evidence):
    """degenerate_signal: a training signal gone flat, NaN or exploding."""

    criteria: tuple[str, ...] = _ev(_Codec(list, lambda raw: tuple(str(c) for c in raw)),
                                    factory=tuple)
    steps: Json = _ev()
    at: Mapping[str, Json] = _ev(factory=dict)  # criterion -> the steps it held at

    def always(self) -> tuple[str, ...]:
        return ("criteria", "steps", "at")


@dataclass(frozen=True, kw_only=True)
class NodeLostEvidence(Evidence):
    """node_lost: a host's ranks and supervisor vanished."""

    host: str = _ev(STR, default="")
    node_rank: int | None = _ev(INT)
    ranks: tuple[int, ...] = _ev(RANKS, factory=tuple)

    def always(self) -> tuple[str, ...]:
        return ("host", "node_rank", "ranks")


@dataclass(frozen=True, kw_only=True)
class PipelineImbalanceEvidence(Evidence):
    """pipeline_imbalance: a stage that works longer per step than the others
    (analysis/slow/pipeline_balance.py)."""

    stage: tuple[int, ...] = _ev(RANKS, factory=tuple)  # the slow stage (several: interleaved)
    stages: Mapping[str, float] = _ev(factory=dict)  # stage -> its work per step, s
    excess_per_step_s: float = _ev(FLOAT, default=0.0)  # the slow stage's more, per step
    idle_share: float = _ev(FLOAT, default=0.0)  # the share of a step the others idle
    step_s: float = _ev(FLOAT, default=0.0)
    replicas: int = _ev(INT, default=0)
    steps: int = _ev(INT, default=0)

    def always(self) -> tuple[str, ...]:
        return ("stage", "stages", "excess_per_step_s", "idle_share", "step_s", "replicas",
                "steps")


@dataclass(frozen=True, kw_only=True)
class P2PEvidence(Evidence):
    """p2p_mismatch: a send/receive channel whose ends disagree (analysis/what/p2p.py)."""

    aspect: str = _ev(STR, default="")  # count | shape | dtype | deadlock
    src: int | None = _ev(INT)  # the channel: global ranks, in the finding's group
    dst: int | None = _ev(INT)
    sent: int = _ev(INT, default=0)  # sends src made on it (in the whole capture)
    received: int = _ev(INT, default=0)  # receives dst posted on it
    #: since the last collective of the group both ends completed: {"after", "sent", "received"}
    step: Json = _ev()
    waiting: Mapping[int, str] = _ev(_by_rank(STR), factory=dict)  # rank -> waits | failed
    instead: Mapping[int, str] = _ev(_by_rank(STR), factory=dict)  # the short end, meanwhile
    loops: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)  # each end's loop
    message: int | None = _ev(INT)  # shape/dtype: the first message (1-based) that differs
    differing: int = _ev(INT, default=0)  # shape/dtype: how many messages differ
    sent_input: str | None = _ev(STR)  # shape/dtype: what was sent, and into what received
    received_input: str | None = _ev(STR)
    cycle: tuple[int, ...] = _ev(RANKS, factory=tuple)  # deadlock: each waits on the next

    def always(self) -> tuple[str, ...]:
        return ("aspect", "src", "dst", "sent", "received")


@dataclass(frozen=True, kw_only=True)
class GroupMismatchEvidence(Evidence):
    """group_mismatch: ranks that made process groups differently (analysis/what/groups.py)."""

    aspect: str = _ev(STR, default="")  # never_made | order
    group: tuple[int, ...] = _ev(RANKS, factory=tuple)  # the group some ranks never made
    made_by: tuple[int, ...] = _ev(RANKS, factory=tuple)
    waiting: tuple[int, ...] = _ev(RANKS, factory=tuple)  # ranks still inside a group's making

    def always(self) -> tuple[str, ...]:
        return ("aspect", "group", "made_by", "waiting")


@dataclass(frozen=True, kw_only=True)
class BlockedWaitEvidence(Evidence):
    """blocked_wait: ranks blocked in torch.distributed's own waits (analysis/what/hang.py)."""

    place: Mapping[int, str] = _ev(_by_rank(STR), factory=dict)  # rank -> store | rendezvous ...
    waiting_ranks: tuple[int, ...] = _ev(RANKS, factory=tuple)  # the ranks in a collective
    # the rendezvous each rank joins ("127.0.0.1:29500 (world size 4)"): ranks told others
    rendezvous: Mapping[int, str] = _ev(_by_rank(STR), factory=dict)
    #: a rank that never joined, whose process was found on this host: {pid, place, frame}
    absent_at: Mapping[int, Json] = _ev(_by_rank(RAW), factory=dict)

    def always(self) -> tuple[str, ...]:
        return ("place", "waiting_ranks")


@dataclass(frozen=True, kw_only=True)
class StepSkewEvidence(Evidence):
    """step_skew: calls paired across different steps (analysis/silent/step_skew.py)."""

    # rank -> the step of its call of the first aligned call whose steps differ
    steps: Mapping[int, int] = _ev(_by_rank(INT), factory=dict)
    # rank -> the steps it made no call of the site in
    skipped: Mapping[int, Json] = _ev(_by_rank(RAW), factory=dict)
    groups: tuple[Json, ...] = _ev(_Codec(list, tuple), factory=tuple)  # {group, seq, pairs}
    marker: Json = _ev()  # the call that counts the steps: {path, line, op, per_step}
    data_jump: Json = _ev()  # the jump before the call, when the source shows one
    branch: Json = _ev()  # else the branch on the rank that leaves the call out of a pass

    def always(self) -> tuple[str, ...]:
        return ("steps", "skipped", "groups", "marker")


#: each finding kind's evidence class (by FindingKind value)
BY_KIND: dict[str, type[Evidence]] = {
    "missing_collective": MissingEvidence, "collective_mismatch": MismatchEvidence,
    "rank_exited": ExitEvidence, "stall": StallEvidence, "gpu_busy_hang": GpuBusyEvidence,
    "straggler": StragglerEvidence, "shared_rng_state": SamplingEvidence,
    "identical_completions": SamplingEvidence, "degenerate_signal": DegenerateEvidence,
    "node_lost": NodeLostEvidence,
    "p2p_mismatch": P2PEvidence,
    "group_mismatch": GroupMismatchEvidence, "blocked_wait": BlockedWaitEvidence,
    "pipeline_imbalance": PipelineImbalanceEvidence, "step_skew": StepSkewEvidence,
}


def evidence_for(kind: str, raw: Mapping[str, Any] | None) -> Evidence:
    """``raw`` (a JSON mapping, or evidence already typed) as kind ``kind``'s evidence."""
    cls = BY_KIND.get(kind, Evidence)
    if isinstance(raw, cls):
        return raw
    return cls.from_json(dict(raw or {}))
