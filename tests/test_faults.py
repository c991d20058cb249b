"""Reliability under faults (issue 8): SIGKILL at many points of a real study, then restart.

Kills are placed deterministically with STUDY_KILL_AT (study/faults.py): "the n-th atomic write" or
"the n-th training step" of a process. A chain of processes is started on one results folder, each
killed at its own point, then one runs to the end; its results must equal an uninterrupted run's
(weights bitwise, metrics exactly, fine-tuning scores exactly) and no partial file may be read as
complete. The chain runs through `study run` and through `dvc repro`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline import _corpus, _glue

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

SPEC = """
name: faulty
question: NSP vs none, killed and restarted
defaults:
  corpus: {sources: ["text:corpus"], valid_fraction: 0.1, test_fraction: 0.1}
  tokenizer: {vocab_size: 200, min_frequency: 1}
  objective: {format: segment_pair, max_seq_len: 32}
  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64, max_positions: 32}
  train: {amount: 8, batch_size: 8, eval_sequences: 16}
  impl: {checkpoint_every: 3, eval_every: 4}
  finetune: {tasks: [SST-2], glue_dir: glue, seeds: [0, 1], epochs: 1, batch_size: 16, max_length: 32,
             probe: true, baseline: true}
factors:
  objective.sentence: [nsp, none]
seeds: [0]
report:
  kind: nsp
  primary_metric: SST-2/finetune/accuracy
  compare: {factor: objective.sentence, baseline: nsp, treatment: none}
"""

# Timing and machine facts legitimately differ between two runs of the same config.
VOLATILE = {
    "wall_s",
    "tokens_per_s",
    "mfu",
    "peak_flops",
    "started",
    "finished",
    "provenance",
    "elapsed_s",
    "time_s",
    "peak_tflops",
    "matmul_peak_flops",
}


def _env(**extra: str) -> dict:
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        **extra,
    }


def _project(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "ablations").mkdir()
    (root / "ablations" / "faulty.yaml").write_text(SPEC)
    (root / "params.yaml").write_text("studies:\n- faulty\n")  # a study project (study/root.py), selecting it
    _corpus(root / "corpus")
    _glue(root / "glue")
    return root


def _run(root: Path, cmd: list[str], kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = _env(**({"STUDY_KILL_AT": kill_at} if kill_at else {}))
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def fingerprint(results: Path) -> dict:
    """Everything a study produces that must not depend on having been killed."""
    out: dict[str, object] = {}
    for run in sorted((results / "runs").iterdir()):
        status = json.loads((run / "status.json").read_text())
        out[f"{run.name}/status"] = status["status"]
        out[f"{run.name}/metrics"] = _strip(json.loads((run / "metrics.json").read_text()))
        for w in sorted((run / "model").glob("*.safetensors")):
            out[f"{run.name}/{w.name}"] = hashlib.sha256(w.read_bytes()).hexdigest()
        losses = [
            json.loads(line).get("loss")
            for line in (run / "history.jsonl").read_text().splitlines()
            if line.strip()
        ]
        out[f"{run.name}/history_losses"] = losses
    for f in sorted((results / "finetune").rglob("*-seed*.json")):
        res = json.loads(f.read_text())
        out[str(f.relative_to(results))] = res.get("metrics", res.get("skipped"))
    import pandas as pd

    tidy = pd.read_csv(results / "studies" / "faulty" / "results.csv")
    tidy = tidy[~tidy["metric"].isin(VOLATILE)]
    out["tidy"] = sorted(tidy.to_csv(index=False).splitlines())
    return out


def _chain(root: Path, cmd: list[str], points: list[str]) -> list[str]:
    """Kill one process per point; return where each kill landed."""
    landed = []
    for point in points:
        proc = _run(root, cmd, point)
        if proc.returncode == -signal.SIGKILL:
            line = [ln for ln in proc.stderr.splitlines() if ln.startswith("fault: SIGKILL")]
            landed.append(line[-1] if line else point)
        else:  # the point was not reached: the process finished its work
            assert proc.returncode == 0, proc.stderr[-3000:]
    return landed


def _no_partial_files(results: Path) -> None:
    """Every run folder that says done holds everything a reader needs, and parses."""
    for run in (results / "runs").iterdir():
        if (run / "status.json").exists():
            json.loads((run / "status.json").read_text())
            json.loads((run / "metrics.json").read_text())
            assert (run / "model" / "config.json").exists()
    for f in results.rglob("*.json"):
        json.loads(f.read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    root = _project(tmp_path_factory.mktemp("ref") / "p")
    proc = _run(root, ["study", "run", "ablations/faulty.yaml", "--quiet"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return fingerprint(root / "results")


# Points spread through every stage of a study, each in its own restarted process: data preparation,
# training steps, checkpoint writes, the run folder's final files, fine-tuning results and its cache,
# the aggregate and the report. "io.replace@X:n" = the n-th atomic write whose path contains X.
STUDY_RUN_POINTS = [
    "io.replace@results/data:1",
    "io.replace@results/data:3",
    "train.step:2",
    "io.replace@checkpoints:1",
    "train.step:4",
    "io.replace@checkpoints:2",
    "io.replace@results/runs:3",
    "io.replace@model:1",
    "io.replace@status.json:1",
    "io.replace@results/.cache:1",
    "io.replace@results/finetune:1",
    "io.replace@results/finetune:3",
    "io.replace@results/studies:1",
    "io.replace@results/studies:4",
    "io.replace@reports:1",
]


def test_study_run_survives_kills(reference, tmp_path):
    root = _project(tmp_path / "p")
    landed = _chain(root, ["study", "run", "ablations/faulty.yaml", "--quiet"], STUDY_RUN_POINTS)
    _no_partial_files(root / "results")
    proc = _run(root, ["study", "run", "ablations/faulty.yaml", "--quiet"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert fingerprint(root / "results") == reference
    where = " ".join(landed)
    assert len(landed) >= 12, landed
    for stage in (
        "results/data",
        "train.step",
        "checkpoints",
        "results/finetune",
        "results/studies",
        "reports",
    ):
        assert stage in where, (stage, landed)


DVC_POINTS = [
    "io.replace@results/data:2",
    "train.step:4",
    "io.replace@checkpoints:1",
    "io.replace@results/runs:2",
    "io.replace@results/finetune:1",
    "io.replace@results/finetune:2",
    "io.replace@results/studies:2",
    "io.replace@reports:1",
]


def test_dvc_repro_survives_kills(reference, tmp_path):
    root = _project(tmp_path / "p")
    shutil.copytree(REPO / "study", root / "study", ignore=shutil.ignore_patterns("__pycache__"))
    (root / ".gitignore").write_text("/results/*\n!/results/metrics/\n!/results/plots/\n/reports/*\n")
    for cmd in (
        ["git", "init", "-q"],
        ["dvc", "init", "-q"],
        ["study", "sync"],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", "x"],
    ):
        proc = _run(root, cmd)
        assert proc.returncode == 0, proc.stderr
    # DVC runs each stage in a child process; the kill lands there, and dvc itself reports the failure
    landed = []
    for point in DVC_POINTS:
        proc = _run(root, ["dvc", "repro"], point)
        killed = [ln for ln in proc.stderr.splitlines() + proc.stdout.splitlines() if "fault: SIGKILL" in ln]
        landed += killed
        if not killed:
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = _run(root, ["dvc", "repro"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(landed) >= 6, landed
    assert fingerprint(root / "results") == reference


def test_two_concurrent_study_runs_train_each_run_once(reference, tmp_path):
    root = _project(tmp_path / "p")
    trace = tmp_path / "trace.txt"
    cmd = ["study", "run", "ablations/faulty.yaml", "--quiet"]
    env = _env(STUDY_TRACE=str(trace))
    procs = [
        subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
    starts = [line.split()[2] for line in trace.read_text().splitlines() if line.split()[1] == "train.start"]
    assert len(starts) == 2 and len(set(starts)) == 2, starts  # two runs, each trained exactly once
    assert fingerprint(root / "results") == reference


def test_a_diverged_run_is_reported_and_the_study_finishes(tmp_path, monkeypatch):
    root = _project(tmp_path / "p")
    from study.studies.spec import load_study

    monkeypatch.chdir(root)  # the spec's corpus path is relative: read (and fingerprinted) from the project
    victim = load_study(root / "ablations" / "faulty.yaml").runs[0].run_hash
    proc = subprocess.run(
        ["study", "run", "ablations/faulty.yaml", "--quiet"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(STUDY_INJECT_NAN_AT_STEP=f"{victim}:5"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads((root / "results" / "runs" / victim / "status.json").read_text())
    assert status["status"] == "diverged" and status["step"] == 5, status
    others = [p for p in (root / "results" / "runs").iterdir() if p.name != victim]
    assert others and all(json.loads((p / "status.json").read_text())["status"] == "done" for p in others)
    html = (root / "reports" / "faulty" / "index.html").read_text()
    assert victim in html and "diverged" in html
    # `study pretrain` without --keep-going says so with its own exit status
    proc = subprocess.run(
        ["study", "pretrain", "ablations/faulty.yaml", "--run", victim, "--quiet"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
