"""ND005: ``generate`` under ZeRO-3 or FSDP without ``synced_gpus=True``, where the module shows
the sharding. Each rank decodes until its own sequences end; with the parameters sharded, every
forward is a collective, so a rank that ends first leaves the others waiting in an all-gather
(docs/bugs.md D; transformers' ``synced_gpus`` keeps every rank stepping until all are done).

The sharding is visible when the module holds a DeepSpeed config with ``"zero_optimization":
{"stage": 3}``, passes ``zero_stage=3``, or wraps a model with FSDP (``fully_shard``,
``FullyShardedDataParallel``). A ``generate`` call whose ``synced_gpus`` is missing or
``False`` is said; one that passes any other expression decides it itself and is not."""

from __future__ import annotations

import ast

from nccl_doctor.check.rules import CheckFinding
from nccl_doctor.check.sites import Module

_FSDP = frozenset({"fully_shard", "FullyShardedDataParallel", "FSDP"})


def sharding(tree: ast.Module) -> int | None:
    """The line that shows ZeRO-3 or FSDP in ``tree``, if any."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Constant) and key.value == "zero_optimization"
                        and isinstance(value, ast.Dict) and _stage3(value)):
                    return node.lineno
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else (
                node.func.id if isinstance(node.func, ast.Name) else "")
            if name in _FSDP:
                return node.lineno
            if any(k.arg == "zero_stage" and isinstance(k.value, ast.Constant)
                   and k.value.value == 3 for k in node.keywords):
                return node.lineno
    return None


def _stage3(config: ast.Dict) -> bool:
    return any(isinstance(k, ast.Constant) and k.value == "stage" and isinstance(v, ast.Constant)
               and v.value == 3 for k, v in zip(config.keys, config.values))


def generate_findings(module: Module) -> list[CheckFinding]:
    shown = sharding(module.tree)
    if shown is None:
        return []
    out = []
    for node in ast.walk(module.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "generate"):
            continue
        synced = next((k.value for k in node.keywords if k.arg == "synced_gpus"), None)
        if synced is not None and not (isinstance(synced, ast.Constant)
                                       and synced.value is False):
            continue
        text = ast.unparse(node.func)
        out.append(CheckFinding(code="ND005", path=module.path, line=node.lineno,
                                col=node.col_offset + 1, call=text,
                                condition="ZeRO-3" if _zero(module.tree) else "FSDP",
                                condition_line=shown, names=()))
    return out


def _zero(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Constant) and n.value == "zero_optimization"
               for n in ast.walk(tree)) or any(
        isinstance(n, ast.keyword) and n.arg == "zero_stage" for n in ast.walk(tree))
