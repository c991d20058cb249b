"""`study plan`'s cost: planned tokens, measured pre-training and fine-tuning time, what is left to do."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from study.cli import main
from study.downstream.finetune import result_path
from study.downstream.tasks import load_task
from study.paths import Layout
from study.studies.cost import (
    TOKENS_PER_WORD,
    batch_width,
    finetune_seconds,
    row_lengths,
    study_finetune_seconds,
)
from study.studies.spec import load_study

SPEC = """
name: tiny
question: what does it cost?
defaults:
  tokenizer: {vocab_size: 300}
  objective: {max_seq_len: 32}
  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64, max_positions: 64}
  train: {amount: 10, batch_size: 8}
  finetune: {tasks: [SST-2], glue_dir: GLUE, seeds: [0, 1], epochs: 2, batch_size: 16, max_length: 32,
             probe: true}
factors:
  objective.sentence: [nsp, none]
"""


def _glue(path, n_train: int = 100, n_dev: int = 30) -> None:
    rng = random.Random(0)
    (path / "SST-2").mkdir(parents=True)
    for split, n in (("train", n_train), ("dev", n_dev)):
        rows = ["sentence\tlabel"] + [
            " ".join("w" * rng.randint(1, 4) for _ in range(rng.randint(2, 12))) + f"\t{rng.randint(0, 1)}"
            for _ in range(n)
        ]
        (path / "SST-2" / f"{split}.tsv").write_text("\n".join(rows) + "\n")


@pytest.fixture
def spec(tmp_path):
    _glue(tmp_path / "glue")
    p = tmp_path / "tiny.yaml"
    p.write_text(SPEC.replace("GLUE", str(tmp_path / "glue")))
    return p


def test_plan_json_has_tokens_and_both_times(spec, tmp_path, capsys):
    assert main(["--results", str(tmp_path / "r"), "plan", str(spec), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and {r["status"] for r in rows} == {"pending"}
    for r in rows:
        assert r["est_tokens"] == 10 * 8 * 32
        assert r["est_seconds"] > 0 and r["est_finetune_seconds"] > 0
    assert main(["--results", str(tmp_path / "r"), "plan", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "still to do on this machine: pre-training ~" in out and "fine-tuning and probes ~" in out
    assert main(["--results", str(tmp_path / "r"), "plan", str(spec), "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "min wall (" in out and "2 at a time" in out and "contention not modelled" in out
    assert "\nin all: ~0 h 0" in out and "min wall (the two above" in out
    assert main(["--results", str(tmp_path / "r"), "plan", str(spec), "--jobs", "0"]) == 2


def test_makespan_schedules_longest_first():
    from study.studies.cost import makespan

    assert makespan([5, 1, 1, 1], 2) == 5 and makespan([1, 1, 1, 1], 2) == 2
    assert makespan([3, 1, 2], 1) == 6 and makespan([], 3) == 0 and makespan([2, 2], 8) == 2


def test_finetune_estimate_counts_only_what_is_not_written(spec, tmp_path):
    study, lay = load_study(spec), Layout(root=tmp_path / "r")
    per_run, bases = study_finetune_seconds(study.runs, lay)
    assert len(bases) == 1  # the runs differ only in objective: they share one random-init baseline
    base = sum(bases.values())
    assert all(v > 0 for v in per_run.values()) and base > 0
    assert base == pytest.approx(per_run[study.runs[0].run_hash], rel=0.5)
    done = study.runs[0]
    fh = done.config.finetune_hash()
    for mode in ("finetune", "probe"):
        for seed in (0, 1):
            p = result_path(lay, done.run_hash, "SST-2", fh, mode, seed)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("{}")
    per_run2, _ = study_finetune_seconds(study.runs, lay)
    assert per_run2[done.run_hash] == 0 and per_run2[study.runs[1].run_hash] > 0
    # one seed left: the step part halves (the probe is already done)
    result_path(lay, done.run_hash, "SST-2", fh, "finetune", 1).unlink()
    one = finetune_seconds(done.config, lay, {"SST-2": (1, False)})
    two = finetune_seconds(done.config, lay, {"SST-2": (2, False)})
    assert study_finetune_seconds(study.runs, lay)[0][done.run_hash] == pytest.approx(one)
    assert two == pytest.approx(2 * one)


def test_unknown_task_sizes_are_said_not_guessed(spec, tmp_path, capsys):
    study, lay = load_study(spec), Layout(root=tmp_path / "r")
    missing = study.runs[0].config.model_copy(deep=True)
    missing.finetune.glue_dir = str(tmp_path / "nowhere")
    assert finetune_seconds(missing, lay, {"SST-2": (2, True)}) is None
    spec.write_text(spec.read_text().replace(str(tmp_path / "glue"), str(tmp_path / "nowhere")))
    assert main(["--results", str(tmp_path / "r"), "plan", str(spec)]) == 0
    assert "fine-tuning and probes unknown (task data not on disk)" in capsys.readouterr().out


def test_row_lengths_and_padded_batch_width(spec, tmp_path):
    cfg = load_study(spec).runs[0].config
    data = load_task("SST-2", cfg.finetune.glue_dir, "train")
    lengths = row_lengths(cfg, Layout(root=tmp_path / "r"), data)  # no tokenizer yet: word counts
    words = np.array([len(t.split()) for t in data.text_a])
    assert list(lengths) == [min(math.ceil(w * TOKENS_PER_WORD) + 2, 32) for w in words]
    assert batch_width(np.full(50, 7), 16) == 7
    w = batch_width(lengths, 16)  # each batch pads to its longest row
    assert lengths.mean() < w <= lengths.max()
    assert batch_width(lengths, 1) == round(lengths.mean())


def test_row_lengths_use_the_runs_tokenizer_once_it_exists(spec, tmp_path):
    from study.data.tokenizer import train_tokenizer

    cfg = load_study(spec).runs[0].config
    lay = Layout(root=tmp_path / "r")
    data = load_task("SST-2", cfg.finetune.glue_dir, "train")
    tok = train_tokenizer(
        [[t] for t in data.text_a], cfg.tokenizer, lay.data_dir(cfg.data_hash()) / "tokenizer"
    )
    want = [len(x) for x in tok(data.text_a, truncation=True, max_length=32)["input_ids"]]
    assert list(row_lengths(cfg, lay, data)) == want


def test_plan_times_on_the_device_the_run_will_use(spec, tmp_path, capsys, monkeypatch):
    """The step is timed where training will run (study.runtime.resolve_device): a run that asks for CUDA on
    a machine without it is the same error naming impl.device, exit 2 and nothing written; on CPU the plan
    says on stderr which model it is timing and where (the gpu profiles take minutes on a CPU)."""
    import torch

    from study.studies import cost

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cost, "_STEP_TIMES", {})  # timings are cached per process: time this shape again
    results = tmp_path / "r"
    assert main(["--results", str(results), "plan", str(spec), "--json"]) == 0
    assert "plan: timing 6 steps of L1/H32 at batch 8 x 32 on cpu" in capsys.readouterr().err
    cuda = tmp_path / "cuda.yaml"
    cuda.write_text(spec.read_text().replace("defaults:\n", "defaults:\n  impl: {device: cuda}\n"))
    assert main(["--results", str(results), "plan", str(cuda)]) == 2
    err = capsys.readouterr().err
    assert "impl.device" in err and "auto, cpu" in err
    assert not results.exists() or not any(results.rglob("*"))


def test_plan_times_the_training_codes_own_step_functions(spec, tmp_path, monkeypatch):
    """`study plan` calls pre-training's and fine-tuning's real step functions (no copies that could drift):
    every timed step goes through study.pretrain.step.pretrain_step / study.downstream.classifier.finetune_step,
    with the run's own optimizer settings and micro-batch split."""
    from study.downstream import classifier
    from study.pretrain import step
    from study.studies import cost

    calls = {"pretrain": [], "finetune": []}
    real_pre, real_ft = step.pretrain_step, classifier.finetune_step

    def pre(module, model, opt, parts, lr, **kw):
        calls["pretrain"].append((len(parts), lr, kw["clip"], opt.defaults["weight_decay"]))
        return real_pre(module, model, opt, parts, lr, **kw)

    def ft(model, opt, *args):
        calls["finetune"].append(opt.defaults["lr"])
        return real_ft(model, opt, *args)

    monkeypatch.setattr(step, "pretrain_step", pre)
    monkeypatch.setattr(classifier, "finetune_step", ft)
    monkeypatch.setattr(cost, "_STEP_TIMES", {})
    cfg = load_study(spec).runs[0].config.model_copy(deep=True)
    cfg.train.grad_accum = 2
    assert cost.estimate_seconds(cfg) > 0
    t = cfg.train
    assert calls["pretrain"] == [(2, t.lr, t.clip, t.weight_decay)] * 6  # 2 micro-batches: grad_accum
    assert finetune_seconds(cfg, Layout(root=tmp_path / "r"), {"SST-2": (1, False)}) > 0
    assert calls["finetune"] and set(calls["finetune"]) == {cfg.finetune.lr}


def test_batched_seeds_are_timed_as_one_stacked_step(spec, tmp_path, monkeypatch):
    """With impl.finetune_batched_seeds the plan times batched.py's own stacked step of all missing seeds
    (SeedBatch.step on K batches) and pays it once per step, not once per seed."""
    from study.downstream import batched
    from study.studies import cost

    widths = []
    real_step = batched.SeedBatch.step

    def step(self, i, batch, y, regression, w=None):
        widths.append(tuple(batch["input_ids"].shape[:2]))
        return real_step(self, i, batch, y, regression, w)

    monkeypatch.setattr(batched.SeedBatch, "step", step)
    monkeypatch.setattr(cost, "_STEP_TIMES", {})
    cfg = load_study(spec).runs[0].config.model_copy(deep=True)
    cfg.impl.finetune_batched_seeds = True
    lay = Layout(root=tmp_path / "r")
    monkeypatch.setattr(cost, "_classifier_step", lambda c, lengths, n=9, k=1: {1: 0.01, 3: 0.015}[k])
    three = finetune_seconds(cfg, lay, {"SST-2": (3, False)})
    one = finetune_seconds(cfg, lay, {"SST-2": (1, False)})
    assert one < three < 3 * one  # 3 seeds stacked: 1.5x one seed's step, not 3x
    monkeypatch.undo()
    monkeypatch.setattr(batched.SeedBatch, "step", step)
    monkeypatch.setattr(cost, "_STEP_TIMES", {})
    assert cost._classifier_step(cfg, np.full(200, 12), k=3) > 0
    assert widths and set(widths) == {(3, cfg.finetune.batch_size)}  # [K, batch, width] batches


def test_hub_fine_tuning_is_bounded_by_the_published_row_counts(spec, tmp_path, capsys, monkeypatch):
    """GLUE from the hub, nothing downloaded: fine-tuning is sized at GLUE's published row counts with
    every row at max_length, and the plan says that this is an upper bound."""
    import study.studies.cost as cost
    from study.downstream.tasks import HUB_ROWS

    study, lay = load_study(spec), Layout(root=tmp_path / "r")
    hub = study.runs[0].config.model_copy(deep=True)
    hub.finetune.glue_dir = "hub"
    seen = []
    monkeypatch.setattr(
        cost, "_classifier_step", lambda cfg, lengths, k=1: seen.append(np.asarray(lengths)) or 0.01
    )
    secs = finetune_seconds(hub, lay, {"SST-2": (2, False)})
    ft = hub.finetune
    n = min(HUB_ROWS["SST-2"][0], ft.max_train_examples)
    assert len(seen[0]) == n and set(seen[0].tolist()) == {ft.max_length}
    assert secs == pytest.approx(
        2
        * (
            math.ceil(ft.epochs * math.ceil(n / ft.batch_size)) * 0.01
            + HUB_ROWS["SST-2"][1] * ft.max_length * 0.01 / (ft.batch_size * ft.max_length) / 3
        )
    )
    assert cost.finetune_is_bound(hub) and not cost.finetune_is_bound(study.runs[0].config)
    spec.write_text(spec.read_text().replace(str(tmp_path / "glue"), "hub"))
    assert main(["--results", str(tmp_path / "r"), "plan", str(spec)]) == 0
    assert "fine-tuning and probes at most " in capsys.readouterr().out
    assert main(["--results", str(tmp_path / "r"), "plan", str(spec), "--json"]) == 0
    assert all(r["finetune_upper_bound"] for r in json.loads(capsys.readouterr().out))


@pytest.mark.parametrize("task", ["CoLA", "SST-2", "MRPC", "STS-B", "QNLI", "RTE", "MNLI", "WNLI"])
def test_published_glue_row_counts_match_the_local_copy(task):
    """HUB_ROWS against ../shared/data/glue where that task is there (skipped elsewhere: CI, and MNLI/QNLI,
    which that copy lacks)."""
    from conftest import SHARED

    from study.downstream.tasks import HUB_ROWS, task_path

    glue = SHARED / "glue"
    if not task_path(task, glue, "train").is_file():
        pytest.skip(f"no local {task}")
    rows = [len(load_task(task, glue, split).labels) for split in ("train", "dev")]
    assert tuple(rows) == HUB_ROWS[task]
