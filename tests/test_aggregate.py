"""Aggregation statistics: bootstrap CI against scipy, paired comparison wording, tidy table from run folders."""
import json

import numpy as np
import pytest
from scipy import stats

from study.aggregate import NOISE_WORDS, aggregate_study, bootstrap_ci, interpret
from study.paths import Layout


def test_bootstrap_matches_scipy():
    x = np.array([1.0, 2.0, 4.0, 3.0, 2.5, 3.5])
    lo, hi = bootstrap_ci(x, n_resamples=10_000, seed=0)
    ref = stats.bootstrap((x,), np.mean, method="percentile", n_resamples=10_000,
                          random_state=np.random.default_rng(0)).confidence_interval
    assert lo == pytest.approx(ref.low, abs=0.1) and hi == pytest.approx(ref.high, abs=0.1)


def test_wording():
    assert NOISE_WORDS in interpret(-0.1, 0.3, 3, 0.4)
    assert NOISE_WORDS in interpret(0.1, 0.3, 3, 0.09)  # CI excludes 0 but the test disagrees
    assert interpret(0.1, 0.3, 5, 0.01, "nsp", "none").startswith("none higher than nsp")


def _fake_run(layout, h, sentence, seed, ppl, acc):
    d = layout.run_dir(h)
    d.mkdir(parents=True)
    (d / "status.json").write_text(json.dumps({"status": "done", "error": None, "step": 10}))
    (d / "metrics.json").write_text(json.dumps({"ref_mlm_loss": float(np.log(ppl)), "ref_ppl": ppl,
                                                "ref_mlm_acc": 0.3, "sentence_acc": None, "tokens_seen": 100,
                                                "steps": 10, "tokens_per_s": 1.0, "mfu": 0.1, "params": 5,
                                                "wall_s": 1.0}))
    (d / "history.jsonl").write_text(json.dumps({"step": 1, "tokens": 10, "loss": 5.0}) + "\n")
    for fs in (0, 1):
        f = layout.finetune_dir(h) / "SST-2" / "ft" / f"finetune-seed{fs}.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"run_key": h, "task": "SST-2", "mode": "finetune", "init": "pretrained",
                                 "seed": fs, "metrics": {"accuracy": acc + 0.01 * fs},
                                 "primary_metric": "accuracy", "primary": acc + 0.01 * fs}))
    return {"run_hash": h, "label": f"objective.sentence={sentence}", "seed": seed,
            "factors": {"objective.sentence": sentence}}


def test_aggregate_from_run_folders(tmp_path):
    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    runs = [_fake_run(layout, f"{s}{seed}", s, seed, 100 + 10 * (s == "none") + seed, 0.7 + 0.01 * seed)
            for s in ("nsp", "none") for seed in (0, 1, 2)]
    plan = {"name": "t", "question": "q", "kind": "nsp", "primary_metric": "SST-2/finetune/accuracy",
            "x": "objective.sentence", "hue": None, "compare": {"factor": "objective.sentence", "a": "nsp",
                                                                "b": "none"},
            "finetune_hash": "ft", "runs": runs, "references": []}
    out = aggregate_study(plan, layout)
    import pandas as pd
    tidy = pd.read_csv(out / "results.csv")
    assert set(tidy["run_hash"]) == {r["run_hash"] for r in runs}
    comp = pd.read_csv(out / "comparisons.csv")
    ppl = comp[comp["metric"] == "ref_ppl"].iloc[0]
    assert ppl["diff"] == pytest.approx(10.0)
