"""The DVC pipeline end to end on a tiny spec, in a temporary git repository (issues 5 and 22).

- a full `dvc repro` trains every run, fine-tunes, aggregates and writes the report, printing one
  progress line per finished run; then `dvc status` is up to date and a second `dvc repro` trains nothing;
- `study rescore` + `dvc commit -f pretrain-tiny finetune-tiny` + `dvc repro` re-aggregates, trains nothing;
- one more factor level + `study sync` + `dvc repro` trains only the new run;
- `dvc exp run -S <spec value>` reruns what that value feeds (fine-tuning), not pre-training;
- `dvc push` to a local remote, a fresh clone, `dvc pull`, `dvc repro`: nothing trains;
- the selection (params.yaml): `study select` adds a second study whose stages alone appear and run,
  sharing a run and a random-init baseline with the first without training them again; `study deselect`
  removes its stages and keeps its results.
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
from study.studies.sync import pipeline_document, read_selection, render, runs_document

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

WORDS = ("the cat dog sat on mat a bird flew over tree river ran fast slow red blue green house "
         "man woman child saw big small old new good bad day night sun moon").split()


def _corpus(path: Path) -> None:
    rng = random.Random(0)
    docs = []
    for _ in range(40):
        sents = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."
                 for _ in range(rng.randint(4, 8))]
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
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           **({"STUDY_TRACE": str(trace)} if trace else {}),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
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
    (root / ".gitignore").write_text("/results/*\n!/results/metrics/\n!/results/plots/\n/reports/*\n__pycache__/\n")
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
    assert len(re.findall(r"^pretrain [12]/2 [0-9a-f]{12} done in \d+ s, ref acc [0-9.]+%", out, re.M)) == 2, out
    assert len(re.findall(r"^finetune [12]/2 [0-9a-f]{12} done in \d+ s: SST-2 finetune", out, re.M)) == 2, out
    assert "Data and pipelines are up to date." in sh(project, "dvc", "status")
    report = project / "reports" / "tiny" / "index.html"
    assert report.exists() and "does NSP help a tiny model?" in report.read_text()
    status = {p.parent.name: p.stat().st_mtime_ns for p in (project / "results" / "runs").glob("*/status.json")}
    assert len(status) == 2

    # a second repro trains nothing
    out = sh(project, "dvc", "repro")
    assert not stages_run(out), out
    assert {p.parent.name: p.stat().st_mtime_ns
            for p in (project / "results" / "runs").glob("*/status.json")} == status

    # a run from before a metrics field existed is re-scored, not retrained: `study rescore`, then
    # `dvc commit -f pretrain finetune` records the changed run folders, and `dvc repro` re-aggregates only
    m_file = sorted((project / "results" / "runs").glob("*/metrics.json"))[0]
    m = json.loads(m_file.read_text())
    floor = m.pop("ref_mode_acc")
    m_file.write_text(json.dumps(m))
    for step in ("aggregate", "report"):  # the study as it was aggregated before the field existed
        sh(project, "study", step, "ablations/tiny.yaml")
    assert _run_row(project, m_file.parent.name)["ref_mode_acc"] == ""
    sh(project, "dvc", "commit", "-f")  # ... and recorded by DVC
    out = sh(project, "study", "rescore", "ablations/tiny.yaml")
    assert out.count("added ref_mode_acc") == 1 and out.count("up to date") == 1, out
    assert json.loads(m_file.read_text())["ref_mode_acc"] == floor
    sh(project, "dvc", "commit", "-f", "pretrain-tiny", "finetune-tiny")
    out = sh(project, "dvc", "repro")
    assert stages_run(out) == {"aggregate-tiny", "report-tiny"}, out
    assert float(_run_row(project, m_file.parent.name)["ref_mode_acc"]) == floor
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

    # dvc exp run -S on one spec value: fine-tuning reruns, pre-training does not
    out = sh(project, "dvc", "exp", "run", "-S", "ablations/tiny.yaml:defaults.finetune.epochs=2")
    ran = stages_run(out)
    assert "finetune-tiny" in ran and "pretrain-tiny" not in ran and not trained(out), out
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "epochs 2")

    # push to a local remote; a fresh clone pulls and trains nothing
    remote = tmp_path / "remote"
    sh(project, "dvc", "remote", "add", "-d", "local", str(remote))
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "remote")
    sh(project, "dvc", "push")
    clone = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "-q", str(project), str(clone))
    sh(clone, "dvc", "pull")
    out = sh(clone, "dvc", "repro")
    assert not trained(out), out


# A second study of its own shape (width 16: its own runs and random-init baseline), on the same data.
OTHER = SPEC.replace("name: tiny", "name: other").replace("hidden: 32", "hidden: 16").replace(
    "intermediate: 64", "intermediate: 32").format(levels="nsp, none")


def _stages(project: Path) -> set[str]:
    return set(yaml.safe_load((project / "dvc.yaml").read_text())["stages"])


@pytest.mark.slow
def test_selection_adds_and_removes_a_study(project: Path):
    assert (project / "params.yaml").read_text().rstrip().endswith("studies:\n- tiny")  # sync made it explicit
    sh(project, "dvc", "repro")
    (project / "ablations" / "other.yaml").write_text(OTHER)
    before = _stages(project)
    sh(project, "study", "sync")
    assert _stages(project) == before, "a spec that is not selected gets no stages"
    assert "Data and pipelines are up to date." in sh(project, "dvc", "status")

    sh(project, "study", "select", "other")
    other = _stages(project) - before
    assert other == {"pretrain-other", "finetune-other", "aggregate-other", "report-other"}, other
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "select other")
    out = sh(project, "dvc", "repro")
    assert stages_run(out) == other, out  # the first study's stages are untouched
    assert len(trained(out)) == 2, out
    assert (project / "reports" / "other" / "index.html").exists()
    assert "Data and pipelines are up to date." in sh(project, "dvc", "status")

    sh(project, "study", "deselect", "other")
    assert _stages(project) == before
    for kept in ("results/studies/other", "reports/other/index.html", *(f"results/runs/{h}" for h in trained(out))):
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


def test_shared_run_is_owned_once_and_finetuned_with_selected_recipes_only(tmp_path: Path):
    abl, out = _two_studies(tmp_path)
    doc = runs_document(abl, [("a", None)])
    stages = pipeline_document(doc)["stages"]
    ft = stages["finetune-a"]["cmd"]
    assert "b.yaml" not in ft and ft.count("study finetune ablations/a.yaml") == 2, ft  # runs, then baseline

    doc = runs_document(abl, [("a", None), ("b", None)])
    stages = pipeline_document(doc)["stages"]
    shared = doc["studies"]["b"]["runs"]
    assert set(shared) <= set(doc["studies"]["a"]["runs"]) and doc["studies"]["b"]["owns"] == []
    assert not {"pretrain-b", "finetune-b"} & set(stages)  # b trains and fine-tunes nothing itself ...
    ft = stages["finetune-a"]["cmd"]
    (h,) = shared
    assert f"study finetune ablations/b.yaml --run {h} --quiet" in ft, ft  # ... a's stage uses b's recipe
    assert {"study_runs.yaml": ["studies.a.finetune", "studies.b.finetune"]} in stages["finetune-a"]["params"]
    assert f"results/finetune/{h}" in stages["aggregate-b"]["deps"]
    outs = [next(iter(o)) if isinstance(o, dict) else o for st in stages.values() for o in st.get("outs", [])]
    assert len(outs) == len(set(outs)), "DVC forbids two stages declaring one output"

    # a deselected: b owns its run again and trains it itself
    doc = runs_document(abl, [("b", None)])
    assert doc["studies"]["b"]["owns"] and "pretrain-b" in pipeline_document(doc)["stages"]
    # a profile is its own study
    doc = runs_document(abl, [("b", None), ("b", "cpu")])
    assert set(doc["studies"]) == {"b", "b-cpu"}


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
    assert "aggregate-a-cpu" in (tmp_path / "dvc.yaml").read_text()
    assert "aggregate-a:" not in (tmp_path / "dvc.yaml").read_text()

    # mistakes exit 2 naming the field and what is allowed, and write nothing
    files = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    capsys.readouterr()
    assert study_main(["select", "c", *args]) == 2
    assert "spec:" in (err := capsys.readouterr().err) and "allowed: a, b" in err, err
    assert study_main(["select", "b", "--profile", "gpu", *args]) == 2
    assert "--profile:" in (err := capsys.readouterr().err) and "allowed: cpu" in err, err
    assert study_main(["deselect", "a", *args]) == 2
    assert "allowed: b, a@cpu" in capsys.readouterr().err
    params.write_text("studies: [b, 'nope@cpu']\n")
    assert study_main(["sync", *args]) == 2
    assert "studies[1]:" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p != params} == \
        {p: b for p, b in files.items() if p != params}


def test_committed_pipeline_has_only_the_selected_studies():
    """The repository's dvc.yaml: exactly the stages of params.yaml's studies (staleness: tests/test_spec.py)."""
    selected = read_selection(REPO / "params.yaml")
    assert selected, "params.yaml selects no study: `make smoke` would have nothing to run"
    names = {f"{s}-{p}" if p else s for s, p in selected}
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for stage in stages:
        kind, _, study = stage.partition("-")
        assert kind == "data" or study in names, stage
    assert {f"report-{n}" for n in names} <= set(stages)


def test_hash_keys_survive_dvcs_yaml_reader():
    """DVC reads study_runs.yaml with ruamel (YAML 1.2): a bare `12e345678901` would be the float inf."""
    doc = {"owners": {"12e345678901": "a", "13e345678901": "b", "0123": "c"}}
    assert YAML(typ="safe").load(render(doc)) == doc
