"""Plugins through entry points: a third-party distribution's known-issue rules (docs/plugins.md
example, verbatim) annotate a diagnosis after nccl-doctor's own; a broken one leaves a note."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest


from nccl_doctor import entry_points
from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls import annotate
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, Severity, Verdict

README = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"  # the example moved there


def _readme_example() -> str:
    block = re.search(r"```python\n(# acme_rules\.py\n.*?)```", README.read_text(), re.S)
    assert block, "docs/plugins.md's plugin example is gone"
    return block.group(1)




def _mismatch(callsite: str) -> Diagnosis:
    f = Finding(kind=FindingKind.COLLECTIVE_MISMATCH, severity=Severity.ERROR,
                title="all_gather #3 of group 0: shapes differ", detail="", ranks=(0, 1),
                hint="original", group="0", seq=3, op="all_reduce", callsite=callsite,
                evidence={"aspect": "op"}, root_cause=True)
    return Diagnosis(verdict=Verdict.HANG, findings=(f,), ranks=(), world_size=2)


def test_the_readme_example_rule_annotates_after_the_builtin_rules(site):
    site.install("acme_rules", "acme = acme_rules:annotate", "acme_rules", _readme_example())
    found = annotate.installed()
    assert [a.name for a in found] == ["builtin", "collective_calls", "acme"] and all(
        a.annotate for a in found)
    d = annotate.apply(_mismatch("site-packages/acme/loss.py:12"), found, {"acme": "1.2.0"})
    k = d.findings[0].evidence["known_issue"]
    assert k["rule"] == "acme-12" and k["library"] == "acme 1.2.0"
    assert d.findings[0].hint == "upgrade acme to 1.4"
    # outside the affected versions: the general fix
    d = annotate.apply(_mismatch("site-packages/acme/loss.py:12"), found, {"acme": "1.4.0"})
    assert d.findings[0].hint == "gather a reduced value, not padded logits"
    assert "upstream" not in d.findings[0].evidence["known_issue"]


def test_analyze_applies_installed_plugins_by_default(site, tb):
    site.install("tagger", "tag = tagger:annotate", "tagger",
             "from dataclasses import replace\n"
             "def annotate(d, versions):\n"
             "    return replace(d, notes=d.notes + ('tagged by a plugin',))\n")
    traces = tb.scenarios["shape_mismatch"]()
    assert "tagged by a plugin" in analyze(traces).notes
    assert "tagged by a plugin" not in analyze(traces, annotators=()).notes


def test_a_plugin_that_fails_to_load_or_raises_leaves_a_note_and_the_report(site):
    site.install("broken", "broken = broken_rules:annotate", "broken_rules",
             "raise ImportError('no acme here')\n")
    (site / "raising.py").write_text("def annotate(d, versions):\n    raise KeyError('x')\n")
    info = site / "broken-1.0.dist-info" / "entry_points.txt"
    info.write_text(info.read_text() + "raising = raising:annotate\n")
    entry_points.load.cache_clear()
    d = annotate.apply(_mismatch("train.py:3"), annotate.installed(), {})
    notes = "\n".join(d.notes)
    assert "known-issue plugin 'broken' could not be loaded (ImportError('no acme here'))" in notes
    assert "known-issue plugin 'raising' failed (KeyError('x'))" in notes
    assert d.verdict is Verdict.HANG and len(d.findings) == 1


@pytest.mark.parametrize("group", ["console_scripts", "pytest11", entry_points.INTEGRATIONS,
                                   entry_points.KNOWN_ISSUES])
def test_the_entry_points_read_from_the_folders_are_importlib_metadatas(group):
    from importlib import metadata

    expected = [(ep.name, ep.value) for ep in metadata.entry_points(group=group)]
    assert sorted(entry_points.installed(group)) == sorted(expected)


def test_a_distribution_seen_twice_on_sys_path_counts_once_and_extras_are_not_the_reference(site):
    site.install("acme", "acme = acme_rules:annotate [fast]", "acme_rules",
                 "def annotate(d, versions):\n    return d\n")
    again = site / "again"
    again.mkdir()
    info = again / "Acme-2.0.dist-info"
    info.mkdir()
    (info / "entry_points.txt").write_text("[nccl_doctor.known_issues]\nold = old:annotate\n")
    sys.path.append(str(again))
    try:
        found = list(entry_points.installed(entry_points.KNOWN_ISSUES))
        loaded = entry_points.load(entry_points.KNOWN_ISSUES)
    finally:
        sys.path.remove(str(again))
    assert ("acme", "acme_rules:annotate [fast]") in found and ("old", "old:annotate") not in found
    acme = [(obj, err) for name, obj, err in loaded if name == "acme"]
    assert acme and acme[0][1] is None and callable(acme[0][0])
