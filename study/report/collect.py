"""Read a study's run folders and fine-tune result files into tidy tables (the aggregate's input), and the
plateau rule (did a run learn past always predicting the most frequent token?).

Built ONLY from files on disk plus the plan dict, so a report can be regenerated without any training
code. Run folders are read with study/rundir.py's one error policy (a damaged status.json is "pending").
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from study.errors import StudyError
from study.io import read_json
from study.metrics import COST_METRICS, PRETRAIN, PRETRAIN_METRICS
from study.paths import Layout
from study.report import zeroshot as Z
from study.rundir import RunDir


def learned(metrics: dict) -> bool | None:
    """The plateau test of one run's metrics: on the asked positions that show [MASK] (ref_mask_acc and
    its floor) when the run has them, else (a run scored before they existed; `study rescore` adds them)
    on every asked position. Why [MASK] only: the reference shows 10% of the asked tokens unchanged, any
    trained model copies them, so a model that knows only unigrams scores about 0.1 + 0.9 x the floor
    over all positions and passed the old test (docs/RESULTS.md, "the copy plateau").
    Where the run has them, beating the floor on the positions shown as another token (ref_rnd_acc) also
    counts: there too only context can answer (a copier scores below the floor), and a run trained
    without [MASK] (masking.mask 0, BERT Table 8) has never seen the token the [MASK] test shows it."""
    if metrics.get("ref_mask_acc") is not None:
        at_mask = learned_beyond_mode(
            metrics.get("ref_mask_acc"), metrics.get("ref_mask_mode_acc"), metrics.get("ref_mask_count")
        )
        at_rnd = learned_beyond_mode(
            metrics.get("ref_rnd_acc"), metrics.get("ref_rnd_mode_acc"), metrics.get("ref_rnd_count")
        )
        return True if at_rnd else at_mask
    return learned_beyond_mode(
        metrics.get("ref_mlm_acc"), metrics.get("ref_mode_acc"), metrics.get("ref_masked")
    )


def learned_beyond_mode(acc: Any, floor: Any, n: Any) -> bool | None:
    """Did a run learn more than its reference set's most frequent token? True when its reference
    accuracy beats always predicting that token (`ref_mode_acc`) by more than 3 binomial standard
    errors over the n asked positions. False flags a collapsed run (deep post-LN models at too high an
    lr predict one token everywhere) or one still on the unigram plateau: comparing it with others
    measures the failure, not the factor. None when the run predates the floor or has no accuracy."""
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (acc, floor, n)) or n <= 0:
        return None
    return bool(acc - floor > 3 * math.sqrt(floor * (1 - floor) / n))


def plateau_hashes(runs: pd.DataFrame) -> set[str]:
    """Run hashes of the finished runs that did not learn past always predicting the most frequent token
    (`learned` False in runs.csv, read back as a bool or a string): the report's floor guard, for the
    answer (problems.plateau_runs) and beside the papers alike."""
    if runs.empty or not {"learned", "status", "run_hash"} <= set(runs.columns):
        return set()
    flat = (runs["status"].astype(str) == "done") & (runs["learned"].astype(str) == "False")
    return set(runs.loc[flat, "run_hash"].astype(str))


TIDY_COLS = [
    "run_hash",
    "source_key",
    "label",
    "status",
    "pretrain_seed",
    "finetune_seed",
    "task",
    "mode",
    "init",
    "metric",
    "value",
]
CURVE_COLS = ["run_hash", "label", "step", "tokens", "loss", "mlm_loss"]


def _run_row(r: dict, st: Any, meta: dict, metrics: dict) -> dict:
    """runs.csv's row of one run: status, cost, device and the reference accuracies with their floors."""
    return {
        "run_hash": r["run_hash"],
        "label": r["label"],
        "status": st.status,
        "error": st.error,
        "step": st.step,
        "params": meta.get("params", metrics.get("params")),
        "tokens_per_s": metrics.get("tokens_per_s"),
        "wall_s": meta.get("wall_s"),
        "device": meta.get("device"),
        "data_hash": meta.get("data_hash"),
        "finished": meta.get("finished"),
        "precision": meta.get("precision"),
        "tokens_seen": metrics.get("tokens_seen"),
        "steps": metrics.get("steps"),
        "mfu": metrics.get("mfu"),
        "baseline_key": r.get("baseline_key"),
        "seed": r["seed"],
        "ref_mlm_acc": metrics.get("ref_mlm_acc"),
        "ref_mode_acc": metrics.get("ref_mode_acc"),
        "ref_mask_acc": metrics.get("ref_mask_acc"),
        "ref_mask_mode_acc": metrics.get("ref_mask_mode_acc"),
        # the kept and the randomly replaced asked positions, which BERT Table 8's splits train
        # differently: per run here, and tidy rows (summary, comparisons) as PRETRAIN_METRICS
        "ref_keep_acc": metrics.get("ref_keep_acc"),
        "ref_rnd_acc": metrics.get("ref_rnd_acc"),
        "ref_rnd_mode_acc": metrics.get("ref_rnd_mode_acc"),
        "ref_spread": metrics.get("ref_spread"),
        "learned": learned(metrics),
    }


def _pretrain_rows(base: dict, metrics: dict) -> list[dict]:
    """Tidy rows of a finished run's pre-training and cost metrics (task = mode = "pretrain")."""
    return [
        {
            **base,
            "finetune_seed": None,
            "task": PRETRAIN,
            "mode": PRETRAIN,
            "init": "pretrained",
            "metric": m,
            "value": float(metrics[m]),
        }
        for m in (*PRETRAIN_METRICS, *COST_METRICS)
        if isinstance(metrics.get(m), (int, float)) and not isinstance(metrics.get(m), bool)
    ]


class _Finetune:
    """What the fine-tune result files of a plan's runs add up to: tidy rows, the seeds that diverged,
    each result's git record, and the dev rows each task was scored on."""

    def __init__(self, plan: dict, layout: Layout, tidy: list[dict]):
        self.plan, self.layout = plan, layout
        self.tidy = tidy  # the study's tidy rows, each run's fine-tune rows after its pre-training rows
        self.problems: list[dict] = []
        self.provenance: dict[str, Any] = {}
        self.eval_rows: dict[str, set] = {}  # task -> the dev rows its scores were computed on (the recipe)

    def read(self, r: dict, run_key: str, init: str, base: dict) -> None:
        """The result files of `run_key` (run r's own model, or its random-init baseline)."""
        files = self.layout.finetune_dir(run_key).glob(f"*/{self.plan['finetune_hash']}/*-seed*.json")
        for f in sorted(files):
            res = read_json(f)
            # seeds and tasks are not in the finetune_hash: files of ones the plan no longer asks for stay out
            if "skipped" in res or any(
                r.get(k) is not None and res.get(x) not in r[k]
                for k, x in (("finetune_seeds", "seed"), ("finetune_tasks", "task"))
            ):
                continue
            if "diverged" in res:  # no score: listed in the report, never averaged as one
                # a random-init baseline may be shared by several runs: named as what it is
                self.problems.append(
                    {
                        "run_hash": r["run_hash"],
                        "source_key": run_key,
                        "label": "random init" if init == "random" else r["label"],
                        "init": res.get("init", init),
                        "task": res["task"],
                        "mode": res["mode"],
                        "seed": res["seed"],
                        "error": res["diverged"],
                    }
                )
                continue
            if isinstance(res.get("provenance"), dict):  # the report lists fine-tuning's commits too
                key = f"{run_key}/{res['task']}/{res['mode']}/{res['seed']}"
                self.provenance[key] = res["provenance"].get("git")
            if isinstance(res.get("n_eval"), int):
                self.eval_rows.setdefault(res["task"], set()).add(res["n_eval"])
            self.tidy.extend(
                {
                    **base,
                    "source_key": run_key,
                    "finetune_seed": res["seed"],
                    "task": res["task"],
                    "mode": res["mode"],
                    "init": res.get("init", init),
                    "metric": m,
                    "value": float(v),
                }
                for m, v in res["metrics"].items()
                if isinstance(v, (int, float))
            )


def collect(plan: dict, layout: Layout) -> dict[str, pd.DataFrame]:
    """Read every run of the plan into tidy/runs/curves frames, and the fine-tune seeds that diverged."""
    for key in ("name", "runs", "finetune_hash"):
        if key not in plan:
            raise StudyError("missing from the study plan", field=key)
    factor_keys = sorted({k for r in plan["runs"] for k in r.get("factors", {})})
    tidy, runs, curves, zs = [], [], [], []
    ft = _Finetune(plan, layout, tidy)
    for r in plan["runs"]:
        rd = RunDir(layout, r["run_hash"])
        st = rd.status()
        metrics = rd.metrics()
        base = {
            "run_hash": r["run_hash"],
            "source_key": r["run_hash"],
            "label": r["label"],
            "status": st.status,
            "pretrain_seed": r["seed"],
            **{k: r.get("factors", {}).get(k) for k in factor_keys},
        }
        runs.append(_run_row(r, st, rd.meta(), metrics))
        if st.status == "done":
            tidy.extend(_pretrain_rows(base, metrics))
        curves.extend(
            {
                "run_hash": r["run_hash"],
                "label": r["label"],
                "step": ev["step"],
                "tokens": ev.get("tokens"),
                "loss": ev["loss"],
                "mlm_loss": ev.get("mlm_loss"),
            }
            for ev in rd.loss_curve()
        )
        ft.read(r, r["run_hash"], "pretrained", base)
        zs += Z.rows(layout, r["run_hash"], "pretrained", base, r.get("zeroshot"))  # BLiMP, cross-sentence
        if r.get("baseline_key"):
            ft.read(r, r["baseline_key"], "random", base)
            zs += Z.rows(layout, r["baseline_key"], "random", base, r.get("zeroshot"))
    tidy += Z.headline(zs)  # the rest (per phenomenon) in zeroshot.csv, out of the comparisons
    return {
        "tidy": pd.DataFrame(tidy, columns=[*TIDY_COLS, *factor_keys]),
        "runs": pd.DataFrame(runs),
        "curves": pd.DataFrame(curves, columns=CURVE_COLS),
        # a random-init baseline shared by several runs is one model: listed once
        "finetune_problems": list(
            {(p["source_key"], p["task"], p["mode"], p["seed"]): p for p in ft.problems}.values()
        ),
        "finetune_provenance": ft.provenance,  # result file -> its git record
        "factor_keys": factor_keys,
        "eval_rows": {t: sorted(v) for t, v in sorted(ft.eval_rows.items())},
        "zeroshot": zs,
    }
