"""What `study sync` makes each DVC stage depend on (study/studies/sync.py), and the selection's checks.

Fast: specs in a temporary folder, the pipeline document only (no DVC, no training); the end-to-end
pipeline is tests/test_pipeline.py.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from study.cli import main as study_main
from study.errors import StudyError
from study.studies.pipeline import CODE, DATA_CODE, pipeline_document, runs_document

REPO = Path(__file__).resolve().parents[1]


def _spec(name: str, **defaults) -> str:
    doc = {
        "name": name,
        "question": "q?",
        "defaults": {
            "corpus": {"sources": ["text:corpus"]},
            "tokenizer": {"vocab_size": 128, "min_frequency": 1},
            "model": {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32, "max_positions": 32},
            "objective": {"max_seq_len": 32},
            "finetune": {"tasks": ["SST-2"], "max_length": 32},
        },
        "seeds": [0],
    }
    for section, values in defaults.items():
        doc["defaults"].setdefault(section, {}).update(values)
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch) -> Path:
    """A repository with ablations/ and a corpus folder inside, and text files outside it: the stages
    run in the repository root, where the specs' relative paths are read."""
    root = tmp_path / "repo"
    (root / "ablations").mkdir(parents=True)
    (root / "corpus").mkdir()
    (root / "corpus" / "a.txt").write_text(
        "The cat sat on the mat. The dog ran.\n\nA bird flew over a tree.\n"
    )
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "b.txt").write_text("Red apples are sweet. Green ones are sour.\n")
    monkeypatch.chdir(root)
    return root


def test_data_stages_depend_on_the_corpus_they_read_and_study_stages_not_on_glue(repo: Path):
    """A corpus folder or file, inside the repository or outside it, is a dependency of its data stage (else
    an edited corpus file left `dvc status` up to date). The GLUE task folders are not dependencies of the
    study stage: on a fresh machine without them `make smoke` must run (the report says the task was
    skipped), where a missing dependency would fail the stage."""
    abl = repo / "ablations"
    (abl / "a.yaml").write_text(
        _spec(
            "a",
            corpus={"sources": ["text:corpus", "text:../elsewhere/b.txt"]},
            finetune={"tasks": ["SST-2", "MRPC"], "glue_dir": "../glue"},
        )
    )
    (abl / "h.yaml").write_text(_spec("h", finetune={"tasks": ["SST-2"], "glue_dir": "hub"}))
    doc = runs_document(abl, [("a", None), ("h", None)])
    stages = pipeline_document(doc)["stages"]
    (dh_a,) = doc["studies"]["a"]["data"]
    assert stages[f"data-{dh_a}"]["deps"][-2:] == ["corpus", "../elsewhere/b.txt"]
    for study in ("study-a", "study-h"):
        assert not [d for d in stages[study]["deps"] if "SST-2" in d or "glue" in d], stages[study]["deps"]


def test_the_search_stage_depends_on_what_the_study_stage_reads(repo: Path):
    """search-<s> ran on its spec's `search:` params alone: an edited profile, base, default or corpus left it
    up to date. It depends on the spec, its bases, the data stamps and the code stamp."""
    abl = repo / "ablations"
    (abl / "base").mkdir()
    (abl / "base" / "common.yaml").write_text("name: common\nquestion: q\ndefaults: {train: {amount: 7}}\n")
    doc = yaml.safe_load(_spec("s", finetune={"glue_dir": "../glue"}))
    doc["base"] = "base/common.yaml"
    doc["profiles"] = {"cpu": {"train.amount": 9}}
    doc["search"] = {
        "objective": "SST-2/finetune/accuracy",
        "n_trials": 2,
        "params": {"masking.rate": [0.1, 0.2]},
    }
    (abl / "s.yaml").write_text(yaml.safe_dump(doc))
    runs = runs_document(abl, [("s", "cpu")])
    stages = pipeline_document(runs)["stages"]
    (dh,) = runs["studies"]["s-cpu"]["data"]
    assert stages["search-s-cpu"]["deps"] == [
        "ablations/s.yaml",
        "ablations/base/common.yaml",
        f"pipeline/data-{dh}.json",
        "pipeline/code-search.json",
    ]
    study_deps = stages["study-s-cpu"]["deps"]
    assert study_deps[:3] == stages["search-s-cpu"]["deps"][:3] and "pipeline/code-study.json" in study_deps


def test_two_selected_specs_with_one_name_are_refused(repo: Path, capsys):
    """`study select smoke2` with a copy of smoke.yaml that kept `name: smoke` made one study-smoke stage for
    both (the second replaced the first) and exit 0."""
    abl = repo / "ablations"
    (abl / "smoke.yaml").write_text(_spec("smoke"))
    (abl / "smoke2.yaml").write_text(_spec("smoke"))
    args = ["--ablations", str(abl), "--out", str(repo / "study_runs.yaml")]
    (repo / "params.yaml").write_text("studies:\n- smoke\n")
    assert study_main(["sync", *args]) == 0
    before = {f: (repo / f).read_bytes() for f in ("params.yaml", "dvc.yaml", "study_runs.yaml")}
    capsys.readouterr()
    assert study_main(["select", "smoke2", *args]) == 2
    err = capsys.readouterr().err
    assert "name:" in err and "ablations/smoke.yaml" in err and "ablations/smoke2.yaml" in err
    assert "specs with distinct names" in err
    assert {f: (repo / f).read_bytes() for f in before} == before
    with pytest.raises(StudyError) as ei:
        runs_document(abl, [("smoke", None), ("smoke2", None)])
    assert ei.value.field == "name" and ei.value.allowed == "specs with distinct names"


def _module_file(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None  # a name imported from a module, not a module


def _imported(root: str, skip: set[str]) -> set[str]:
    """Every `study.*` module reachable from `root` through import statements anywhere in a file (the lazy
    ones inside functions too), not following `skip`."""
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or name in skip or path is None:
            continue
        seen.add(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("study")
            ):
                todo += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("study")]
    return seen


def _files_loaded(modules: list[str], then: str = "") -> list[str]:
    """The repo-relative files of every `study.*` module loaded in a fresh interpreter that imports
    `modules` and runs `then`."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}:\n    importlib.import_module(m)\n{then}"
        "print(json.dumps(sorted(m.__file__ for n, m in sys.modules.items()\n"
        "                        if n.split('.')[0] == 'study' and getattr(m, '__file__', None))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [Path(f).resolve().relative_to(REPO).as_posix() for f in json.loads(proc.stdout.splitlines()[-1])]


def _uncovered(files: list[str], paths: list[str]) -> list[str]:
    return [f for f in files if not any(f == p or f.startswith(p + "/") for p in paths)]


def test_code_stamps_cover_every_module_the_stage_commands_import():
    """code-study (code-search) must digest the code its stages run: every `study.*` module that the
    `study` commands import, found by importing them all in a fresh interpreter (study/cli.py and the
    search CLI with every import they name, lazy ones included; `study sync` itself, which only writes
    the stamp, excepted). study/studies (specs), study/cli.py and the root modules were missing."""
    modules = sorted(_imported("study.cli", {"study.studies.sync"}) | _imported("study.search.cli", set()))
    files = _files_loaded(modules, then="import study.cli\nstudy.cli.build_parser()\n")
    assert "study/studies/spec.py" in files and "study/pretrain/trainer.py" in files  # it imported the stages
    for kind, paths in CODE.items():
        uncovered = _uncovered([f for f in files if f != "study/studies/sync.py"], paths)
        assert not uncovered, f"code-{kind} does not digest {uncovered}"


def test_data_stages_digest_every_module_prepare_imports():
    """A data stage's outputs are made by `study.data.prepare` and what it imports (lazy imports included):
    an edit to any of those modules must rerun the stage. DATA_CODE was study/data and config.py only, so
    an edited io.py (the atomic writes, the hashes) left `dvc status` up to date."""
    files = _files_loaded(sorted(_imported("study.data.prepare", set())))
    assert "study/data/masking.py" in files and "study/io.py" in files  # it followed the lazy imports
    uncovered = _uncovered(files, DATA_CODE)
    assert not uncovered, f"the data stages do not depend on {uncovered}"


def _selected(repo: Path, *names: str) -> list[str]:
    """Specs a and b in ablations/, `names` selected and synced; the CLI arguments that go with them."""
    for n in ("a", "b"):
        (repo / "ablations" / f"{n}.yaml").write_text(_spec(n))
    args = ["--ablations", str(repo / "ablations"), "--out", str(repo / "study_runs.yaml")]
    (repo / "params.yaml").write_text("# my note\nstudies:\n" + "".join(f"- {n}  # why {n}\n" for n in names))
    assert study_main(["sync", *args]) == 0
    return args


def _files(repo: Path) -> dict:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in repo.rglob("*") if p.is_file()}


@pytest.mark.parametrize("text", [b"studies: [a\n", b"\xff\xfestudies: [a]\n", b"- a\n- b\n"])
def test_a_broken_params_yaml_exits_2_naming_it(repo: Path, capsys, text):
    """A YAML error or non-UTF-8 bytes in params.yaml were a traceback; a top-level list silently selected
    every spec. sync, select and deselect now exit 2 naming params.yaml and `studies`, writing nothing."""
    args = _selected(repo, "a")
    (repo / "params.yaml").write_bytes(text)
    before = _files(repo)
    for argv in (["sync"], ["select", "b"], ["deselect", "a"]):
        capsys.readouterr()
        assert study_main([*argv, *args]) == 2, argv
        err = capsys.readouterr().err
        assert "params.yaml: studies:" in err and "Traceback" not in err, err
    assert _files(repo) == before


def test_deselect_checks_the_remaining_studies_before_writing(repo: Path, capsys):
    """With b broken, `deselect a` exited 2 after params.yaml had already lost a."""
    args = _selected(repo, "a", "b")
    (repo / "ablations" / "b.yaml").write_text("name: b\nfactors: {model.layerz: [1]}\n")
    before = _files(repo)
    assert study_main(["deselect", "a", *args]) == 2
    assert "model.layerz" in capsys.readouterr().err
    assert _files(repo) == before


def test_selecting_a_selected_study_changes_nothing(repo: Path, capsys):
    """`select a` when a was selected rewrote params.yaml and dropped its comments."""
    args = _selected(repo, "a")
    before = _files(repo)
    capsys.readouterr()
    assert study_main(["select", "a", *args]) == 0
    assert "a is already selected" in capsys.readouterr().out
    assert _files(repo) == before


def test_select_refuses_a_profile_that_needs_quoting(repo: Path, capsys):
    """`select a --profile "my prof"` would put an unquoted `--profile my prof` into dvc.yaml's commands."""
    args = _selected(repo, "a")
    (repo / "ablations" / "b.yaml").write_text(
        _spec("b").replace("seeds:", "profiles:\n  my prof: {}\nseeds:")
    )
    before = _files(repo)
    for argv in (["select", "a", "--profile", "my prof"], ["select", "a@my prof"]):
        assert study_main([*argv, *args]) == 2
        assert "--profile:" in capsys.readouterr().err
    assert study_main(["select", "b", *args]) == 2  # nor can a spec define such a profile
    assert "profiles.my prof:" in capsys.readouterr().err
    assert _files(repo) == before


def test_a_stamp_sees_a_same_size_rewrite_whose_mtime_was_restored(tmp_path):
    """The stamps' digest cache reused a file's old sha256 when its size and mtime were unchanged, so a
    rewrite of the same size with its mtime set back (`cp -p`, `rsync -t`) left the stamp, and DVC's view,
    stale. ctime cannot be set back: it is in the key now."""
    import os
    import time

    from study.studies.stamps import _Digests

    root, cache = tmp_path / "run", tmp_path / "cache.json"
    root.mkdir()
    f = root / "metrics.json"
    f.write_text("aaaa")
    st = f.stat()
    first = _Digests(cache)
    before = first.tree(root)
    first.save()
    time.sleep(0.01)
    f.write_text("bbbb")  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime restored, as `cp -p` does
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    assert _Digests(cache).tree(root)["digest"] != before["digest"]
