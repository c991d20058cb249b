"""The report's zero-shot section (templates/_zeroshot.html): BLiMP per level with its CI beside the BLiMP paper's
models and human agreement, a per-phenomenon table and figure, the cross-sentence gain and win rate per level,
and a methods line (pairs, metric). Read from the study folder only: `zeroshot_summary.csv` and `zeroshot.json`,
written by study/report/zeroshot.py at aggregation."""

from __future__ import annotations

import base64
import io as _io
import math
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from study.io import read_json
from study.metrics import BLIMP, CROSS_SENTENCE
from study.report.levelnames import run_labels, with_levels


def _pct(v: Any) -> str:
    return f"{100 * v:.1f}" if isinstance(v, (int, float)) and math.isfinite(v) else "–"


def _ci(r: pd.Series, scale: float = 100, digits: int = 1) -> str:
    lo, hi = r.get("ci_low"), r.get("ci_high")
    if not (isinstance(lo, float) and math.isfinite(lo) and math.isfinite(hi)):
        return "–"
    return f"[{scale * lo:.{digits}f}, {scale * hi:.{digits}f}]"


def _levels(s: pd.DataFrame, plan: dict, keys: list[str]) -> pd.DataFrame:
    """Summary rows with a `level` column; random-init rows shared by every level (one baseline) kept once."""
    s = with_levels(s, keys, run_labels(plan, keys))
    rnd = s["init"] == "random"
    s.loc[rnd, "level"] = "random init · " + s.loc[rnd, "level"].astype(str)
    same = s[rnd].groupby(["task", "metric"])[["mean", "n"]].nunique().max(axis=1) <= 1
    for task, metric in same[same].index:
        at = rnd & (s["task"] == task) & (s["metric"] == metric)
        s.loc[at, "level"] = "random init"
    return s.drop_duplicates(["task", "metric", "level"])


def _figure(s: pd.DataFrame, paper: pd.DataFrame) -> str | None:
    acc = s[(s["task"] == BLIMP) & s["metric"].str.startswith("accuracy:")]
    if acc.empty:
        return None
    terms = sorted({m.split(":", 1)[1] for m in acc["metric"]})
    fig = Figure(figsize=(7.5, 0.32 * len(terms) + 1.6))
    ax = fig.add_subplot()
    y = {t: i for i, t in enumerate(terms)}
    levels = list(dict.fromkeys(acc["level"]))
    for k, level in enumerate(levels):
        g = acc[acc["level"] == level]
        off = (k - (len(levels) - 1) / 2) * 0.12
        ax.errorbar(
            100 * g["mean"],
            [y[m.split(":", 1)[1]] + off for m in g["metric"]],
            xerr=[100 * (g["mean"] - g["ci_low"]).fillna(0), 100 * (g["ci_high"] - g["mean"]).fillna(0)],
            fmt="x" if level.startswith("random") else "o",
            ms=4,
            lw=0.8,
            label=level,
            color="0.5" if level.startswith("random") else None,
        )
    for source, mark in (("5-gram", "<"), ("GPT-2", ">"), ("human", "|")):
        p = paper[(paper["source"] == source) & paper["term"].isin(terms)]
        ax.scatter(
            100 * p["value"], [y[t] for t in p["term"]], marker=mark, s=22, c="k", label=f"{source} (paper)"
        )
    ax.axvline(50, color="0.7", lw=0.8, ls="--")
    ax.set_xlim(0, 100)
    ax.invert_yaxis()  # phenomena top-down in name order, as in the table
    ax.set_yticks(range(len(terms)), terms, fontsize=8)
    ax.set_xlabel("BLiMP accuracy (%) per phenomenon; 50 = chance")
    ax.legend(fontsize=7, loc="lower right", framealpha=0.8)
    fig.tight_layout()
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _methods(info: dict) -> str:
    b, c = info.get(BLIMP, {}), info.get(CROSS_SENTENCE, {})
    parts = []
    if b.get("pairs"):
        n = "/".join(f"{x:,}" for x in b["pairs"])
        parts.append(
            f"BLiMP: {n} minimal pairs (a fixed sample of each of the 67 paradigms), each sentence scored by its "
            f"MLM pseudo-log-likelihood ({'/'.join(b['pll'])}; Salazar et al. 2020), a pair correct when the good "
            "sentence scores strictly higher (a tie fails); accuracy is the mean over pairs, 50% is chance."
        )
    if c.get("pairs"):
        n = "/".join(f"{x:,}" for x in c["pairs"])
        parts.append(
            f"Cross-sentence: {n} consecutive sentence pairs (A, B) of the run's held-out test documents; "
            "gain = the PLL of B's tokens after A minus after a sentence of another document, per token of B "
            "(nats), in the run's own row layout; win rate = pairs where the true A scores strictly higher."
        )
    return " ".join(parts)


def section(study_dir: Path, plan: dict, keys: list[str]) -> dict | None:
    """What templates/_zeroshot.html shows; None when the study has no zero-shot results."""
    path = Path(study_dir) / "zeroshot_summary.csv"
    try:
        s = pd.read_csv(path)
        info = read_json(Path(study_dir) / "zeroshot.json")
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return None
    if s.empty:
        return None
    s = _levels(s, plan, keys)
    paper = pd.DataFrame(info.get("papers") or [], columns=["source", "term", "value"])

    def table(task: str, metric: str, scale: float, digits: int) -> list[dict]:
        g = s[(s["task"] == task) & (s["metric"] == metric)]
        return [
            {
                "level": r["level"],
                "mean": f"{scale * r['mean']:.{digits}f}",
                "ci": _ci(r, scale, digits),
                "n": int(r["n"]),
            }
            for _, r in g.iterrows()
        ]

    overall = paper[paper["term"] == "overall"]
    terms = sorted({m.split(":", 1)[1] for m in s["metric"] if m.startswith("accuracy:")})
    cols = list(dict.fromkeys(s.loc[s["task"] == BLIMP, "level"])) + list(dict.fromkeys(paper["source"]))
    cells = {
        (r["level"], r["metric"].split(":", 1)[1]): r["mean"] for _, r in s.iterrows() if ":" in r["metric"]
    }
    cells.update({(r["source"], r["term"]): r["value"] for _, r in paper.iterrows()})
    return {
        "methods": _methods(info.get("methods") or {}),
        "blimp": table(BLIMP, "accuracy", 100, 1),
        "papers": [{"source": r["source"], "value": _pct(r["value"])} for _, r in overall.iterrows()],
        "cross": [
            {**g, "win": w.get("mean", "–"), "win_ci": w.get("ci", "–")}
            for g in table(CROSS_SENTENCE, "gain", 1, 4)
            for w in [
                next((x for x in table(CROSS_SENTENCE, "win_rate", 100, 1) if x["level"] == g["level"]), {})
            ]
        ],
        "phen_cols": cols,
        "phen_rows": [{"term": t, "cells": [_pct(cells.get((c, t))) for c in cols]} for t in terms],
        "figure": _figure(s, paper),
    }
