"""The documentation: the MkDocs site built from docs/ builds strict (a broken link, anchor or nav
entry fails it, as mkdocs.yml's validation says), README.md stays short and every relative link in
it resolves, and each benchmark script that prints figures has its page under docs/benchmarks/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BENCHMARKS = ROOT / "benchmarks"
README_MAX_LINES = 300

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]"  # [text] or ![alt], one level of [...]
                          r"\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # (target "title")
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(markdown: str) -> str:
    """The text links can be in: fenced code blocks and code spans removed."""
    return _CODE_SPAN.sub("", _FENCE.sub("", markdown))


def links(markdown: str) -> list[str]:
    text = _prose(markdown)
    return (_INLINE_LINK.findall(text) + _REFERENCE_DEF.findall(text)
            + _HTML_LINK.findall(text))


def _slugs(heading: str) -> set[str]:
    """The anchors a heading gets: MkDocs' (Python-Markdown's toc) and GitHub's."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    mkdocs = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text)).strip("-")
    github = re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))
    return {mkdocs, github}


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", markdown)):
        found |= _slugs(heading)
    return found


def test_links_and_anchors_are_found_where_they_are_and_only_there():
    text = ("See [a](docs/a.md), ![pic](docs/p.png) and [b](docs/b.md#some-part).\n"
            "`[not](a-link.md)`\n```\n[nor](this.md)\n```\n[ref]: docs/c.md\n"
            '<a href="docs/d.md">d</a>\n')
    assert links(text) == ["docs/a.md", "docs/p.png", "docs/b.md#some-part", "docs/c.md",
                           "docs/d.md"]
    assert {"what-it-finds-this-release", "reportjson-schema_version-1", "the-gpu-tier"} <= anchors(
        "# What it finds (this release)\n## report.json (schema_version 1)\n### The `gpu` tier\n")
    assert "not-a-heading" not in anchors("```\n# not a heading\n```\n")


def test_the_site_builds_strict(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        "mkdocs build --strict failed (mkdocs>=1.6 is in the test extra):\n"
        + proc.stdout[-4000:] + proc.stderr[-8000:])
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "benchmarks" / "index.html").is_file()


def test_the_readme_is_short_and_its_relative_links_resolve():
    text = README.read_text(encoding="utf-8")
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/")
    found = links(text)
    local = [t for t in found if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]
    assert any(t.startswith("docs/") and t.split("#")[0].endswith(".md") for t in local), (
        "README.md links to no docs/ page")
    broken = []
    for target in local:
        path, _, anchor = target.partition("#")
        if target.startswith("/"):
            broken.append(f"{target}: an absolute link (GitHub and the site need relative ones)")
            continue
        file = (README.parent / path).resolve() if path else README
        if not file.exists():
            broken.append(f"{target}: {path} does not exist")
        elif not file.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and file.suffix == ".md" and anchor not in anchors(
                file.read_text(encoding="utf-8")):
            broken.append(f"{target}: {path or 'README.md'} has no heading #{anchor}")
    assert not broken, "README.md links that do not resolve:\n" + "\n".join(broken)


def _printing_benchmarks() -> list[str]:
    """The benchmark scripts that print figures: runnable (a __main__ block) and printing."""
    names = []
    for script in sorted(BENCHMARKS.glob("*.py")):
        source = script.read_text(encoding="utf-8")
        if (not script.name.startswith("_") and "__name__ == \"__main__\"" in source
                and "print(" in source):
            names.append(script.stem)
    return names


def test_each_benchmark_that_prints_figures_has_its_page():
    names = _printing_benchmarks()
    assert "recorder_overhead" in names and len(names) >= 5, names
    index = (DOCS / "benchmarks" / "index.md").read_text(encoding="utf-8")
    problems = []
    for name in names:
        page = DOCS / "benchmarks" / f"{name}.md"
        if not page.is_file():
            problems.append(f"{name}: no docs/benchmarks/{name}.md")
            continue
        body = page.read_text(encoding="utf-8")
        if f"benchmarks/{name}.py" not in body:
            problems.append(f"{name}: its page does not say how to run benchmarks/{name}.py")
        if not re.search(r"\b20\d\d-\d\d-\d\d\b", body):
            problems.append(f"{name}: its page does not date its figures (YYYY-MM-DD)")
        if f"({name}.md)" not in index:
            problems.append(f"{name}: docs/benchmarks/index.md does not link its page")
    pages = {p.stem for p in (DOCS / "benchmarks").glob("*.md")} - {"index"}
    problems += [f"docs/benchmarks/{p}.md: no benchmarks/{p}.py prints figures"
                 for p in sorted(pages - set(names))]
    assert not problems, "\n".join(problems)
