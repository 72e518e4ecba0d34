"""Repository hygiene: CI runs exactly the README's test command."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    top = [line for line in readme.splitlines() if line.startswith("pip install torch==2.13.0")]
    assert len(top) >= 2, "README must start with the dashboard and test commands"
    test_cmd = top[1].split("#")[0].strip()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "python -m pytest -q" in test_cmd
    assert test_cmd in ci_lines, f"CI must run the README's test command verbatim: {test_cmd!r}"


def test_cli_lists_both_commands_and_needs_one(capsys):
    from landscape.cli import build_parser, main

    help_text = build_parser().format_help()
    assert "sharpness" in help_text and "surface" in help_text
    assert main([]) == 2  # no command: help and a usage error code
    assert "COMMAND" in capsys.readouterr().out


# ----------------------------------------------------------------------------- layout hygiene
PACKAGES = (
    "landscape", "optimizers", "toy_problems", "experiments", "app", "sharpscape", "benchmarks", "tests",
    "docs",
)  # fmt: skip
#: a guard against the egregious only: a module holds one idea, however long (docs/contributing.md,
#: "Files by concept"); this catches a file that has clearly become several
EGREGIOUS_LINES = 1500


def _sources():
    for pkg in PACKAGES:
        yield from sorted((ROOT / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


#: every package of the tree, and the folders whose scripts import one another by bare name (the
#: app's pages put ``app/`` on ``sys.path`` and import ``dashboard``; the docs scripts import their
#: siblings as ``claims``, ``claim_list``, ...)
GRAPH_PACKAGES = (
    "landscape", "optimizers", "toy_problems", "experiments", "app", "sharpscape", "benchmarks", "docs",
)  # fmt: skip
SCRIPT_ROOTS = ("app", "docs")


def _import_targets(node: ast.AST, mod: str, is_pkg: bool, files: dict[str, Path]) -> list[str]:
    """The modules an ``import`` / ``from ... import`` statement names, as dotted names from the
    repository root (``importlib.import_module`` is dispatch by name, not a dependency: left out)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        else:
            base = _resolve(base, mod, files)
        # ``from pkg import submodule`` depends on the submodule, not on the package
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
        return subs if len(subs) == len(node.names) else [base] + subs
    return []


def _resolve(name: str, mod: str, files: dict[str, Path]) -> str:
    """``name`` as imported from ``mod``: a script under a :data:`SCRIPT_ROOTS` folder finds its
    siblings by bare name (``dashboard.network`` is ``app.dashboard.network``)."""
    root = mod.split(".")[0]
    if root in SCRIPT_ROOTS and name not in files and f"{root}.{name}".split(".")[0] == root:
        head = f"{root}.{name.split('.')[0]}"
        if head in files:
            return f"{root}.{name}"
    return name


def _import_graph() -> dict[str, set[str]]:
    """File-level import graph of the whole tree, lazy (function-level) and ``TYPE_CHECKING``
    imports included."""
    files = {_module_name(p): p for pkg in GRAPH_PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            for t in _import_targets(node, mod, is_pkg, files):
                t = _resolve(t, mod, files)
                if t in files and t != mod:
                    graph[mod].add(t)
    return graph


def test_the_import_graph_sees_every_package_and_the_script_imports():
    graph = _import_graph()
    assert {m.split(".")[0] for m in graph} == set(GRAPH_PACKAGES)
    assert "app.dashboard.layout" in graph["app.dashboard.network_plots"]  # relative import
    assert "app.dashboard" in graph["app.Home"]  # ``from dashboard import ...`` under app/
    assert "docs.claim" in graph["docs.claim_list"]  # ``from claim import ...`` under docs/


def test_no_import_cycles_between_files():
    graph = _import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n) :] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


def test_no_source_file_is_egregiously_long():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > EGREGIOUS_LINES
    }
    assert not long, (
        f"files over {EGREGIOUS_LINES} lines: {long} — a module holds one idea; split along the ideas "
        "it holds, not into fragments behind a facade (docs/contributing.md, 'Files by concept')"
    )


#: the packages whose modules re-export nothing (the library packages still have some; their
#: ``__init__`` files, which define the public API, are exempt everywhere)
NO_RE_EXPORTS = ("experiments", "app", "sharpscape", "toy_problems")


def test_no_module_re_exports_or_imports_at_its_bottom():
    """No facade tails: a module lists in ``__all__`` only names it defines (the package
    ``__init__`` files excepted), and no module imports after its first function or class (a
    bottom-of-file import hides a circle)."""
    re_exports, late = [], []
    for pkg in GRAPH_PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text())
            rel = str(path.relative_to(ROOT))
            imported: set[str] = set()
            defined = False
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defined = True
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
                    if defined:
                        late.append(f"{rel}:{node.lineno}")
                elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
                ):
                    names = ast.literal_eval(node.value)
                    if pkg in NO_RE_EXPORTS and path.name != "__init__.py":
                        re_exports += [f"{rel}: {n}" for n in names if n in imported]
    assert not late, f"imports after the first definition (move them to the top): {late}"
    assert not re_exports, f"__all__ re-exports another module's names (import them from there): {re_exports}"


def test_no_reference_to_files_the_project_lacks():
    bad = []
    for p in list(_sources()) + sorted(ROOT.glob("*.md")) + sorted((ROOT / "docs").rglob("*.md")):
        if p.name in ("HELPERS.md", "test_repo.py"):
            continue
        text = p.read_text()
        if re.search(r"specs/|seeds/|\b\w+\.txt``", text):
            bad.append(str(p.relative_to(ROOT)))
        for ref in re.findall(r"``(docs/[\w./-]+)``", text):
            if not (ROOT / ref).exists():
                bad.append(f"{p.relative_to(ROOT)} -> {ref}")
    assert not bad, f"references to files outside the project: {bad}"


def test_api_reference_covers_every_public_module():
    documented = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        documented |= set(re.findall(r"^::: ([\w.]+)", page.read_text(), flags=re.M))
    public = {
        _module_name(p)
        for pkg in ("landscape", "optimizers", "toy_problems", "experiments")
        for p in (ROOT / pkg).rglob("*.py")
        if p.name != "__main__.py"
        and not any(part.startswith("_") and part != "__init__.py" for part in p.relative_to(ROOT).parts)
    }
    missing = sorted(public - documented)
    assert not missing, f"modules missing from docs/api/*.md: {missing}"
