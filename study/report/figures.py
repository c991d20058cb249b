"""Seaborn/matplotlib figures for a study report, drawn from aggregate tables only.

Every figure function takes DataFrames (the aggregate CSVs) and returns a `Drawn` with a matplotlib
figure, or a reason why there is nothing to draw: a figure without data is skipped with a note,
never a crash. `make_figures` picks the figures by the study's `kind`, always adds the training
curves, and writes each one as PNG and SVG.

Error bars are the aggregate's intervals over pre-training seeds (study.report.stats: 95% t-intervals;
a paired difference's bar is drawn at the level its decision uses, Holm's for secondary rows); the
report never re-computes statistics, and a level with fewer than 3 seeds is drawn without a bar.
No torch import anywhere here: the report must render on a machine without the training stack.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from study.metrics import BOUNDED, COST_METRICS
from study.report.comparisons import compare_sides
from study.report.levelfigures import depth, generic, mask_rate, replacement
from study.report.plotting import (
    Drawn,
    FigureFile,
    new_figure,
)
from study.report.searchreport import search_importance


def _short_switch_steps(curves: pd.DataFrame, recipe: dict) -> list[float]:
    """Optimizer steps where the sequence-length warmup (train.short_len rows) ends, from the plan's
    recipe: short_fraction of a steps budget, or the first logged step past that share of a tokens
    budget; none for a time budget (its step is not in the plan) or without a warmup."""
    fracs = [f for f in recipe.get("train.short_fraction") or [] if f]
    budget, amounts = recipe.get("train.budget") or [], recipe.get("train.amount") or []
    if not fracs or len(budget) != 1 or budget[0] not in ("steps", "tokens"):
        return []
    if budget[0] == "steps":
        return sorted({f * a for f in fracs for a in amounts})
    tok = (
        curves.dropna(subset=["tokens"]).groupby("step")["tokens"].mean()
        if "tokens" in curves
        else pd.Series()
    )
    return sorted({float(tok.index[tok >= f * a][0]) for f in fracs for a in amounts if (tok >= f * a).any()})


def training_curves(
    curves: pd.DataFrame, runs: pd.DataFrame | None = None, plan: dict | None = None
) -> Drawn:
    recipe = (plan or {}).get("recipe") or {}
    sentence = [x for x in recipe.get("objective.sentence") or [] if x not in (None, "none")]
    d = Drawn(
        "training_curves",
        "Training loss",
        "Training loss per logged step: mean over seeds, the band spans "
        "the lowest to the highest seed, one line per design point.",
    )
    if curves is None or curves.empty or curves["loss"].dropna().empty:
        d.skipped = "no training curves yet (no run has logged a loss)"
        return d
    c = curves.dropna(subset=["loss"]).copy()
    c = c[np.isfinite(c["loss"].astype(float))]
    if c.empty:
        d.skipped = "every logged loss is non-finite"
        return d
    # The MLM loss alone is what compares across levels: the total adds NSP/SOP's loss (≈ ln 2 at chance)
    # to the levels that have a sentence task, which reads as "trains worse". Older aggregates lack it.
    has_mlm = "mlm_loss" in c and c["mlm_loss"].notna().any()
    panels = (
        [("mlm_loss", "training MLM loss")]
        if has_mlm
        else [
            (
                "loss",
                "training loss (MLM + sentence task)" if sentence or not recipe else "training loss (MLM)",
            )
        ]
    )
    if has_mlm and sentence:
        panels.append(("loss", "total training loss (MLM + sentence task)"))
    # x is the optimizer step: seeds log at the same steps, while their token counts differ slightly
    # (variable-length instances), and averaging over unaligned x values would draw a sawtooth.
    fig, axes = new_figure(len(panels), width=7.0 if len(panels) == 1 else 5.0, height=3.6)
    switch = _short_switch_steps(c, recipe)
    for ax, (col, ylabel) in zip(axes, panels, strict=True):
        # Min-max band, not a bootstrap: curves have hundreds of steps and the band is only a visual aid.
        sns.lineplot(data=c.dropna(subset=[col]), x="step", y=col, hue="label", errorbar=("pi", 100), ax=ax)
        for x in switch:
            ax.axvline(x, ls=":", c="black", lw=1)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7, title=None)
    if has_mlm and sentence:
        d.caption += (
            " Left: the MLM loss alone, which compares across levels. Right: the total, which adds the "
            "sentence task's loss (about ln 2 = 0.69 at chance) to the levels that have one, so it sits "
            "higher there without the MLM training worse."
        )
    elif has_mlm:
        d.caption += " The loss is the MLM loss (no level has a sentence task)."
    elif sentence:
        d.caption += (
            " The loss is the total (this aggregate predates the separate MLM loss): levels with a "
            "sentence task add its loss (about ln 2 = 0.69 at chance), so their lines sit higher."
        )
    if switch:
        d.caption += (
            f" The dotted vertical line marks the end of the sequence-length warmup: before it the rows "
            f"are {' / '.join(str(x) for x in recipe.get('train.short_len') or ['?'])} tokens "
            f"(train.short_len), after it full length, so the loss changes there by row length."
        )
    d.fig = fig
    return d


def paired_differences(comparisons: pd.DataFrame, plan: dict) -> Drawn:
    cmp = plan.get("compare") or {}
    a, b = compare_sides(cmp)
    a, b = ("a" if a is None else a), ("b" if b is None else b)
    d = Drawn(
        "paired_differences",
        f"{b} minus {a}, per task",
        f"Paired difference {b} − {a} (same pre-training "
        "seed), mean with its interval at the level that decides it (95% for the primary comparison, "
        "Holm's level for the others); the dashed line is no effect. Downstream scores in percentage "
        "points (pp); perplexity in its own units. A row with fewer than 3 seeds has no interval: a bare "
        "point, labelled so; ★ marks the primary comparison.",
    )
    if comparisons is None or comparisons.empty:
        d.skipped = "no paired comparison in the aggregate (the study has no `compare`, or no seed finished both levels)"
        return d
    c = comparisons[~comparisons["metric"].isin(COST_METRICS)].copy()
    down = c[c["task"] != "pretrain"].copy()
    pre = c[(c["task"] == "pretrain") & (c["metric"] == "ref_ppl")]
    if down.empty and pre.empty:
        d.skipped = "the comparison has neither downstream scores nor perplexity"
        return d
    fig, axes = new_figure(
        2 if (len(down) and len(pre)) else 1, width=4.6, height=0.5 + 0.45 * max(len(down), 3)
    )
    i = 0
    if len(down):
        ax = axes[i]
        i += 1
        scale = np.where(down["metric"].isin(BOUNDED), 100.0, 1.0)
        star = (
            down["primary"].astype(str).eq("True")
            if "primary" in down
            else pd.Series(False, index=down.index)
        )
        down["what"] = down["task"] + " " + down["mode"] + " " + down["metric"] + np.where(star, " ★", "")
        y = np.arange(len(down))
        ax.errorbar(
            down["diff"] * scale,
            y,
            xerr=np.nan_to_num(
                np.vstack(
                    [(down["diff"] - down["ci_low"]) * scale, (down["ci_high"] - down["diff"]) * scale]
                ),
                nan=0.0,
            ).clip(min=0),
            fmt="o",
            capsize=3,
        )
        ax.set_yticks(y, down["what"])
        _no_interval_notes(ax, down["diff"] * scale, y, down)
        ax.axvline(0, ls="--", c="grey")
        ax.set_xlabel(f"{b}\n− {a} (pp)")
    if len(pre):
        ax = axes[i]
        ax.errorbar(pre["diff"], [0] * len(pre), xerr=_xerr(pre), fmt="o", capsize=3, color="C1")
        ax.set_yticks([0], ["fixed-reference perplexity"])
        _no_interval_notes(ax, pre["diff"], [0] * len(pre), pre)
        ax.axvline(0, ls="--", c="grey")
        ax.set_xlabel(f"{b}\n− {a} (perplexity)")
    d.fig = fig
    return d


def _no_interval_notes(ax, xs, ys, g: pd.DataFrame) -> None:
    """Label the bare points (no interval: n<3, or none drawn) and pad the axes so no point sits on an edge."""
    for x, y, r in zip(xs, ys, g.itertuples(), strict=True):
        if not (math.isfinite(r.ci_low) and math.isfinite(r.ci_high)):
            why = f"n={int(r.n)}: no interval" if "n" in g and int(r.n) < 3 else "no interval"
            ax.annotate(why, (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.6)
    ax.margins(x=0.2)


def _xerr(g: pd.DataFrame) -> np.ndarray:
    return np.nan_to_num(np.vstack([g["diff"] - g["ci_low"], g["ci_high"] - g["diff"]]), nan=0.0).clip(min=0)


def search_trials(trials: pd.DataFrame | None, direction: str = "minimize") -> Drawn:
    """Optuna trials: value per trial and the best so far; x is training tokens when the table has them.

    `trials` columns: number, state, value, params_* (any), and optionally tokens.
    """
    d = Drawn(
        "search_trials",
        "Search trials",
        "Objective value of every completed trial (dots) and the best "
        "value so far (line); pruned and failed trials are counted in the caption, not drawn.",
    )
    if trials is None or trials.empty or "value" not in trials:
        d.skipped = "no search trials"
        return d
    t = trials.copy()
    if "tokens" not in t and "user_attrs_tokens" in t:  # optuna's trials_dataframe() spelling
        t = t.rename(columns={"user_attrs_tokens": "tokens"})
    state = t["state"].astype(str).str.upper() if "state" in t else pd.Series("COMPLETE", index=t.index)
    done = t[state.str.contains("COMPLETE") & t["value"].notna()]
    if done.empty:
        d.skipped = f"{len(t)} trials, none completed with a value"
        return d
    done = done.sort_values("number")
    best = done["value"].cummin() if direction == "minimize" else done["value"].cummax()
    x = "tokens" if "tokens" in done and done["tokens"].notna().all() else "number"
    fig, (ax,) = new_figure(1, width=6.0)
    ax.scatter(done[x], done["value"], s=14, label="trial")
    ax.step(done[x], best, where="post", color="C1", label=f"best so far ({direction})")
    ax.set_xlabel("training tokens" if x == "tokens" else "trial number")
    ax.set_ylabel("objective value")
    ax.legend(fontsize=7)
    d.caption += f" {len(done)} of {len(t)} trials completed."
    d.fig = fig
    return d


# --------------------------------------------------------------------------- orchestration
def _safe(name: str, fn) -> Drawn:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - odd data degrades one figure to a note, never the report
        plt.close("all")
        return Drawn(name, name.replace("_", " "), "", skipped=f"could not draw: {type(exc).__name__}: {exc}")


def choose(
    plan: dict,
    keys: list[str],
    summary: pd.DataFrame,
    comparisons: pd.DataFrame,
    curves: pd.DataFrame,
    runs: pd.DataFrame | None = None,
) -> list[Drawn]:
    """The kind's figures, a paired-difference plot whenever the plan compares two levels, the
    primary metric when nothing else drew, and always the training curves."""
    kind = plan.get("kind", "generic")
    by_kind = {
        "nsp": ("paired_differences", lambda: paired_differences(comparisons, plan)),
        "mask_rate": ("mask_rate", lambda: mask_rate(summary, plan, keys)),
        "replacement": ("replacement", lambda: replacement(summary, plan, keys, runs)),
        "depth": ("depth", lambda: depth(summary, plan, keys)),
    }
    drawn = [_safe(*by_kind[kind])] if kind in by_kind else []
    if kind != "nsp" and plan.get("compare"):
        drawn.append(_safe("paired_differences", lambda: paired_differences(comparisons, plan)))
    if kind == "generic" or not any(d.fig for d in drawn):
        drawn.append(_safe("primary_metric", lambda: generic(summary, plan, keys)))
    drawn.append(_safe("training_curves", lambda: training_curves(curves, runs, plan)))
    return drawn


def save(drawn: list[Drawn], out_dir: Path) -> list[FigureFile]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for d in drawn:
        png = svg = None
        if d.fig is not None:
            try:
                d.fig.tight_layout(rect=d.rect)
                png, svg = out_dir / f"{d.name}.png", out_dir / f"{d.name}.svg"
                d.fig.savefig(png, dpi=110, metadata={"Software": None})
                d.fig.savefig(svg, metadata={"Date": None, "Creator": None})
            except Exception as exc:  # noqa: BLE001 - one bad figure must not cost the whole report
                png = svg = None
                d.skipped = f"drawing failed: {type(exc).__name__}: {exc}"
            finally:
                plt.close(d.fig)
        files.append(FigureFile(d.name, d.title, d.caption, png, svg, d.skipped))
    return files


def make_figures(
    plan: dict,
    keys: list[str],
    summary: pd.DataFrame,
    comparisons: pd.DataFrame,
    curves: pd.DataFrame,
    out_dir: Path,
    runs: pd.DataFrame | None = None,
    trials: pd.DataFrame | None = None,
    direction: str = "minimize",
) -> list[FigureFile]:
    """Draw the kind's figures (+ training curves, + search trials when given) into out_dir."""
    drawn = choose(plan, keys, summary, comparisons, curves, runs)
    if trials is not None:
        drawn.append(_safe("search_trials", lambda: search_trials(trials, direction)))
        drawn.append(_safe("search_importance", lambda: search_importance(trials, direction)))
    return save(drawn, out_dir)
