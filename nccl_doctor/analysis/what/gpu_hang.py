"""``gpu_busy_hang``: ranks inside a collective that never completes while their GPUs read ~100%
busy at low power with device memory idle - NCCL kernels polling for a peer. Pure.

"Inside" is where the GPU is, not the CPU: on NCCL a call returns once it is enqueued, so a rank
that enqueued the collective where its group diverged waits in it on the GPU (the stream runs in
order and that collective never completes) whatever its Python thread does next - as well as a
rank whose thread is still inside a collective call.

This is bug A's symptom (docs/bugs.md): the dashboards show every GPU at 100% and the job looks alive
until the NCCL timeout. The finding names the GPUs, their readings, and whom they wait for (the
culprits of the group's desync, when there is one). It explains a hang; it is never its root cause
while a desync explains it. What counts as spinning: nccl_doctor/gpu/signature.py.
"""

from __future__ import annotations

from nccl_doctor.analysis.calls.align import blocked_event
from nccl_doctor.analysis.calls.wording import call_fields, call_name, call_site, ranks_text
from nccl_doctor.analysis.what.desync import desyncs
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.gpu.readings import GpuTrace, RankGpu
from nccl_doctor.gpu.signature import Activity, Window, window
from nccl_doctor.model import Event, EventKind, RankTrace, TraceSet

SETTLE_S = 0.5  # samples this soon after entering the call are not the wait's

HINT_WAITING = (
    "The GPUs are not working: NCCL's kernels spin, polling for {who}, and NVML counts a running "
    "kernel as 100% utilisation whatever it does (the low power is the tell). Nothing is wrong "
    "with these GPUs or the network: fix what keeps {who} out of this collective (the desync "
    "finding says what). Alert on collective progress or GPU power, not utilisation."
)
HINT_TRANSPORT = (
    "Every rank of the collective is inside it and the kernels spin without completing it: the "
    "transport is stuck, not the program. Check the network/NCCL (NCCL_DEBUG=INFO, "
    "NCCL_P2P_DISABLE=1 or NCCL_IB_DISABLE=1 to isolate a transport; PCIe ACS on bare metal), a "
    "dead peer host, or a GPU that stopped responding."
)


def detect_gpu_busy_hang(traces: TraceSet) -> list[Finding]:
    gpu = traces.gpu
    if gpu is None or not gpu.available or not gpu.samples:
        return []
    found = desyncs(traces)
    stuck: dict[str, int] = {}  # NCCL group -> the seq where it diverged
    for f in found:
        if f.group is not None and f.seq is not None and _maybe_nccl(traces, f.group):
            stuck[f.group] = min(f.seq, stuck.get(f.group, f.seq))
    spinning: dict[int, tuple[Event, RankGpu, Window]] = {}
    for rank, trace in sorted(traces.ranks.items()):
        e = _waiting_in(trace, stuck)
        placed = gpu.ranks.get(rank)
        if (e is None or placed is None or e.kind not in (EventKind.COLLECTIVE, EventKind.P2P)
                or not _maybe_nccl(traces, e.group)):
            continue
        until = trace.exit.time_ns / 1e9 if trace.exit.time_ns else float("inf")
        w = window(gpu.series(placed.index, since=e.t_enter_ns / 1e9 + SETTLE_S, until=until),
                   gpu.devices.get(placed.index))
        if w.activity is Activity.SPIN:
            spinning[rank] = (e, placed, w)
    if not spinning:
        return []
    first = min((e for e, _, _ in spinning.values()), key=lambda e: e.t_enter_ns)
    groups = {e.group for e, _, _ in spinning.values()}
    culprits = sorted({r for f in found if f.group in groups for r in f.ranks})
    indices = sorted({placed.index for _, placed, _ in spinning.values()})
    gpus = ", ".join(map(str, indices))
    who = ranks_text(culprits) if culprits else ""
    title = (f"NCCL kernels spinning on GPU{'s' if len(indices) > 1 else ''} {gpus} "
             f"({ranks_text(sorted(spinning))}) in {call_name(first)}: ~100% busy, low power, "
             + (f"waiting for {who}" if culprits else "no progress"))
    lines = [_line(r, e, placed, w, gpu) for r, (e, placed, w) in spinning.items()]
    lines.append("NVML's utilisation is the share of time a kernel runs, and a kernel polling "
                 "for a peer runs all the time: 100% here is waiting, not work.")
    return [Finding(
        kind=FindingKind.GPU_BUSY_HANG, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=tuple(culprits) or tuple(sorted(spinning)),
        hint=HINT_WAITING.format(who=who) if culprits else HINT_TRANSPORT,
        group=first.group, seq=first.align_seq, op=first.op, **call_fields(first),
        evidence={"waiting_for": culprits, "spinning": {
            str(r): _evidence(placed, w, e.t_enter_ns / 1e9 + SETTLE_S)
            for r, (e, placed, w) in spinning.items()}},
        time_ns=first.t_enter_ns,
    )]


def _waiting_in(trace: RankTrace, stuck: dict[str, int]) -> Event | None:
    """The collective the rank's GPU waits in since the earliest: the first it enqueued at or
    past the seq where its NCCL group diverged (``stuck``), or the call its thread is still
    inside."""
    inside = blocked_event(trace)
    for e in trace.events:
        if inside is not None and e.t_enter_ns >= inside.t_enter_ns:
            break
        if (e.group in stuck and e.align_seq >= stuck[e.group]
                and e.kind in (EventKind.COLLECTIVE, EventKind.P2P)):
            return e
    return inside


def _maybe_nccl(traces: TraceSet, group: str) -> bool:
    """A group known to run on another backend (gloo, mpi) launches no NCCL kernels; "undefined"
    (init_process_group() without a backend) and "cpu:gloo,cuda:nccl" may."""
    info = traces.groups.get(group)
    backend = info.backend if info is not None else ""
    return backend in ("", "undefined") or "nccl" in backend


def _line(rank: int, e: Event, placed: RankGpu, w: Window, gpu: GpuTrace) -> str:
    device = gpu.devices.get(placed.index)
    name = f" ({device.name})" if device is not None and device.name else ""
    power = (f" at {w.power_w:.0f} W of {w.power_limit_w:.0f} W ({w.power_share:.0%})"
             if w.power_w is not None and w.power_limit_w and w.power_share is not None else "")
    link = f", {w.link_kbs / 1000:.1f} MB/s over PCIe/NVLink" if w.link_kbs is not None else ""
    return (f"rank {rank} on GPU {placed.index}{name}: {w.util or 0:.0f}% utilisation{power}"
            f"{link}, {w.samples} samples over {w.span_s:.0f} s since it entered {call_name(e)} "
            f"at {call_site(e)}.")


def _evidence(placed: RankGpu, w: Window, since: float) -> dict:
    return {
        "gpu": placed.index, "since": round(since, 3), "placed_by": placed.how, "util": w.util,
        "power_w": w.power_w, "power_limit_w": w.power_limit_w,
        "power_share": round(w.power_share, 3) if w.power_share is not None else None,
        "link_kbs": w.link_kbs, "samples": w.samples, "span_s": round(w.span_s, 1),
    }
