"""Where a program shards its model (ZeRO-3, FSDP), and its ``generate`` calls that do not pass
``synced_gpus=True`` (``nccl-doctor check``'s ND005, check/generate.py). Each rank decodes
until its own sequences end; with the parameters sharded, every forward is a collective, so a
rank that ends first leaves the others waiting in an all-gather (docs/bugs.md D; transformers'
``synced_gpus`` keeps every rank stepping until all are done).

The sharding is seen where a module holds a DeepSpeed config with ``"zero_optimization":
{"stage": 3}``, passes ``zero_stage=3``, wraps a model with FSDP (``fully_shard``,
``FullyShardedDataParallel``), or names a config file that says so (a DeepSpeed JSON, an
Accelerate YAML with ``zero_stage: 3`` or ``distributed_type: FSDP``, as a string in the source
or on the launch command); and in a module the ``generate`` call's module imports or is imported
by, among those checked (the config in config.py, the call in train.py).

A ``generate`` call whose ``synced_gpus`` is missing or ``False`` is unsynced; so is one that
passes a command-line flag that is ``False`` unless given (``synced_gpus=args.fixed`` with
``add_argument("--fixed", action="store_true")``: with the flag). Any other expression decides
it itself and is not."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

from nccl_doctor.source.rank_flow import call_name
from nccl_doctor.source.sites import Module

_FSDP = frozenset({"fully_shard", "FullyShardedDataParallel", "FSDP"})
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
MAX_CONFIG_BYTES = 1_000_000


@dataclass(frozen=True)
class Shown:
    """Where the sharding is seen: what ("ZeRO-3", "FSDP"), the file and line."""

    what: str
    path: str
    line: int


def sharding(module: Module) -> Shown | None:
    """Where ``module`` shows ZeRO-3 or FSDP, if it does (itself, or a config file it names)."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Constant) and key.value == "zero_optimization"
                        and isinstance(value, ast.Dict) and _stage3(value)):
                    return Shown("ZeRO-3", module.path, node.lineno)
        elif isinstance(node, ast.Call):
            if call_name(node) in _FSDP:
                return Shown("FSDP", module.path, node.lineno)
            if any(k.arg == "zero_stage" and isinstance(k.value, ast.Constant)
                   and k.value.value == 3 for k in node.keywords):
                return Shown("ZeRO-3", module.path, node.lineno)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.endswith(CONFIG_SUFFIXES) and len(node.value) < 512):
            base = Path(module.path).parent
            for candidate in (base / node.value, Path.cwd() / node.value):
                what = config_sharding(candidate)
                if what is not None:
                    return Shown(what, str(candidate.resolve()), 1)
    return None


def config_sharding(path: Path) -> str | None:
    """"ZeRO-3" or "FSDP" when the config file at ``path`` (DeepSpeed JSON, Accelerate YAML)
    says so; None when it does not, or is not a config that can be read."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml  # (libcst's dependency; safe_load builds plain values only)

            data = yaml.safe_load(text)
    except Exception:  # (a file that is not a config: nothing seen)
        return None
    if not isinstance(data, dict):
        return None
    zero = data.get("zero_optimization")
    if isinstance(zero, dict) and zero.get("stage") == 3:
        return "ZeRO-3"
    ds = data.get("deepspeed_config")
    if isinstance(ds, dict) and ds.get("zero_stage") == 3:
        return "ZeRO-3"
    if data.get("distributed_type") == "FSDP" or isinstance(data.get("fsdp_config"), dict):
        return "FSDP"
    return None


def _stage3(config: ast.Dict) -> bool:
    return any(isinstance(k, ast.Constant) and k.value == "stage" and isinstance(v, ast.Constant)
               and v.value == 3 for k, v in zip(config.keys, config.values))


def unsynced(tree: ast.Module) -> list[tuple[ast.Call, str]]:
    """The ``generate`` calls of ``tree`` that do not pass ``synced_gpus=True``: each with how,
    when it passes a flag that is off unless given (else "")."""
    flags = flag_defaults(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "generate"):
            continue
        synced = next((k.value for k in node.keywords if k.arg == "synced_gpus"), None)
        how = ""
        if isinstance(synced, ast.Attribute) and synced.attr in flags:
            flag, line = flags[synced.attr]
            how = (f"synced_gpus={ast.unparse(synced)} is False unless {flag} is given "
                   f"(line {line})")
        elif synced is not None and not (isinstance(synced, ast.Constant)
                                         and synced.value is False):
            continue
        out.append((node, how))
    return out


def flag_defaults(tree: ast.Module) -> dict[str, tuple[str, int]]:
    """The command-line flags that are False unless given: dest -> (the flag, its line), from
    ``add_argument("--fixed", action="store_true")`` (or ``default=False``)."""
    out = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and node.args[0].value.startswith("-")):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = kw.get("action")
        default = kw.get("default")
        off = (isinstance(action, ast.Constant) and action.value == "store_true"
               and not (isinstance(default, ast.Constant) and default.value is True)) or (
            isinstance(default, ast.Constant) and default.value is False
            and not (isinstance(action, ast.Constant) and action.value == "store_false"))
        if not off:
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str)]
        long = next((n for n in names if n.startswith("--")), names[0])
        dest = kw.get("dest")
        key = dest.value if isinstance(dest, ast.Constant) else long.lstrip("-").replace("-", "_")
        out[key] = (long, node.lineno)
    return out
