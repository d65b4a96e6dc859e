"""A command's synopsis, made from its parser: what ``--help`` shows and what the README and
docs/ show (docs/cli_reference.py writes them there), so that neither can leave a flag out.

argparse's own usage line spells choices as ``{a,b}``, shows ``-h`` and puts a positional
after every option; the synopsis reads as the docs always have: ``PATH [PATH...]`` first,
``--on-hang report|kill|restart``, the launch command last as ``-- COMMAND [ARGS...]``.
"""

from __future__ import annotations

import argparse
import shutil


def synopsis(parser: argparse.ArgumentParser, width: int = 100, prefix: str = "") -> str:
    """``parser``'s prog and its arguments, wrapped at ``width`` columns, each line after the
    first indented under the first argument. ``prefix`` is what the first line will be printed
    after (argparse's ``"usage: "``): counted in the width and the indent, not returned."""
    first = f"{prefix}{parser.prog}"
    indent = " " * (len(first) + 1)
    lines, line = [], first
    for token in tokens(parser):
        if len(line) + 1 + len(token) > width and line != first:  # (never a bare prog)
            lines.append(line)
            line = indent + token
        else:
            line = f"{line} {token}"
    lines.append(line)
    return "\n".join(lines)[len(prefix):]


def tokens(parser: argparse.ArgumentParser) -> list[str]:
    """The synopsis's words: the positionals, the options (a mutually exclusive group as one
    word, ``[--diff | --fix]``), then a command after ``--``; ``-h`` left out (every command
    has it)."""
    actions = [a for a in parser._actions  # (argparse has no public list of them)
               if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
    groups = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    last = (argparse.REMAINDER, argparse.PARSER)  # what follows is another command's
    positionals = [_positional(a) for a in actions
                   if not a.option_strings and a.nargs not in last]
    options: list[str] = []
    done: set[int] = set()
    for action in actions:
        if not action.option_strings or id(action) in done:
            continue
        group = groups.get(id(action))
        if group is None:
            options.append(_option(action))
            continue
        members = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        done.update(id(a) for a in members)
        inner = " | ".join(_option(a, bare=True) for a in members)
        options.append(f"({inner})" if group.required else f"[{inner}]")
    after = [_positional(a) for a in actions if not a.option_strings and a.nargs in last]
    return positionals + options + after


def word(action: argparse.Action) -> str:
    """One argument as the synopsis spells it, without its brackets, every spelling of an
    option given (``-o/--output FILE``)."""
    if not action.option_strings:
        if action.nargs == argparse.OPTIONAL:
            return _metavar(action)
        return _positional(action)
    spelled = "/".join(action.option_strings)
    return _option(action, bare=True).replace(action.option_strings[0], spelled, 1)


def _metavar(action: argparse.Action) -> str:
    if action.choices is not None and action.metavar is None:
        return "|".join(str(c) for c in action.choices)
    if isinstance(action.metavar, tuple):
        return " ".join(action.metavar)
    return action.metavar or (action.dest.upper() if action.option_strings else action.dest)


def _option(action: argparse.Action, bare: bool = False) -> str:
    flag = action.option_strings[0]
    if action.nargs == 0:
        text = flag
    elif action.nargs == argparse.OPTIONAL:
        text = f"{flag} [{_metavar(action)}]"
    elif action.nargs in (argparse.ZERO_OR_MORE, argparse.ONE_OR_MORE):
        text = f"{flag} {_metavar(action)} [{_metavar(action)}...]"
    else:
        text = f"{flag} {_metavar(action)}"
    return text if bare or action.required else f"[{text}]"


def _positional(action: argparse.Action) -> str:
    name = _metavar(action)
    if action.nargs == argparse.REMAINDER:
        return f"-- {name} [ARGS...]"
    if action.nargs == argparse.PARSER:
        return f"{name} [ARGS...]"
    if action.nargs == argparse.OPTIONAL:
        return f"[{name}]"
    if action.nargs == argparse.ZERO_OR_MORE:
        return f"[{name}...]"
    if action.nargs == argparse.ONE_OR_MORE:
        return f"{name} [{name}...]"
    return name


def help_width() -> int:
    """The width argparse lays ``--help`` out in: the terminal's, less 2 (its formatter's)."""
    return max(shutil.get_terminal_size().columns - 2, 40)
