"""Known-issue rules: when a finding matches one of docs/bugs.md's five mechanisms, say which.

A rule matches its mechanism, never an op name alone (A: an all_gather of tensors that differ in
one padded dimension only, or ranks left behind in a gather of logits-like tensors). If the
job's environment points at the upstream library - its recorded version in the affected range
and one of its files on the finding's call path (the frames between the user's line and torch;
for captures without call paths and Flight Recorder dumps: the callsites and stacks) - the
finding carries the upstream issue and its fix; otherwise the general fix for the mechanism.
Pure: a ``Diagnosis`` and the ranks' recorded library versions in, an annotated ``Diagnosis``
out. The annotation is ``evidence["known_issue"]`` plus the hint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind
from nccl_doctor.model import TensorSig, parse_tensor_desc


@dataclass(frozen=True)
class Rule:
    id: str  # docs/bugs.md's letter
    mechanism: str
    applies: Callable[[Finding, str], bool]  # (finding, its frames as one text)
    library: str  # the import name whose version is checked
    affected: tuple[str, str] | None  # [first affected, first fixed) versions
    files: tuple[str, ...]  # path fragments of the library's code that identify the bug
    upstream: str
    upstream_fix: str
    general_fix: str


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def _in_range(version: str | None, affected: tuple[str, str] | None) -> bool:
    if version is None:
        return False
    if affected is None:
        return True
    return _version(affected[0]) <= _version(version) < _version(affected[1])


def _ops(f: Finding) -> set[str]:
    sides = f.evidence.get("sides") or []
    return {str(s.get("value")) for s in sides if isinstance(s, Mapping)} | {f.op or ""}


def _gather_desync(f: Finding, _frames: str) -> bool:
    """A gather in the desync: a shape mismatch of an all_gather, or (NCCL's semantics) ranks
    left behind in an all_gather while a peer moved on."""
    if f.kind is FindingKind.COLLECTIVE_MISMATCH:
        aspect = f.evidence.get("aspect")
        return (aspect == "shape" and (f.op or "").startswith("all_gather")) or (
            aspect == "op" and any(o.startswith("all_gather") for o in _ops(f)))
    return f.kind is FindingKind.MISSING_COLLECTIVE and (f.op or "").startswith("all_gather")


_LOGITS = re.compile(r"logit|metric|accuracy", re.I)


def _padded_gather(f: Finding, frames: str) -> bool:
    """Tensors each rank padded to its own length, gathered: an all_gather whose shapes differ
    in exactly one dimension past the batch one (``[B, T_rank, V]``), or ranks left behind in an
    all_gather (a peer moved on: NCCL's semantics) of a logits-like tensor - three or more
    dimensions, or two with logits/metrics/accuracy on its call path."""
    if not _gather_desync(f, frames):
        return False
    if f.evidence.get("aspect") == "shape":
        shapes = [parse_tensor_desc(str(side.get("value", ""))) for side in _sides(f)]
        return len(shapes) >= 2 and _differ_in_one_padded_dim(shapes)
    inputs = [str(side.get("input") or "") for side in _sides(f)
              if str(side.get("op", "")).startswith("all_gather")]
    inputs += [str(f.evidence.get("input") or "")] if f.kind is FindingKind.MISSING_COLLECTIVE \
        else []
    dims = [len(sig.shape) for text in inputs for sig in parse_tensor_desc(text)]
    return any(d >= 3 or (d == 2 and _LOGITS.search(frames)) for d in dims)


def _sides(f: Finding) -> list[Mapping]:
    return [s for s in f.evidence.get("sides") or [] if isinstance(s, Mapping)]


def _differ_in_one_padded_dim(shapes: list[tuple[TensorSig, ...]]) -> bool:
    if any(len(s) != 1 for s in shapes):
        return False
    first = shapes[0][0]
    if len(first.shape) < 2 or any(s[0].dtype != first.dtype or s[0].count != first.count
                                   or len(s[0].shape) != len(first.shape) for s in shapes):
        return False
    differ = {axis for s in shapes for axis, (a, b) in enumerate(zip(s[0].shape, first.shape))
              if a != b}
    return len(differ) == 1 and differ != {0}


def _node_seeded(f: Finding, _frames: str) -> bool:
    return f.kind in (FindingKind.IDENTICAL_COMPLETIONS, FindingKind.SHARED_RNG_STATE) and (
        "each node" in f.title)


def _stuck_in_rendezvous(f: Finding, frames: str) -> bool:
    return f.kind is FindingKind.MISSING_COLLECTIVE and bool(
        re.search(r"TCPStore|rendezvous|init_process_group|ProcessGroup|weight.?sync", frames,
                  re.I)) and "stuck" in f.evidence


def _sft_desync(f: Finding, frames: str) -> bool:
    return _padded_gather(f, frames) and bool(re.search(r"sft|token_accuracy|accuracy", frames))


def _generate_desync(f: Finding, frames: str) -> bool:
    return _gather_desync(f, frames) and bool(
        re.search(r"generation[/\\]utils\.py|\bgenerate\b", frames))


#: the most specific first: where several apply, the first gives the general fix
RULES: tuple[Rule, ...] = (
    Rule("E", "sharded (ZeRO-3) generate with unsynced decode lengths", _generate_desync,
         "deepspeed", None, ("transformers/generation/utils.py", "deepspeed/"),
         "transformers #22231 / #22242 (OpenRLHF #427): generate under ZeRO-3",
         "Call generate(..., synced_gpus=True) under ZeRO-3, or generate with a separate "
         "inference engine.",
         "Ranks decode different numbers of steps and every step all-gathers shards: keep them "
         "stepping together (synced_gpus=True) or fix the generation length."),
    Rule("B", "padded logits/labels gathered for SFT token accuracy", _sft_desync,
         "trl", ("0.15.0", "0.15.1"), ("trl/trainer/sft_trainer.py",),
         "TRL issue #2879, introduced by PR #2597 (token accuracy) in v0.15.0",
         "Upgrade TRL to v0.15.1 or later (PR #2890 gathers correct/total token counts), or "
         "train with packing=True.",
         "Compute the metric's counts locally and all-reduce the numbers; gathering "
         "per-rank-padded logits or labels mismatches across ranks."),
    Rule("A", "per-rank-padded logits gathered for metrics (CPO/SimPO/ORPO)", _padded_gather,
         "trl", ("0.14.0", "0.17.0"), ("trl/trainer/cpo_trainer.py", "trl/trainer/orpo_trainer.py"),
         "TRL issue #3068 (ms-swift #3827), introduced by PR #2474 in v0.14.0",
         "Upgrade TRL to v0.17.0 or later (PR #3069 gathers logits.detach().mean() instead of "
         "the [B, T, V] logits).",
         "Each rank pads to its own length, so gathered [B, T, V] tensors differ in T: gather "
         "a reduced value (tensor.mean(), counts), or pad to a length agreed across ranks."),
    Rule("C", "sampling seeded per node, not per global rank", _node_seeded,
         "swift", None, ("swift/",),
         "ms-swift issues #3745 / #3780 (GRPO, multi-node colocate; fixed by #4712)",
         "Upgrade ms-swift past the colocate seed fix (#4712), which seeds each rank's engine "
         "by global rank.",
         "Seed sampling by global rank (and per request for vLLM), not by node: samples of one "
         "prompt sit on the ranks of one node."),
    Rule("D", "a weight-sync group a participant never joins", _stuck_in_rendezvous,
         "openrlhf", None, ("openrlhf/",),
         "OpenRLHF issue #918 (vLLM >= 0.8.1; related #865, #492)",
         "Workaround from the issue: VLLM_USE_V1=1, VLLM_ENABLE_V1_MULTIPROCESSING=0 and "
         "--vllm_sync_backend nccl.",
         "A rank waits to create a group that some participant never joins while the others "
         "wait in a collective: make every participant join (check the workers' logs) and give "
         "the rendezvous a timeout shorter than the collectives'."),
)


def _frames(d: Diagnosis, f: Finding) -> str:
    """Everything that says where the finding's ranks are: call paths, callsites, detail,
    stacks."""
    parts = [f.callsite or "", f.detail, f.title, _call_paths(f)]
    for side in _sides(f):
        parts.append(str(side.get("callsite", "")))
    for c in d.stack_classes:
        if not f.ranks or set(c.ranks) & set(f.ranks):
            parts.extend(c.frames)
    return "\n".join(parts)


def _call_paths(f: Finding) -> str:
    """The finding's call paths (its own and each side's), a frame a line: where a library's
    file must be for its upstream issue to be named."""
    frames = [frame.to_json() for frame in f.call_path] + [frame for side in _sides(f)
                                  for frame in side.get("call_path") or []]
    return "\n".join(f"{frame.get('path')}:{frame.get('line')} {frame.get('function')}"
                     for frame in frames if isinstance(frame, Mapping))


def annotate(d: Diagnosis, versions: Mapping[str, str]) -> Diagnosis:
    """``d`` with each finding that matches a mechanism annotated (upstream or general fix).
    The annotator registered as ``builtin`` in the ``nccl_doctor.known_issues`` entry points."""
    return _annotate(d, versions, RULES)


def rules_annotator(rules: Sequence[Rule]) -> Callable[[Diagnosis, Mapping[str, str]], Diagnosis]:
    """An annotator for your own ``Rule``s, to register in the ``nccl_doctor.known_issues``
    entry-point group (docs/plugins.md)."""
    chosen = tuple(rules)
    return lambda d, versions: _annotate(d, versions, chosen)


def _annotate(d: Diagnosis, versions: Mapping[str, str], all_rules: Sequence[Rule]) -> Diagnosis:
    findings = []
    for f in d.findings:
        frames = _frames(d, f)
        rules = [r for r in all_rules if r.applies(f, frames)]
        # the library's file on the call path; without one recorded (captures of format 1,
        # Flight Recorder dumps), among the callsites and stacks
        on_path = _call_paths(f) or frames
        upstream = [r for r in rules if _in_range(versions.get(r.library), r.affected)
                    and any(part in on_path for part in r.files)]
        if upstream:
            r = upstream[0]
            known = {"rule": r.id, "mechanism": r.mechanism, "upstream": r.upstream,
                     "library": f"{r.library} {versions.get(r.library)}", "fix": r.upstream_fix}
            f = replace(f, hint=r.upstream_fix, evidence={**f.evidence, "known_issue": known})
        elif rules:
            r = rules[0]
            known = {"rule": r.id, "mechanism": r.mechanism, "fix": r.general_fix}
            f = replace(f, hint=r.general_fix, evidence={**f.evidence, "known_issue": known})
        findings.append(f)
    return replace(d, findings=tuple(findings))
