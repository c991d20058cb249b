"""Write a study's tables (see docs/ARCHITECTURE.md): `aggregate_study` reads the runs (collect.py), summarizes
them per level (units.py), tests the comparisons (comparisons.py) and writes to layout.study_dir(plan["name"]):
results.parquet/.csv (tidy), runs.csv, summary.csv, comparisons.csv, baseline.csv, curves.csv, study.json,
and the DVC metrics file results/metrics/study-<name>.json.

Built ONLY from files on disk plus the plan dict, so a report can be regenerated without any training code.
"""

from __future__ import annotations

import io as _io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from study.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from study.metrics import parse_metric
from study.paths import Layout
from study.report import sees as SP
from study.report import stats as S
from study.report import zeroshot as Z
from study.report.collect import collect, plateau_hashes
from study.report.comparisons import baseline_gain, compare
from study.report.units import summarize
from study.rundir import RunDir


def primary_key(plan: dict) -> tuple[str, str, str]:
    """(task, mode, metric) of the study's primary metric: the comparison that stays uncorrected."""
    return tuple(parse_metric(plan.get("primary_metric"), field="report.primary_metric"))  # type: ignore[return-value]


def _run_configs(plan: dict, layout: Layout) -> dict[str, dict]:
    """The semantic config of each run (corpus, model, budget): the report's scale statement needs it."""
    out = {}
    for r in plan["runs"]:
        if c := RunDir(layout, r["run_hash"]).config():
            out[r["run_hash"]] = {
                k: c.get(k) for k in ("seed", "corpus", "tokenizer", "objective", "masking", "model", "train")
            }
    return out


def _num(x: Any) -> float | int | None:
    """JSON-safe number: NaN/inf become null (DVC's metrics reader rejects NaN)."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, (int, np.integer)):
        return int(x)
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def study_metrics(
    plan: dict, runs: pd.DataFrame, summary: pd.DataFrame, answer: dict | None, factor_keys: list[str]
) -> dict:
    """The headline of a study for `dvc metrics show` (results/metrics/study-<name>.json, outside the
    study folder because DVC forbids a metrics file inside another output): run counts, the paired
    answer on the primary metric, and the primary metric per factor level."""
    status = runs["status"].value_counts().to_dict() if len(runs) else {}
    task, mode, metric = primary_key(plan)
    primary: dict[str, dict] = {}
    if len(summary):
        sel = summary[
            (summary["task"] == task)
            & (summary["mode"] == mode)
            & (summary["metric"] == metric)
            & (summary["init"] == "pretrained")
        ]
        for r in sel.to_dict("records"):
            level = ",".join(f"{k}={r[k]}" for k in factor_keys) or "base"
            primary[level] = {k: _num(r[k]) for k in ("mean", "ci_low", "ci_high", "n")}
    ans = None
    if answer:
        ans = {
            k: _num(answer.get(k))
            for k in ("diff", "ci_low", "ci_high", "n", "p_value", "mean_a", "mean_b", "sd_diff", "mde")
        }
        ans.update(
            {
                "a": str(answer.get("a")),
                "b": str(answer.get("b")),
                "interpretation": answer.get("interpretation"),
            }
        )
    collapsed = len(plateau_hashes(runs))  # the report's rule: finished runs only
    return {
        "study": plan["name"],
        "primary_metric": plan.get("primary_metric"),
        "runs": {
            "total": int(len(runs)),
            **{str(k): int(v) for k, v in status.items()},
            "not_beyond_mode": collapsed,
        },
        "answer": ans,
        "primary": primary,
    }


STATS_METHOD = (
    f"t-interval on n-1 df over pre-training seeds (BCa bootstrap, {S.N_RESAMPLES:,} resamples, "
    f"seed {S.BOOTSTRAP_SEED}, from n={S.BOOTSTRAP_MIN_N}); Welch t for pre-trained vs random init; "
    f"no interval below n={S.MIN_N}"
)
STATS_TEST = "two-sided paired t-test; Holm across the secondary comparisons, the primary one uncorrected"


def statistics_note(comps: pd.DataFrame) -> dict:
    """The numbers the report's methods paragraph states: alpha, thresholds, the Holm family's size,
    and the primary comparison's n, SD of paired differences and minimum detectable effect."""
    note = {
        "alpha": S.ALPHA,
        "min_n": S.MIN_N,
        "bootstrap_min_n": S.BOOTSTRAP_MIN_N,
        "power": S.POWER,
        "family": 0,
        "primary": None,
    }
    if len(comps):
        note["family"] = int(comps["correction"].astype(str).str.startswith("Holm").sum())
        p = comps[comps["primary"]]
        if len(p):
            r = p.iloc[0]
            note["primary"] = {
                "task": r["task"],
                "mode": r["mode"],
                "metric": r["metric"],
                "n": int(r["n"]),
                "sd_diff": _num(r["sd_diff"]),
                "mde": _num(r["mde"]),
                "model": r.get("model"),  # pooled level + seed model or paired t: the SD and MDE are its
            }
    return note


def measured_sd(study_dir: Path) -> dict | None:
    """The primary comparison's measured SD of paired differences and its n, from an aggregate's
    study.json (for `study plan --detect`); None when there is no aggregate or no finite SD yet."""
    p = Path(study_dir) / "study.json"
    if not p.exists():
        return None
    prim = ((read_json(p).get("statistics") or {}).get("primary")) or {}
    sd = prim.get("sd_diff")
    return prim if isinstance(sd, (int, float)) and math.isfinite(sd) and sd > 0 else None


def _csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False)


def aggregate_study(plan: dict, layout: Layout) -> Path:
    c = collect(plan, layout)
    out = layout.study_dir(plan["name"])
    tidy = c["tidy"]
    buf = _io.BytesIO()
    tidy.to_parquet(buf, index=False)
    atomic_write_bytes(out / "results.parquet", buf.getvalue())
    atomic_write_text(out / "results.csv", _csv(tidy))
    atomic_write_text(out / "runs.csv", _csv(c["runs"]))
    atomic_write_text(out / "curves.csv", _csv(c["curves"]))
    done = tidy[tidy["status"] == "done"]
    atomic_write_text(out / "summary.csv", _csv(summarize(done, c["factor_keys"])))
    key = primary_key(plan)
    comps = (
        compare(
            done,
            plan["compare"],
            key,
            others=[] if plan["compare"].get("factor") == "label" else c["factor_keys"],
        )
        if plan.get("compare")
        else pd.DataFrame()
    )
    # Without a `compare`, a one-design-point study's headline is its baseline row: exempt it then only.
    base = baseline_gain(done, c["factor_keys"], None if plan.get("compare") else key)
    # Which metrics see pre-training (sees.py), per metric the tables list; a column of comparisons.csv too
    sees = SP.sees_pretraining(base, c["runs"], done[["task", "mode", "metric"]].itertuples(index=False))
    if len(comps):
        comps = comps.merge(sees[["task", "mode", "metric", "sees_pretraining"]], how="left")
    atomic_write_text(out / "comparisons.csv", _csv(comps))
    atomic_write_text(out / "baseline.csv", _csv(base))
    zs = pd.DataFrame(c["zeroshot"], columns=[*c["tidy"].columns, "pll"])
    Z.write(out, c["zeroshot"], summarize(zs[zs["status"] == "done"], c["factor_keys"]), layout, plan)
    provenance: dict[str, Any] = {}
    for r in plan["runs"]:
        if m := RunDir(layout, r["run_hash"]).meta():
            provenance[r["run_hash"]] = {
                "data_hash": m.get("data_hash"),
                "device": m.get("device"),
                "provenance": m.get("provenance"),
            }
    answer = None
    if len(comps) and comps["primary"].any():
        # numpy scalars -> Python ones: study.json is written with default=str, which would quote them.
        answer = {
            k: (v.item() if isinstance(v, np.generic) else v)
            for k, v in comps[comps["primary"]].iloc[0].to_dict().items()
        }
    atomic_write_json(
        layout.metrics_file(f"study-{plan['name']}"),
        study_metrics(plan, c["runs"], summarize(done, c["factor_keys"]), answer, c["factor_keys"]),
    )
    atomic_write_json(
        out / "study.json",
        {
            "plan": plan,
            "provenance": provenance,
            "answer": answer,
            "factor_keys": c["factor_keys"],
            "configs": _run_configs(plan, layout),
            "finetune_problems": c["finetune_problems"],
            "eval_rows": c["eval_rows"],
            "finetune_provenance": c["finetune_provenance"],
            "ci_method": STATS_METHOD,
            "test": STATS_TEST,
            "statistics": statistics_note(comps),
            "sees_pretraining": SP.records(sees),
            "primary_sees_pretraining": SP.primary_check(key, sees),
        },
    )
    return out
