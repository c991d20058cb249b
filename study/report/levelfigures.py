"""The figure of each study kind: the primary metric per factor level (`mask_rate`, `replacement`,
`depth`, and `generic` for any other study), drawn from the summary table with its seed intervals."""

from __future__ import annotations

import pandas as pd

from study.metrics import COST_METRICS, parse_metric
from study.report.levelnames import (
    REPLACEMENT_KEYS,
    metric_label,
    run_labels,
    select,
    with_levels,
)
from study.report.plotting import (
    REF_ACCURACY,
    Drawn,
    downstream_metrics,
    in_points,
    new_figure,
    panel_vs_x,
    x_key,
    yerr,
)

# the captions of the figures against one numeric factor
MASK_RATE_CAPTION = (
    "Left: perplexity on the fixed reference masks (15%, 80/10/10, the same positions for every run) "
    "against the training masking rate. Right: downstream scores. Mean over pre-training seeds, 95% "
    "t-interval."
)
DEPTH_CAPTION = (
    "Against the number of layers: fixed-reference perplexity, the primary downstream score, parameter "
    "count and measured training throughput (tokens/s on this study's hardware). Mean, 95% t-interval "
    "over seeds."
)


def _factor_x(
    d: Drawn, summary: pd.DataFrame, plan: dict, keys: list[str], hint: str, factor: str
) -> str | None:
    """The column a figure against one factor draws along, or None with `d.skipped` saying why not."""
    x = x_key(plan, keys, hint)
    if x is None or summary.empty:
        d.skipped = f"no {factor} factor or no finished runs"
        return None
    return x


def mask_rate(summary: pd.DataFrame, plan: dict, keys: list[str]) -> Drawn:
    d = Drawn("mask_rate", "Masking rate vs perplexity and downstream score", MASK_RATE_CAPTION)
    x = _factor_x(d, summary, plan, keys, "masking.rate", "masking-rate")
    if x is None:
        return d
    ppl = select(summary, "pretrain", "pretrain", "ref_ppl")
    down = downstream_metrics(summary, ("finetune", "probe"))
    if ppl.empty and not down:
        d.skipped = "no perplexity and no downstream scores yet"
        return d
    fig, (a1, a2) = new_figure(2)
    if not panel_vs_x(a1, ppl, x):
        a1.text(0.5, 0.5, "no perplexity yet", ha="center", transform=a1.transAxes)
    a1.set_xlabel(x)
    a1.set_ylabel("reference perplexity")
    for t, m, met in down:
        panel_vs_x(a2, select(summary, t, m, met), x, label=f"{t} {m} {met}")
    a2.set_xlabel(x)
    a2.set_ylabel("downstream score")
    in_points(a2, [met for _, _, met in down])
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
    fig, axes = new_figure(3, height=4.8)
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
            line = ax.errorbar(xs, g["mean"], yerr=yerr(g), fmt="o", capsize=3, label=what)
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
        in_points(ax, p["metric"].unique())
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
    d = Drawn("depth", "Depth vs perplexity, score, parameters and measured speed", DEPTH_CAPTION)
    x = _factor_x(d, summary, plan, keys, "layers", "depth")
    if x is None:
        return d
    task, mode, metric = parse_metric(plan.get("primary_metric"), field="report.primary_metric")
    if task == "pretrain":
        dm = downstream_metrics(summary)
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
    fig, axes = new_figure(4, width=3.3)
    for ax, (ylabel, g) in zip(axes, panels, strict=True):
        if not panel_vs_x(ax, g, x):
            ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        in_points(ax, g["metric"].unique() if not g.empty else [])
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
    fig, (ax,) = new_figure(1, width=max(4.0, 0.9 * len(g) + 2))
    ax.bar(range(len(g)), g["mean"], yerr=yerr(g), capsize=3)
    ax.set_xticks(range(len(g)), g["level"], rotation=30, ha="right")
    ax.set_ylabel(metric_label(task, mode, metric))
    in_points(ax, [metric])
    d.fig = fig
    return d
