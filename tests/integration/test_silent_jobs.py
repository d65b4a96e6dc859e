"""Silent errors on real jobs: ranks sampling identical completions (transformers generate on a
tiny random Llama, 4 gloo ranks), seeded by node (two torchrun agents), and a real TRL
GRPOTrainer whose ranks are forced onto one seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_doctor.diagnosis import FindingKind, Severity, Verdict
from nccl_doctor.errors import ExitStatus
from nccl_doctor.reproducers.nodes import free_port

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
CLI = [sys.executable, "-m", "nccl_doctor"]


def doctor_run(out: Path, command: list[str], env: dict[str, str], *extra: str):
    return subprocess.run([*CLI, "run", "--out", str(out), *extra, "--", *command],
                          capture_output=True, text=True, timeout=400,
                          env=dict(os.environ, **env))


def spawn(nproc: int, script: str) -> list[str]:
    """The job's ranks started as torchrun would, without its process (the pytest plugin's
    launcher, nccl_doctor/testing/spawn.py), forked by the fork server."""
    from nccl_doctor.testing.spawn import command

    return command(nproc, [str(JOBS / script)])


def replay(out: Path):
    from nccl_doctor.analysis import analyze
    from nccl_doctor.analysis.calls.loaded import load_capture_dir

    return analyze(load_capture_dir(out))


def kinds(d, severity=Severity.WARNING) -> dict[FindingKind, object]:
    return {f.kind: f for f in d.findings if f.severity is severity}


def test_identically_seeded_sampling_is_caught(tmp_path):
    proc = doctor_run(tmp_path / "o", spawn(4, "sampling.py"), {"SEED_MODE": "same"},
                      "--fail-on", "suspect")
    assert proc.returncode == ExitStatus.VERDICT_FAILED, proc.stderr[-3000:]
    d = replay(tmp_path / "o")
    found = kinds(d)
    assert d.verdict is Verdict.SUSPECT
    same = found[FindingKind.IDENTICAL_COMPLETIONS]
    assert same.ranks == (0, 1, 2, 3) and same.evidence["same_prompts"]
    assert same.evidence["identical"] == 3 and same.evidence["sampling"]
    assert "same prompt + same seed" in same.title and "all 4 ranks" in same.title
    rng = found[FindingKind.SHARED_RNG_STATE]
    assert rng.evidence["classes"] == [[0, 1, 2, 3]]
    assert rng.evidence["seeding"]["3"] == "transformers.set_seed(1234)"
    assert "SUSPECT" in proc.stderr and "identical_completions" in proc.stderr


def test_per_rank_seeds_are_fine(tmp_path):
    proc = doctor_run(tmp_path / "o", spawn(4, "sampling.py"), {"SEED_MODE": "rank"},
                      "--fail-on", "suspect")
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = replay(tmp_path / "o")
    assert d.verdict is Verdict.OK and not d.findings, [f.title for f in d.findings]
    # the hashes were recorded: four ranks, three generations each, all different
    gens = [n for n in _notes(tmp_path / "o") if n.get("note") == "gen"]
    assert len(gens) == 12 and len({g["all"] for g in gens}) == 12


def test_greedy_decoding_is_not_the_seed_bug(tmp_path):
    proc = doctor_run(tmp_path / "o", spawn(4, "sampling.py"), {"SEED_MODE": "greedy"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = replay(tmp_path / "o")
    assert d.verdict is Verdict.OK
    assert not kinds(d), [f.title for f in d.findings]
    note = kinds(d, Severity.INFO)[FindingKind.IDENTICAL_COMPLETIONS]
    assert "deterministic decoding" in note.title and not note.evidence["sampling"]


def test_seeded_by_node_is_said_per_node(tmp_path):
    # two "nodes" on localhost: two torchrun agents with --nnodes 2, 2 ranks each
    agent = (f"{sys.executable} -m torch.distributed.run --nnodes 2 --nproc-per-node 2 "
             f"--master-addr 127.0.0.1 --master-port {free_port()}")
    job = JOBS / "sampling.py"
    script = f"{agent} --node-rank 0 {job} & {agent} --node-rank 1 {job}; wait"
    proc = doctor_run(tmp_path / "o", ["bash", "-c", script], {"SEED_MODE": "node"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = kinds(replay(tmp_path / "o"))
    for kind in (FindingKind.IDENTICAL_COMPLETIONS, FindingKind.SHARED_RNG_STATE):
        f = found[kind]
        assert f.evidence["classes"] == [[0, 1], [2, 3]], f
        assert "all local ranks of each node" in f.title and "differ across nodes" in f.title
        assert "node 0 (ranks 0, 1): ranks 0, 1" in f.detail
        assert "node 1 (ranks 2, 3): ranks 2, 3" in f.detail


def test_grpo_forced_onto_one_seed(tmp_path):
    # long enough that the supervisor's live check runs while the trainer still trains (30 steps
    # were not, twice in four runs of the whole suite on 2 cores: the check looks every 2 s)
    proc = doctor_run(tmp_path / "o", spawn(2, "grpo_seed.py"),
                      {"SEED_MODE": "same", "STEPS": "60"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = replay(tmp_path / "o")
    found = kinds(d)
    assert d.verdict is Verdict.SUSPECT
    assert found[FindingKind.IDENTICAL_COMPLETIONS].ranks == (0, 1)
    signal = found[FindingKind.DEGENERATE_SIGNAL]
    assert "reward_std" in signal.evidence["criteria"], signal
    # shown while the job ran: before rank 0 said training had finished
    lines = proc.stderr.splitlines()
    live = [i for i, ln in enumerate(lines) if ln.startswith("nccl-doctor: SUSPECT: ")]
    finished = next(i for i, ln in enumerate(lines) if "GRPO-TRAINING-FINISHED" in ln)
    assert live and live[0] < finished, proc.stderr[-3000:]


def test_grpo_with_trls_own_seeding_is_fine(tmp_path):
    proc = doctor_run(tmp_path / "o", spawn(2, "grpo_seed.py"), {"SEED_MODE": "trl"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = replay(tmp_path / "o")
    assert d.verdict is Verdict.OK, [f.title for f in d.findings]
    # it did record: TRL logged metrics (a loss of 0 with a reward spread is not degenerate)
    rows = [n for n in _notes(tmp_path / "o") if n.get("note") == "metrics"]
    assert rows and any(r["values"].get("reward_std", 0) > 0 for r in rows)
    assert any(r["values"].get("loss") == 0 for r in rows)


def _notes(out: Path) -> list[dict]:
    from nccl_doctor.analysis.calls.loaded import load_capture_dir

    traces = load_capture_dir(out)
    return [n for t in traces.ranks.values() for n in t.notes]


def test_seeding_calls_and_the_public_api_are_recorded(run_job):
    job = run_job(2, str(JOBS / "seeding_calls.py"))
    assert job.exit_status == 0
    from nccl_doctor.analysis.calls.loaded import load_capture_dir

    for rank, trace in load_capture_dir(job.out).ranks.items():
        rng = [n for n in trace.notes if n.get("note") == "rng"]
        assert [n["label"] for n in rng] == [
            "random.seed", "numpy.random.seed", "init", "torch.manual_seed",
            "accelerate.utils.set_seed", "step"]
        assert [n.get("seed") for n in rng[:2]] + [rng[3]["seed"], rng[4]["seed"]] == [1, 2, 3, 4]
        assert rng[4]["device_specific"] is True and rng[5]["step"] == 0
        assert set(rng[4]["fp"]) == {"torch", "numpy", "python"}
        (gen,) = [n for n in trace.notes if n.get("note") == "gen"]
        assert gen["source"] == "user" and gen["nrows"] == 2 and len(set(gen["prompts"])) == 1
        (metrics,) = [n for n in trace.notes if n.get("note") == "metrics"]
        assert metrics["values"] == {"loss": 0.5, "reward_std": 0.25} and metrics["step"] == 1


@pytest.mark.parametrize("mode", ["same", "rank"])
def test_vllm_generate_is_hooked(tmp_path, mode):
    standin = Path(__file__).parent.parent / "fixtures" / "vllm_standin"
    env = {"SEED_MODE": mode, "PYTHONPATH": f"{standin}{os.pathsep}" +
           os.environ.get("PYTHONPATH", "")}
    proc = doctor_run(tmp_path / "o", spawn(2, "vllm_sampling.py"), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gens = [n for n in _notes(tmp_path / "o") if n.get("note") == "gen"]
    assert len(gens) == 6 and {g["source"] for g in gens} == {"vllm"}
    assert all(g["nrows"] == 4 and g["sample"] for g in gens)
    found = kinds(replay(tmp_path / "o"))
    if mode == "same":
        assert found[FindingKind.IDENTICAL_COMPLETIONS].ranks == (0, 1)
        assert {tuple(g["seeds"]) for g in gens} == {(7,), (107,), (207,)}
        assert found[FindingKind.SHARED_RNG_STATE].evidence["classes"] == [[0, 1]]
    else:
        assert not found, [f.title for f in found.values()]
