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
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or in DVC stages
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter

from study.levels import level_key
from study.metrics import BOUNDED, COST_METRICS, parse_metric

# Deterministic SVG ids and no timestamps, so re-rendering the same aggregate gives the same files.
matplotlib.rcParams["svg.hashsalt"] = "study-report"
REPLACEMENT_KEYS = ("masking.mask", "masking.keep", "masking.random")  # BERT Table 8 order: MASK/SAME/RND
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


# --------------------------------------------------------------------------- helpers
def metric_label(task: str, mode: str, metric: str) -> str:
    return metric if task == "pretrain" else f"{task} {mode} {metric}"


def run_labels(plan: dict, keys: list[str]) -> dict[tuple, str] | None:
    """Factor values -> the spec's run label, when the spec names its design points by label
    (`x: label` or `compare.factor: label`, i.e. explicit `runs:`) and the mapping is one to one."""
    if "label" not in (plan.get("x"), (plan.get("compare") or {}).get("factor")):
        return None
    out: dict[tuple, str] = {}
    for r in plan.get("runs", []):
        k = tuple(level_key(r.get("factors", {}).get(key)) for key in keys)
        if out.setdefault(k, r["label"]) != r["label"]:
            return None
    return out


def level_label(values: dict, keys: list[str], names: dict[tuple, str] | None = None) -> str:
    """One readable name per factor level: the spec's run label when it has one, else '0.4',
    '80/10/10' (MASK/SAME/RND), or 'k=v, k=v'."""
    if not keys:
        return "base"
    if names:
        got = names.get(tuple(level_key(values.get(k)) for k in keys))
        if got is not None:
            return got
    if set(keys) == set(REPLACEMENT_KEYS):
        try:
            return "/".join(f"{round(float(values[k]) * 100):d}" for k in REPLACEMENT_KEYS)
        except (TypeError, ValueError):
            pass
    if len(keys) == 1:
        return _fmt_level(values.get(keys[0]))
    return ", ".join(f"{k.split('.')[-1]}={_fmt_level(values.get(k))}" for k in keys)


def _fmt_level(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "base"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def with_levels(df: pd.DataFrame, keys: list[str], names: dict[tuple, str] | None = None) -> pd.DataFrame:
    df = df.copy()
    if not keys:  # one design point: its run label (e.g. "pretrained") when the spec named it
        df["level"] = (names or {}).get((), "base")
        return df
    df["level"] = [level_label(r, keys, names) for r in df[keys].to_dict("records")]
    return df


def _numeric(series: pd.Series) -> pd.Series | None:
    out = pd.to_numeric(series, errors="coerce")
    return out if out.notna().all() else None


def _yerr(g: pd.DataFrame) -> np.ndarray:
    lo = (g["mean"] - g["ci_low"]).to_numpy(dtype=float)
    hi = (g["ci_high"] - g["mean"]).to_numpy(dtype=float)
    return np.nan_to_num(np.vstack([lo, hi]), nan=0.0).clip(min=0)


def select(
    summary: pd.DataFrame, task: str, mode: str, metric: str, init: str = "pretrained"
) -> pd.DataFrame:
    if summary.empty:
        return summary
    m = (summary["task"] == task) & (summary["mode"] == mode) & (summary["metric"] == metric)
    if "init" in summary:
        m &= summary["init"] == init
    return summary[m]


def _x_key(plan: dict, keys: list[str], hint: str) -> str | None:
    x = plan.get("x")
    if x in keys:
        return x
    for k in keys:
        if hint in k:
            return k
    return keys[0] if keys else None


def _panel_vs_x(ax, g: pd.DataFrame, x: str, label: str | None = None, **kw) -> bool:
    """Mean +/- CI against a numeric factor; categorical factors fall back to level order."""
    if g.empty:
        return False
    xs = _numeric(g[x])
    g = g.assign(_x=xs if xs is not None else g[x].astype(str)).sort_values("_x")
    ax.errorbar(
        g["_x"] if xs is not None else range(len(g)),
        g["mean"],
        yerr=_yerr(g),
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


def _in_points(ax, metrics) -> None:
    """Tick a y-axis of bounded scores (stored as fractions) in points, as the report's tables write them."""
    if len(metrics) and all(m in BOUNDED for m in metrics):
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.4g}"))
        ax.set_ylabel(f"{ax.get_ylabel() or 'score'} (%)")


def _fig(ncols: int, width: float = 4.2, height: float = 3.3):
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.8)
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def _downstream_metrics(summary: pd.DataFrame, modes=("finetune",)) -> list[tuple[str, str, str]]:
    if summary.empty:
        return []
    d = summary[(summary["task"] != "pretrain") & summary["mode"].isin(modes)]
    return sorted({(r.task, r.mode, r.metric) for r in d.itertuples()})


# --------------------------------------------------------------------------- figures
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
    fig, axes = _fig(len(panels), width=7.0 if len(panels) == 1 else 5.0, height=3.6)
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
    a, b = cmp.get("a", "a"), cmp.get("b", "b")
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
    fig, axes = _fig(2 if (len(down) and len(pre)) else 1, width=4.6, height=0.5 + 0.45 * max(len(down), 3))
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


def mask_rate(summary: pd.DataFrame, plan: dict, keys: list[str]) -> Drawn:
    d = Drawn(
        "mask_rate",
        "Masking rate vs perplexity and downstream score",
        "Left: perplexity on the fixed "
        "reference masks (15%, 80/10/10, the same positions for every run) against the training masking "
        "rate. Right: downstream scores. Mean over pre-training seeds, 95% t-interval.",
    )
    x = _x_key(plan, keys, "masking.rate")
    if x is None or summary.empty:
        d.skipped = "no masking-rate factor or no finished runs"
        return d
    ppl = select(summary, "pretrain", "pretrain", "ref_ppl")
    down = _downstream_metrics(summary, ("finetune", "probe"))
    if ppl.empty and not down:
        d.skipped = "no perplexity and no downstream scores yet"
        return d
    fig, (a1, a2) = _fig(2)
    if not _panel_vs_x(a1, ppl, x):
        a1.text(0.5, 0.5, "no perplexity yet", ha="center", transform=a1.transAxes)
    a1.set_xlabel(x)
    a1.set_ylabel("reference perplexity")
    for t, m, met in down:
        _panel_vs_x(a2, select(summary, t, m, met), x, label=f"{t} {m} {met}")
    a2.set_xlabel(x)
    a2.set_ylabel("downstream score")
    _in_points(a2, [met for _, _, met in down])
    if down:
        a2.legend(fontsize=7)
    else:
        a2.text(0.5, 0.5, "no downstream scores yet", ha="center", transform=a2.transAxes)
    d.fig = fig
    return d


def replacement(
    summary: pd.DataFrame, plan: dict, keys: list[str], runs: pd.DataFrame | None = None
) -> Drawn:
    d = Drawn(
        "replacement",
        "Replacement split: reference MLM, fine-tune and feature-based",
        "Per MASK/SAME/RND "
        "split (as BERT Table 8): accuracy on the fixed reference masks (15%, 80/10/10, the same positions "
        "for every split), over all asked positions and by what they show ([MASK], another token, their own) "
        "(left); fine-tuning "
        "(middle) and the frozen-encoder probe (right), the dotted line the random-init baseline. The dashed "
        "line on the left is the most-frequent-token floor (always predicting the commonest asked token). "
        "Mean over pre-training seeds, 95% t-interval.",
    )
    if summary.empty:
        d.skipped = "no finished runs"
        return d
    s = with_levels(summary[summary["init"] == "pretrained"], keys, run_labels(plan, keys))
    # The reference panel matters here: a split changes what the model sees at the asked positions, and
    # how fast it leaves the unigram plateau, before any downstream task is involved.
    ref = s[(s["task"] == "pretrain") & s["metric"].isin(list(REF_ACCURACY))]
    panels = [("reference MLM accuracy", "pretrain", ref.assign(what=ref["metric"].map(REF_ACCURACY)))]
    for mode, title in (("finetune", "fine-tune"), ("probe", "feature-based (probe)")):
        p = s[(s["mode"] == mode) & (s["task"] != "pretrain") & ~s["metric"].isin(COST_METRICS)]
        panels.append((title, mode, p.assign(what=p["task"] + " " + p["metric"])))
    if all(p.empty for _, _, p in panels):
        d.skipped = "no reference, fine-tune or probe scores yet"
        return d
    fig, axes = _fig(3, height=4.8)
    order = list(dict.fromkeys(s.sort_values(keys, ascending=False)["level"])) if keys else ["base"]
    random = summary[summary["init"] == "random"] if "init" in summary else summary.iloc[:0]
    random = random.assign(what=random["task"] + " " + random["metric"])
    for ax, (title, mode, p) in zip(axes, panels, strict=True):
        ax.set_title(title)
        if p.empty:
            ax.text(0.5, 0.5, f"no {title} scores", ha="center", transform=ax.transAxes)
            continue
        whats = sorted(p["what"].unique())
        w = 0.8 / len(whats)
        for k, what in enumerate(whats):
            g = p[p["what"] == what].set_index("level").reindex(order).dropna(subset=["mean"])
            xs = [order.index(lv) + (k - (len(whats) - 1) / 2) * w for lv in g.index]
            # Points, not bars: a bar's length from zero would hide differences of a point or two.
            line = ax.errorbar(xs, g["mean"], yerr=_yerr(g), fmt="o", capsize=3, label=what)
            # the random-init baseline (the same for every split: one architecture), so a reader sees
            # at once whether pre-training bought anything on this task
            rnd = random[(random["mode"] == mode) & (random["what"] == what)]["mean"].unique()
            if len(rnd) == 1:
                ax.axhline(rnd[0], ls=":", color=line[0].get_color(), label=f"{what}, random init")
        floor = _floor(runs) if mode == "pretrain" else None
        if floor is not None:  # as curves.py: under it a run learned word frequencies only
            ax.axhline(floor, ls="--", c="black", lw=1, label="most-frequent-token floor")
        ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
        ax.set_xlabel("MASK/SAME/RND %" if set(keys) == set(REPLACEMENT_KEYS) else ", ".join(keys))
        # below the panel: inside it the legend covered the top of the intervals
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.5), frameon=False).set_in_layout(
            False
        )
        _in_points(ax, p["metric"].unique())
    d.rect = (0, 0.2, 1, 1)
    d.fig = fig
    return d


def _floor(runs: pd.DataFrame | None) -> float | None:
    """The reference set's most-frequent-token accuracy (runs.csv ref_mode_acc); one set, one value."""
    if runs is None or "ref_mode_acc" not in runs:
        return None
    v = pd.to_numeric(runs["ref_mode_acc"], errors="coerce").dropna()
    return float(v.max()) if len(v) else None


def depth(summary: pd.DataFrame, plan: dict, keys: list[str]) -> Drawn:
    d = Drawn(
        "depth",
        "Depth vs perplexity, score, parameters and measured speed",
        "Against the number of "
        "layers: fixed-reference perplexity, the primary downstream score, parameter count and measured "
        "training throughput (tokens/s on this study's hardware). Mean, 95% t-interval over seeds.",
    )
    x = _x_key(plan, keys, "layers")
    if x is None or summary.empty:
        d.skipped = "no depth factor or no finished runs"
        return d
    task, mode, metric = parse_metric(plan.get("primary_metric"), field="report.primary_metric")
    if task == "pretrain":
        dm = _downstream_metrics(summary)
        task, mode, metric = dm[0] if dm else (task, mode, metric)
    panels = [
        ("reference perplexity", select(summary, "pretrain", "pretrain", "ref_ppl")),
        (metric_label(task, mode, metric), select(summary, task, mode, metric)),
        ("parameters", select(summary, "pretrain", "pretrain", "params")),
        ("tokens / s (measured)", select(summary, "pretrain", "pretrain", "tokens_per_s")),
    ]
    if all(g.empty for _, g in panels):
        d.skipped = "no per-depth metrics yet"
        return d
    fig, axes = _fig(4, width=3.3)
    for ax, (ylabel, g) in zip(axes, panels, strict=True):
        if not _panel_vs_x(ax, g, x):
            ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        _in_points(ax, g["metric"].unique() if not g.empty else [])
    d.fig = fig
    return d


def generic(summary: pd.DataFrame, plan: dict, keys: list[str]) -> Drawn:
    task, mode, metric = parse_metric(plan.get("primary_metric"), field="report.primary_metric")
    d = Drawn(
        "primary_metric",
        f"{metric_label(task, mode, metric)} per design point",
        "The primary metric per factor level, mean over pre-training seeds with 95% t-interval.",
    )
    g = select(summary, task, mode, metric) if not summary.empty else summary
    if g.empty:
        d.skipped = f"no values of the primary metric {plan.get('primary_metric')!r} yet"
        return d
    g = with_levels(g, keys, run_labels(plan, keys))
    fig, (ax,) = _fig(1, width=max(4.0, 0.9 * len(g) + 2))
    ax.bar(range(len(g)), g["mean"], yerr=_yerr(g), capsize=3)
    ax.set_xticks(range(len(g)), g["level"], rotation=30, ha="right")
    ax.set_ylabel(metric_label(task, mode, metric))
    _in_points(ax, [metric])
    d.fig = fig
    return d


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
    fig, (ax,) = _fig(1, width=6.0)
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
    return save(drawn, out_dir)
