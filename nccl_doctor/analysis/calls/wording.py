"""Shared wording for findings: how to name a call, a rank's fate, a list of ranks."""

from __future__ import annotations

from typing import Any, Mapping

from nccl_doctor import paths, words
from nccl_doctor.model import Event, EventSource, Location, RankTrace, TraceSet

_NO_VERSIONS: Mapping[str, str] = {}

#: a list of ranks as the reports name it (the sentences with ranks as their subject: words.py)
ranks_text = words.ranks_text


def duration(seconds: float) -> str:
    """A short time as reports say it: "40 ms" under a second, else "1.25 s"."""
    return f"{seconds * 1e3:.0f} ms" if seconds < 1.0 else f"{seconds:.2f} s"


def site(c: Location | None) -> str:
    return c.text() if c is not None else "?"


def call_site(e: Event, versions: Mapping[str, str] = _NO_VERSIONS) -> str:
    """Where a call was made, as reports say it: the line that issued it and, when that line is
    not the user's, the user's line that led there - ``trl/trainer/cpo_trainer.py:839 in
    get_batch_loss_metrics (trl 0.16.1) <- your train.py:16``; the user's line alone when the
    user's code made the call (``versions``: the rank's recorded library versions). A call
    issued from C++ (Flight Recorder's) says so, and what its stack says made it."""
    entry, issuing = e.callsite or e.api_callsite, e.issuing
    if issuing is None and entry is None:
        if e.source is EventSource.FLIGHT_RECORDER:
            return f"no Python line ({e.context or 'seen by Flight Recorder'}; no stack of it " \
                "was recorded)"
        return "?"
    if issuing is None or entry is None or issuing == entry:
        text = site(issuing or entry)
    else:
        text = (f"{issuing.text('in')}{_library(issuing, versions)} <- "
                f"{paths.whose(entry.path)}{site(entry)}")
    return f"{text} ({e.context})" if e.context else text


def _library(loc: Location, versions: Mapping[str, str]) -> str:
    package = paths.package_of(loc.path)
    if package is None:
        return ""
    version = versions.get(package)
    return f" ({package} {version})" if version else f" ({package})"


def site_key(e: Event) -> tuple[str, int, str] | None:
    """Where a call was made, as a key: the line that issued it (a library's, when one did),
    else the user's, and its op (``("trl/.../cpo_trainer.py", 839, "all_gather")``)."""
    loc = e.issuing or e.callsite or e.api_callsite
    return (loc.path, loc.line, e.op) if loc is not None else None


def call_fields(e: Event, versions: Mapping[str, str] = _NO_VERSIONS) -> dict[str, Any]:
    """A finding's fields naming its call: ``callsite`` (the issuing line, ``path:line``),
    ``entry_callsite`` (the user's line that led there, when another) and ``call_path`` (its
    frames, innermost first, each with its package and that package's recorded version)."""
    entry, issuing = e.callsite or e.api_callsite, e.issuing
    return {
        "callsite": site(issuing or entry) if (issuing or entry) else None,
        "entry_callsite": site(entry) if entry is not None and issuing != entry else None,
        "call_path": frames_json(e.path, versions),
    }


def frames_json(frames: tuple[Location, ...],
                versions: Mapping[str, str] = _NO_VERSIONS) -> tuple[dict[str, Any], ...]:
    out = []
    for loc in frames:
        package = paths.package_of(loc.path)
        out.append({**loc.to_json(), "package": package,
                    "version": versions.get(package) if package else None})
    return tuple(out)


def versions_of(traces: TraceSet, rank: int) -> Mapping[str, str]:
    """The library versions rank ``rank`` recorded (none known: empty)."""
    trace = traces.ranks.get(rank)
    return trace.meta.versions if trace is not None else _NO_VERSIONS


def call_name(e: Event) -> str:
    """``all_gather #3 (group 0)``."""
    return f"{e.op} #{e.align_seq} (group {e.group})"


def fate(trace: RankTrace) -> str:
    """What became of a rank, with where: 'exited cleanly after train.py:40 (all_reduce #9)'."""
    from nccl_doctor.analysis.calls.align import last_leaf

    last = last_leaf(trace)
    after = f" after {call_site(last)} ({call_name(last)})" if last is not None else ""
    text = trace.exit.describe()
    if trace.exit.callsite is not None:
        text += f" at {site(trace.exit.callsite)}"
    return text + after
