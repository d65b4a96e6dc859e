"""Run the passes, pick the root cause, and assemble the ``Diagnosis``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from nccl_doctor import paths, words
from nccl_doctor.analysis.who import actors, blame
from nccl_doctor.analysis.calls import annotate, ends
from nccl_doctor.analysis.what import replayed
from nccl_doctor.analysis.why.check_rule import with_rule
from nccl_doctor.analysis.slow import straggler
from nccl_doctor.analysis.calls.align import (
    UNSEEN_WHY, blocked_event, last_leaf, timelines, unseen_lines,
)
from nccl_doctor.analysis.calls.wording import call_name, call_site, ranks_text
from nccl_doctor.analysis.what.desync import HANGING, first_divergence_per_group
from nccl_doctor.analysis.what.exited import detect_rank_exited, early_stopped, first_line
from nccl_doctor.analysis.what.lost import detect_node_lost
from nccl_doctor.analysis.what.wait_chain import (
    behind, leads_on, wait_links, with_wait_chains,
)
from nccl_doctor.analysis.what.first_error import first_error
from nccl_doctor.analysis.what.groups import detect_group_mismatch
from nccl_doctor.analysis.what.rendezvous import detect_rendezvous
from nccl_doctor.analysis.what.gpu_hang import detect_gpu_busy_hang
from nccl_doctor.analysis.what.mismatch import detect_collective_mismatch
from nccl_doctor.analysis.what.p2p import detect_p2p_mismatch, without_p2p_waits
from nccl_doctor.analysis.what.missing import detect_missing_collective
from nccl_doctor.analysis.silent.sampling import (
    detect_identical_completions, detect_shared_rng_state,
)
from nccl_doctor.analysis.silent.degenerate import detect_degenerate_signal
from nccl_doctor.analysis.silent.step_skew import detect_step_skew
from nccl_doctor.analysis.slow.pipeline_balance import detect_pipeline_imbalance
from nccl_doctor.analysis.who.roles import mesh_groups, roles
from nccl_doctor.analysis.slow.straggler import detect_straggler
from nccl_doctor.capture.format import CAPTURE_SUFFIX
from nccl_doctor.capture.roles import Role
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, RankSummary, Severity, Verdict
from nccl_doctor.finding_evidence import DesyncEvidence, ExitEvidence
from nccl_doctor.model import EventKind, EventState, ExitKind, RankTrace, TraceSet
from nccl_doctor.sections import CaptureInfo, LastCollective
from nccl_doctor.watch_log import WatchLog

Pass = Callable[[TraceSet], list[Finding]]

#: The analysis passes, in order. Each is pure and accepts any TraceSet, empty included.
PASSES: tuple[Pass, ...] = (
    detect_rendezvous,
    detect_group_mismatch,
    detect_collective_mismatch,
    detect_missing_collective,
    detect_p2p_mismatch,
    detect_rank_exited,
    detect_node_lost,
    detect_identical_completions,
    detect_shared_rng_state,
    detect_degenerate_signal,
    detect_step_skew,
    detect_straggler,
    detect_pipeline_imbalance,
    detect_gpu_busy_hang,
)
#: The passes for silent errors only (the supervisor runs them on a healthy job while it runs).
SILENT_PASSES: tuple[Pass, ...] = (
    detect_identical_completions, detect_shared_rng_state, detect_degenerate_signal,
    detect_step_skew,
)

NOT_RECORDED_NOTE = (
    "no rank joined a process group under the recorder: nothing to diagnose if the program "
    "makes no torch.distributed calls; else its ranks did not inherit nccl-doctor's "
    "environment (a Ray cluster started before, a scheduler's launcher, a container: "
    "docs/findings.md#verdicts)"
)

def _not_recorded(traces: TraceSet) -> str:
    """Why nothing was recorded: what the ranks said of it (a full disk, an --out they could
    not write), else that no process of the job inherited the recorder."""
    if not traces.unrecorded:
        return NOT_RECORDED_NOTE
    by_why: dict[str, list[int]] = {}
    for rank, u in sorted(traces.unrecorded.items()):
        by_why.setdefault(u.why, []).append(rank)
    said = "; ".join(f"{ranks_text(ranks)}: {why}" for why, ranks in by_why.items())
    return (f"no rank was recorded, and {'the rank' if len(traces.unrecorded) == 1 else 'each'} "
            f"said why: {said}")


_STATE = {
    ExitKind.CLEAN: "exited", ExitKind.EXCEPTION: "exception", ExitKind.SIGNAL: "signal",
    ExitKind.VANISHED: "vanished", ExitKind.STOPPED: "stopped", ExitKind.LOST: "lost",
    ExitKind.FINISHED: "finished",
}


def analyze(traces: TraceSet, passes: tuple[Pass, ...] = PASSES,
            annotators: Sequence[annotate.Annotator] | None = None,
            watch: WatchLog | None = None) -> Diagnosis:
    """The passes' findings, ranked, as a ``Diagnosis``, then through ``annotators`` (default:
    every installed known-issue plugin, nccl_doctor.analysis.calls.annotate); a hang the watchdog
    called stands (``watch``: its events, typed, default the record the traces carry: the live
    report it made is one of them, taken as it is)."""
    traces = ends.with_finished_marked(traces)
    found, notes = [], list(traces.problems)
    for p in passes:
        try:
            found.extend(p(traces))
        except Exception as err:  # a capture is input: one odd note must not lose the report
            notes.append(f"analysis pass {p.__name__} failed on this capture ({err!r}); its "
                         "findings are missing")
    findings = _inside_a_mismatch(first_divergence_per_group(found))
    # a rank missing from a collective because it waits in a short p2p channel: the channel's
    # finding is the cause (analysis/what/p2p.py), never the stage split as a skipping branch
    findings = without_p2p_waits(findings)
    if traces.unfinished:
        findings, notes = _while_running(findings, traces, notes)
    # calls whose absent ranks have not reached them yet (analysis/what/wait_chain.py
    # ``behind``): never blamed on a branch (a jump the data decided is still named: the ranks
    # that took it did), never the root cause. Read once, with the sources blame reads.
    sources = blame.sources_for(traces)
    try:
        not_yet_there = {_call(f) for f in findings if behind(f, traces, sources)}
    except Exception as err:  # as for a pass: the report goes on without it
        not_yet_there = set()
        notes.append(f"telling the ranks behind a call failed on this capture ({err!r})")
    try:  # who is wrong, and why: the branch on the rank
        findings = [f if _call(f) in not_yet_there and s.branch is not None and s.branch.culprit
                    else s for f, s in zip(findings, blame.settle(findings, traces, sources))]
    except Exception as err:  # as for a pass: the report goes on without it
        notes.append(f"reading the branch on the rank failed on this capture ({err!r})")
    findings = _rank_findings(findings, traces, not_yet_there)
    if not any(f.root_cause for f in findings) and _verdict(findings, traces) in (
            Verdict.CRASH, Verdict.HANG):
        # every verdict but ok has a root cause: at the least the run's first error
        # (analysis/what/first_error.py), where no pass found a reason (every rank failed in one
        # call)
        fallback = first_error(traces)
        said = next((f for f in findings if fallback is not None and f.kind is
                     FindingKind.RANK_EXITED and set(fallback.ranks) <= set(f.ranks)), None)
        if said is not None:  # a finding says how that rank ended already (a warning): it
            findings = [replace(said, root_cause=True)] + [f for f in findings if f is not said]
        elif fallback is not None:
            findings = [replace(fallback, root_cause=True)] + findings
    findings = _on_hosts(findings, traces)
    try:  # ranks that wait for ranks that wait, through several groups
        findings = with_wait_chains(findings, traces, mesh_groups(traces))
    except Exception as err:  # as for a pass: the report goes on without it
        notes.append(f"following the wait chains failed on this capture ({err!r})")
    try:  # the rule nccl-doctor check finds the root cause by, before the run
        findings = with_rule(findings, traces)
    except Exception as err:  # as for a pass: the report goes on without it
        notes.append(f"reading the branch's file as nccl-doctor check does failed ({err!r})")
    try:
        findings = _with_unseen(findings, traces)
    except Exception as err:  # as for a pass: the report goes on without it
        notes.append(f"placing the unrecorded calls failed on this capture ({err!r})")
    unseen: list[str] = []
    try:
        unseen = unseen_lines(traces)
    except Exception as err:  # as for a pass: the report goes on without it
        notes.append(f"looking for unrecorded calls failed on this capture ({err!r})")
    for rank, u in traces.unrecorded.items():
        on = f" on {u.host}" if u.host else ""
        if u.damaged:
            notes.append(f"rank {rank}{on}: {u.why}: what it did is not seen; it is never blamed "
                         "for what its file lost, and may be the rank others wait for; the "
                         "diagnosis is partial")
            continue
        notes.append(f"rank {rank}{on} was not recorded: {u.why}; what it did is not seen: it is "
                     "never counted as missing from a collective, and may be the rank others wait "
                     "for")
    old = sorted(r for r, t in traces.ranks.items() if not t.paths_recorded)
    if old:
        notes.append(f"{ranks_text(old)} recorded by an nccl-doctor from before call paths "
                     "(capture format 1): their calls name the user's line and the API's caller "
                     "only, not the library line that issued them")
    if traces.partial:
        notes.append(f"{traces.partial}: the ranks with no capture here are not seen (other "
                     "hosts, or files not given); nothing is said about them")
    if traces.joining and not traces.ranks:
        notes.append(f"{ranks_text(sorted(traces.joining))} began init_process_group and "
                     "none returned from it (the rendezvous never completed): nothing was "
                     "recorded after it")
    elif not traces.ranks and not traces.early_exits:
        notes.append(_not_recorded(traces))
    if detect_straggler in passes:
        try:
            unmeasured = straggler.unmeasured_note(traces)
        except Exception:  # as for a pass: the report goes on without it
            unmeasured = None
        if unmeasured:
            notes.append(unmeasured)
    if traces.gpu is not None and not traces.gpu.available and may_use_cuda(traces):
        notes.append(f"GPUs not sampled: {traces.gpu.reason}")
    elif traces.gpu is not None and traces.gpu.stopped:
        notes.append(f"{traces.gpu.stopped} (GPU evidence after that is missing)")
    annotators = annotate.installed() if annotators is None else annotators
    verdict = _verdict(findings, traces)
    # calls issued from C++ change nothing in a healthy run: said for the record only
    healthy = verdict is Verdict.OK
    diagnosis = annotate.apply(Diagnosis(
        verdict=verdict, findings=tuple(findings),
        ranks=tuple(_summaries(traces)), world_size=traces.world_size, command=traces.command,
        exit_status=traces.exit_status, notes=tuple(notes if healthy else [*notes, *unseen]),
        details=tuple(unseen if healthy else ()),
        groups={name: g.ranks for name, g in sorted(traces.groups.items())}, source=traces.source,
        partial=damage_partial(traces), ray=actors.summary(traces),
    ), annotators, annotate.versions_of(traces))
    # a hang the live watchdog called stands (its kept record: replay reaches the live verdict)
    return replayed.with_watch(diagnosis, traces, annotators, watch)


def may_use_cuda(traces: TraceSet) -> bool:
    """Whether the job may have run on CUDA (and the GPU sampler's failure is worth a note): a
    process group that may run NCCL (``nccl``, ``cpu:gloo,cuda:nccl``, or ``undefined`` or not
    recorded: ``init_process_group()`` with no backend), or a rank the sampler placed on a GPU.
    A job whose groups all run on gloo (or mpi) used none."""
    gpu = traces.gpu
    return (any(g.backend in ("", "undefined") or "nccl" in g.backend
                for g in traces.groups.values())
            or (gpu is not None and bool(gpu.ranks)))


def damage_partial(traces: TraceSet) -> str:
    """Why the diagnosis is partial, in a few words ("" when no capture is damaged)."""
    damaged = sorted(traces.damaged_ranks())
    if not damaged:
        return ""
    return (f"the capture{'s' if len(damaged) > 1 else ''} of {ranks_text(damaged)} "
            f"{words.verb(damaged, 'is')} damaged")


def _inside_a_mismatch(findings: list[Finding]) -> list[Finding]:
    """A rank that vanished (no exit record: torchrun's SIGTERM once a peer failed, or a kill)
    while inside a collective whose calls did not match is that mismatch's consequence: the
    collective could never complete. Its exit stays in the root cause's consequences. (A rank
    that raised or was signalled inside a collective is already left out by rank_exited.)"""
    mismatched = {(f.group, f.seq) for f in findings
                  if f.kind is FindingKind.COLLECTIVE_MISMATCH and f.group is not None}
    return [f for f in findings if not (
        _vanished(f) and (f.group, f.seq) in mismatched)]


#: what only the job's end can tell: a rank behind its peers while the job still runs (or was
#: cut off) is behind, not missing, and a GPU polling for it is waiting, not hung
_NEEDS_THE_END = (FindingKind.MISSING_COLLECTIVE, FindingKind.GPU_BUSY_HANG)


def _while_running(findings: list[Finding], traces: TraceSet,
                   notes: list[str]) -> tuple[list[Finding], list[str]]:
    """A run whose end is unknown: what is certain stays a finding (two ranks in different
    collectives at one sequence number, identical completions); the rest becomes notes."""
    kept = [f for f in findings if f.kind not in _NEEDS_THE_END]
    said = [f"not a hang until the job is seen to stop: {f.title}" for f in findings
            if f.kind in _NEEDS_THE_END]
    return kept, [traces.unfinished] + said + notes


def _call(f: Finding) -> tuple:
    """A finding's call, as ``Finding.same_call`` compares them (its kind, group and number)."""
    return f.kind, f.group, f.seq


def _rank_findings(findings: list[Finding], traces: TraceSet,
                   not_yet_there: set[tuple] = frozenset()) -> list[Finding]:
    """Mark the root cause and put it first; later findings are consequences or context."""
    errors = [f for f in findings if f.severity is Severity.ERROR]
    if not errors:
        return findings
    lost = {r for f in errors if f.kind is FindingKind.NODE_LOST for r in f.ranks}
    if lost:  # what a lost node's ranks last said is stale: missing there is its loss, no news
        findings = [f for f in findings if f.kind is not FindingKind.MISSING_COLLECTIVE
                    or not set(f.absent) <= lost]
        errors = [f for f in errors if f in findings]
    exits = [f for f in errors if f.kind in (FindingKind.RANK_EXITED, FindingKind.NODE_LOST)]
    candidates = []
    for f in errors:
        # A rank missing from a collective because it exited: the exit is the cause.
        explained = f.kind is FindingKind.MISSING_COLLECTIVE and any(
            set(f.absent) <= set(x.ranks) for x in exits
        ) and not _blamed_branch(f)  # (the branch sent them away, not the exit)
        if not explained:
            candidates.append(f)
    # Ranks missing from a collective of one group because they wait, in their own order, in
    # another group's: that wait is another finding's (the rank that broke its order skipped)
    candidates = [f for f in candidates if not _waiting_in_order(f, traces)] or candidates
    # ranks missing from a collective because they wait, through other groups, for ranks that
    # wait for no one: the chain's end is the cause (analysis/what/wait_chain.py)
    links = wait_links(findings)
    candidates = [f for f in candidates if not leads_on(f, links)] or candidates
    # (ranks waiting for each other in a cycle: where the absent ranks went past the call, not
    # where they have not reached it yet)
    candidates = [f for f in candidates if _call(f) not in not_yet_there] or candidates
    if lost:  # a rank gone unrecorded beside a lost node: when it went is unknown
        candidates = [f for f in candidates if not _vanished_beside(f, lost)] or candidates
    candidates = candidates or errors
    candidates = _who_left_first(candidates, traces)
    # groups made differently leave every later group named differently across ranks: what
    # their collectives, exits and errors show after that follows from it (analysis/what/groups.py)
    candidates = [f for f in candidates if f.kind is FindingKind.GROUP_MISMATCH] or candidates
    # spinning GPUs are the symptom of whatever keeps the peers away
    candidates = [f for f in candidates if f.kind is not FindingKind.GPU_BUSY_HANG] or candidates
    first = min(candidates, key=lambda f: (f.time_ns is None, f.time_ns or 0))
    rest = [f for f in findings if f is not first]
    rest.sort(key=lambda f: (f.severity is not Severity.ERROR, f.time_ns or 0))
    first = _with_unanswered(first, findings)
    return [replace(first, root_cause=True, **_consequences(first, traces))] + rest


UNSEEN_NEAR = 8  # unrecorded calls this many numbers before a finding's are said in it


def _with_unseen(findings: list[Finding], traces: TraceSet) -> list[Finding]:
    """Each desync finding says which ranks made calls nothing recorded just before its call
    (analysis/calls/align.py ``unseen``): they hold their numbers, so the finding's is torch's own,
    and those ranks are not missing from them (``evidence.unseen``)."""
    lines = timelines(traces)
    out = []
    for f in findings:
        line = lines.get(f.group) if f.group is not None and f.seq is not None else None
        near = {r: [s for s in seqs if f.seq - UNSEEN_NEAR <= s <= f.seq]
                for r, seqs in (line.unseen.items() if line is not None else ())}
        near = {r: s for r, s in near.items() if s}
        if not near:
            out.append(f)
            continue
        said = "; ".join(
            f"rank {r} made {'a collective' if len(s) == 1 else 'collectives'} at "
            f"{', '.join(f'#{n}' for n in s)} of group {f.group} that "
            f"{'was' if len(s) == 1 else 'were'} not recorded" for r, s in sorted(near.items()))
        detail = f"{f.detail}\n{said}: {UNSEEN_WHY}; the numbers above are torch's own."
        out.append(replace(f, detail=detail, evidence=replace(
            f.evidence, unseen={r: s for r, s in sorted(near.items())})))
    return out


def _with_unanswered(root: Finding, findings: list[Finding]) -> Finding:
    """A rank that left while its peers needed it: the call it left unanswered, and the branch
    on the rank that kept it from that call (its missing_collective's, analysis/who/blame.py)."""
    if not _needed(root):
        return root
    missing = next((f for f in findings if f.kind is FindingKind.MISSING_COLLECTIVE
                    and f.branch is not None and _blamed_branch(f)
                    and set(f.ranks) & set(root.ranks)), None)
    if missing is None or missing.branch is None:
        return root
    b = missing.branch
    detail = (f"{root.detail}\nThe call it left unanswered: {missing.title}. "
              f"{ranks_text(list(b.ranks or root.ranks))} skipped it at the "
              f"rank-dependent branch {paths.short_path(b.path)}:{b.line} (`{b.text}`).")
    return replace(root, detail=detail, branch=b, hint=missing.hint,
                   evidence=replace(root.evidence, unanswered={
                       "group": missing.group, "seq": missing.seq, "op": missing.op}))


def _needed(f: Finding) -> tuple[dict, ...]:
    """A rank_exited's calls its peers still needed it in ({group, seq}); () for the rest."""
    ev = f.evidence
    return tuple(ev.needed_in) if isinstance(ev, ExitEvidence) else ()


def _vanished(f: Finding) -> bool:
    ev = f.evidence
    return (f.kind is FindingKind.RANK_EXITED and isinstance(ev, ExitEvidence)
            and ev.exit == ExitKind.VANISHED.value)


def _blamed_branch(f: Finding) -> bool:
    """The branch on the rank (analysis/who/blame.py), not the absent ranks, decided the culprit."""
    return isinstance(f.evidence, DesyncEvidence) and f.evidence.blame == "branch"


def _who_left_first(candidates: list[Finding], traces: TraceSet) -> list[Finding]:
    """A rank that ended while its peers still needed it - it made fewer calls in a group than
    they did - is the cause; a peer's own end, having made more calls there (gloo's "Connection
    closed by peer", NCCL's "remote process exited", a DistBackendError), is its consequence,
    whatever the clocks say: a rank's teardown can be stamped after the error it caused.
    Decided by the recorded sequence numbers (analysis/calls/align.py), not by time."""
    left = [f for f in candidates if _needed(f)]
    if not left:
        return candidates
    lines = timelines(traces)
    needed = {(n["group"], n["seq"]) for f in left for n in _needed(f)}

    def after_them(f: Finding) -> bool:
        ev = f.evidence
        if not isinstance(ev, ExitEvidence) or ev.needed_in or ev.before_joining:
            return False
        for group, seq in needed:
            line = lines.get(group)
            if line is not None and all(line.last_seq.get(r, 0) >= seq for r in f.ranks):
                return True  # it made the call the leaver never did
        return False

    return [f for f in candidates if not after_them(f)] or candidates


def _vanished_beside(f: Finding, lost: set[int]) -> bool:
    """Ranks on a host that kept answering that ended with no exit record, in a job that lost a
    node. Their finding's time is their last call's, not their end's, which is unknown; and a
    rank gone on one host cannot silence another host's supervisor, while a lost node is what
    makes Ray end the job's other actors (its driver fails) or a launcher kill the ranks left.
    The lost node is the cause (a rank that raised or was signalled, its end time known, still
    competes by time)."""
    return _vanished(f) and not set(f.ranks) & lost


def _waiting_in_order(f: Finding, traces: TraceSet) -> bool:
    """Every rank ``f`` says is missing from its collective (group A) is blocked in a call of
    another group B, and did its last call of A *after* its last call of B: it keeps the order
    it kept before (B, A, B, ...), so it will come once B completes - it waits, it did not skip
    A. (The rank that skipped shows the other pattern: A, B, and now B again.)"""
    if f.kind is not FindingKind.MISSING_COLLECTIVE or f.group is None or not f.absent:
        return False
    for rank in f.absent:
        trace = traces.ranks.get(rank)
        blocked = blocked_event(trace) if trace is not None else None
        if blocked is None or blocked.group == f.group:
            return False
        last: dict[str, int] = {}
        for i, e in enumerate(trace.events):
            if e.idx != blocked.idx and e.state is not EventState.ENTERED and e.kind in (
                    EventKind.COLLECTIVE, EventKind.P2P):
                last[e.group] = i
        if not (f.group in last and blocked.group in last and last[f.group] > last[blocked.group]):
            return False
    return True


def _on_hosts(findings: list[Finding], traces: TraceSet) -> list[Finding]:
    """A job across several hosts, or of Ray actors: each finding says where its ranks run
    ("rank 3 on nodeB"), which actors hold them ("rank 3 (Engine 1a2b3c4d)") and what its group
    is between the actors ("group 2: weight-sync group (Trainer rank 0 -> Engine ranks 2, 3)"),
    in its title and as ``evidence.hosts`` / ``actors`` / ``group_role``."""
    hosts = {r: t.meta.host for r, t in traces.ranks.items() if t.meta.host}
    several = len(set(hosts.values())) >= 2
    held = actors.actors(traces)
    on_mesh = mesh_groups(traces)  # (a group of a DeviceMesh: "the data-parallel (dp) group")
    if not several and not held and not on_mesh:
        return findings
    roles = {**on_mesh, **actors.group_roles(traces, held)}
    out = []
    for f in findings:
        mine = {r: hosts.get(r, "") for r in f.ranks if (several and r in hosts) or r in held}
        role = roles.get(str(f.group)) if f.group is not None else None
        if not mine and role is None:
            out.append(f)
            continue
        by_host: dict[str, list[int]] = {}
        for r, h in sorted(mine.items()):
            by_host.setdefault(h if several else "", []).append(r)
        shown = [_who(rs, held) + (f" on {h}" if h else "") for h, rs in by_host.items()]
        if len(shown) > 4:  # the full map is in the evidence
            shown = shown[:3] + [f"... {len(shown) - 3} more hosts"]
        if role is not None:
            shown.append(f"group {f.group}: {role}")
        where = "; ".join(shown)
        title = f.title if f.kind is FindingKind.NODE_LOST else f"{f.title} [{where}]"
        evidence = f.evidence
        if several:
            evidence = replace(evidence, hosts={r: h for r, h in sorted(mine.items()) if h})
        if held:
            evidence = replace(evidence, actors={r: held[r].label for r in sorted(mine)
                                                 if r in held})
        if role is not None:
            evidence = replace(evidence, group_role=role)
        out.append(replace(f, title=title, evidence=evidence))
    return out


def _who(ranks: list[int], held: dict[int, actors.Actor]) -> str:
    """"rank 3 (Engine 1a2b3c4d)", or the ranks and their actors' classes when there are many."""
    if not any(r in held for r in ranks):
        return ranks_text(ranks)
    if len(ranks) <= 3:
        return ", ".join(f"rank {r} ({held[r].label})" if r in held else f"rank {r}"
                         for r in ranks)
    classes = sorted({held[r].cls for r in ranks if r in held})
    return f"{ranks_text(ranks)} ({', '.join(classes)})"


def _consequences(root: Finding, traces: TraceSet) -> dict:
    """What the other ranks suffered afterwards (the cascade), stated as such."""
    items = []
    alike: dict[str, list[int]] = {}  # ranks that suffered the same, said once
    for rank, trace in sorted(traces.ranks.items()):
        if not trace.exit.abnormal:
            continue
        if rank in root.ranks and root.kind in (FindingKind.RANK_EXITED, FindingKind.NODE_LOST):
            continue  # its own exit is the finding's title
        last = last_leaf(trace)
        where = f" in {call_name(last)}" if last is not None else ""
        what = f"{trace.exit.describe(short=True)}{where}"
        alike.setdefault(what, []).append(rank)
        items.append({"rank": rank, "exit": trace.exit.kind.value,
                      "detail": f"rank {rank} then {what}"})
    for rank, e in sorted(traces.early_exits.items()):
        if rank in root.ranks:
            continue
        inside = " in init_process_group" if e.in_init else ""
        what = f"raised {first_line(e.exception, 60)}{inside}, before joining"
        alike.setdefault(what, []).append(rank)
        items.append({"rank": rank, "exit": ExitKind.EXCEPTION.value, "before_joining": True,
                      "detail": f"rank {rank} then {what}"})
    if not items:
        return {}
    lines = [f"{ranks_text(ranks)} then {words.conjugate(ranks, what)}"
             for what, ranks in alike.items()]
    detail = root.detail + "\nAfterwards (consequences, not causes): " + "; ".join(lines) + "."
    return {"detail": detail, "evidence": replace(root.evidence, consequences=tuple(items))}


def _verdict(findings: list[Finding], traces: TraceSet) -> Verdict:
    if traces.unfinished:
        return Verdict.UNFINISHED
    if (not traces.ranks and not traces.early_exits and not traces.joining
            and traces.exit_status in (None, 0)):
        return Verdict.NOT_RECORDED  # (a job that failed with no rank recorded is a crash)
    # (ranks that never returned from init_process_group were alive inside it to the end)
    running = bool(traces.joining) or any(t.exit.was_running for t in traces.ranks.values())
    if running and any(f.kind in HANGING for f in findings):
        return Verdict.HANG
    abnormal = any(t.exit.abnormal for t in traces.ranks.values()) or bool(
        set(traces.early_exits) - early_stopped(traces))
    failed = traces.exit_status not in (None, 0)
    if abnormal or failed or any(f.severity is Severity.ERROR for f in findings):
        return Verdict.CRASH
    if any(f.severity is Severity.WARNING for f in findings):
        return Verdict.SUSPECT
    return Verdict.OK


def _summaries(traces: TraceSet) -> list[RankSummary]:
    try:  # (a rank's coordinates, when it has any: the report says them)
        held = {r: role for r, role in roles(traces).items() if role.known}
    except Exception:  # a capture is input: odd notes must not lose the report
        held = {}
    out = [_summary(t, held.get(r)) for r, t in sorted(traces.ranks.items())]
    unseen = "left no capture"
    if traces.partial:  # a node's directory of a multi-node job, or one rank's file
        unseen = ("not in this replay" if traces.source.endswith(CAPTURE_SUFFIX)
                  else "on another host, not seen here")
    stopped = early_stopped(traces)
    for rank, e in sorted(traces.early_exits.items()):
        if rank not in traces.ranks:
            where = f" at {e.callsite.text()}" if e.callsite is not None else ""
            out.append(RankSummary(
                rank=rank, host=e.host, pid=e.pid,
                state="stopped" if rank in stopped else "exception", exit_code=None,
                signal=None, exit_detail=f"raised {first_line(e.exception, 60)}{where} before "
                                         "joining a process group",
                last_collective=None, stack_summary=None, capture=None,
            ))
    for rank, j in sorted(traces.joining.items()):
        if rank not in traces.ranks and rank not in traces.early_exits:
            out.append(RankSummary(
                rank=rank, host=j.host, pid=j.pid, state="no_capture", exit_code=None,
                signal=None, exit_detail=f"began init_process_group (rendezvous at "
                                         f"{j.address or '?'}) and never returned",
                last_collective=None, stack_summary=None, capture=None,
            ))
    for rank in range(traces.world_size):
        if (rank not in traces.ranks and rank not in traces.early_exits
                and rank not in traces.joining):
            u = traces.unrecorded.get(rank)
            out.append(RankSummary(
                rank=rank, host=u.host if u else "", pid=0, state="no_capture", exit_code=None,
                signal=None, exit_detail=("capture damaged (see the note)" if u and u.damaged
                                          else "not recorded (see the note)" if u else unseen),
                last_collective=None, stack_summary=None, capture=None,
            ))
    return sorted(out, key=lambda s: s.rank)


def _summary(trace: RankTrace, role: Role | None = None) -> RankSummary:
    ex = trace.exit
    state = _STATE.get(ex.kind) or ("blocked" if blocked_event(trace) else "running")
    last = last_leaf(trace)
    last_call = None
    if last is not None:
        last_call = LastCollective(
            group=last.group, seq=last.align_seq, op=last.op, state=last.state.name.lower(),
            callsite=call_site(last, trace.meta.versions), input=last.input,
            source=last.source.value)
    return RankSummary(
        rank=trace.rank, host=trace.meta.host, pid=trace.meta.pid, state=state,
        exit_code=ex.code, signal=ex.signal, exit_detail=ex.describe(short=True),
        last_collective=last_call, stack_summary=None,
        capture=CaptureInfo(file=Path(trace.path).name, events=trace.records,
                            complete=trace.integrity.complete,
                            integrity=trace.integrity.describe()),
        role=role,
    )
