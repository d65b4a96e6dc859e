"""ND005: ``generate`` under ZeRO-3 or FSDP without ``synced_gpus=True``, where the sharding can
be seen (source/sharding.py reads both). Each rank decodes until its own sequences end; with the
parameters sharded, every forward is a collective, so a rank that ends first leaves the others
waiting in an all-gather (docs/bugs.md D)."""

from __future__ import annotations

import ast
from pathlib import Path

from nccl_doctor.check.rules import CheckFinding
from nccl_doctor.source.sharding import CONFIG_SUFFIXES, Shown, unsynced
from nccl_doctor.source.sites import Module


def generate_findings(module: Module, shown: Shown) -> list[CheckFinding]:
    """``shown``: the sharding seen for the module (its own, a linked module's or the launch
    command's: check/engine.py)."""
    here = shown.path == module.path
    where = "" if here else (f"shown in {Path(shown.path).name}" + (
        f":{shown.line}" if not shown.path.endswith(CONFIG_SUFFIXES) else ""))
    return [CheckFinding(code="ND005", path=module.path, line=node.lineno,
                         col=node.col_offset + 1, call=ast.unparse(node.func),
                         condition=shown.what,
                         condition_line=shown.line if here else node.lineno, names=(),
                         how="; ".join(h for h in (where, how) if h))
            for node, how in unsynced(module.tree)]
