"""A job ended by a signal sent to its processes and not to nccl-doctor (supervisor/signals.py
outside_end): Slurm's ``--signal`` to the steps, srun's 128 + N. The real Slurm case is
tests/upstream/test_slurm.py's."""

from __future__ import annotations

import pytest

from nccl_doctor import env
from nccl_doctor.supervisor.signals import outside_end


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch):
    monkeypatch.delenv(env.SLURM_JOB_ID, raising=False)


@pytest.mark.parametrize("code, name, how", [
    (143, "SIGTERM", "with status 143"), (-15, "SIGTERM", "killed by SIGTERM"),
    (130, "SIGINT", "with status 130"), (-1, "SIGHUP", "killed by SIGHUP"),
    (138, "SIGUSR1", "with status 138"), (-12, "SIGUSR2", "killed by SIGUSR2")])
def test_an_end_by_a_sent_signal_is_an_interrupt_naming_the_launcher(code, name, how):
    got = outside_end(code, "srun")
    assert got is not None and got.signals == (name,)
    assert got.sender == f"sent to the job's processes, not to nccl-doctor: srun ended {how}"


@pytest.mark.parametrize("code", [0, 1, 2, 124, 128, 137, -9, 139, -11, 134, -6, 135, 255])
def test_a_crash_an_oom_kill_or_an_exit_status_is_not(code):
    assert outside_end(code, "srun") is None
