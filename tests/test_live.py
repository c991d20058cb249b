"""Live curves (impl.live, study/pretrain/live.py): while a run trains, dvclive's files grow every
log_every steps and read back with dvclive's own reader; a resumed run continues them without repeating a
step, and says "resumed from step k"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from dvclive.utils import parse_tsv

from study.paths import Layout
from study.studies.spec import load_study

sys.path.insert(0, str(Path(__file__).parent))
from test_search import write_corpus, write_spec  # noqa: E402 - the search tests' tiny run


class Stop(Exception):
    pass


def test_live_curves_grow_while_training_and_a_resume_does_not_repeat_steps(tmp_path: Path, capsys):
    from study.pretrain.trainer import train_run

    spec = write_spec(
        tmp_path / "s.yaml", write_corpus(tmp_path / "corpus", n_docs=120), steps=20, eval_every=5
    )
    cfg = load_study(spec).runs[0].config
    cfg = cfg.model_copy(update={"impl": cfg.impl.model_copy(update={"live": True, "log_every": 5})})
    assert cfg.run_hash() == load_study(spec).runs[0].run_hash  # logging only: the same run
    layout = Layout(root=tmp_path / "results")
    live = layout.run_dir(cfg.run_hash()) / "live"
    loss, acc = (
        live / "plots" / "metrics" / "train" / "loss.tsv",
        live / "plots" / "metrics" / "eval" / "ref_mlm_acc.tsv",
    )
    seen = []

    def watch(step, tokens, res):  # called at each eval, while the run trains
        seen.append((step, [int(r["step"]) for r in parse_tsv(str(loss))], len(parse_tsv(str(acc)))))
        if step == 10 and len(seen) == 2:
            raise Stop  # the trainer checkpoints at step 10 and leaves the run resumable

    with pytest.raises(Stop):
        train_run(cfg, layout, quiet=True, on_eval=watch)
    assert seen == [(5, [5], 1), (10, [5, 10], 2)]  # a row every log_every steps, as it trains
    capsys.readouterr()
    train_run(cfg, layout, quiet=True, on_eval=watch)
    assert "resumed from step 10" in capsys.readouterr().err
    rows = parse_tsv(str(loss))
    assert [int(r["step"]) for r in rows] == [5, 10, 15, 20]  # continued, no step twice
    assert [int(r["step"]) for r in parse_tsv(str(acc))] == [5, 10, 15, 20]
    hist = [
        line
        for line in __import__("json").loads(
            "[" + ",".join((layout.run_dir(cfg.run_hash()) / "history.jsonl").read_text().splitlines()) + "]"
        )
        if "loss" in line
    ]
    assert [float(r["loss"]) for r in rows] == pytest.approx(
        [h["loss"] for h in hist]
    )  # the history's values
