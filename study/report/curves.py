"""The learning-curve figure of `study curve` (study/pretrain/curve.py) and of docs/CURVES.md.

Four panels: reference MLM accuracy and loss, each against tokens seen and against training seconds.
The accuracy panels draw each curve's most-frequent-token floor (`ref_mode_acc`) as a dashed line in
the curve's colour: a model under that line has learned no more than word frequencies. Dotted: the same
accuracy on the positions that show [MASK]; dash-dot: that on the warmup's short rows, for runs with one.
Several curves (e.g. a recipe before and after a change, trained side by side) share the axes.
Same look as the report's figures (study/report/figures.py); no torch import.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or in DVC stages
import matplotlib.pyplot as plt
import seaborn as sns

from study.io import atomic_write_bytes


def curve_figure(curves: dict[str, list[dict]], title: str | None = None) -> plt.Figure:
    """curves: label -> rows of a curve CSV (step, tokens, train_s, ref_mlm_acc, ref_mode_acc, ref_mlm_loss,
    and where present ref_mask_acc, drawn dotted, and short_mask_acc, dash-dot)."""
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.8)
    fig, axes = plt.subplots(2, 2, figsize=(9.0, 6.4), squeeze=False)
    colours = dict(zip(curves, sns.color_palette(n_colors=max(len(curves), 1)), strict=False))
    # The floor is a property of the reference set: constant along a curve, and the same line for every
    # curve that shares the vocabulary and sequence length, so it is drawn once per distinct value.
    floors: dict[float, list[str]] = {}
    for label, rows in curves.items():
        vals = {r["ref_mode_acc"] for r in rows if r.get("ref_mode_acc") is not None}
        if vals:
            floors.setdefault(round(max(vals), 6), []).append(label)
    for col, (x, xlabel) in enumerate(
        (("tokens", "tokens seen"), ("train_s", "training seconds (evals excluded)"))
    ):
        acc_ax, loss_ax = axes[0][col], axes[1][col]
        for label, rows in curves.items():
            pts = [r for r in rows if r.get(x) is not None]
            acc_ax.plot(
                [r[x] for r in pts],
                [100 * r["ref_mlm_acc"] for r in pts],
                marker=".",
                color=colours[label],
                label=label,
            )
            # dotted, same colour: the positions that show [MASK] only (no copying)
            _plot_known(acc_ax, pts, x, "ref_mask_acc", ":", colours[label], f"{label}, at [MASK] only")
            # dash-dot: the same on rows of the warmup's short length (evaluate.short_reference_set)
            _plot_known(
                acc_ax, pts, x, "short_mask_acc", "-.", colours[label], f"{label}, at [MASK] on short rows"
            )
            loss_ax.plot(
                [r[x] for r in pts], [r["ref_mlm_loss"] for r in pts], marker=".", color=colours[label]
            )
        for floor, owners in floors.items():
            shared = len(floors) == 1
            acc_ax.axhline(
                100 * floor,
                color="black" if shared else colours[owners[0]],
                linestyle="--",
                linewidth=1,
                label="most-frequent-token floor" + ("" if shared else f" ({owners[0]})"),
            )
        acc_ax.set_xlabel(xlabel)
        loss_ax.set_xlabel(xlabel)
        acc_ax.set_ylabel("reference MLM accuracy (%)")
        loss_ax.set_ylabel("reference MLM loss")
        for ax in (acc_ax, loss_ax):
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 4))
    # one legend under the panels: inside any panel it would cover the curves
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 2), fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.025 * ((len(labels) + 1) // 2), 1, 1))
    return fig


def _plot_known(ax, rows: list[dict], x: str, key: str, linestyle: str, colour, label: str) -> None:
    """`key` in percent against `x`, over the rows that have it (an older run's curve may not); nothing
    when none do."""
    known = [r for r in rows if r.get(key) is not None]
    if known:
        ax.plot(
            [r[x] for r in known],
            [100 * r[key] for r in known],
            linestyle=linestyle,
            color=colour,
            label=label,
        )


def save_curve_png(curves: dict[str, list[dict]], path: Path, title: str | None = None) -> Path:
    fig = curve_figure(curves, title)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())  # a kill leaves the old PNG or none, never half of one
    return path
