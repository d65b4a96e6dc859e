"""The spin signature against what a real H100 showed (tests/fixtures/gpu/h100, see its README):
NVML read every 0.1 s under known activities, and the GPU series nccl-doctor recorded during
real NCCL hangs and healthy runs on the same GPU. Every spinning window must read as spin, the
matmul, device-copy and busy-rank-0 windows must not, and replay of the hang captures must name
whom the spinning GPUs wait for."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.gpu.readings import GpuDevice, GpuSample
from nccl_doctor.gpu.series import read_gpu
from nccl_doctor.gpu.signature import Activity, classify, window

H100 = Path(__file__).parents[1] / "fixtures" / "gpu" / "h100"
HANGS = ["nccl_shape_mismatch.report", "nccl_shape_mismatch.nowatch",
         "nccl_skip_broadcast.report", "nccl_ddp_uneven"]
HEALTHY = ["nccl_ok", "nccl_busy_rank0_ok", "nccl_same_seed", "nccl_same_seed.fixed"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("h100")
    with tarfile.open(H100 / "captures.tar.gz") as tar:
        tar.extractall(root, filter="data")
    return root


def _phases() -> tuple[GpuDevice, dict[str, list[GpuSample]]]:
    data = json.loads((H100 / "nvml_signatures.json").read_text())
    device = GpuDevice(0, name=data["name"], power_limit_w=data["power_limit_w"])
    phases: dict[str, list[GpuSample]] = {}
    for x in data["series"]:
        phases.setdefault(x["phase"], []).append(GpuSample(
            t=x["t"], index=0, util=x["util"], memory_util=x["mem"], sm_mhz=x["sm"],
            power_w=x["power"], pcie_kbs=x["pcie"]))
    return device, phases


def _busy(samples: list[GpuSample]) -> list[GpuSample]:
    return [s for s in samples if s.util is not None and s.util >= 90]


def test_a_kernel_that_only_spins_reads_as_spin_and_work_does_not():
    device, phases = _phases()
    spin = _busy(phases["spin_sleep_kernel"])
    assert len(spin) >= 30 and all(classify(s, device) is Activity.SPIN for s in spin)
    assert window(spin, device).activity is Activity.SPIN
    # bf16 matmuls (~700 W) and device-to-device copies (54% of the limit, memory 100%)
    for phase, expected in (("matmul_bf16", Activity.COMPUTE), ("d2d_copy", Activity.COMPUTE)):
        busy = _busy(phases[phase])
        assert len(busy) >= 20, phase
        # NVML averages power over a longer period than utilisation: the first busy sample of
        # the matmuls still reads the idle 118 W. One sample is never a window.
        start = phases[phase][0].t
        assert all(s.t - start < 0.3 for s in busy if classify(s, device) is Activity.SPIN), phase
        assert window(busy, device).activity is expected, phase
        assert window(busy[:3], device).activity is not Activity.SPIN, phase
    assert window(phases["small_kernels"], device).activity is not Activity.SPIN
    assert window(phases["idle"], device).activity is Activity.IDLE


def test_copies_at_spin_power_are_transfers():
    """Device memory busy is data moving, even at a power a spin could draw."""
    device, phases = _phases()
    copy = _busy(phases["d2d_copy"])[0]
    low = GpuSample(t=copy.t, index=0, util=100, memory_util=copy.memory_util, power_w=120,
                    pcie_kbs=copy.pcie_kbs)
    assert classify(low, device) is Activity.TRANSFER


@pytest.mark.parametrize("run", HANGS)
def test_every_busy_sample_of_a_real_nccl_hang_is_a_spin(runs, run):
    """Hundreds of MB/s of PCIe polling (the socket transport's proxy) do not make it a
    transfer: power and idle device memory say the kernels wait."""
    gpu = read_gpu(runs / run)
    assert gpu is not None and gpu.available
    device = gpu.devices[0]
    busy = _busy(list(gpu.samples))
    assert len(busy) >= 3
    assert max(s.pcie_kbs or 0 for s in busy) > 50_000  # more than the old 50 MB/s veto
    assert [classify(s, device) for s in busy] == [Activity.SPIN] * len(busy)
    assert window(busy, device).activity is Activity.SPIN


def test_rank0_computing_while_rank1_waits_is_compute(runs):
    """One GPU shared by both ranks: rank 0's 25 s of matmuls dominate the waiting kernel."""
    gpu = read_gpu(runs / "nccl_busy_rank0_ok")
    busy = _busy(list(gpu.samples))
    assert len(busy) >= 40
    assert not any(classify(s, gpu.devices[0]) is Activity.SPIN for s in busy)
    assert window(busy, gpu.devices[0]).activity is Activity.COMPUTE


@pytest.mark.parametrize("run", ["nccl_shape_mismatch.report", "nccl_shape_mismatch.nowatch",
                                 "nccl_skip_broadcast.report"])
def test_replay_of_a_real_hang_names_whom_the_spinning_gpus_wait_for(runs, run):
    """On NCCL the stuck calls return once enqueued and the ranks end by NCCL's own abort: the
    GPU waits from the collective where the group diverged, whatever the CPU did next."""
    d = analyze(load_capture_dir(runs / run))
    (mismatch,) = [f for f in d.findings if f.kind is FindingKind.COLLECTIVE_MISMATCH]
    (busy,) = [f for f in d.findings if f.kind is FindingKind.GPU_BUSY_HANG]
    assert busy.evidence["waiting_for"] == sorted(mismatch.ranks) == list(busy.ranks)
    assert set(busy.evidence["spinning"]) == {"0", "1"}
    assert (busy.group, busy.seq) == (mismatch.group, mismatch.seq)
    for reading in busy.evidence["spinning"].values():
        assert reading["power_share"] < 0.2 and reading["util"] == 100
    assert f"waiting for rank {mismatch.ranks[0]}" in busy.title and "GPU 0 " in busy.title
    assert not busy.root_cause and mismatch.root_cause


@pytest.mark.parametrize("run", HEALTHY)
def test_no_gpu_busy_hang_in_a_healthy_run(runs, run):
    d = analyze(load_capture_dir(runs / run))
    assert not any(f.kind is FindingKind.GPU_BUSY_HANG for f in d.findings)
