"""Write the command line's words from its parser, where the docs show them.

    python docs/cli_reference.py [--check]

- docs/cli.md, the whole page: every command's description, synopsis and options;
- the synopsis of a command wherever README.md or a page of docs/ shows one, between
  ``<!-- synopsis:COMMAND:begin -->`` and ``<!-- synopsis:COMMAND:end -->``.

The synopsis is the one ``nccl-doctor COMMAND --help`` prints (nccl_doctor/cli/usage.py), at
100 columns. ``--check`` writes nothing and exits 1 when a file is not what the parser makes
(tests/unit/test_cli_reference.py runs it); ``make cli-docs`` writes them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nccl_doctor.cli import usage  # noqa: E402
from nccl_doctor.cli.main import build_parser  # noqa: E402

REFERENCE = ROOT / "docs" / "cli.md"
WIDTH = 100
SYNOPSIS = re.compile(
    r"(<!-- synopsis:([\w-]+):begin -->\n```\n)(.*?)(\n```\n<!-- synopsis:\2:end -->)", re.S)
INTRO = """\
Every command's synopsis and options, as `nccl-doctor COMMAND --help` gives them. This page is
made from the parser by `docs/cli_reference.py` (`make cli-docs`), and so are the synopses the
README and the other pages show: `tests/unit/test_cli_reference.py` fails when one of them is not
what the parser makes. What each exit status means: [Exit status](exit-status.md)."""
_DEFAULT_GROUPS = ("positional arguments", "options", "optional arguments")


def commands(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, by name, in the order ``--help`` lists them."""
    parser = parser or build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def synopses() -> dict[str, str]:
    return {name: usage.synopsis(p, WIDTH) for name, p in commands().items()}


def with_synopses(text: str, made: dict[str, str], where: str) -> str:
    """``text`` with each marked synopsis replaced by the one the parser makes."""
    def one(m: re.Match) -> str:
        if m.group(2) not in made:
            raise SystemExit(f"{where}: <!-- synopsis:{m.group(2)}:begin --> names no command "
                             f"(the commands: {', '.join(made)})")
        return m.group(1) + made[m.group(2)] + m.group(4)
    return SYNOPSIS.sub(one, text)


def _markdown(text: str) -> str:
    """Help text as Markdown prose: its backquotes kept, a ``*`` (a glob) not emphasis."""
    return text.replace("*", r"\*").replace("<", "&lt;")


def _help(action: argparse.Action, prog: str) -> str:
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    return _markdown((action.help or "") % dict(params, prog=prog))


def reference() -> str:
    """docs/cli.md."""
    parsers = commands()
    out = ["# Command line", "", INTRO, "", "```", usage.synopsis(build_parser(), WIDTH), "```"]
    seen: dict[tuple[tuple[str, ...], str], str] = {}  # an option and its help -> its command
    for name, p in parsers.items():
        out += ["", f"## nccl-doctor {name}", ""]
        if p.description:
            out += [_markdown(p.description), ""]
        out += ["```", usage.synopsis(p, WIDTH), "```"]
        shared: dict[str, list[str]] = {}
        for group in p._action_groups:
            items = []
            for action in group._group_actions:
                if action.help is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                    continue
                key = (tuple(action.option_strings), action.help or "")
                if action.option_strings and key in seen:
                    shared.setdefault(seen[key], []).append(f"`{usage.word(action)}`")
                    continue
                seen.setdefault(key, name)
                items.append(f"- `{usage.word(action)}`: {_help(action, p.prog)}")
            if not items:
                continue
            out.append("")
            if group.title not in _DEFAULT_GROUPS:
                title = f"**{group.title}**"
                out += [f"{title}: {_markdown(group.description)}" if group.description
                        else title, ""]
            out += items
        for other, names in shared.items():
            out += ["", f"And, as in [`{other}`](#nccl-doctor-{other}): {', '.join(names)}."]
    return "\n".join(out) + "\n"


def pages() -> list[Path]:
    """README.md and every page of docs/ (docs/cli.md is made whole)."""
    return [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md")
                                         if p != REFERENCE)


def made() -> dict[Path, str]:
    """Each file the parser's words are in, as the parser makes it."""
    out = {REFERENCE: reference()}
    synopsis = synopses()
    for page in pages():
        text = page.read_text(encoding="utf-8")
        if SYNOPSIS.search(text):
            out[page] = with_synopses(text, synopsis, str(page.relative_to(ROOT)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a file is not what the parser makes; write nothing")
    a = p.parse_args(argv)
    stale = {path: text for path, text in made().items()
             if not path.exists() or path.read_text(encoding="utf-8") != text}
    if a.check:
        for path in stale:
            sys.stderr.write(f"{path.relative_to(ROOT)}: the command line's words there are not "
                             "the parser's: run `make cli-docs`\n")
        return 1 if stale else 0
    for path, text in stale.items():
        path.write_text(text, encoding="utf-8")
        print(f"Wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
