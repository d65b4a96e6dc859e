"""GPU evidence without a GPU: real NVML readings published with hung and healthy jobs (see
tests/fixtures/gpu/published_readings.json), played through the classifier, the rank mapping,
the bounded sample file, the sampler thread and the gpu_busy_hang pass."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.supervisor.gpu.mapping import RankHints, map_ranks
from nccl_doctor.gpu.readings import GpuDevice, GpuSample, GpuTrace, RankGpu
from nccl_doctor.supervisor.gpu.nvml import GpuUnavailable
from nccl_doctor.supervisor.gpu.recorded import RecordedGpus
from nccl_doctor.supervisor.gpu.sampler import GpuSampler
from nccl_doctor.gpu.series import GPU_JSONL, GpuLog, read_gpu
from nccl_doctor.gpu.signature import Activity, classify, window
from nccl_doctor.model import ExitKind, GroupInfo, RankExit

READINGS = json.loads((Path(__file__).parents[1] / "fixtures" / "gpu" /
                       "published_readings.json").read_text())["readings"]


def of(state: str, source: str | None = None) -> list[dict]:
    return [r for r in READINGS if r["state"] == state and (source is None or source in r["source"])]


def series(readings: list[dict], index: int = 0, t0: float = 1000.0, every: float = 1.0):
    """(device, samples): the readings in order, ``every`` seconds apart."""
    device = GpuDevice(index, name=readings[0]["gpu"], power_limit_w=readings[0]["power_limit_w"])
    samples = [GpuSample(t=t0 + k * every, index=index, util=r["util"], power_w=r["power_w"],
                         pcie_kbs=r.get("pcie_kbs"), nvlink_kbs=r.get("nvlink_kbs"))
               for k, r in enumerate(readings)]
    return device, samples


@pytest.mark.parametrize("reading", READINGS, ids=lambda r: f"{r['state']}-{r['gpu']}-{r['power_w']}W")
def test_each_published_reading_is_classified_as_its_thread_says(reading):
    device, (sample,) = series([reading])
    expected = {"spin": Activity.SPIN, "compute": Activity.COMPUTE, "idle": Activity.IDLE}
    assert classify(sample, device) is expected[reading["state"]]


def test_fixture_covers_the_three_shapes():
    assert {r["state"] for r in READINGS} == {"spin", "compute", "idle"}
    assert all(r["source"].startswith("https://github.com/") for r in READINGS)


def test_a_window_spins_only_when_it_holds_over_enough_samples():
    spin = of("spin", "DeepSpeed/issues/6524")  # two GPUs of one hung H100 job
    device, samples = series(spin * 3)
    w = window(samples, device)
    assert w.activity is Activity.SPIN and w.samples == 6 and w.span_s == 5.0
    assert w.util == 100 and 116 <= w.power_w <= 121 and w.power_share < 0.2
    assert window(samples[:2], device).activity is Activity.UNKNOWN  # too few to say
    # a training step in between breaks it only beyond 20% of the window
    compute = {**of("compute", "libai")[0], "power_limit_w": 700, "power_w": 650}
    _, mixed = series(spin * 2 + [compute] + spin * 2)
    assert window(mixed, device).activity is Activity.SPIN
    _, busy = series(spin + [compute] * 3)
    assert window(busy, device).activity is Activity.COMPUTE


def test_data_moving_is_a_transfer_not_a_spin():
    moving = [{**r, "nvlink_kbs": 40_000_000} for r in of("spin", "6524")]  # 40 GB/s
    device, samples = series(moving * 2)
    assert window(samples, device).activity is Activity.TRANSFER
    polling = [{**r, "pcie_kbs": 3_000} for r in of("spin", "6524")]  # 3 MB/s of flag reads
    device, samples = series(polling * 2)
    assert window(samples, device).activity is Activity.SPIN


def test_without_power_or_utilisation_nothing_is_claimed():
    device = GpuDevice(0, power_limit_w=None)
    assert classify(GpuSample(t=0, index=0, util=100, power_w=116), device) is Activity.UNKNOWN
    assert classify(GpuSample(t=0, index=0, power_w=116), GpuDevice(0, power_limit_w=700)) \
        is Activity.UNKNOWN


def test_ranks_map_to_devices_by_nvml_pids_then_environment():
    devices = {i: GpuDevice(i, uuid=f"GPU-{i}aaa-{i}") for i in range(4)}
    hints = {
        0: RankHints(pid=100, local_rank=0, visible="3,2"),  # NVML lists pid 100 on GPU 1
        1: RankHints(pid=101, local_rank=1, visible="3,2"),  # -> visible[1] = 2
        2: RankHints(pid=102, local_rank=0, visible=None),  # no CUDA_VISIBLE_DEVICES -> 0
        3: RankHints(pid=103, local_rank=1, visible="GPU-3aaa,GPU-1aa"),  # UUID prefixes
        4: RankHints(pid=104, local_rank=2, visible="0,1"),  # beyond what it can see
        5: RankHints(pid=105, local_rank=None, visible=None),  # environment unknown
        6: RankHints(pid=106, local_rank=0, visible="MIG-abc"),
    }
    assert map_ranks(hints, devices, {1: {100}, 0: set()}) == {
        0: RankGpu(1, "nvml_pids"), 1: RankGpu(2, "environment"), 2: RankGpu(0, "local_rank"),
        3: RankGpu(1, "environment"),
    }


def test_the_sample_file_round_trips_and_stays_bounded(tmp_path):
    log = GpuLog(tmp_path, max_bytes=4096)
    device = GpuDevice(0, "GPU-x", "NVIDIA H100 80GB HBM3", 700.0, 1980.0, 81559.0)
    log.header(available=True, host="node1", devices=[device])
    log.ranks(1.0, {0: RankGpu(0, "nvml_pids")})
    for k in range(200):
        log.samples([GpuSample(t=1000.0 + k, index=0, util=100.0, power_w=116.0)])
    assert (tmp_path / GPU_JSONL).stat().st_size <= 4096
    trace = read_gpu(tmp_path)
    assert trace.available and trace.host == "node1" and trace.devices == {0: device}
    assert trace.ranks == {0: RankGpu(0, "nvml_pids")}
    ts = [s.t for s in trace.samples]
    assert ts == sorted(ts) and ts[-1] == 1199.0 and 10 < len(ts) < 200  # the newest kept
    assert trace.samples[-1] == GpuSample(t=1199.0, index=0, util=100.0, power_w=116.0)
    log.error("GPU sampling stopped: RuntimeError('x')")
    for k in range(200):  # rewrites after it keep the error line
        log.samples([GpuSample(t=2000.0 + k, index=0, util=100.0, power_w=116.0)])
    assert read_gpu(tmp_path).stopped == "GPU sampling stopped: RuntimeError('x')"


def test_a_damaged_or_foreign_sample_file_is_refused_or_skipped(tmp_path):
    assert read_gpu(tmp_path) is None
    path = tmp_path / GPU_JSONL
    path.write_text('{"kind": "header", "format": "nccl-doctor-gpu", "format_version": 1, '
                    '"available": true, "devices": [{"index": 0, "power_limit_w": 700}, "x"]}\n'
                    '{"kind": "sample", "t": 5, "index": 0, "util": 100, "power_w": "lots"}\n'
                    'not json\n{"kind": "sample", "t": "x", "index": 0}\n[1, 2]\n'
                    '{"kind": "sample", "t": 6, "index": -1}\n'
                    '{"kind": "ranks", "ranks": {"0": {"index": 0, "how": "local_rank"}, "x": 1}}\n')
    trace = read_gpu(tmp_path)
    assert [s.t for s in trace.samples] == [5.0] and trace.samples[0].power_w is None
    assert list(trace.devices) == [0] and trace.ranks == {0: RankGpu(0, "local_rank")}
    path.write_text('{"kind": "header", "format": "nccl-doctor-gpu", "format_version": 9}\n')
    with pytest.raises(ValueError, match="version 9"):
        read_gpu(tmp_path)
    path.write_bytes(b"\x00\xff garbage")
    with pytest.raises(ValueError, match="not an nccl-doctor GPU sample file"):
        read_gpu(tmp_path)


def wait_for(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_the_sampler_records_the_devices_and_speeds_up_when_nothing_moves(tmp_path):
    source = RecordedGpus({0: of("spin", "6524"), 1: of("idle", "1550")[:1]})
    quiet = [False]
    sampler = GpuSampler(tmp_path, ranks=lambda: {0: (4242, 0)}, open_source=lambda: source,
                         fast=lambda: quiet[0], slow=0.6, fast_every=0.05)
    sampler()
    wait_for(lambda: (read_gpu(tmp_path) or GpuTrace(False)).samples)
    time.sleep(0.2)
    assert len(read_gpu(tmp_path).samples) == 2  # one look at each device, then slow
    # ranks join before their CUDA context exists: NVML lists the pid later, and the sampler
    # maps again (every slow period) until NVML itself places the rank
    first = read_gpu(tmp_path).ranks
    source._pids = {1: {4242}}
    quiet[0] = True
    sampler()  # the supervisor's next tick
    wait_for(lambda: len(read_gpu(tmp_path).samples) >= 30)
    sampler.close()
    assert source.closed and sampler.error is None
    trace = read_gpu(tmp_path)
    assert first == {} or first[0].how != "nvml_pids"
    assert trace.ranks == {0: RankGpu(1, "nvml_pids")}
    assert {s.index for s in trace.samples} == {0, 1}
    assert [s.power_w for s in trace.series(0)][:2] == [116, 121]


def test_a_sampler_failure_is_one_line_in_the_file_and_a_note(tmp_path, tb):
    from dataclasses import replace

    class Failing(RecordedGpus):
        def sample(self, index):
            raise RuntimeError("driver went away")

    sampler = GpuSampler(tmp_path, ranks=dict, open_source=lambda: Failing({0: of("spin")}))
    sampler()
    sampler.close()
    assert "driver went away" in sampler.error
    traces = tb.traceset([tb.trace(0, tb.collectives(2)), tb.trace(1, tb.collectives(2))])
    d = analyze(replace(traces, gpu=read_gpu(tmp_path)))
    assert [n for n in d.notes if "GPU" in n] == [
        "GPU sampling stopped: RuntimeError('driver went away') (GPU evidence after that is "
        "missing)"]


def test_without_nvml_one_header_line_says_why_and_the_report_one_note(tmp_path, tb):
    def unavailable():
        raise GpuUnavailable("no NVIDIA driver on this host (libnvidia-ml.so.1 not found)")

    sampler = GpuSampler(tmp_path, ranks=dict, open_source=unavailable)
    sampler()
    sampler.close()
    lines = (tmp_path / GPU_JSONL).read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["available"] is False
    gloo = tb.traceset([tb.trace(0, tb.collectives(2)), tb.trace(1, tb.collectives(2))])
    from dataclasses import replace

    nccl = replace(gloo, groups={n: replace(g, backend="nccl") for n, g in gloo.groups.items()})
    d = analyze(replace(nccl, gpu=read_gpu(tmp_path)))
    assert [n for n in d.notes if "GPU" in n] == [
        "GPUs not sampled: no NVIDIA driver on this host (libnvidia-ml.so.1 not found)"]
    assert not any(f.kind is FindingKind.GPU_BUSY_HANG for f in d.findings)
    # a job on gloo used no GPU: the sampler's failure is no news to it
    assert not [n for n in analyze(replace(gloo, gpu=read_gpu(tmp_path))).notes if "GPU" in n]


def hung_world(tb, gpu_readings: dict[int, list[dict]], backend: str = "nccl"):
    """Ranks 0 and 1 wait in all_reduce #3 since T0 + 3 ms; rank 2 never came; GPU samples from
    1 s after that, each rank on the device of its number."""
    from dataclasses import replace

    waiting = [tb.event(i, seq=i, state=tb.ENTERED if i == 3 else tb.RETURNED) for i in (1, 2, 3)]
    traces = tb.traceset(
        [tb.trace(0, waiting, tb.RUNNING, world_size=3), tb.trace(1, waiting, tb.RUNNING, world_size=3),
         tb.trace(2, [tb.event(i, seq=i) for i in (1, 2)], tb.RUNNING, world_size=3)],
        groups={"0": (0, 1, 2)}, world_size=3)
    start = tb.T0 / 1e9 + 1.0
    devices, samples = {}, []
    for index, readings in gpu_readings.items():
        device, s = series(readings, index=index, t0=start)
        devices[index] = device
        samples += s
    gpu = GpuTrace(True, devices=devices, samples=tuple(sorted(samples, key=lambda s: s.t)),
                   ranks={r: RankGpu(r, "nvml_pids") for r in range(3)})
    return replace(traces, gpu=gpu, groups={"0": GroupInfo("0", (0, 1, 2), backend)})


def test_gpu_busy_hang_names_the_spinning_gpus_and_whom_they_wait_for(tb):
    spin = of("spin", "6524")
    traces = hung_world(tb, {0: spin * 3, 1: spin[::-1] * 3, 2: of("idle", "1550")[:3]})
    d = analyze(traces)
    assert d.root_cause.kind is FindingKind.MISSING_COLLECTIVE and d.root_cause.ranks == (2,)
    (f,) = [f for f in d.findings if f.kind is FindingKind.GPU_BUSY_HANG]
    assert f.ranks == (2,) and f.evidence["waiting_for"] == [2] and not f.root_cause
    assert set(f.evidence["spinning"]) == {"0", "1"}
    assert f.evidence["spinning"]["0"]["power_limit_w"] == 700
    assert f.evidence["spinning"]["0"]["power_share"] < 0.2 and f.evidence["spinning"]["0"]["samples"] == 6
    assert "waiting for rank 2" in f.title and "GPUs 0, 1" in f.title
    assert "H100" in f.detail and "of 700 W" in f.detail


def test_no_gpu_busy_hang_when_the_waiting_gpus_compute_or_samples_are_too_few(tb):
    busy = [{**r, "power_limit_w": 500} for r in of("compute", "CHTC")]
    for readings in ({0: busy * 2, 1: busy * 2}, {0: of("spin", "6524"), 1: of("spin", "6524")}):
        d = analyze(hung_world(tb, readings))
        assert not any(f.kind is FindingKind.GPU_BUSY_HANG for f in d.findings), readings


def test_every_rank_spinning_with_no_peer_missing_blames_the_transport(tb):
    from dataclasses import replace

    spin = of("spin", "lambdal")
    traces = hung_world(tb, {i: spin * 2 for i in range(3)})
    waiting = traces.ranks[0].events
    traces = replace(traces, ranks={**traces.ranks, 2: replace(traces.ranks[2], events=waiting)})
    (f,) = [f for f in analyze(traces).findings if f.kind is FindingKind.GPU_BUSY_HANG]
    assert f.ranks == (0, 1, 2) and f.evidence["waiting_for"] == []
    assert "no progress" in f.title and "transport" in f.hint


class StandInNvml:
    """The few pynvml calls Nvml makes, answering in NVML's units (mW, bytes, KB/s, KiB
    counters) with the readings of DeepSpeed#6524's hung H100; the NVLink counters advance 1000 KiB
    per read (of any device), and device 1 does not support PCIe throughput. This machine has no driver."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM, NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES, NVML_SUCCESS = 1, 0, 1, 0
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139

    def __init__(self):
        from types import SimpleNamespace as NS

        self.NS, self.kib, self.shut = NS, 0, False

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return 1980

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1980

    def nvmlDeviceGetMemoryInfo(self, h):
        return self.NS(total=81559 * 2**20, used=55217 * 2**20)

    def nvmlDeviceGetUtilizationRates(self, h):
        return self.NS(gpu=100, memory=0)

    def nvmlDeviceGetPowerUsage(self, h):
        return 116_000

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        if h == 1:
            raise self.NVMLError("Not Supported")
        return 1500 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 500

    def nvmlDeviceGetFieldValues(self, h, fields):
        self.kib += 1000
        return [self.NS(nvmlReturn=0, value=self.NS(ullVal=self.kib)) for _ in fields]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [self.NS(pid=4242)] if h == 0 else []

    def nvmlShutdown(self):
        self.shut = True


def test_nvml_readings_are_converted_from_nvml_units(monkeypatch):
    from nccl_doctor.supervisor.gpu.nvml import Nvml

    fake = StandInNvml()
    nvml = Nvml(fake)
    times = iter([100.0, 102.0])
    monkeypatch.setattr("nccl_doctor.supervisor.gpu.nvml.time.time", lambda: next(times))
    d0 = nvml.devices()[0]
    assert (d0.power_limit_w, d0.memory_total_mib, d0.sm_max_mhz) == (700.0, 81559.0, 1980)
    first, second = nvml.sample(0), nvml.sample(1)
    assert (first.util, first.power_w, first.memory_used_mib, first.pcie_kbs) == \
        (100, 116, 55217, 2000)
    assert first.nvlink_kbs is None  # a rate needs two readings of the counter
    assert second.pcie_kbs is None  # not supported on that device: None, not an error
    assert nvml.pids(0) == {4242} and nvml.pids(1) == set()
    assert classify(first, d0) is Activity.SPIN
    times = iter([104.0])
    # TX + RX counters: 2 x 1000 KiB at t=100, 2 x 3000 KiB at t=104 (device 1 read in between)
    assert nvml.sample(0).nvlink_kbs == (6000 - 2000) / 4
    nvml.close()
    assert fake.shut


def test_gloo_groups_and_samples_after_a_rank_ended_are_not_spinning_nccl(tb):
    from dataclasses import replace

    spin = of("spin", "6524")
    assert any(f.kind is FindingKind.GPU_BUSY_HANG
               for f in analyze(hung_world(tb, {0: spin * 3}, "undefined")).findings)
    for backend in ("gloo", "mpi"):  # no NCCL kernels to spin
        d = analyze(hung_world(tb, {0: spin * 3}, backend))
        assert not any(f.kind is FindingKind.GPU_BUSY_HANG for f in d.findings), backend
    # rank 0 was killed 1.5 s into its samples: what its GPU did afterwards is not its wait
    traces = hung_world(tb, {0: spin * 3, 1: spin * 3})
    killed = RankExit(ExitKind.SIGNAL, signal="SIGKILL", time_ns=int(tb.T0 + 2.5e9))
    traces = replace(traces, ranks={**traces.ranks, 0: replace(traces.ranks[0], exit=killed)})
    (f,) = [f for f in analyze(traces).findings if f.kind is FindingKind.GPU_BUSY_HANG]
    assert set(f.evidence["spinning"]) == {"1"}  # rank 0: 2 samples before its end, too few


def test_a_host_without_the_driver_is_told_before_nvidia_ml_py_is_imported():
    import json
    import subprocess
    import sys

    probe = ("import json, sys\n"
             "from nccl_doctor.supervisor.gpu.nvml import GpuUnavailable, Nvml, _library_loads\n"
             "try:\n    Nvml.open().close(); error = None\n"
             "except GpuUnavailable as e:\n    error = str(e)\n"
             "print(json.dumps([_library_loads(), error, 'pynvml' in sys.modules]))")
    loads, error, imported = json.loads(subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    if not loads:  # this host: no libnvidia-ml.so.1 to load
        assert error == "no NVIDIA driver on this host (libnvidia-ml.so.1 not found)"
        assert not imported
    else:  # a GPU host: NVML opened, or nvidia-ml-py said why not
        assert error is None or "NVML" in error or error == "nvidia-ml-py is not installed"
