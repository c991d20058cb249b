"""What every report figure shares: the headless matplotlib setup, the `Drawn` / `FigureFile` records, and
the drawing helpers (a mean with its CI against a factor, scores ticked in points, a new figure).

Deterministic SVG ids and no timestamps, so re-rendering the same aggregate gives the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or in DVC stages
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter

from study.metrics import BOUNDED

matplotlib.rcParams["svg.hashsalt"] = "study-report"
# The reference accuracies (study/pretrain/evaluate.py): over every asked position, and by what the position
# showed: [MASK], another token, its own token (kept positions, which copying alone answers).
REF_ACCURACY = {
    "ref_mlm_acc": "overall",
    "ref_mask_acc": "at [MASK]",
    "ref_rnd_acc": "shown another token",
    "ref_keep_acc": "shown unchanged",
}


@dataclass
class Drawn:
    name: str
    title: str
    caption: str
    fig: plt.Figure | None = None
    skipped: str | None = None
    rect: tuple = (0, 0, 1, 1)  # tight_layout's box: room left below for legends kept out of the layout


@dataclass
class FigureFile:
    name: str
    title: str
    caption: str
    png: Path | None
    svg: Path | None
    skipped: str | None


def numeric(series: pd.Series) -> pd.Series | None:
    out = pd.to_numeric(series, errors="coerce")
    return out if out.notna().all() else None


def yerr(g: pd.DataFrame) -> np.ndarray:
    lo = (g["mean"] - g["ci_low"]).to_numpy(dtype=float)
    hi = (g["ci_high"] - g["mean"]).to_numpy(dtype=float)
    return np.nan_to_num(np.vstack([lo, hi]), nan=0.0).clip(min=0)


def x_key(plan: dict, keys: list[str], hint: str) -> str | None:
    x = plan.get("x")
    if x in keys:
        return x
    for k in keys:
        if hint in k:
            return k
    return keys[0] if keys else None


def panel_vs_x(ax, g: pd.DataFrame, x: str, label: str | None = None, **kw) -> bool:
    """Mean +/- CI against a numeric factor; categorical factors fall back to level order."""
    if g.empty:
        return False
    xs = numeric(g[x])
    g = g.assign(_x=xs if xs is not None else g[x].astype(str)).sort_values("_x")
    ax.errorbar(
        g["_x"] if xs is not None else range(len(g)),
        g["mean"],
        yerr=yerr(g),
        marker="o",
        capsize=3,
        label=label,
        **kw,
    )
    if xs is None:
        ax.set_xticks(range(len(g)), g["_x"])
    for xv, (_, r) in zip(g["_x"] if xs is not None else range(len(g)), g.iterrows(), strict=True):
        if int(r["n"]) < 2:
            ax.annotate("n=1", (xv, r["mean"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    return True


def in_points(ax, metrics) -> None:
    """Tick a y-axis of bounded scores (stored as fractions) in points, as the report's tables write them."""
    if len(metrics) and all(m in BOUNDED for m in metrics):
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.4g}"))
        ax.set_ylabel(f"{ax.get_ylabel() or 'score'} (%)")


def new_figure(ncols: int, width: float = 4.2, height: float = 3.3):
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.8)
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def downstream_metrics(summary: pd.DataFrame, modes=("finetune",)) -> list[tuple[str, str, str]]:
    if summary.empty:
        return []
    d = summary[(summary["task"] != "pretrain") & summary["mode"].isin(modes)]
    return sorted({(r.task, r.mode, r.metric) for r in d.itertuples()})
