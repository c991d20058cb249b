"""Fake aggregate inputs for the report tests: run folders written the way training would write them.

These are FIXTURES, not results: every number is drawn from a seeded numpy Generator with an
effect planted on purpose, so the tests can check that the report shows what the tables say.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from study.config import RunConfig
from study.paths import Layout
from study.report.aggregate import aggregate_study
from study.studies.specfile import recipe_values

EVIL = '<script>alert("x")</script> & "quoted" \'label\''


def _w(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _run(
    layout: Layout,
    h: str,
    label: str,
    seed: int,
    factors: dict,
    *,
    ppl: float,
    acc: float,
    layers: int = 2,
    status: str = "done",
    error: str | None = None,
    baseline: str | None = "random-base",
    rng: np.random.Generator,
    tasks=("SST-2", "MRPC"),
    ft_hash: str = "ft",
    collapsed: bool = False,
) -> dict:
    d = layout.run_dir(h)
    params = 100_000 * layers + 50_000
    _w(
        d / "config.json",
        {
            "seed": seed,
            "corpus": {"sources": [{"kind": "embedded", "path": None, "name": None}]},
            "tokenizer": {"vocab_size": 4096},
            "objective": {"max_seq_len": 64, "format": "segment_pair"},
            "masking": {"rate": 0.15},
            "model": {"layers": layers, "hidden": 64, "heads": 2},
            "train": {"budget": "steps", "amount": 150, "batch_size": 32},
            "run_hash": h,
        },
    )
    _w(
        d / "meta.json",
        {
            "run_hash": h,
            "data_hash": "data123",
            "device": "cpu",
            "params": params,
            "wall_s": 12.5,
            "provenance": {
                "git": {"commit": "abc123def", "dirty": False},
                "packages": {"torch": "2.13.0", "pandas": "3.1.1"},
                "hardware": {"platform": "Linux", "cpu_count": 2, "device": "cpu"},
            },
        },
    )
    hist = [
        {"step": s, "tokens": s * 2048, "loss": float(8.0 - 0.02 * s + rng.normal(0, 0.05)), "lr": 1e-3}
        for s in range(10, 160, 10)
    ]
    (d / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in hist))
    if status == "done":
        ref_acc = (
            0.051 if collapsed else 0.2 + rng.normal(0, 0.01)
        )  # collapsed: the most-frequent-token floor
        _w(
            d / "metrics.json",
            {
                "ref_mlm_loss": float(np.log(ppl)),
                "ref_ppl": ppl,
                "ref_mlm_acc": ref_acc,
                "ref_mode_acc": 0.05,
                "ref_masked": 9000,
                "sentence_acc": None,
                "tokens_seen": 150 * 32 * 64,
                "steps": 150,
                "tokens_per_s": 9000.0 / layers + rng.normal(0, 50),
                "mfu": 0.01,
                "params": params,
                "wall_s": 12.5,
            },
        )
        for task in tasks:
            for mode in ("finetune", "probe"):
                for fs in (0, 1):
                    v = float(np.clip(acc + rng.normal(0, 0.005) - (0.05 if mode == "probe" else 0), 0, 1))
                    _w(
                        layout.finetune_dir(h) / task / ft_hash / f"{mode}-seed{fs}.json",
                        {
                            "run_key": h,
                            "task": task,
                            "mode": mode,
                            "init": "pretrained",
                            "seed": fs,
                            "metrics": {"accuracy": v, **({"f1": v - 0.02} if task == "MRPC" else {})},
                            "primary_metric": "accuracy",
                            "primary": v,
                        },
                    )
    _w(d / "status.json", {"status": status, "error": error, "step": 150 if status == "done" else 40})
    if baseline:
        for task in tasks:
            for fs in (0, 1, 2):
                v = float(0.5 + rng.normal(0, 0.01))
                _w(
                    layout.finetune_dir(baseline) / task / ft_hash / f"finetune-seed{fs}.json",
                    {
                        "run_key": baseline,
                        "task": task,
                        "mode": "finetune",
                        "init": "random",
                        "seed": fs,
                        "metrics": {"accuracy": v},
                        "primary_metric": "accuracy",
                        "primary": v,
                    },
                )
    return {
        "run_hash": h,
        "label": label,
        "seed": seed,
        "factors": factors,
        "status": status,
        **({"baseline_key": baseline} if baseline else {}),
    }


def build(
    root: Path,
    kind: str = "nsp",
    *,
    seeds=(0, 1, 2),
    name: str | None = None,
    evil: bool = False,
    failures: bool = True,
) -> tuple[Layout, dict, Path]:
    """Fake run folders for one study of `kind`, aggregated; returns (layout, plan, study_dir)."""
    layout = Layout(root=root / "results", reports=root / "reports")
    rng = np.random.default_rng(0)
    runs = []
    if kind == "nsp":
        key = "objective.sentence"
        for s in ("nsp", "none"):
            for seed in seeds:
                lab = f"{key}={s}" + (f" {EVIL}" if evil and s == "none" else "")
                runs.append(
                    _run(
                        layout,
                        f"{s}{seed}",
                        lab,
                        seed,
                        {key: s},
                        ppl=100 + 10 * (s == "none") + seed,
                        acc=0.70 + 0.03 * (s == "none") + 0.002 * seed,
                        rng=rng,
                    )
                )
        plan_extra = {
            "x": key,
            "compare": {"factor": key, "a": "nsp", "b": "none"},
            "primary_metric": "SST-2/finetune/accuracy",
            "references": ["bert_table5"],
        }
    elif kind == "nsp_labels":  # as ablations/nsp.yaml: explicit runs, compared by label
        design = {
            "segment_pair+nsp": ("segment_pair", "nsp", 0.0),
            "segment_pair": ("segment_pair", "none", 0.02),
            "sentence_pair+nsp": ("sentence_pair", "nsp", -0.03),
            "doc_sentences": ("doc_sentences", "none", 0.03),
            "segment_pair+sop": ("segment_pair", "sop", 0.01),
        }
        for lab, (fmt, sent, eff) in design.items():
            for seed in seeds:
                runs.append(
                    _run(
                        layout,
                        f"{lab.replace('+', 'p')}{seed}",
                        lab,
                        seed,
                        {"objective.format": fmt, "objective.sentence": sent},
                        ppl=100 - 100 * eff + seed,
                        acc=0.70 + eff + 0.002 * seed,
                        rng=rng,
                    )
                )
        plan_extra = {
            "x": "label",
            "compare": {"factor": "label", "a": "segment_pair+nsp", "b": "segment_pair"},
            "primary_metric": "SST-2/finetune/accuracy",
            "references": ["bert_table5", "roberta_table2", "albert_table5"],
        }
    elif kind == "mask_rate":
        key = "masking.rate"
        for r in (0.15, 0.4, 0.8):
            for seed in seeds:
                runs.append(
                    _run(
                        layout,
                        f"m{int(r * 100)}s{seed}",
                        f"{key}={r}",
                        seed,
                        {key: r},
                        ppl=80 + 100 * (r - 0.4) ** 2 + seed,
                        acc=0.72 - 0.1 * (r - 0.4) ** 2,
                        rng=rng,
                    )
                )
        plan_extra = {"x": key, "compare": None, "primary_metric": "ref_ppl", "references": []}
    elif kind == "depth":
        key = "model.layers"
        for L in (1, 2, 4):
            for seed in seeds:
                runs.append(
                    _run(
                        layout,
                        f"L{L}s{seed}",
                        f"{key}={L}",
                        seed,
                        {key: L},
                        ppl=120 - 10 * L + seed,
                        acc=0.68 + 0.01 * L,
                        layers=L,
                        rng=rng,
                        baseline=f"random-L{L}",
                        collapsed=(L, seed) == (4, 2),
                    )
                )  # as the depth cpu study at a too-high lr
        plan_extra = {
            "x": key,
            "compare": None,
            "primary_metric": "SST-2/finetune/accuracy",
            "references": [],
            # what load_study's plan carries (the other fixtures stand for aggregates from before it)
            "recipe": recipe_values([RunConfig(model={"layers": L}) for L in (1, 2, 4)]),
        }
    elif kind == "replacement":
        keys = ("masking.mask", "masking.keep", "masking.random")
        for lab, (m, k, r) in {
            "80/10/10": (0.8, 0.1, 0.1),
            "100/0/0": (1.0, 0.0, 0.0),
            "0/0/100": (0.0, 0.0, 1.0),
        }.items():
            for seed in seeds:
                runs.append(
                    _run(
                        layout,
                        f"r{int(m * 100)}{int(r * 100)}s{seed}",
                        lab,
                        seed,
                        dict(zip(keys, (m, k, r), strict=True)),
                        ppl=90 + 20 * r + seed,
                        acc=0.71 - 0.02 * r,
                        rng=rng,
                    )
                )
        plan_extra = {
            "x": None,
            "compare": None,
            "primary_metric": "SST-2/finetune/accuracy",
            "references": [],
        }
    else:
        raise ValueError(kind)
    if failures:
        runs.append(
            _run(
                layout,
                "bad0",
                "a run that failed" + (f" {EVIL}" if evil else ""),
                0,
                dict(runs[0]["factors"]),
                ppl=1,
                acc=0,
                status="failed",
                rng=rng,
                baseline=None,
                error=f"RuntimeError: out of memory {EVIL if evil else ''}",
            )
        )
        runs.append(
            _run(
                layout,
                "div0",
                "a run that diverged",
                1,
                dict(runs[0]["factors"]),
                ppl=1,
                acc=0,
                status="diverged",
                rng=rng,
                baseline=None,
                error="Diverged: non-finite loss nan at step 40",
            )
        )
    plan = {
        "name": name or f"fixture-{kind}",
        "question": f"Fixture question for {kind}?" + (f" {EVIL}" if evil else ""),
        "kind": kind,
        "hue": None,
        "spec": f"ablations/{kind}.yaml",
        "profile": None,
        "finetune_hash": "ft",
        "runs": runs,
        **plan_extra,
    }
    return layout, plan, aggregate_study(plan, layout)
