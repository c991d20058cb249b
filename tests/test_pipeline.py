"""The DVC pipeline end to end on a tiny spec, in a temporary git repository (issue 5's "must show").

- a full `dvc repro` trains every run, fine-tunes, aggregates and writes the report;
- a second `dvc repro` trains nothing;
- `study rescore` + `dvc commit -f pretrain finetune` + `dvc repro` re-aggregates and trains nothing;
- one more factor level + `study sync` + `dvc repro` trains only the new runs;
- `dvc exp run -S <spec value>` reruns what that value feeds (fine-tuning), not pre-training;
- `dvc push` to a local remote, a fresh clone, `dvc pull`, `dvc repro`: nothing trains.
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

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

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


def _env() -> dict:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return env


def sh(cwd: Path, *cmd: str) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def trained(output: str) -> set[str]:
    return set(re.findall(r"Running stage 'pretrain@([0-9a-f]+)'", output))


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


def test_repro_is_incremental_and_shareable(project: Path, tmp_path: Path):
    out = sh(project, "dvc", "repro")
    assert len(trained(out)) == 2, out
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
    sh(project, "dvc", "commit", "-f", "pretrain", "finetune")
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

    # dvc exp run -S on one spec value: fine-tuning reruns, pre-training does not
    out = sh(project, "dvc", "exp", "run", "-S", "ablations/tiny.yaml:defaults.finetune.epochs=2")
    ran = stages_run(out)
    assert any(s.startswith("finetune@") for s in ran) and not trained(out), out
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
