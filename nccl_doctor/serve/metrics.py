"""``/metrics``: a ``Published`` look in Prometheus's text format, through prometheus_client.

Per rank: ``nccl_doctor_rank_calls_total`` (the capture's progress counter),
``nccl_doctor_rank_seconds_since_progress``, ``nccl_doctor_rank_state`` (1 for its state).
Per job: ``nccl_doctor_hang_detected`` (1 from the watchdog's call until the process exits),
``nccl_doctor_phase``, ``nccl_doctor_run_state`` and ``nccl_doctor_verdict`` (1 for the current
one), ``nccl_doctor_findings`` by kind, ``nccl_doctor_root_cause`` (1 per culprit rank of the root
cause, labelled with the finding's kind, the rank's host and the call site),
``nccl_doctor_straggler_skew_seconds``, ``nccl_doctor_rank_lateness_seconds``,
``nccl_doctor_straggler_cost_seconds_total``, ``nccl_doctor_nodes`` (joined, lost, expected),
``nccl_doctor_quiet_seconds``. docs/serve.md lists them with example queries.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nccl_doctor.serve.state import Published

PREFIX = "nccl_doctor"


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
    calls = CounterMetricFamily(f"{PREFIX}_rank_calls", "calls the rank has recorded so far "
                                "(its capture's progress counter)", labels=["rank", "host"])
    since = GaugeMetricFamily(f"{PREFIX}_rank_seconds_since_progress",
                              "seconds since the rank last recorded a call",
                              labels=["rank", "host"])
    state = GaugeMetricFamily(f"{PREFIX}_rank_state", "1 for the rank's state as the watchdog "
                              "last saw it (running, computing, waiting, awaited, stopped, "
                              "ended)", labels=["rank", "host", "state"])
    hosts = {}
    for r in view.ranks if view is not None else ():
        labels = [str(r.rank), r.host]
        hosts[r.rank] = r.host
        calls.add_metric(labels, r.calls)
        since.add_metric(labels, pub.since_progress.get(r.rank, 0.0))
        state.add_metric([*labels, r.state.value], 1)
    yield from (calls, since, state)

    yield GaugeMetricFamily(f"{PREFIX}_hang_detected", "1 while a hang the watchdog called "
                            "stands: from the call until this process exits (through the stop, "
                            "the analysis and --serve-linger), unless progress retracts it; "
                            "0 otherwise", value=1 if pub.hang_detected else 0)
    phase = GaugeMetricFamily(f"{PREFIX}_phase", "1 for the job's phase (starting, running, "
                              "computing, waiting_on_peers, ended, analysing, done; hang from "
                              "the call until this process exits)", labels=["phase"])
    phase.add_metric([pub.phase], 1)
    run = GaugeMetricFamily(f"{PREFIX}_run_state", "1 for the run's state (starting, running, "
                            "ended, analysing, done: the job is over, its report final)",
                            labels=["state"])
    run.add_metric([pub.state], 1)
    verdict = GaugeMetricFamily(f"{PREFIX}_verdict", "1 for the newest report's verdict "
                                "(none before the first report)", labels=["verdict"])
    verdict.add_metric([pub.verdict], 1)
    yield from (phase, run, verdict)

    findings = GaugeMetricFamily(f"{PREFIX}_findings", "findings of the newest report, by kind",
                                 labels=["kind"])
    by_kind = Counter(f.kind.value for f in (pub.report.findings if pub.report else ()))
    for kind, n in sorted(by_kind.items()):
        findings.add_metric([kind], n)
    yield findings

    cause = pub.root_cause
    root = GaugeMetricFamily(f"{PREFIX}_root_cause", "1 for each culprit rank of the newest "
                             "report's root cause (branch: the branch on the rank that split the "
                             "ranks, path:line)", labels=["rank", "host", "kind", "callsite",
                                                          "branch"])
    if cause is not None:
        branch = cause.branch
        where = f"{branch.path}:{branch.line}" if branch is not None else ""
        for rank in cause.ranks:
            host = hosts.get(rank) or _host_of(pub, rank)
            root.add_metric([str(rank), host, cause.kind.value, cause.callsite or "", where], 1)
    yield root

    skew = GaugeMetricFamily(f"{PREFIX}_straggler_skew_seconds", "a late rank's median lateness "
                             "at the collectives it was last to (the straggler watch's latest)",
                             labels=["rank"])
    for rank, seconds in sorted(pub.skew_s.items()):
        skew.add_metric([str(rank)], seconds)
    yield skew

    late = GaugeMetricFamily(f"{PREFIX}_rank_lateness_seconds", "how late the rank arrives at "
                             "collectives per step, after the first member (across hosts "
                             "without comparing clocks; the straggler watch's latest)",
                             labels=["rank", "host"])
    yield _per_rank(late, pub.lateness_s, lambda rank: hosts.get(rank) or _host_of(pub, rank))

    cost = CounterMetricFamily(f"{PREFIX}_straggler_cost_seconds", "time the other ranks "
                               "waited for this rank, the last to arrive, at collectives "
                               "skewed past 20 ms (their median wait, summed per collective)",
                               labels=["rank", "host"])
    yield _per_rank(cost, pub.cost_s, lambda rank: hosts.get(rank) or _host_of(pub, rank))

    nodes = GaugeMetricFamily(f"{PREFIX}_nodes", "nodes of the job: joined, lost, expected "
                              "(multi-node and Ray jobs; 1 joined otherwise)", labels=["state"])
    for key, n in sorted(pub.nodes.items()):
        nodes.add_metric([key], n)
    yield nodes

    if view is not None:
        yield GaugeMetricFamily(f"{PREFIX}_quiet_seconds", "seconds since any rank recorded a "
                                "call", value=view.quiet_s)


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
