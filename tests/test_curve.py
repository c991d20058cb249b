"""`study curve`: one CSV row per eval with increasing tokens, the study's own run folder, a finished run
read back without retraining, and no fake curve from a run trained without intermediate evals."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from study.cli import main
from study.errors import EXIT_USAGE
from study.paths import Layout
from study.pretrain.curve import read_csv, seconds_at, train_seconds
from study.rundir import RunDir
from study.studies.spec import load_study

STEPS, EVERY = 24, 6


def corpus_text(n_docs: int = 50, seed: int = 0) -> str:
    """Sentences from a small made-up grammar: a WordPiece vocab of a few hundred, learnable in seconds."""
    rng = np.random.default_rng(seed)
    syl = [c + v for c in "bdfgklmnprst" for v in "aeiou"]
    words = sorted({"".join(rng.choice(syl, size=int(rng.integers(1, 4)))) for _ in range(400)})[:240]
    det, noun, verb = words[:8], words[8:160], words[160:]
    docs = []
    for _ in range(n_docs):
        sents = [
            " ".join(
                [rng.choice(det), rng.choice(noun), rng.choice(verb), rng.choice(det), rng.choice(noun)]
            ).capitalize()
            + "."
            for _ in range(int(rng.integers(6, 10)))
        ]
        docs.append("\n".join(sents))
    return "\n\n".join(docs) + "\n"


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("curve")
    (root / "corpus.txt").write_text(corpus_text(), encoding="utf-8")
    path = root / "tiny.yaml"
    path.write_text(
        f"""
name: tiny-curve
question: does a tiny model learn?
defaults:
  corpus: {{sources: ["text:{root / "corpus.txt"}"], valid_fraction: 0.15}}
  tokenizer: {{vocab_size: 300}}
  objective: {{format: segment_pair, max_seq_len: 32}}
  model: {{layers: 1, hidden: 32, heads: 2, intermediate: 64, max_positions: 64}}
  train: {{amount: {STEPS}, batch_size: 8, lr: 2.0e-3, eval_sequences: 32, short_len: 8, short_fraction: 0.25}}
  finetune: {{max_length: 32}}
  impl: {{threads: 1, log_every: 4, progress: false}}
factors:
  objective.sentence: [nsp, none]
seeds: [0]
""",
        encoding="utf-8",
    )
    return path


def run_cli(results: Path, *args: str) -> int:
    return main(["--results", str(results), "--reports", str(results / "reports"), *args])


def test_curve_rows_then_reuse(spec, tmp_path, capsys):
    results = tmp_path / "results"
    run = load_study(spec).runs[1]  # by label: the second design point
    assert run_cli(results, "curve", str(spec), "--run", run.label, "--every", str(EVERY), "--quiet") == 0
    rows = read_csv(results / "curves" / f"{run.run_hash}.csv")
    assert (results / "curves" / f"{run.run_hash}.png").stat().st_size > 0
    # one row per eval: every EVERY steps, and the final eval at the end (not repeated at step 24)
    assert [r["step"] for r in rows] == list(range(EVERY, STEPS + 1, EVERY))
    assert all(a["tokens"] < b["tokens"] for a, b in pairwise(rows))
    assert all(a["train_s"] < b["train_s"] for a, b in pairwise(rows))
    assert all(0 < r["ref_mode_acc"] < 1 and 0 <= r["ref_mlm_acc"] <= 1 for r in rows)
    # the encoder's spread, and the same questions on rows of the warmup's short length (drawn dash-dot)
    assert all(
        0 <= r["ref_spread"] <= 1 and 0 <= r["short_mask_acc"] <= 1 and 0 < r["short_mask_mode_acc"] < 1
        for r in rows
    )
    # the study's own run folder (impl.eval_every is outside the hash), finished and matching its metrics
    rd = RunDir(Layout(root=results), run.run_hash)
    assert rd.status().done
    m = rd.metrics()
    assert rows[-1]["ref_mlm_acc"] == m["ref_mlm_acc"] and rows[-1]["tokens"] == m["tokens_seen"]
    assert rows[-1]["train_s"] == pytest.approx(m["time_s"])
    out = capsys.readouterr().out
    assert "trained now" in out and f"{len(rows)} evals, every {EVERY} steps" in out

    # A finished run is read back, not retrained: history, metrics and weights stay byte for byte.
    before = {p: p.read_bytes() for p in rd.path.rglob("*") if p.is_file()}
    (results / "curves" / f"{run.run_hash}.csv").unlink()
    assert run_cli(results, "curve", str(spec), "--run", run.run_hash, "--every", "3", "--quiet") == 0
    assert {p: p.read_bytes() for p in rd.path.rglob("*") if p.is_file()} == before
    assert (
        read_csv(results / "curves" / f"{run.run_hash}.csv") == rows
    )  # the eval interval it was trained with
    assert "read from the finished run" in capsys.readouterr().out


def test_finished_without_evals_gives_no_curve(spec, tmp_path, capsys):
    results = tmp_path / "results"
    run = load_study(spec).runs[0]
    # `study pretrain` trains with the spec's impl (eval_every 0): only the final eval is logged
    assert run_cli(results, "pretrain", str(spec), "--run", run.run_hash, "--quiet") == 0
    assert run_cli(results, "curve", str(spec), "--run", run.run_hash, "--quiet") == EXIT_USAGE
    err = capsys.readouterr().err
    assert "without intermediate evals" in err and "--run" in err
    assert not (results / "curves").exists()


def test_unknown_run_names_the_choices(spec, tmp_path, capsys):
    assert run_cli(tmp_path, "curve", str(spec), "--run", "nope") == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--run" in err and "objective.sentence=nsp" in err
    assert run_cli(tmp_path, "curve", str(spec), "--every", "0") == EXIT_USAGE
    assert "--every" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_train_seconds_from_log_windows():
    # windows of 100 tokens at 50 tok/s and 200 tokens at 100 tok/s: 2 s then 2 s more
    hist = [
        {"step": 1, "tokens": 100, "loss": 5.0, "tokens_per_s": 50.0},
        {"step": 1, "tokens": 100, "eval": {"ref_mlm_acc": 0.1}},
        {"step": 2, "tokens": 300, "loss": 4.0, "tokens_per_s": 100.0},
    ]
    toks, secs = train_seconds(hist)
    assert (toks, secs) == ([0, 100, 300], [0.0, 2.0, 4.0])
    assert seconds_at(200, toks, secs) == pytest.approx(3.0)
    assert seconds_at(400, toks, secs) is None  # past the last log line: unknown, not extrapolated
