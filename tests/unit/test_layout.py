"""The package's structure stays what docs/ARCHITECTURE.md says: every module on one side of the
split, imports only in the allowed directions, no import cycle.

Read from the source (``ast``), so a function-level import counts as much as a top-level one;
imports under ``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# where each installed package's source lives (pyproject.toml's package-dir)
SOURCES = {"nccl_doctor": ROOT / "nccl_doctor", "nccl_doctor.plugins": ROOT / "plugins",
           "nccl_doctor.reproducers": ROOT / "reproducers"}

# The layers, by module-name prefix (the longest prefix decides).
LAYERS = {
    # pure: data model, capture format, analysis, reporters; both processes use it
    "nccl_doctor._version": "core", "nccl_doctor.errors": "core", "nccl_doctor.env": "core",
    "nccl_doctor.paths": "core", "nccl_doctor.location": "core", "nccl_doctor.files": "core",
    "nccl_doctor.call_path": "core", "nccl_doctor.words": "core",
    "nccl_doctor.redact": "core", "nccl_doctor.processes": "core",
    "nccl_doctor.bounded_json": "core",
    "nccl_doctor.entry_points": "core", "nccl_doctor.model": "core",
    "nccl_doctor.diagnosis": "core", "nccl_doctor.status_view": "core", "nccl_doctor.watch_log": "core",
    "nccl_doctor.watch_account": "core",
    "nccl_doctor.page_model": "core",
    "nccl_doctor.sections": "core", "nccl_doctor.finding_evidence": "core",
    "nccl_doctor.agent_protocol": "core", "nccl_doctor.capture": "core",
    "nccl_doctor.analysis": "core", "nccl_doctor.gpu": "core", "nccl_doctor.stacks": "core",
    "nccl_doctor.check": "core",  # the static pre-flight: files in, findings out
    "nccl_doctor.source": "core",  # the source analysis the run's analysis and check share
    "nccl_doctor.reporters": "core",
    # a recorded job as pandas tables and files (nccl_doctor.open, export): reads, pure
    "nccl_doctor.data": "core",
    # inside each rank of the job
    "nccl_doctor.rank": "rank",
    # the supervisor process, outside the job
    "nccl_doctor.supervisor": "supervisor",
    "nccl_doctor.serve": "supervisor",  # run --serve: the supervisor's HTTP endpoint
    # integrations with other libraries (rank side) and known-issue rules (pure)
    "nccl_doctor.plugins": "plugins",
    # programs users run: reference trainers, examples, reproducers of upstream bugs
    "nccl_doctor.trainers": "programs", "nccl_doctor.examples": "programs",
    "nccl_doctor.reproducers": "programs",
    # the edges that put the sides together: the public API, the CLI, the pytest plugin, and the
    # sitecustomize every Python process of a job loads (it arms the rank side)
    "nccl_doctor": "edge", "nccl_doctor.__main__": "edge", "nccl_doctor.cli": "edge",
    "nccl_doctor.testing": "edge", "nccl_doctor.pytest_plugin": "edge",
    "nccl_doctor.rank._bootstrap": "edge",
}
ALLOWED = {
    "core": {"core"},
    "rank": {"core", "rank"},
    "supervisor": {"core", "supervisor"},
    "plugins": {"core", "rank", "plugins"},
    "programs": {"core", "programs", "edge-api"},
    "edge": {"core", "rank", "supervisor", "plugins", "programs", "edge", "edge-api"},
}


def modules() -> dict[str, Path]:
    out = {}
    for package, directory in SOURCES.items():
        for path in directory.rglob("*.py"):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def layer(module: str) -> str | None:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len,
               default=None)
    if best is None:
        return None
    if module == "nccl_doctor":
        return "edge-api"  # the public API (install, observe_*): what user programs import
    return LAYERS[best]


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``module`` imports."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != module}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}


def test_every_module_is_on_one_side_of_the_split():
    unplaced = sorted(m for m in modules() if layer(m) is None)
    assert not unplaced, f"place these modules in LAYERS (and docs/ARCHITECTURE.md): {unplaced}"


def test_imports_only_go_down_the_layers():
    wrong = []
    for module, targets in sorted(graph().items()):
        mine = layer(module)
        for target in sorted(targets):
            theirs = layer(target)
            if theirs not in ALLOWED["edge" if mine == "edge-api" else mine]:
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not wrong, "\n".join(wrong)


def test_the_import_graph_has_no_cycle():
    g = graph()
    cycles = [c for c in _strongly_connected(g) if len(c) > 1]
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


#: analysis/'s sub-packages, its passes in the order they build on each other: each imports only
#: those before it (and itself); the modules at the top (diagnose, attempts, page_builder) put
#: them together.
ANALYSIS_ORDER = ["calls", "why", "who", "what", "slow", "silent"]
ANALYSIS_TOP = {"nccl_doctor.analysis", "nccl_doctor.analysis.diagnose",
                "nccl_doctor.analysis.attempts", "nccl_doctor.analysis.page_builder"}


def analysis_arrows_back_up(g: dict[str, set[str]]) -> list[str]:
    """Imports inside analysis/ that go up its order, or from a sub-package to the top; and any
    analysis module outside a sub-package that is not one of the top modules."""
    def place(module: str) -> int | None:
        if module in ANALYSIS_TOP:
            return len(ANALYSIS_ORDER)
        parts = module.split(".")
        return ANALYSIS_ORDER.index(parts[2]) if parts[2] in ANALYSIS_ORDER else None

    wrong = []
    for module, targets in sorted(g.items()):
        if not module.startswith("nccl_doctor.analysis"):
            continue
        mine = place(module)
        if mine is None:
            wrong.append(f"{module} is in no sub-package of analysis/ ({ANALYSIS_ORDER})")
            continue
        for target in sorted(t for t in targets if t.startswith("nccl_doctor.analysis")):
            theirs = place(target)
            if theirs is None or theirs > mine:
                wrong.append(f"{module} imports {target}, later in analysis/'s order")
    return wrong


def test_analysis_sub_packages_import_only_down_their_order():
    wrong = analysis_arrows_back_up(graph())
    assert not wrong, "\n".join(wrong)


def test_the_analysis_order_rule_sees_a_violation():
    g = {"nccl_doctor.analysis.calls.align": {"nccl_doctor.analysis.who.blame"},
         "nccl_doctor.analysis.who.blame": {"nccl_doctor.analysis.diagnose"},
         "nccl_doctor.analysis.stray": set(),
         "nccl_doctor.analysis.what.p2p": {"nccl_doctor.analysis.who.blame"}}
    assert analysis_arrows_back_up(g) == [
        "nccl_doctor.analysis.calls.align imports nccl_doctor.analysis.who.blame, later in "
        "analysis/'s order",
        "nccl_doctor.analysis.stray is in no sub-package of analysis/ "
        "(['calls', 'why', 'who', 'what', 'slow', 'silent'])",
        "nccl_doctor.analysis.who.blame imports nccl_doctor.analysis.diagnose, later in "
        "analysis/'s order"]


def shared_source_arrows(g: dict[str, set[str]]) -> list[str]:
    """Issue 51: one source analysis, two callers - nccl_doctor.source imports neither caller,
    and check (the front end) none of the run's analysis."""
    return [f"{m} imports {t}" for m, targets in sorted(g.items()) for t in sorted(targets)
            if (m.startswith("nccl_doctor.source") and t.startswith(("nccl_doctor.analysis",
                                                                      "nccl_doctor.check")))
            or (m.startswith("nccl_doctor.check") and t.startswith("nccl_doctor.analysis"))]


def test_the_shared_source_analysis_imports_neither_caller():
    wrong = shared_source_arrows(graph())
    assert not wrong, "\n".join(wrong)
    g = {"nccl_doctor.source.branch": {"nccl_doctor.check.rules"},
         "nccl_doctor.check.engine": {"nccl_doctor.analysis.why.check_rule",
                                      "nccl_doctor.source.branch"},
         "nccl_doctor.analysis.why.check_rule": {"nccl_doctor.check.engine"}}
    assert shared_source_arrows(g) == [
        "nccl_doctor.check.engine imports nccl_doctor.analysis.why.check_rule",
        "nccl_doctor.source.branch imports nccl_doctor.check.rules"]


#: What a reporter may import besides its own package: the data it renders (the model, the
#: diagnosis, the page's drawings) and plain helpers. It computes nothing (docs/ARCHITECTURE.md).
RENDERED = {"nccl_doctor.model", "nccl_doctor.diagnosis", "nccl_doctor.page_model",
            "nccl_doctor.sections", "nccl_doctor.finding_evidence",
            "nccl_doctor.location", "nccl_doctor.gpu.readings", "nccl_doctor.status_view",
            "nccl_doctor._version", "nccl_doctor.errors", "nccl_doctor.files",
            "nccl_doctor.words"}


def reporter_imports_beyond_the_model(g: dict[str, set[str]]) -> list[str]:
    return [f"{m} imports {t}" for m, targets in sorted(g.items())
            if m.startswith("nccl_doctor.reporters") for t in sorted(targets)
            if not t.startswith("nccl_doctor.reporters") and t not in RENDERED]


def supervisor_imports_of_reporters(g: dict[str, set[str]]) -> list[str]:
    return [f"{m} imports {t}" for m, targets in sorted(g.items())
            if m.startswith("nccl_doctor.supervisor") for t in sorted(targets)
            if t.startswith("nccl_doctor.reporters")]


def test_every_module_says_its_job():
    """Each module's docstring says what it is for (docs/ARCHITECTURE.md's tree is their sum)."""
    silent = sorted(m for m, path in modules().items()
                    if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip())
    assert not silent, f"modules without a docstring: {silent}"


def test_reporters_import_only_what_they_render():
    wrong = reporter_imports_beyond_the_model(graph())
    assert not wrong, "\n".join(wrong)


def test_the_supervisor_imports_no_reporter():
    wrong = supervisor_imports_of_reporters(graph())
    assert not wrong, "\n".join(wrong)


def test_the_reporter_rules_see_a_violation():
    g = {"nccl_doctor.reporters.html": {"nccl_doctor.analysis.calls.timeline",
                                        "nccl_doctor.page_model"},
         "nccl_doctor.supervisor.supervisor": {"nccl_doctor.reporters.html"}}
    assert reporter_imports_beyond_the_model(g) == [
        "nccl_doctor.reporters.html imports nccl_doctor.analysis.calls.timeline"]
    assert supervisor_imports_of_reporters(g) == [
        "nccl_doctor.supervisor.supervisor imports nccl_doctor.reporters.html"]


def test_the_check_sees_a_violation_and_a_cycle(tmp_path):
    """The checks above can fail: a rank module importing the supervisor, and two modules
    importing each other, are both found."""
    pkg = tmp_path / "nccl_doctor"
    (pkg / "rank").mkdir(parents=True)
    (pkg / "supervisor").mkdir()
    (pkg / "rank" / "a.py").write_text("def f():\n    from nccl_doctor.supervisor import b\n")
    (pkg / "supervisor" / "b.py").write_text("from nccl_doctor.rank import a\n")
    known = {"nccl_doctor.rank.a", "nccl_doctor.supervisor.b"}
    g = {m: imports(m, pkg / (m.split(".", 1)[1].replace(".", "/") + ".py"), known)
         for m in known}
    assert g == {"nccl_doctor.rank.a": {"nccl_doctor.supervisor.b"},
                 "nccl_doctor.supervisor.b": {"nccl_doctor.rank.a"}}
    assert layer("nccl_doctor.supervisor.b") not in ALLOWED[layer("nccl_doctor.rank.a")]
    assert [sorted(c) for c in _strongly_connected(g) if len(c) > 1] == [sorted(known)]


def _strongly_connected(g: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in g:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(g[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                out.append(component)
    return out


def test_frames_in_the_top_level_plugins_are_ours_the_reproducers_are_user_code():
    """plugins/ and reproducers/ are installed from the top of the repository (package-dir): in
    an editable install their files lie outside nccl_doctor/. A frame of a plugin (the generate
    wrapper) is never "the user's line"; a reproducer's is (it stands for a user's program)."""
    from nccl_doctor import paths
    from nccl_doctor.plugins import hf_transformers
    from nccl_doctor.reproducers import cpo_logits_gather

    assert paths.is_internal_file(hf_transformers.__file__)
    assert paths.is_library_file(hf_transformers.__file__)
    assert not paths.is_library_file(cpo_logits_gather.__file__)
    assert not paths.is_library_file(str(ROOT / "train.py"))


def test_every_package_is_installed():
    """A non-editable install ships only the packages pyproject.toml lists: one left out (as
    nccl_doctor.supervisor.federation once was) breaks ``nccl-doctor run`` there."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(root).parts)
             for p in (root / "nccl_doctor").rglob("__init__.py")}
    assert found - listed == set()
