"""Secrets on the job's command line are stored as *** in every file of a capture directory
(manifest.json, report.json, each rank's .ndcap), unless `run --no-redact`; the environment's
are never stored. The rule itself (nccl_doctor/redact.py) is tested on its own first."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nccl_doctor import env, redact
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.capture.manifest import MANIFEST, Manifest, read_manifest
from nccl_doctor.rank.recorder import core

from .conftest import JOBS, doctor, os, spawn

M = redact.MASK


# -- the rule ------------------------------------------------------------------------------

@pytest.mark.parametrize("given, stored", [
    (["--api-key=secret456"], ["--api-key=***"]),
    (["--api-key", "secret456"], ["--api-key", M]),
    (["--hf-token", "tok789"], ["--hf-token", M]),
    (["--hf_token=tok789"], ["--hf_token=***"]),
    (["--token", "t"], ["--token", M]),
    (["--hub_token", "t"], ["--hub_token", M]),
    (["--hubToken", "t"], ["--hubToken", M]),  # camelCase
    (["--HF-TOKEN", "t"], ["--HF-TOKEN", M]),
    (["--auth-token", "t"], ["--auth-token", M]),
    (["--authtoken", "t"], ["--authtoken", M]),
    (["--wandb_api_key", "k"], ["--wandb_api_key", M]),
    (["--openai-apikey", "k"], ["--openai-apikey", M]),
    (["--aws-access-key", "k"], ["--aws-access-key", M]),
    (["--aws_secret_access_key=k"], ["--aws_secret_access_key=***"]),
    (["--private-key", "pem"], ["--private-key", M]),
    (["--client-secret", "s"], ["--client-secret", M]),
    (["--db-password", "p"], ["--db-password", M]),
    (["--passwd=p"], ["--passwd=***"]),
    (["--http-auth", "u:p"], ["--http-auth", M]),
    (["--gcp-credentials", "c"], ["--gcp-credentials", M]),
    (["--api-key="], ["--api-key=***"]),
    (["--api-key=a=b"], ["--api-key=***"]),
])
def test_secret_flags_keep_their_name_and_lose_their_value(given, stored) -> None:
    assert redact.argv(["train.py", *given, "--lr", "3e-4"]) == ["train.py", *stored, "--lr",
                                                                    "3e-4"]


@pytest.mark.parametrize("arg", [
    "--max-tokens", "--max-new-tokens", "--max_tokens", "--num-tokens", "--tokens",
    "--tokenizer", "--tokenizer-name", "--pad-token", "--eos_token", "--bos-token",
    "--pad-token-id", "--max-token-length", "--hf-token-file",
    "--key", "--text-key", "--label_key", "--sort-key", "--keyboard-layout", "--keys",
    "--author", "--monkey", "--no-auth", "--hotkey", "-p", "-k",
])
def test_names_that_only_resemble_a_secret_keep_their_value(arg: str) -> None:
    args = ["train.py", arg, "5", f"{arg}=6"]
    assert redact.argv(args) == args


def test_a_secret_flag_followed_by_a_flag_takes_no_value() -> None:
    args = ["train.py", "--use-auth-token", "--lr", "3", "--hf-token", "--", "x.py"]
    assert redact.argv(args) == args
    # ... but a positional after it is its value: when in doubt, redact
    assert redact.argv(["--use-auth-token", "data/"]) == ["--use-auth-token", M]
    assert redact.argv(["--hf-token"]) == ["--hf-token"]


@pytest.mark.parametrize("given, stored", [
    ("https://u:pw@h/x", "https://u:***@h/x"),
    ("https://user:p@ss@host:8443/repo.git", "https://user:***@host:8443/repo.git"),
    ("--db=postgres://admin:hunter2@db:5432/x", "--db=postgres://admin:***@db:5432/x"),
    ("DATA=s3://k:s@bucket/p", "DATA=s3://k:***@bucket/p"),
    ("https://h/x?access_token=abc&page=2", "https://h/x?access_token=***&page=2"),
    ("https://b.blob/c?sv=1&sig=abc", "https://b.blob/c?sv=1&sig=***"),
    ("https://s3/x?X-Amz-Credential=a&X-Amz-Signature=b",
     "https://s3/x?X-Amz-Credential=***&X-Amz-Signature=***"),
])
def test_url_passwords_and_secret_query_parameters(given: str, stored: str) -> None:
    assert redact.argv([given]) == [stored]


@pytest.mark.parametrize("url", [
    "http://host:8080/a@b", "https://git@github.com/x.git", "ssh://host:22/x",
    "https://h/x?page=2&max_tokens=5", "git@github.com:org/repo.git",
])
def test_urls_without_credentials_are_kept(url: str) -> None:
    assert redact.argv([url]) == [url]


@pytest.mark.parametrize("given, stored", [
    ("HF_TOKEN=abc", "HF_TOKEN=***"),
    ("WANDB_API_KEY=abc", "WANDB_API_KEY=***"),
    ("AWS_SECRET_ACCESS_KEY=a=b", "AWS_SECRET_ACCESS_KEY=***"),
    ("+wandb.api_key=abc", "+wandb.api_key=***"),  # a Hydra override
    ("trainer.hub_token=abc", "trainer.hub_token=***"),
])
def test_secret_assignments(given: str, stored: str) -> None:
    assert redact.argv(["env", given, "python", "t.py"]) == ["env", stored, "python", "t.py"]


@pytest.mark.parametrize("arg", ["MAX_TOKENS=5", "CUDA_VISIBLE_DEVICES=0,1", "lr=3", "a==b"])
def test_plain_assignments_are_kept(arg: str) -> None:
    assert redact.argv([arg]) == [arg]


def test_redaction_is_idempotent_and_leaves_clean_commands_alone() -> None:
    dirty = ["torchrun", "t.py", "--api-key=s", "--hf-token", "t", "HF_TOKEN=x",
             "https://u:p@h/x?token=z"]
    once = redact.argv(dirty)
    assert redact.argv(once) == once
    clean = ["torchrun", "--nproc-per-node=2", "t.py", "--max-new-tokens", "64"]
    assert redact.argv(clean) == clean


def test_the_documented_words_are_the_rule() -> None:
    doc = redact.__doc__ or ""
    for name in ("SECRET_WORDS", "KEY_OWNERS", "TOKENIZER_WORDS", "--no-redact", env.NO_REDACT):
        assert name in doc
    for word in redact.SECRET_WORDS:
        assert redact.secret_name(f"--my-{word}")
    for owner in redact.KEY_OWNERS:
        assert redact.secret_name(f"--{owner}-key")
    for word in redact.TOKENIZER_WORDS:
        assert not redact.secret_name(f"--{word}-token")


# -- where the command is stored -------------------------------------------------------------

SECRETS = ["--api-key=secret456", "--hf-token", "tok789", "https://u:pw987zz@h/x"]
MASKED = ["--api-key=***", "--hf-token", M, "https://u:***@h/x"]


def test_the_manifest_stores_the_command_redacted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(env.NO_REDACT, raising=False)
    m = Manifest(command=("torchrun", "t.py", *SECRETS), started_at=1.0, run_id="r")
    m.write(tmp_path)
    raw = json.loads((tmp_path / MANIFEST).read_text())
    assert raw["command"] == ["torchrun", "t.py", *MASKED] and raw["redacted"] is True
    assert read_manifest(tmp_path).command == ("torchrun", "t.py", *MASKED)


def test_a_manifest_not_redacted_keeps_its_command_verbatim(tmp_path: Path) -> None:
    # what the supervisor writes under `run --no-redact` (redact.wanted of the job's environment)
    assert redact.wanted({env.NO_REDACT: "1"}) is False and redact.wanted({}) is True
    Manifest(command=("t.py", *SECRETS), started_at=1.0, run_id="r", redacted=False).write(
        tmp_path)
    raw = json.loads((tmp_path / MANIFEST).read_text())
    assert raw["command"] == ["t.py", *SECRETS] and raw["redacted"] is False
    # the manifest says so: a replay (any environment) keeps it verbatim as well
    assert read_manifest(tmp_path).command == ("t.py", *SECRETS)


def test_a_manifest_written_before_redaction_is_redacted_when_read(tmp_path: Path) -> None:
    m = Manifest(command=("t.py",), started_at=1.0, run_id="r").to_json()
    m.pop("redacted")
    m["command"] = ["t.py", *SECRETS]
    (tmp_path / MANIFEST).write_text(json.dumps(m))
    assert read_manifest(tmp_path).command == ("t.py", *MASKED)
    assert load_capture_dir(tmp_path).command == ("t.py", *MASKED)  # what report.json shows


def test_the_rank_keeps_its_argv_redacted(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py", *SECRETS])
    monkeypatch.delenv(env.NO_REDACT, raising=False)
    assert core._argv() == ["train.py", *MASKED]
    monkeypatch.setenv(env.NO_REDACT, "1")
    assert core._argv() == ["train.py", *SECRETS]


# -- a real run ------------------------------------------------------------------------------

ENV_SECRET = "envsecret321"


def _run(out: Path, *options: str) -> None:
    job_env = {**os.environ, "HF_TOKEN": ENV_SECRET, "WANDB_API_KEY": ENV_SECRET}
    job_env.pop(env.NO_REDACT, None)
    proc = doctor("run", "--quiet", "--out", str(out), *options, "--",
                  *spawn(2, JOBS / "clean.py", *SECRETS), env=job_env)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _holding(out: Path, secret: str) -> list[str]:
    """The files under ``out`` whose bytes hold ``secret``."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if p.is_file() and secret.encode() in p.read_bytes())


@pytest.mark.integration
def test_a_run_stores_no_secret_of_its_command_line_or_environment(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    _run(out)
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert MANIFEST in files and "report.json" in files
    assert sum(f.endswith(".ndcap") for f in files) == 2
    for secret in ("secret456", "tok789", "pw987zz", ENV_SECRET):
        assert _holding(out, secret) == [], secret
    # stored redacted, not dropped
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["command"][-4:] == MASKED
    report = json.loads((out / "report.json").read_text())
    assert report["command"][-4:] == MASKED and report["verdict"] == "ok"
    traces = load_capture_dir(out)
    assert sorted(traces.ranks) == [0, 1]
    for trace in traces.ranks.values():
        assert list(trace.meta.argv[-4:]) == MASKED


@pytest.mark.integration
def test_no_redact_stores_the_command_line_verbatim(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    _run(out, "--no-redact")
    for secret in ("secret456", "tok789", "pw987zz"):
        held = _holding(out, secret)
        assert MANIFEST in held and "report.json" in held, (secret, held)
        assert sum(f.endswith(".ndcap") for f in held) == 2, (secret, held)
    assert _holding(out, ENV_SECRET) == []  # the environment: never, even so
