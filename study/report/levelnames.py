"""How the report names a factor level, a metric and a design point (tables, sentences and figures alike),
and the summary rows of one metric. Pure pandas: the report's prose uses it without a plotting import."""

from __future__ import annotations

import math

import pandas as pd

from study.levels import level_key

REPLACEMENT_KEYS = ("masking.mask", "masking.keep", "masking.random")  # BERT Table 8 order: MASK/SAME/RND


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


def select(
    summary: pd.DataFrame, task: str, mode: str, metric: str, init: str = "pretrained"
) -> pd.DataFrame:
    if summary.empty:
        return summary
    m = (summary["task"] == task) & (summary["mode"] == mode) & (summary["metric"] == metric)
    if "init" in summary:
        m &= summary["init"] == init
    return summary[m]
