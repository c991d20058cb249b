"""`study search-best` says when the best trial did not learn: the report's plateau guard (one rule,
study/report/aggregate.py `learned` + `plateau_hashes`), in a warning, the spec's header and best.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from study.paths import Layout
from study.rundir import RunDir

sys.path.insert(0, str(Path(__file__).parent))
from test_search import tiny_search, write_corpus, write_spec  # noqa: E402 - the search tests' tiny spec


def _trainer(mask_acc: float):
    """A finished run in no time; the value its mask rate; its [MASK] accuracy `mask_acc` against a 4.1%
    most-frequent-token floor over 2,000 positions (3 SE: 1.3 pp)."""

    def train(cfg, layout, quiet, on_eval):
        run = RunDir(layout, cfg.run_hash())
        run.write_metrics(
            {
                "ref_mlm_loss": cfg.masking.rate,
                "tokens_seen": 64,
                "ref_mask_acc": mask_acc,
                "ref_mask_mode_acc": 0.041,
                "ref_mask_count": 2000,
            }
        )
        run.write_status("done")

    return train


@pytest.mark.parametrize("mask_acc", [0.037, 0.30])
def test_search_best_warns_when_the_best_trial_did_not_learn(tmp_path: Path, capsys, mask_acc):
    from study.search import run_search, write_best

    search = tiny_search(
        n_trials=2,
        sampler={"kind": "grid", "seed": 0},
        pruner={"kind": "none"},
        params={"masking.rate": [0.15, 0.3]},
    )
    spec = write_spec(tmp_path / "s.yaml", write_corpus(tmp_path / "corpus"), search, name="tiny")
    layout = Layout(root=tmp_path / "results")
    ostudy = run_search(spec, layout=layout, quiet=True, train_fn=_trainer(mask_acc))
    progress = capsys.readouterr().err  # a line per trial's run, as `study pretrain` prints per run
    assert progress.count("search tiny trial #") == 2 and "seed 0 (1/1): run " in progress
    assert f"ref acc at [MASK] {100 * mask_acc:.1f}% (floor 4.1%)" in progress
    out = write_best(spec, tmp_path / "best.yaml", layout=layout)
    err, text = capsys.readouterr().err, out.read_text()
    info = json.loads((layout.search_dir("tiny") / "best.json").read_text())
    hashes = ostudy.best_trial.user_attrs["run_hashes"]
    if mask_acc < 0.041:
        assert f"best trial (#{ostudy.best_trial.number}) did not learn" in err
        assert text.startswith("# WARNING: the best trial") and info["not_learned"] == sorted(hashes)
    else:
        assert "did not learn" not in err + text and info["not_learned"] == []


def test_plan_estimates_the_search(tmp_path: Path, capsys, monkeypatch):
    import study.studies.cost
    from study.cli import main

    search = tiny_search(
        n_trials=5, seeds=[0, 1], pruner={"kind": "none"}, params={"masking.rate": [0.15, 0.3]}
    )
    spec = write_spec(tmp_path / "s.yaml", write_corpus(tmp_path / "corpus"), search, name="tiny")
    monkeypatch.setattr(study.studies.cost, "estimate_seconds", lambda cfg: 60.0)
    capsys.readouterr()
    assert main(["--results", str(tmp_path / "r"), "plan", str(spec), "--no-time"]) == 0
    assert "search: 5 trials x 2 runs (" in capsys.readouterr().out
    assert main(["--results", str(tmp_path / "r"), "plan", str(spec)]) == 0
    assert "~2.0 min each): ~10 min on one worker" in capsys.readouterr().out
