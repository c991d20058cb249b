"""The independent units a study's statistics count, and the per-level summary (summary.csv).

The unit is the pre-training seed: fine-tune seeds are averaged within it. A level with a single pre-trained
model falls back to that model's fine-tune seeds (the result then speaks for one checkpoint, and the words
say so), and a deterministic procedure repeated per fine-tune seed is one measurement, not several.
Shared by the summary, the paired comparisons and the pre-trained vs random-init table (comparisons.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from study.report import stats as S


def _per_seed(tidy: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    # Average fine-tune seeds within a pre-training seed: the pre-training seed is the unit.
    return tidy.groupby([*by, "pretrain_seed"], dropna=False)["value"].mean().reset_index()


FT_UNIT = "ft"  # prefix of a unit that is one fine-tune seed (of a single model) rather than a model


def _units_of(rows: pd.DataFrame, by: list[str], source: str) -> pd.DataFrame:
    """One row per independent unit: the `source` (a model) when a group has several, else the single
    model's fine-tune seeds. Returned with the unit in the `pretrain_seed` column."""
    if rows.empty:
        return pd.DataFrame(columns=[*by, "pretrain_seed", "value"])
    n = rows.groupby(by, dropna=False)[source].transform("nunique")
    rows = rows.assign(
        unit=np.where(n > 1, rows[source].astype(str), FT_UNIT + rows["finetune_seed"].astype(str))
    )
    rows = rows.groupby([*by, "unit"], dropna=False)["value"].mean().reset_index()
    return rows.rename(columns={"unit": "pretrain_seed"})


def pretrained_units(tidy: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Pre-trained rows per unit: the pre-training seed, or, with a single pre-training seed, its
    fine-tune seeds (the comparison then speaks for that checkpoint, not for the pre-training recipe;
    `baseline_gain` says so in its words)."""
    return _units_of(tidy, by, "pretrain_seed")


def random_units(tidy: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Random-init rows, one per independent unit.

    collect() repeats a `random-<hash>` baseline's results once per run that points at it; counting
    those copies as seeds would fake precision, so copies are dropped first. The unit is then the
    baseline itself when a group has several (one per pre-training seed: fine-tune seeds averaged
    within it, as for pre-trained runs), else the single baseline's fine-tune seed.
    Returned with the unit in the `pretrain_seed` column so it lines up with `_per_seed`.
    """
    return _units_of(
        tidy[tidy["init"] == "random"].drop_duplicates([*by, "source_key", "finetune_seed"]), by, "source_key"
    )


def _units(tidy: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    pre = _per_seed(tidy[tidy["init"] != "random"], by)
    return (
        pd.concat([pre, random_units(tidy, by)], ignore_index=True)
        if (tidy["init"] == "random").any()
        else pre
    )


def one_model(units: pd.DataFrame) -> bool:
    return bool(units["pretrain_seed"].astype(str).str.startswith(FT_UNIT).all())


def replicates(units: pd.DataFrame) -> pd.DataFrame:
    """Fine-tune-seed units that all scored exactly the same are one measurement, not several: a
    deterministic procedure (the logistic probe on frozen features ignores the seed) repeated is not a
    replicate, and counting it would give a zero-width CI and p = 0."""
    if len(units) > 1 and one_model(units) and units["value"].nunique() == 1:
        return units.iloc[:1]
    return units


def summarize(tidy: pd.DataFrame, factor_keys: list[str]) -> pd.DataFrame:
    """Mean and 95% interval per task/mode/init/metric and factor level, one value per unit."""
    by = ["task", "mode", "init", "metric", *factor_keys]
    cols = [*by, "mean", "std", "n", "ci_low", "ci_high", "ci_method"]
    if tidy.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, g in _units(tidy, by).groupby(by, dropna=False):
        g = replicates(g)  # a deterministic probe copied per fine-tune seed is one unit, as in baseline_gain
        iv = S.mean_interval(g["value"])  # iv.n: the finite units the mean and the interval use
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "mean": g["value"].mean(),
                "std": g["value"].std(ddof=1),
                "n": iv.n,
                "ci_low": iv.low,
                "ci_high": iv.high,
                "ci_method": iv.method,
            }
        )
    return pd.DataFrame(rows, columns=cols)
