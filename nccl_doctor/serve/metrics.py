"""``/metrics``: a ``Published`` look in Prometheus's text format, through prometheus_client.

Per rank: ``nccl_doctor_rank_calls_total`` (the capture's progress counter),
``nccl_doctor_rank_seconds_since_progress``, ``nccl_doctor_rank_state`` (1 for its state).
Per job: ``nccl_doctor_hang_detected`` (1 from the watchdog's call until the process exits),
``nccl_doctor_phase``, ``nccl_doctor_run_state`` and ``nccl_doctor_verdict`` (1 for the current
one), ``nccl_doctor_findings`` by kind, ``nccl_doctor_root_cause`` (1 per culprit rank of the root
cause, labelled with the finding's kind, the rank's host, the call site and the branch on the
rank), ``nccl_doctor_straggler_skew_seconds``, ``nccl_doctor_rank_lateness_seconds``,
``nccl_doctor_straggler_cost_seconds_total``, ``nccl_doctor_nodes`` (joined, lost, expected),
``nccl_doctor_quiet_seconds``. Their labels are declared once (``LABELS``); docs/serve.md lists
them.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nccl_doctor.serve.state import Published

PREFIX = "nccl_doctor"

# Each metric's labels, by the name a query uses (a counter's with ``_total``): the families below
# are made with these, and docs/serve.md lists them (tests/unit/test_cli_reference.py keeps the
# page's label lists the same as this table).
LABELS: dict[str, tuple[str, ...]] = {
    f"{PREFIX}_rank_calls_total": ("rank", "host"),
    f"{PREFIX}_rank_seconds_since_progress": ("rank", "host"),
    f"{PREFIX}_rank_state": ("rank", "host", "state"),
    f"{PREFIX}_hang_detected": (),
    f"{PREFIX}_phase": ("phase",),
    f"{PREFIX}_run_state": ("state",),
    f"{PREFIX}_verdict": ("verdict",),
    f"{PREFIX}_findings": ("kind",),
    f"{PREFIX}_root_cause": ("rank", "host", "kind", "callsite", "branch"),
    f"{PREFIX}_straggler_skew_seconds": ("rank",),
    f"{PREFIX}_rank_lateness_seconds": ("rank", "host"),
    f"{PREFIX}_straggler_cost_seconds_total": ("rank", "host"),
    f"{PREFIX}_nodes": ("state",),
    f"{PREFIX}_quiet_seconds": (),
}


def _gauge(name: str, documentation: str, **value: float) -> GaugeMetricFamily:
    full = f"{PREFIX}_{name}"
    return GaugeMetricFamily(full, documentation, labels=LABELS[full] or None, **value)


def _counter(name: str, documentation: str) -> CounterMetricFamily:
    full = f"{PREFIX}_{name}"
    return CounterMetricFamily(full, documentation, labels=LABELS[f"{full}_total"])


def render(pub: Published) -> bytes:
    """The exposition text of ``pub``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(pub))
    return generate_latest(registry)


class _Collector:
    def __init__(self, pub: Published) -> None:
        self.pub = pub

    def collect(self) -> Iterator[Metric]:
        yield from families(self.pub)


def families(pub: Published) -> Iterator[Metric]:
    view = pub.view
    calls = _counter("rank_calls", "calls the rank has recorded so far (its capture's progress "
                     "counter)")
    since = _gauge("rank_seconds_since_progress", "seconds since the rank last recorded a call")
    state = _gauge("rank_state", "1 for the rank's state as the watchdog last saw it (running, "
                   "computing, waiting, awaited, stopped, ended)")
    hosts = {}
    for r in view.ranks if view is not None else ():
        labels = [str(r.rank), r.host]
        hosts[r.rank] = r.host
        calls.add_metric(labels, r.calls)
        since.add_metric(labels, pub.since_progress.get(r.rank, 0.0))
        state.add_metric([*labels, r.state.value], 1)
    yield from (calls, since, state)

    yield _gauge("hang_detected", "1 while a hang the watchdog called stands: from the call "
                 "until this process exits (through the stop, the analysis and --serve-linger), "
                 "unless progress retracts it; 0 otherwise", value=1 if pub.hang_detected else 0)
    phase = _gauge("phase", "1 for the job's phase (starting, running, computing, "
                   "waiting_on_peers, ended, analysing, done; hang from the call until this "
                   "process exits)")
    phase.add_metric([pub.phase], 1)
    run = _gauge("run_state", "1 for the run's state (starting, running, ended, analysing, done: "
                 "the job is over, its report final)")
    run.add_metric([pub.state], 1)
    verdict = _gauge("verdict", "1 for the newest report's verdict (none before the first "
                     "report)")
    verdict.add_metric([pub.verdict], 1)
    yield from (phase, run, verdict)

    findings = _gauge("findings", "findings of the newest report, by kind")
    by_kind = Counter(f.kind.value for f in (pub.report.findings if pub.report else ()))
    for kind, n in sorted(by_kind.items()):
        findings.add_metric([kind], n)
    yield findings

    cause = pub.root_cause
    root = _gauge("root_cause", "1 for each culprit rank of the newest report's root cause "
                  "(branch: the branch on the rank that split the ranks, path:line)")
    if cause is not None:
        branch = cause.branch
        where = f"{branch.path}:{branch.line}" if branch is not None else ""
        for rank in cause.ranks:
            host = hosts.get(rank) or _host_of(pub, rank)
            root.add_metric([str(rank), host, cause.kind.value, cause.callsite or "", where], 1)
    yield root

    skew = _gauge("straggler_skew_seconds", "a late rank's median lateness at the collectives "
                  "it was last to (the straggler watch's latest)")
    for rank, seconds in sorted(pub.skew_s.items()):
        skew.add_metric([str(rank)], seconds)
    yield skew

    late = _gauge("rank_lateness_seconds", "how late the rank arrives at collectives per step, "
                  "after the first member (across hosts without comparing clocks; the straggler "
                  "watch's latest)")
    yield _per_rank(late, pub.lateness_s, lambda rank: hosts.get(rank) or _host_of(pub, rank))

    cost = _counter("straggler_cost_seconds", "time the other ranks waited for this rank, the "
                    "last to arrive, at collectives skewed past 20 ms (their median wait, summed "
                    "per collective)")
    yield _per_rank(cost, pub.cost_s, lambda rank: hosts.get(rank) or _host_of(pub, rank))

    nodes = _gauge("nodes", "nodes of the job: joined, lost, expected (multi-node and Ray "
                   "jobs; 1 joined otherwise)")
    for key, n in sorted(pub.nodes.items()):
        nodes.add_metric([key], n)
    yield nodes

    if view is not None:
        yield _gauge("quiet_seconds", "seconds since any rank recorded a call",
                     value=view.quiet_s)


def _per_rank(family: Metric, values: Mapping[int, float],
              host: Callable[[int], str]) -> Metric:
    """``family`` with one sample per rank of ``values``, labelled with the rank and its host."""
    for rank, value in sorted(values.items()):
        family.add_metric([str(rank), host(rank)], value)
    return family


def _host_of(pub: Published, rank: int) -> str:
    if pub.report is not None:
        for r in pub.report.ranks:
            if r.rank == rank:
                return r.host or ""
    return ""
