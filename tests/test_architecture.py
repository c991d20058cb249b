"""docs/ARCHITECTURE.md is true of the code, and the code keeps the project's budgets: the modules the doc
names exist and every module is named, the dependency rules it states hold for the imports, no module
imports another's private names, no module is over 450 lines, no function over 80, and no import circle
among study's modules. Text and AST only (no torch), so it runs anywhere in seconds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "study"
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
STAGES = {"studies", "data", "model", "pretrain", "downstream", "zeroshot", "search", "report", "executors"}
# What each stage may import besides the root modules (ARCHITECTURE.md, "orchestrators above stages"):
# studies and search know the stages, report knows none (it re-renders without torch).
MAX_MODULE_LINES = 450  # the project's budgets (ruff-formatted code)
MAX_FUNCTION_LINES = 80
CLI_MODULES = {
    "cli.py",
    "work.py",
    "makecli.py",
}  # the root modules that call the stages (the command line's side)
MAY_IMPORT = {
    "data": set(),
    "model": set(),
    "pretrain": {"data", "model"},
    "downstream": {"data", "model"},
    "zeroshot": {"data", "model", "downstream"},  # the encoders fine-tuning loads, and their digests
    "report": set(),
    "studies": STAGES,
    "search": STAGES,
    "executors": STAGES,  # submits and watches any stage's work
}


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "templates" not in p.parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) for each import in the file; relative imports resolved."""
    pkg = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = list(pkg[: len(pkg) - (node.level - 1)]) if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.append((mod, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def test_every_module_is_named_and_every_named_module_exists():
    named = set(re.findall(r"`(study/[\w/]+\.py)`", DOC))
    assert named, "ARCHITECTURE.md names no module paths"
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"ARCHITECTURE.md names modules that do not exist: {missing}"
    # A stage's modules are listed by file name in its package's row; root modules by path.
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `study/(\w+)/` \|.*$", DOC, re.M)}
    unnamed = []
    for p in _modules():
        rel = p.relative_to(ROOT).as_posix()
        parts = p.relative_to(PKG).parts
        if p.name == "__init__.py" or rel in named:
            continue
        if len(parts) == 2 and parts[0] in rows and f"`{p.name}`" in rows[parts[0]]:
            continue
        unnamed.append(rel)
    assert not unnamed, f"modules ARCHITECTURE.md does not describe: {unnamed}"
    assert set(rows) == STAGES
    ghosts = [
        f"{pkg}/{f}"
        for pkg, row in rows.items()
        for f in re.findall(r"`(\w+\.py)`", row)
        if not (PKG / pkg / f).is_file()
    ]
    assert not ghosts, f"ARCHITECTURE.md's package rows name modules that do not exist: {ghosts}"


def test_no_module_is_over_budget():
    counts = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _modules()}
    over = {p: n for p, n in sorted(counts.items()) if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_is_over_budget():
    over = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    over[f"{p.relative_to(ROOT).as_posix()}:{node.lineno} {node.name}"] = n
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def _module_name(p: Path) -> str:
    parts = p.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(p: Path, known: set[str]) -> set[str]:
    """The study modules `p` imports when it is imported: its module-level statements (an `if
    TYPE_CHECKING:` block does not run), a `from pkg import name` counting as pkg.name where that is a
    module. Function-local imports run later and cannot make a circle at import time."""
    me = _module_name(p)
    is_pkg = p.name == "__init__.py"
    out = set()
    stack = list(ast.parse(p.read_text()).body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, (ast.If, ast.Try)):
            stack += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            stack += [n for h in getattr(node, "handlers", []) for n in h.body]
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = me.split(".") if is_pkg else me.split(".")[:-1]
            mod = (
                ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                if node.level
                else node.module or ""
            )
            subs = {f"{mod}.{a.name}" for a in node.names} & known
            out |= subs or ({mod} & known)
    return out - {me}


def test_no_import_circle():
    files = {_module_name(p): p for p in _modules()}
    graph = {m: _top_level_imports(p, set(files)) for m, p in files.items()}
    circles, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                circles.append(" -> ".join(path[path.index(n) :] + [n]))
            elif n not in state:
                visit(n, [*path, n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not circles, f"import circles among study's modules: {circles}"


def test_only_orchestrators_import_other_stages():
    bad = []
    for p in _modules():
        parts = p.relative_to(PKG).parts
        for mod, _ in _imports(p):
            bits = mod.split(".")
            if bits[0] != "study" or len(bits) < 2 or bits[1] not in STAGES:
                continue
            if len(parts) == 1:  # a root module: none imports a stage but the CLI's, which call them
                if p.name not in CLI_MODULES:
                    bad.append(f"{p.name} -> {mod}")
            elif bits[1] != parts[0] and bits[1] not in MAY_IMPORT[parts[0]]:
                bad.append(f"{parts[0]}/{p.name} -> {mod}")
    assert not bad, bad


def test_no_private_names_imported_across_modules():
    bad = []
    for p in _modules():
        me = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for mod, names in _imports(p):
            if mod.startswith("study") and mod != me:
                bad += [
                    f"{me} imports {mod}.{n}" for n in names if n.startswith("_") and not n.startswith("__")
                ]
    assert not bad, bad
