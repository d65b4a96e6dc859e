"""The command line's words have one source each, and the docs say what it says: the synopses
(``--help``, README.md, docs/) and docs/cli.md come from the parser (docs/cli_reference.py), the
exit statuses from ``ExitStatus``, the metrics' labels from ``serve/metrics.py``'s ``LABELS``."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_doctor.cli import usage
from nccl_doctor.cli.main import main
from nccl_doctor.errors import ExitStatus
from nccl_doctor.serve import metrics
from nccl_doctor.serve.state import Published
from nccl_doctor.status_view import LiveView, RankState, RankView

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))

import cli_reference  # noqa: E402

COMMANDS = cli_reference.commands()


def test_the_docs_show_the_parser_s_words():
    run = subprocess.run([sys.executable, str(DOCS / "cli_reference.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_argument_is_in_its_synopsis_and_on_the_reference_page(name):
    parser = COMMANDS[name]
    synopsis = usage.synopsis(parser, width=80)
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        spelled = action.option_strings[0] if action.option_strings else usage.word(action)
        assert spelled in synopsis, (name, spelled)
        assert f"`{usage.word(action)}`" in page, (name, usage.word(action))
    assert all(len(line) <= 80 for line in synopsis.splitlines())


def test_the_help_s_usage_names_every_flag_a_user_found_missing(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = capsys.readouterr().out
    head = shown[:shown.index("\n\n")]
    assert head.startswith("usage: nccl-doctor run [--out DIR]")
    for flag in ("--serve [HOST:]PORT", "--serve-linger SECONDS", "--user-code PATTERN",
                 "--library-code PATTERN", "--slurm", "-- COMMAND [ARGS...]"):
        assert flag in head, flag
    assert all(len(line) <= 98 for line in head.splitlines())
    lines = head.splitlines()  # later lines under the first argument, as argparse lays them out
    assert all(line.startswith(" " * len("usage: nccl-doctor run ")) for line in lines[1:])


def test_the_synopsis_spells_arguments_as_the_docs_do():
    p = argparse.ArgumentParser(prog="tool x")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--mode", choices=["a", "b"])
    p.add_argument("--maybe", nargs="?", const="x", metavar="ADDRESS")
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    both = p.add_mutually_exclusive_group()
    both.add_argument("--diff", action="store_true")
    both.add_argument("--fix", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND")
    assert usage.synopsis(p) == ("tool x PATH [PATH...] [--mode a|b] [--maybe [ADDRESS]] -o FILE "
                                 "[--diff | --fix] -- COMMAND [ARGS...]")
    assert usage.synopsis(p, width=40) == (
        "tool x PATH [PATH...] [--mode a|b]\n"
        "       [--maybe [ADDRESS]] -o FILE\n"
        "       [--diff | --fix]\n"
        "       -- COMMAND [ARGS...]")
    assert usage.word(p._actions[4]) == "-o/--output FILE"


def test_a_marked_synopsis_is_replaced_and_one_naming_no_command_is_an_error():
    text = ("intro\n<!-- synopsis:run:begin -->\n```\nnccl-doctor run [--old]\n```\n"
            "<!-- synopsis:run:end -->\nrest\n")
    made = cli_reference.with_synopses(text, {"run": "nccl-doctor run [--new]"}, "x.md")
    assert made == text.replace("[--old]", "[--new]")
    with pytest.raises(SystemExit, match="names no command"):
        cli_reference.with_synopses(text.replace(":run:", ":walk:"), {"run": "r"}, "x.md")


def test_the_readme_shows_every_command_s_synopsis():
    readme = README.read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"<!-- synopsis:{name}:begin -->" in readme, name


def _section(text: str, heading: str) -> str:
    start = text.index(heading) + len(heading)
    end = text.find("\n#", start)
    return text[start:end if end >= 0 else None]


def test_every_option_of_run_is_said_beside_its_synopsis():
    """docs/run.md's table says what each option is for, and the README's words after the
    synopsis name each one: none left out."""
    readme = _section(README.read_text(encoding="utf-8"), "### `nccl-doctor run`")
    readme = readme[readme.index("<!-- synopsis:run:end -->"):]
    page = _section((DOCS / "run.md").read_text(encoding="utf-8"), "## Options")
    for action in COMMANDS["run"]._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--help":
                assert f"`{flag}" in readme, ("README.md", flag)
                assert f"| `{flag}" in page or f", `{flag}" in page, ("docs/run.md", flag)


def _statuses() -> set[int]:
    return {v for k, v in vars(ExitStatus).items() if k.isupper() and isinstance(v, int)}


def test_the_exit_status_page_lists_every_status_and_only_those():
    page = (DOCS / "exit-status.md").read_text(encoding="utf-8")
    listed = {int(n) for n in re.findall(r"^\| (\d+) \|", page, re.M)}
    assert listed == _statuses()


def test_the_readme_names_every_exit_status():
    said = _section(README.read_text(encoding="utf-8"), "### Exit status")
    named: set[int] = set()
    for low, high in re.findall(r"(?<![\w.-])(\d+)(?:-(\d+))?\s+\(", said):
        named |= set(range(int(low), int(high or low) + 1))
    assert named == _statuses()


def _published() -> Published:
    view = LiveView((RankView(0, "nodeA", 4, RankState.WAITING, "all_reduce #4 (group 0)"),),
                    "waiting_on_peers", "", 1.0, 2.0)
    return Published(at=1.7e9, state="running", view=view, since_progress={0: 1.0},
                     nodes={"joined": 1}, skew_s={0: 0.1}, lateness_s={0: 0.1}, cost_s={0: 0.1})


def test_every_metric_is_made_with_its_declared_labels():
    made = {}
    for family in metrics.families(_published()):
        name = family.name + ("_total" if family.type == "counter" else "")
        made[name] = family._labelnames  # (prometheus_client keeps them only there)
    assert made == metrics.LABELS


def test_the_serve_page_lists_every_metric_with_its_labels():
    page = _section((DOCS / "serve.md").read_text(encoding="utf-8"), "## Metrics")
    listed = {m.group(1): tuple(filter(None, (m.group(2) or "").split(",")))
              for m in re.finditer(r"^\| `(nccl_doctor_\w+)(?:\{([\w,]*)\})?` \|", page, re.M)}
    assert listed == metrics.LABELS
