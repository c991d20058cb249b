"""docs/ARCHITECTURE.md is true of the code: the modules it names exist and every module is named, the
dependency rules it states hold for the imports, no module imports another's private names, and its
longest-module sentence is the measured one. Text and AST only (no torch), so it runs anywhere in seconds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "study"
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
STAGES = {"studies", "data", "model", "pretrain", "downstream", "zeroshot", "search", "report", "executors"}
# What each stage may import besides the root modules (ARCHITECTURE.md, "Dependencies point down the
# pipeline only"): studies and search know the stages, report knows none (it re-renders without torch).
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


def test_longest_module_sentence_is_true():
    m = re.search(r"No module is over (\d+) lines; `([\w.]+)` \((\d+)\) is the longest", DOC)
    assert m, "the longest-module sentence is gone from ARCHITECTURE.md"
    limit, name, lines = int(m.group(1)), m.group(2), int(m.group(3))
    counts = {p: len(p.read_text().splitlines()) for p in _modules()}
    longest = max(counts, key=counts.get)
    assert (longest.name, counts[longest]) == (name, lines), (longest, counts[longest])
    assert lines <= limit


def test_dependencies_point_down_the_pipeline():
    bad = []
    for p in _modules():
        parts = p.relative_to(PKG).parts
        for mod, _ in _imports(p):
            bits = mod.split(".")
            if bits[0] != "study" or len(bits) < 2 or bits[1] not in STAGES:
                continue
            if len(parts) == 1:  # a root module: none imports a stage but the CLI, which calls them
                if p.name != "cli.py":
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
