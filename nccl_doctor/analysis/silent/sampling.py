"""``identical_completions`` and ``shared_rng_state``: ranks that should sample independently do
not (docs/bugs.md C). Pure: reads the ``gen`` and ``rng`` notes of each rank's capture.

The k-th generation of every rank is compared with the k-th of the others. Ranks whose outputs
are identical in at least ``K`` of the ``N`` generations they all made (K = min(2, N)) form a
class; so do ranks whose RNG state before sampling was identical while they sampled the same
prompts. Each class is described against the job's nodes, so that "all local ranks of each node
share one seed" is said in those words. Deterministic decoding (greedy, temperature 0) makes
identical outputs expected: that is an ``info`` finding, never a warning.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Sequence

from nccl_doctor.analysis.calls.wording import ranks_text
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import TraceSet

HINT_SEED = (
    "Seed sampling by global rank, not by node or by a shared constant: e.g. "
    "set_seed(seed + RANK) (accelerate: set_seed(seed, device_specific=True)), and give vLLM "
    "engines/requests per-rank seeds. GRPO places the G samples of a prompt on consecutive "
    "ranks, so identical samples there make reward std 0, advantages 0 and the loss 0."
)
HINT_GREEDY = (
    "Decoding was deterministic (greedy or temperature 0), so identical outputs for identical "
    "prompts are expected. For RL sampling, use do_sample=True with temperature > 0."
)

Gen = Mapping[str, Any]


def _clean(note: Mapping[str, Any]) -> dict[str, Any] | None:
    """A ``gen`` note with fields of the expected types, or None (captures are input: a
    damaged or hand-made one must not crash the analysis)."""
    def text(key: str) -> str:
        value = note.get(key)
        return value if isinstance(value, str) else ""

    def number(key: str) -> int:
        value = note.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    rng = note.get("rng")
    seeds = note.get("seeds")
    return {
        "n": number("n"), "all": text("all"), "nrows": number("nrows"),
        "prompts_all": text("prompts_all"), "sample": note.get("sample") is True,
        "source": text("source"), "time_ns": number("time_ns"), "tp": max(1, number("tp")),
        "rng": {str(k): str(v) for k, v in rng.items()} if isinstance(rng, dict) else {},
        "seeds": [x if isinstance(x, int) else None for x in seeds]
        if isinstance(seeds, list) else None,
    }


def _gens(traces: TraceSet) -> dict[int, list[Gen]]:
    out = {}
    for rank, trace in traces.ranks.items():
        gens = [g for n in trace.notes if n.get("note") == "gen" and (g := _clean(n))]
        if gens:
            out[rank] = sorted(gens, key=lambda g: g["n"])
    return out


def _classes(pairs: dict[tuple[int, int], int], need: int) -> list[tuple[int, ...]]:
    """Ranks linked by pairs seen together in at least ``need`` generations (union-find)."""
    parent: dict[int, int] = {}

    def find(r: int) -> int:
        parent.setdefault(r, r)
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for (a, b), count in pairs.items():
        if count >= need:
            parent[find(a)] = find(b)
    members: dict[int, list[int]] = defaultdict(list)
    for r in parent:
        members[find(r)].append(r)
    return sorted(tuple(sorted(m)) for m in members.values() if len(m) > 1)


def _pairs(gens: dict[int, list[Gen]], key: Any, n: int) -> dict[tuple[int, int], list[int]]:
    """(a, b) -> the generation indices where ``key(gen)`` was equal (and not None) on both."""
    out: dict[tuple[int, int], list[int]] = defaultdict(list)
    ranks = sorted(gens)
    for k in range(n):
        by_value: dict[Any, list[int]] = defaultdict(list)
        for r in ranks:
            value = key(gens[r][k])
            if value is not None:
                by_value[value].append(r)
        for members in by_value.values():
            for i, a in enumerate(members):
                for b in members[i + 1:]:
                    tp = min(gens[a][k]["tp"], gens[b][k]["tp"])
                    if tp > 1 and a // tp == b // tp:
                        continue  # one tensor-parallel vLLM engine: identical by design
                    out[(a, b)].append(k)
    return out


def _hits(c: tuple[int, ...], pairs: dict[tuple[int, int], list[int]]) -> list[int]:
    """The generation indices of the best-matched pair inside class ``c``."""
    return max((pairs.get((a, b), []) for i, a in enumerate(c) for b in c[i + 1:]), key=len)


def _node_of(traces: TraceSet, rank: int) -> str:
    meta = traces.ranks[rank].meta
    if meta.node_rank is not None:
        hosts = {t.meta.host for t in traces.ranks.values()}
        on = f" on {meta.host}" if len(hosts) > 1 and meta.host else ""  # really several hosts
        return f"node {meta.node_rank}{on}"
    return f"host {meta.host}" if meta.host else "node ?"


def describe_classes(traces: TraceSet, classes: Sequence[tuple[int, ...]], what: str,
                     alike: str) -> tuple[str, list[str]]:
    """A title phrase and per-node lines for classes of ranks that ``alike`` (e.g. "share one
    seed"). Says "all local ranks of each node ..." when the classes are exactly the nodes."""
    nodes: dict[str, list[int]] = defaultdict(list)
    for r in sorted(traces.ranks):
        nodes[_node_of(traces, r)].append(r)
    node_sets = {tuple(v) for v in nodes.values()}
    everyone = tuple(sorted(traces.ranks))
    lines = []
    for name, members in sorted(nodes.items(), key=lambda kv: kv[1][0]):
        inside = [c for c in classes if set(c) <= set(members)]
        across = [c for c in classes if set(c) & set(members) and not set(c) <= set(members)]
        parts = [f"{ranks_text(list(c))} {alike}" for c in inside + across]
        lines.append(f"{name} ({ranks_text(members)}): " + ("; ".join(parts) if parts else
                                                           f"{what} differ"))
    if len(classes) == 1 and classes[0] == everyone:
        title = f"{'both' if len(everyone) == 2 else f'all {len(everyone)}'} ranks {alike}"
    elif len(nodes) > 1 and set(classes) == node_sets:
        title = f"all local ranks of each node {alike}; {what} differ across nodes"
    else:
        title = "; ".join(f"{ranks_text(list(c))} {alike}" for c in classes)
    return title, lines


def _sampling_fp(gen: Gen) -> str | None:
    """The generator that drove the sampling: CUDA's when the rank used CUDA, else torch's (for
    transformers); vLLM's per-request seeds when every request had one; every generator for
    completions observed through the API."""
    rng = gen["rng"]
    if not gen["sample"]:
        return None
    seeds = gen["seeds"]
    if gen["source"] == "vllm" and seeds and None not in seeds:
        return "seeds=" + ",".join(str(s) for s in seeds)
    if gen.get("source") == "transformers":
        return rng.get("cuda") or rng.get("torch")
    return "|".join(f"{k}={v}" for k, v in sorted(rng.items())) or None


def _seeding(traces: TraceSet, rank: int) -> str:
    """The last seeding call the rank made before its first generation, as 'label(seed)'."""
    trace = traces.ranks[rank]
    def when(n: Mapping[str, Any]) -> int:
        t = n.get("time_ns")
        return t if isinstance(t, int) else 0

    first = min((when(n) for n in trace.notes if n.get("note") == "gen"), default=0)
    calls = [n for n in trace.notes if n.get("note") == "rng" and n.get("label") not in
             ("init", "step") and when(n) <= first]
    if not calls:
        return "no seeding call recorded"
    last = max(calls, key=when)
    extra = ", device_specific=True" if last.get("device_specific") else ""
    return f"{last.get('label')}({last.get('seed')!r}{extra})"


def detect_identical_completions(traces: TraceSet) -> list[Finding]:
    gens = _gens(traces)
    if len(gens) < 2:
        return []
    n = min(len(g) for g in gens.values())
    need = min(2, n)
    same = _pairs(gens, lambda g: g.get("all") if g.get("nrows") else None, n)
    classes = _classes({p: len(ks) for p, ks in same.items()}, need)
    if not classes:
        return []
    sampled = {p: sum(1 for k in ks if gens[p[0]][k].get("sample") and gens[p[1]][k].get("sample"))
               for p, ks in same.items()}
    sampling_classes = _classes(sampled, need)
    findings = []
    if sampling_classes:
        findings.append(_identical(traces, gens, sampling_classes, same, n, sampling=True))
    greedy = [c for c in classes if not any(set(c) >= set(s) for s in sampling_classes)]
    if greedy:
        findings.append(_identical(traces, gens, greedy, same, n, sampling=False))
    return findings


def _identical(traces: TraceSet, gens: dict[int, list[Gen]], classes: list[tuple[int, ...]],
               same: dict[tuple[int, int], list[int]], n: int, sampling: bool) -> Finding:
    culprits = tuple(sorted({r for c in classes for r in c}))
    matched = max(len(_hits(c, same)) for c in classes)
    head, lines = describe_classes(traces, classes, "completions", "sampled identical completions"
                                   if sampling else "decoded identical completions")
    same_prompt = all(
        gens[c[0]][k].get("prompts_all") and all(
            gens[r][k].get("prompts_all") == gens[c[0]][k].get("prompts_all") for r in c[1:])
        for c in classes for k in _hits(c, same)
    )
    seeds = {r: _seeding(traces, r) for r in culprits}
    lines.append("seeding: " + "; ".join(f"rank {r} {s}" for r, s in sorted(seeds.items())))
    if sampling:
        why = ("same prompt + same seed: the ranks sampled the same prompts from the same RNG "
               "state" if same_prompt else "the ranks sampled from the same RNG state")
        title = f"{head} ({matched} of {n} generations; {why})"
        severity, hint = Severity.WARNING, HINT_SEED
    else:
        title = f"{head} ({matched} of {n} generations, deterministic decoding: expected)"
        severity, hint = Severity.INFO, HINT_GREEDY
    first = min(gens[c[0]][_hits(c, same)[0]].get("time_ns", 0) for c in classes)
    return Finding(
        kind=FindingKind.IDENTICAL_COMPLETIONS, severity=severity, title=title,
        detail="\n".join(lines), ranks=culprits, hint=hint,
        evidence={"classes": [list(c) for c in classes], "generations": n, "identical": matched,
                  "sampling": sampling, "same_prompts": same_prompt,
                  "source": gens[culprits[0]][0].get("source"),
                  "seeding": {str(r): s for r, s in seeds.items()}},
        time_ns=first or None,
    )


def detect_shared_rng_state(traces: TraceSet) -> list[Finding]:
    """Ranks that sampled the same prompts from the same RNG state. (Sharing a state while
    sampling different prompts is harmless, and common: DDP seeds every rank alike.)"""
    gens = _gens(traces)
    if len(gens) < 2:
        return []
    n = min(len(g) for g in gens.values())
    need = min(2, n)

    def key(g: Gen) -> tuple | None:
        fp = _sampling_fp(g)
        # without the prompts, a shared state is harmless (DDP seeds every rank alike)
        return (fp, g["prompts_all"]) if fp is not None and g["prompts_all"] else None

    shared = _pairs(gens, key, n)
    classes = _classes({p: len(ks) for p, ks in shared.items()}, need)
    if not classes:
        return []
    culprits = tuple(sorted({r for c in classes for r in c}))
    head, lines = describe_classes(traces, classes, "states", "share one seed")
    seeds = {r: _seeding(traces, r) for r in culprits}
    lines.append("seeding: " + "; ".join(f"rank {r} {s}" for r, s in sorted(seeds.items())))
    matched = max(len(_hits(c, shared)) for c in classes)
    return [Finding(
        kind=FindingKind.SHARED_RNG_STATE, severity=Severity.WARNING,
        title=f"{head}: the same RNG state before sampling the same prompts "
              f"({matched} of {n} generations)",
        detail="\n".join(lines), ranks=culprits, hint=HINT_SEED,
        evidence={"classes": [list(c) for c in classes], "generations": n, "shared": matched,
                  "seeding": {str(r): s for r, s in seeds.items()}},
        time_ns=min(gens[r][0].get("time_ns", 0) for r in culprits) or None,
    )]
