"""The DVC pipeline end to end on a tiny spec, in a temporary git repository (issues 5 and 22).

- a full `dvc repro` trains every run, fine-tunes, aggregates and writes the report, printing one
  progress line per finished run; then `dvc status` is up to date and a second `dvc repro` trains nothing;
- `study rescore` + `dvc repro -f -s study-tiny` re-aggregates, trains nothing;
- one more factor level + `study sync` + `dvc repro` trains only the new run;
- `dvc exp run -S <spec value>` reruns what that value feeds (fine-tuning), not pre-training;
- `dvc push` to a local remote, a fresh clone, `dvc pull`: up to date, `dvc repro` trains nothing;
- the selection (params.yaml): `study select` adds a second study whose stage alone appears and runs;
  `study deselect` removes it and keeps its results;
- the generated pipeline's shape (fast): one stage per study whose DVC entries do not grow with its runs,
  each depending on its own study only; the stamp (`study sync --stamp`) and its staleness check.
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ruamel.yaml import YAML  # DVC's own YAML reader (installed with dvc)

from study.cli import main as study_main
from study.errors import StudyError
from study.studies.pipeline import pipeline_document, render, runs_document
from study.studies.selection import read_selection
from study.studies.stamps import stamp
from study.studies.sync import is_stale

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

SPEC = """
name: tiny
question: does NSP help a tiny model?
defaults:
  corpus: {{sources: ["text:corpus"], valid_fraction: 0.1, test_fraction: 0.1}}
  tokenizer: {{vocab_size: 200, min_frequency: 1}}
  objective: {{format: segment_pair, max_seq_len: 32}}
  model: {{layers: 1, hidden: 32, heads: 2, intermediate: 64, max_positions: 32}}
  train: {{amount: 6, batch_size: 8, eval_sequences: 16}}
  finetune: {{tasks: [SST-2], glue_dir: glue, seeds: [0], epochs: 1, batch_size: 16, max_length: 32,
              probe: false}}
factors:
  objective.sentence: [{levels}]
seeds: [0]
report:
  kind: nsp
  primary_metric: SST-2/finetune/accuracy
  compare: {{factor: objective.sentence, a: nsp, b: none}}
"""

WORDS = (
    "the cat dog sat on mat a bird flew over tree river ran fast slow red blue green house "
    "man woman child saw big small old new good bad day night sun moon"
).split()


def _corpus(path: Path) -> None:
    rng = random.Random(0)
    docs = []
    for _ in range(40):
        sents = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."
            for _ in range(rng.randint(4, 8))
        ]
        docs.append(" ".join(sents))
    path.mkdir()
    (path / "docs.txt").write_text("\n\n".join(docs) + "\n")


def _glue(path: Path) -> None:
    rng = random.Random(1)
    for split, n in (("train", 120), ("dev", 40)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randint(0, 1)
            word = "good" if label else "bad"
            rows.append(" ".join([*(rng.choice(WORDS) for _ in range(5)), word]) + f"\t{label}")
        (path / "SST-2").mkdir(parents=True, exist_ok=True)
        (path / "SST-2" / f"{split}.tsv").write_text("\n".join(rows) + "\n")


def _env(trace: Path | None = None) -> dict:
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        **({"STUDY_TRACE": str(trace)} if trace else {}),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return env


def sh(cwd: Path, *cmd: str) -> str:
    """Run a command; its output, followed by the fault points it passed (`TRACE <pid> <point> <detail>`)."""
    trace = cwd.parent / f"trace-{cwd.name}.txt"  # outside the repository: git and DVC must not see it
    trace.unlink(missing_ok=True)
    proc = subprocess.run(cmd, cwd=cwd, env=_env(trace), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    points = trace.read_text().splitlines() if trace.exists() else []
    return proc.stdout + proc.stderr + "".join(f"TRACE {p}\n" for p in points)


def trained(output: str) -> set[str]:
    """Run hashes that started training during the command that printed `output` (the trainer's
    `train.start` fault point, traced by `sh`): a per-study stage that reruns reuses finished runs."""
    return set(re.findall(r"^TRACE \d+ train\.start ([0-9a-f]{12})$", output, re.M))


def stages_run(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def _run_row(project: Path, run_hash: str) -> dict:
    with open(project / "results" / "studies" / "tiny" / "runs.csv", newline="") as f:
        return next(r for r in csv.DictReader(f) if r["run_hash"] == run_hash)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copytree(REPO / "study", root / "study", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "ablations").mkdir()
    (root / "ablations" / "tiny.yaml").write_text(SPEC.format(levels="nsp, none"))
    _corpus(root / "corpus")
    _glue(root / "glue")
    # metrics and plots are `cache: false` outputs: git carries them, as in the main repository
    (root / ".gitignore").write_text(
        "/results/*\n!/results/metrics/\n!/results/plots/\n/reports/*\n__pycache__/\n"
    )
    sh(root, "git", "init", "-q")
    sh(root, "dvc", "init", "-q")
    sh(root, "dvc", "config", "core.analytics", "false")
    sh(root, "dvc", "config", "core.check_update", "false")
    sh(root, "study", "sync")
    sh(root, "git", "add", "-A")
    sh(root, "git", "commit", "-qm", "tiny study")
    return root


@pytest.mark.slow
def test_repro_is_incremental_and_shareable(project: Path, tmp_path: Path):
    out = sh(project, "dvc", "repro")
    assert len(trained(out)) == 2, out
    # progress under DVC: one line per finished run and fine-tune, passed through from the stage's stderr
    assert (
        len(re.findall(r"^pretrain [12]/2 [0-9a-f]{12} done in \d+ s, ref acc [0-9.]+%", out, re.M)) == 2
    ), out
    assert len(re.findall(r"^finetune [0-9a-f]{12} .*done in \d+ s: SST-2 finetune", out, re.M)) == 2, out
    assert "Data and pipelines are up to date." in sh(project, "dvc", "status")
    report = project / "reports" / "tiny" / "index.html"
    assert report.exists() and "does NSP help a tiny model?" in report.read_text()
    status = {
        p.parent.name: p.stat().st_mtime_ns for p in (project / "results" / "runs").glob("*/status.json")
    }
    assert len(status) == 2
    manifest = json.loads((project / "pipeline" / "study-tiny.json").read_text())
    assert {h: r["status"] for h, r in manifest["runs"].items()} == dict.fromkeys(status, "done")
    # 2 runs + the random-init baseline, each with the study's results
    assert len(manifest["finetune"]) == 3 and all(f["files"] for f in manifest["finetune"].values())
    plot = (project / "results" / "plots" / "study-tiny.csv").read_text().splitlines()  # a column per run
    assert plot[0] == "step,objective.sentence=none:seed0,objective.sentence=nsp:seed0", plot
    assert len(plot) == len(
        (project / "results" / "plots" / f"{next(iter(status))}.csv").read_text().splitlines()
    )

    # a second repro trains nothing
    out = sh(project, "dvc", "repro")
    assert not stages_run(out), out
    assert {
        p.parent.name: p.stat().st_mtime_ns for p in (project / "results" / "runs").glob("*/status.json")
    } == status

    # a run from before a metrics field existed is re-scored, not retrained: `study rescore`, then
    # `dvc repro -f -s study-tiny` re-aggregates (run folders are the harness's cache, not DVC outputs)
    m_file = sorted((project / "results" / "runs").glob("*/metrics.json"))[0]
    m = json.loads(m_file.read_text())
    floor = m.pop("ref_mode_acc")
    newer = (
        "ref_mask_acc",
        "ref_mask_mode_acc",
        "ref_mask_count",
        "ref_keep_acc",
        "ref_keep_count",
        "ref_rnd_acc",
        "ref_rnd_mode_acc",
        "ref_rnd_count",
        "ref_spread",
    )  # newer still
    for key in newer:
        m.pop(key)
    m_file.write_text(json.dumps(m))
    for step in ("aggregate", "report"):  # the study as it was aggregated before the field existed
        sh(project, "study", step, "ablations/tiny.yaml")
    assert _run_row(project, m_file.parent.name)["ref_mode_acc"] == ""
    sh(project, "dvc", "commit", "-f")  # ... and recorded by DVC
    out = sh(project, "study", "rescore", "ablations/tiny.yaml")
    assert out.count("added " + ", ".join(("ref_mode_acc",) + newer)) == 1, out
    assert out.count("up to date") == 1, out
    assert json.loads(m_file.read_text())["ref_mode_acc"] == floor
    out = sh(project, "dvc", "repro", "-f", "-s", "study-tiny")
    assert stages_run(out) == {"study-tiny"} and not trained(out), out
    assert float(_run_row(project, m_file.parent.name)["ref_mode_acc"]) == floor
    assert "Data and pipelines are up to date." in sh(project, "dvc", "status")
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "results")

    # one more factor level: only the new run trains
    (project / "ablations" / "tiny.yaml").write_text(SPEC.format(levels="nsp, none, sop"))
    sh(project, "study", "sync")
    out = sh(project, "dvc", "repro")
    new = trained(out)
    assert len(new) == 1 and not (new & set(status)), out
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "sop level")

    assert "Data and pipelines are up to date." in sh(project, "dvc", "status")

    # dvc exp run -S on one spec value: the study reruns, fine-tunes with the new recipe, trains nothing
    before = set((project / "results" / "finetune").rglob("*.json"))
    out = sh(project, "dvc", "exp", "run", "-S", "ablations/tiny.yaml:defaults.finetune.epochs=2")
    assert stages_run(out) == {"study-tiny"} and not trained(out), out
    assert len(set((project / "results" / "finetune").rglob("*.json")) - before) == 4, (
        out
    )  # 3 runs + baseline
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "epochs 2")

    # push to a local remote; a fresh clone pulls, is up to date, and trains nothing
    remote = tmp_path / "remote"
    sh(project, "dvc", "remote", "add", "-d", "local", str(remote))
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "remote")
    sh(project, "dvc", "push")
    clone = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "-q", str(project), str(clone))
    sh(clone, "dvc", "pull")
    assert "Data and pipelines are up to date." in sh(clone, "dvc", "status")
    out = sh(clone, "dvc", "repro")
    assert not trained(out) and not stages_run(out), out
    assert (clone / "results" / "studies" / "tiny" / "runs.csv").exists()


# A second study of its own shape (width 16: its own runs and random-init baseline), on the same data.
OTHER = (
    SPEC.replace("name: tiny", "name: other")
    .replace("hidden: 32", "hidden: 16")
    .replace("intermediate: 64", "intermediate: 32")
    .format(levels="nsp, none")
)


def _stages(project: Path) -> set[str]:
    return set(yaml.safe_load((project / "dvc.yaml").read_text())["stages"])


@pytest.mark.slow
def test_selection_adds_and_removes_a_study(project: Path):
    assert (
        (project / "params.yaml").read_text().rstrip().endswith("studies:\n- tiny")
    )  # sync made it explicit
    sh(project, "dvc", "repro")
    (project / "ablations" / "other.yaml").write_text(OTHER)
    before = _stages(project)
    sh(project, "study", "sync")
    assert _stages(project) == before, "a spec that is not selected gets no stages"
    assert "Data and pipelines are up to date." in sh(project, "dvc", "status")

    sh(project, "study", "select", "other")
    other = _stages(project) - before
    assert other == {"study-other"}, other
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "select other")
    out = sh(project, "dvc", "repro")
    assert stages_run(out) == other, out  # the first study's stage is untouched
    assert len(trained(out)) == 2, out
    assert (project / "reports" / "other" / "index.html").exists()
    assert "Data and pipelines are up to date." in sh(project, "dvc", "status")

    sh(project, "study", "deselect", "other")
    assert _stages(project) == before
    for kept in (
        "results/studies/other",
        "reports/other/index.html",
        *(f"results/runs/{h}" for h in trained(out)),
    ):
        assert (project / kept).exists(), kept  # deselecting removes stages, never results
    out = sh(project, "dvc", "repro")
    assert not stages_run(out), out


SHARED = """
name: {name}
question: q
defaults:
  corpus: {{sources: [embedded]}}
  tokenizer: {{vocab_size: 200, min_frequency: 1}}
  objective: {{format: segment_pair, max_seq_len: 32}}
  model: {{layers: 1, hidden: 32, heads: 2, intermediate: 64, max_positions: 32}}
  train: {{amount: 6, batch_size: 8}}
  finetune: {{tasks: [SST-2], seeds: [0], max_length: 32, lr: {lr}}}
factors:
  objective.sentence: [{levels}]
seeds: [0]
profiles:
  cpu: {{train.amount: 8}}
"""


def _two_studies(tmp_path: Path) -> tuple[Path, Path]:
    abl = tmp_path / "ablations"
    abl.mkdir()
    (abl / "a.yaml").write_text(SHARED.format(name="a", lr=1e-3, levels="nsp, none"))
    (abl / "b.yaml").write_text(SHARED.format(name="b", lr=5e-4, levels="none"))  # shares a's `none` run
    return abl, tmp_path / "study_runs.yaml"


def _outs(stages: dict) -> list[str]:
    return [next(iter(o)) if isinstance(o, dict) else o for st in stages.values() for o in st.get("outs", [])]


def test_each_study_stage_depends_on_its_own_work_only(tmp_path: Path):
    abl, out = _two_studies(tmp_path)
    doc = runs_document(abl, [("a", None), ("b", None)])
    stages = pipeline_document(doc)["stages"]
    assert set(doc["studies"]["b"]["runs"]) < set(doc["studies"]["a"]["runs"])  # b shares a's `none` run
    assert set(doc["studies"]["b"]["baselines"]) == set(
        doc["studies"]["a"]["baselines"]
    )  # ... and its baseline
    for me, other in (("a", "b"), ("b", "a")):
        st = stages[f"study-{me}"]
        # its own spec, recipe and outputs only: no other study's spec, manifest, aggregate or report
        paths = [*st["deps"], *_outs({"x": st})]
        assert not [p for p in paths if p.endswith((f"/{other}", f"/{other}.yaml", f"study-{other}.json"))], (
            st
        )
        assert f"{other}.yaml" not in st["cmd"] and f"study-{other}" not in st["cmd"], st["cmd"]
        assert st["cmd"].count(f"study finetune ablations/{me}.yaml") == 1, st["cmd"]
    outs = _outs(stages)
    assert len(outs) == len(set(outs)), "DVC forbids two stages declaring one output"
    # a profile is its own study
    doc = runs_document(abl, [("b", None), ("b", "cpu")])
    assert set(doc["studies"]) == {"b", "b-cpu"}
    assert {"study-b", "study-b-cpu"} <= set(pipeline_document(doc)["stages"])
    # a spec's base files are dependencies of its stage (paths like the spec's)
    (abl / "base").mkdir()
    (abl / "base" / "common.yaml").write_text("name: common\nquestion: q\ndefaults: {train: {amount: 7}}\n")
    (abl / "d.yaml").write_text(
        "name: d\nquestion: q\nbase: base/common.yaml\n"
        "defaults: {corpus: {sources: [embedded]}, finetune: {tasks: [SST-2]}}\nseeds: [0]\n"
    )
    deps = pipeline_document(runs_document(abl, [("d", None)]))["stages"]["study-d"]["deps"]
    assert deps[:2] == ["ablations/d.yaml", "ablations/base/common.yaml"], deps


def test_no_op_cost_does_not_grow_with_a_studys_runs(tmp_path: Path):
    """What DVC re-reads on every `dvc status` / `dvc repro` (docs/RESULTS.md "DVC no-op at scale"): one stage
    per study with the same few entries whatever its number of runs; no run or fine-tune folder is a DVC
    dependency or output; the code folders are hashed by one stage, not by every study's."""
    abl, _ = _two_studies(tmp_path)
    (abl / "c.yaml").write_text(
        SHARED.format(name="c", lr=2e-3, levels="")
        .replace("objective.sentence: []", "train.amount: [6, 7, 8, 9, 10]")
        .replace("seeds: [0]", "seeds: [0, 1, 2]")
    )
    doc = runs_document(abl, [("a", None), ("b", None), ("c", None)])
    assert [len(doc["studies"][n]["runs"]) for n in "abc"] == [2, 1, 15]
    pipe = pipeline_document(doc)
    stages = pipe["stages"]
    assert set(stages) == {
        "code-study",
        *(f"data-{dh}" for dh in doc["data"]),
        "study-a",
        "study-b",
        "study-c",
    }
    shape = {
        n: (
            len(stages[f"study-{n}"]["deps"]),
            len(stages[f"study-{n}"]["outs"]),
            len(stages[f"study-{n}"]["cmd"]),
        )
        for n in "abc"
    }
    assert len({s[:2] for s in shape.values()}) == 1 and shape["c"][2] < shape["a"][2] + 20, shape
    paths = [*_outs(stages), *(d for st in stages.values() for d in st.get("deps", []))]
    assert not [p for p in paths if p.startswith(("results/runs", "results/finetune"))], paths
    code = [p for st in stages.values() for p in st.get("deps", []) if p.startswith("study/")]
    assert sorted(code) == sorted(
        [
            *stages["code-study"]["deps"],
            *(d for n, st in stages.items() if n.startswith("data-") for d in st["deps"]),
        ]
    )
    assert pipe["metrics"] == [f"results/metrics/study-{n}.json" for n in "abc"]


def _run_folder(results: Path, run_hash: str, status: str = "done", loss: float = 5.0) -> None:
    d = results / "runs" / run_hash
    (d / "model").mkdir(parents=True, exist_ok=True)
    (d / "status.json").write_text(json.dumps({"status": status}))
    (d / "metrics.json").write_text('{"ref_mlm_acc": 0.1}')
    (d / "model" / "model.safetensors").write_bytes(b"weights")
    (d / "history.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": loss - s}) + "\n" for s in (1, 2))
    )
    (d / "checkpoints").mkdir(exist_ok=True)
    (d / "checkpoints" / "step-1.pt").write_text("resume state: not part of the digest")


def test_stamp_records_the_study_and_refuses_a_stale_pipeline(tmp_path: Path, monkeypatch):
    abl, out = _two_studies(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert study_main(["sync", "--ablations", str(abl), "--out", str(out)]) == 0
    s = runs_document(abl, [("a", None)])["studies"]["a"]
    results = tmp_path / "results"
    for h in s["runs"]:
        _run_folder(results, h)
    (base,) = s["baselines"]
    (fh,) = {r["finetune"] for r in s["runs"].values()}
    mine = results / "finetune" / base / "SST-2" / fh / "finetune-seed0.json"
    mine.parent.mkdir(parents=True)
    mine.write_text('{"primary": 0.5}')
    theirs = (
        results / "finetune" / base / "SST-2" / "0123456789ab" / "finetune-seed0.json"
    )  # another recipe's
    theirs.parent.mkdir(parents=True)
    theirs.write_text('{"primary": 0.6}')
    cmd = pipeline_document(runs_document(abl, [("a", None)]))["stages"]["study-a"]["cmd"]
    of = re.search(r"--stamp study-a --of ([0-9a-f]+)", cmd).group(1)

    line = stamp("study-a", out, results, of)
    m = json.loads((tmp_path / "pipeline" / "study-a.json").read_text())
    assert "2 runs (2 done)" in line and m["of"] == of
    assert {h: (r["status"], r["files"]) for h, r in m["runs"].items()} == dict.fromkeys(
        s["runs"], ("done", 4)
    )
    assert m["finetune"][base]["files"] == 1  # its own recipe's results only
    curves = (results / "plots" / "study-a.csv").read_text().splitlines()
    assert (
        curves[0] == "step,objective.sentence=none:seed0,objective.sentence=nsp:seed0"
        and curves[1] == "1,4.0,4.0"
    )

    # the digests follow the files, not their checkpoints or other recipes' results
    theirs.write_text('{"primary": 0.7}')
    (results / "runs" / next(iter(s["runs"])) / "checkpoints" / "step-2.pt").write_text("x")
    stamp("study-a", out, results, of)
    assert json.loads((tmp_path / "pipeline" / "study-a.json").read_text()) == m
    h = next(iter(s["runs"]))
    (results / "runs" / h / "metrics.json").write_text(
        '{"ref_mlm_acc": 0.2, "ref_mode_acc": 0.05}'
    )  # rescored
    stamp("study-a", out, results, of)
    m2 = json.loads((tmp_path / "pipeline" / "study-a.json").read_text())
    assert m2["runs"][h]["digest"] != m["runs"][h]["digest"]
    assert {k: v for k, v in m2["runs"].items() if k != h} == {k: v for k, v in m["runs"].items() if k != h}

    # the spec edited after sync (`dvc exp run -S`): the stamp records what the stage ran, and says that
    # dvc.yaml lags behind
    (abl / "a.yaml").write_text(SHARED.format(name="a", lr=1e-3, levels="nsp, none, sop"))
    line = stamp("study-a", out, results, of)
    assert "3 runs (2 done)" in line and "`study sync`" in line, line
    assert len(json.loads((tmp_path / "pipeline" / "study-a.json").read_text())["runs"]) == 3
    assert "`study sync`" not in stamp(
        "study-a",
        out,
        results,
        re.search(
            r"--of (\w+)", pipeline_document(runs_document(abl, [("a", None)]))["stages"]["study-a"]["cmd"]
        ).group(1),
    )
    with pytest.raises(StudyError, match="zzz"):
        stamp("study-zzz", out, results, of)


def test_code_stamp_ignores_bytecode(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "study", tmp_path / "study", ignore=shutil.ignore_patterns("__pycache__"))
    runs_file, file = tmp_path / "study_runs.yaml", tmp_path / "pipeline" / "code-study.json"
    stamp("code-study", runs_file, tmp_path / "results")
    first = file.read_text()
    (tmp_path / "study" / "report" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "study" / "report" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    stamp("code-study", runs_file, tmp_path / "results")
    assert file.read_text() == first
    (tmp_path / "study" / "report" / "new_module.py").write_text("X = 1\n")  # a module added inside counts
    stamp("code-study", runs_file, tmp_path / "results")
    after, before = json.loads(file.read_text())["paths"], json.loads(first)["paths"]
    assert [p for p in after if after[p] != before[p]] == ["study/report"]


def test_sync_writes_a_placeholder_for_each_stamp_a_study_stage_reads(tmp_path: Path):
    """So that every dependency of a study stage exists in a fresh clone, where `dvc repro --dry` would
    otherwise fail hashing a missing upstream output (treeverse/dvc#9021); the stage replaces it."""
    abl, out = _two_studies(tmp_path)
    args = ["--ablations", str(abl), "--out", str(out)]
    assert study_main(["sync", *args]) == 0
    stages = yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"]
    wanted = {
        d
        for n, st in stages.items()
        if n.startswith("study-")
        for d in st["deps"]
        if d.startswith("pipeline/")
    }
    (dh,) = {dh for s in yaml.safe_load(out.read_text())["studies"].values() for dh in s["data"]}
    assert wanted == {"pipeline/code-study.json", f"pipeline/data-{dh}.json"}
    assert {p.relative_to(tmp_path).as_posix() for p in (tmp_path / "pipeline").iterdir()} == wanted
    assert "pending" in json.loads((tmp_path / "pipeline" / "code-study.json").read_text())
    (tmp_path / "pipeline" / "code-study.json").write_text(
        '{"stage": "code-study", "paths": {}}'
    )  # as stamped
    (tmp_path / f"pipeline/data-{dh}.json").unlink()
    assert is_stale(abl, out)
    assert study_main(["sync", *args]) == 0 and not is_stale(abl, out)
    assert "paths" in json.loads(
        (tmp_path / "pipeline" / "code-study.json").read_text()
    )  # a real stamp stays


def test_select_and_deselect_edit_the_committed_selection(tmp_path: Path, capsys):
    abl, out = _two_studies(tmp_path)
    args = ["--ablations", str(abl), "--out", str(out)]
    assert study_main(["sync", *args]) == 0
    params = tmp_path / "params.yaml"
    assert read_selection(params) == [("a", None), ("b", None)]  # no selection yet: every spec, default scale
    assert study_main(["deselect", "a", *args]) == 0
    assert study_main(["select", "a", "--profile", "cpu", *args]) == 0
    assert read_selection(params) == [("b", None), ("a", "cpu")]
    assert "studies:\n- b\n- a@cpu" in params.read_text()
    assert "study-a-cpu:" in (tmp_path / "dvc.yaml").read_text()
    assert "study-a:" not in (tmp_path / "dvc.yaml").read_text()

    # mistakes exit 2 naming the field and what is allowed, and write nothing
    files = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    capsys.readouterr()
    assert study_main(["select", "c", *args]) == 2
    assert "spec:" in (err := capsys.readouterr().err) and "allowed: a, b" in err, err
    assert study_main(["select", "b", "--profile", "gpu", *args]) == 2
    assert "--profile:" in (err := capsys.readouterr().err) and "allowed: cpu" in err, err
    assert study_main(["deselect", "a", *args]) == 2
    assert "allowed: b, a@cpu" in capsys.readouterr().err
    # the profile in NAME@PROFILE is checked like --profile's (it was dropped: `select b@gpu` selected b)
    assert study_main(["select", "b@gpu", *args]) == 2
    assert "--profile:" in (err := capsys.readouterr().err) and "allowed: cpu" in err, err
    assert study_main(["deselect", "a@gpu", *args]) == 2  # a@cpu is selected, a@gpu is not
    assert "is not selected" in capsys.readouterr().err
    assert study_main(["select", "a@cpu", "--profile", "gpu", *args]) == 2
    assert "--profile:" in capsys.readouterr().err
    # a spec file outside the ablations folder is not the selected spec of that name
    other = tmp_path / "elsewhere" / "b.yaml"
    other.parent.mkdir()
    other.write_text((abl / "b.yaml").read_text())
    assert study_main(["select", str(other), *args]) == 2
    assert "study:" in (err := capsys.readouterr().err) and "is not in" in err, err
    assert study_main(["select", str(abl / "b.yaml"), *args]) == 0  # the folder's own file is b (selected)
    capsys.readouterr()
    assert study_main(["sync", "--of", "abc", *args]) == 2  # --of means something only with --stamp
    assert "--of:" in capsys.readouterr().err
    params.write_text("studies: [b, 'nope@cpu']\n")
    assert study_main(["sync", *args]) == 2
    assert "studies[1]:" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p != params} == {
        p: b for p, b in files.items() if p != params
    }


def test_committed_pipeline_has_only_the_selected_studies():
    """The repository's dvc.yaml: exactly the stages of params.yaml's studies (staleness: tests/test_spec.py)."""
    selected = read_selection(REPO / "params.yaml")
    assert selected, "params.yaml selects no study: `make smoke` would have nothing to run"
    names = {f"{s}-{p}" if p else s for s, p in selected}
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for stage in stages:
        kind, _, study = stage.partition("-")
        assert kind in ("data", "code") or study in names, stage
    assert {f"study-{n}" for n in names} <= set(stages)


def test_hash_keys_survive_dvcs_yaml_reader():
    """DVC reads study_runs.yaml with ruamel (YAML 1.2): a bare `12e345678901` would be the float inf."""
    doc = {"owners": {"12e345678901": "a", "13e345678901": "b", "0123": "c"}}
    assert YAML(typ="safe").load(render(doc)) == doc


def test_git_dirty_ignores_what_the_pipeline_writes(tmp_path, monkeypatch):
    """Provenance's "dirty" means changed code or specs, not the stamps a DVC stage rewrites."""
    import subprocess

    from study import provenance

    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    for rel in ("study/x.py", "pipeline/study-a.json", "dvc.lock", "params.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("0\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(provenance, "PACKAGE_DIR", tmp_path / "study")

    def dirty():
        provenance.git_info.cache_clear()
        return provenance.git_info()["dirty"]

    assert dirty() is False
    (tmp_path / "pipeline" / "study-a.json").write_text("{}\n")
    (tmp_path / "dvc.lock").write_text("1\n")
    assert dirty() is False
    (tmp_path / "notes.txt").write_text("an untracked file beside the code is not code\n")
    assert dirty() is False
    (tmp_path / "study" / "new_masking.py").write_text("# untracked code inside the package is\n")
    assert dirty() is True
    (tmp_path / "study" / "new_masking.py").unlink()
    monkeypatch.chdir(tmp_path / "study")  # the same answer from a subfolder
    assert dirty() is False
    (tmp_path / "study" / "x.py").write_text("1\n")
    assert dirty() is True
    monkeypatch.chdir(tmp_path / "pipeline")
    assert dirty() is True


def test_the_commit_is_the_packages_not_the_working_directorys(tmp_path, monkeypatch):
    """Run from inside another repository (a researcher's project that imports study): provenance names
    the commit of the code that ran. Before, it named the working directory's HEAD."""
    import subprocess

    from study import provenance

    def repo(path, name):
        (path / name).mkdir(parents=True)
        (path / name / "x.py").write_text(f"{name}\n")
        for a in (
            ("init", "-q"),
            ("add", "-A"),
            ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"),
        ):
            subprocess.run(["git", *a], cwd=path, check=True, capture_output=True)
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True
        ).stdout.strip()

    code, other = repo(tmp_path / "code", "study"), repo(tmp_path / "project", "src")
    assert code != other
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.setattr(provenance, "PACKAGE_DIR", tmp_path / "code" / "study")
    provenance.git_info.cache_clear()
    try:
        assert provenance.git_info()["commit"] == code
        # a copy of the package inside the project's (ignored) folder is not tracked there: not its commit
        inside = tmp_path / "project" / ".venv" / "study"
        inside.mkdir(parents=True)
        (tmp_path / "project" / ".gitignore").write_text(".venv/\n")
        monkeypatch.setattr(provenance, "PACKAGE_DIR", inside)
        monkeypatch.setattr(provenance, "ARCHIVE_COMMIT", inside / "COMMIT")
        provenance.git_info.cache_clear()
        assert provenance.git_info()["commit"] is None
    finally:
        provenance.git_info.cache_clear()


def test_a_git_archive_copy_names_its_commit(tmp_path, monkeypatch):
    """Without a .git (a `git archive` copy, how long studies run from a frozen tree) provenance reads the
    commit that `git archive` wrote into study/COMMIT; in a clone the file is a placeholder, not a commit."""
    import subprocess

    from study import provenance

    monkeypatch.chdir(tmp_path)  # not a git repository
    fake = tmp_path / "COMMIT"
    monkeypatch.setattr(provenance, "ARCHIVE_COMMIT", fake)
    monkeypatch.setattr(provenance, "PACKAGE_DIR", tmp_path)  # nor is the package's folder
    for text, want in (
        ("0123456789abcdef0123456789abcdef01234567\n", "0123456789abcdef0123456789abcdef01234567"),
        ("$Format:%H$\n", None),
    ):
        fake.write_text(text)
        provenance.git_info.cache_clear()
        info = provenance.git_info()
        assert info["commit"] == want
        assert info["dirty"] is None and (info.get("source") == "git archive") == (want is not None)
    provenance.git_info.cache_clear()
    # the real export: the attribute substitutes the commit (needs the repository's .git, as in CI)
    repo = Path(provenance.__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    out = subprocess.run(
        "git archive HEAD study/COMMIT | tar -xO",
        shell=True,
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == head.stdout.strip()


def test_run_outside_a_checkout_names_the_package_commit(tmp_path, monkeypatch):
    """Run from a folder that is no git repository, with the package imported from a checkout (an editable
    install; a `git archive` copy sharing another checkout's virtualenv): provenance names the commit of the
    code that ran, and whether it was edited, instead of `commit: null`."""
    import subprocess

    from study import provenance

    repo = tmp_path / "checkout"
    (repo / "study").mkdir(parents=True)
    (repo / "study" / "x.py").write_text("0\n")

    def git(*a):
        return subprocess.run(
            ["git", *a], cwd=repo, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not a git repository
    placeholder = tmp_path / "COMMIT"
    placeholder.write_text("$Format:%H$\n")  # the package's own COMMIT file, unexpanded as in a checkout
    monkeypatch.setattr(provenance, "ARCHIVE_COMMIT", placeholder)
    monkeypatch.setattr(provenance, "PACKAGE_DIR", repo / "study")
    provenance.git_info.cache_clear()
    info = provenance.git_info()
    assert info == {"commit": git("rev-parse", "HEAD"), "dirty": False, "source": "package checkout"}
    (repo / "study" / "x.py").write_text("1\n")
    provenance.git_info.cache_clear()
    assert provenance.git_info()["dirty"] is True
    provenance.git_info.cache_clear()
