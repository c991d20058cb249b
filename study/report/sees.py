"""Does a metric see pre-training at this profile? The rule a study's primary metric must pass
(docs/STATISTICS.md, "Which metric may be primary").

A metric that random init scores as well as pre-training cannot show what a pre-training factor changed:
a null between levels on it says nothing about the factor. So a metric *sees pre-training* where some
level's pre-trained score beats its random-init baseline beyond seed noise: a row of `baseline.csv`
(aggregate.baseline_gain: Welch's interval at the level its Holm family tests it at) whose interval lies
above 0. A metric only pre-trained runs have (the reference MLM scores: random init predicts nearly
uniformly, far below always predicting the most frequent token) sees it where a finished run beats that
floor by more than 3 binomial SE (`aggregate.learned`, the plateau test): a stronger baseline than random
init. Cost metrics, and metrics with neither (kept-position accuracy, which copying alone earns; the
sentence head's accuracy), are not judged: None.

Pure pandas over the aggregate's tables: `sees_pretraining` gives one row per metric, `primary_check`
applies the rule to the study's primary metric, `sees_sentence` words either for the report.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from study.metrics import COST_METRICS, PRETRAIN, format_metric

# The reference metrics the plateau test judges: the predictions at the asked positions it tests
PLATEAU_JUDGED = ("ref_mlm_acc", "ref_mask_acc", "ref_rnd_acc", "ref_mlm_loss", "ref_ppl")
COLUMNS = [
    "task",
    "mode",
    "metric",
    "sees_pretraining",
    "levels",
    "levels_beyond",
    "gain_min",
    "gain_max",
    "why",
]


def beats_random(baseline_rows: pd.DataFrame) -> pd.Series:
    """Per baseline.csv row: pre-trained above random init beyond seed noise (its interval above 0)."""
    lo = pd.to_numeric(baseline_rows.get("ci_low", pd.Series(dtype=float)), errors="coerce")
    return lo.notna() & np.isfinite(lo) & (lo > 0)


def _plain(x: float) -> str:
    return f"{x:+.3g}"


def _downstream(rows: pd.DataFrame, fmt: Callable[[float], str]) -> tuple:
    if rows.empty:
        return None, 0, 0, np.nan, np.nan, "no random-init baseline scored on it: not judged"
    if not pd.to_numeric(rows["ci_low"], errors="coerce").map(np.isfinite).any():
        return None, len(rows), 0, np.nan, np.nan, "no level has an interval against random init: not judged"
    beat = beats_random(rows)
    gains = pd.to_numeric(rows["diff"], errors="coerce")
    lo, hi = gains.min(), gains.max()
    span = fmt(lo) if lo == hi else f"{fmt(lo)} to {fmt(hi)}"
    k, m = int(beat.sum()), len(rows)
    if k:
        why = f"pre-trained beats random init beyond seed noise at {k} of {m} levels; gains {span}"
    else:
        why = f"no level of {m} beats random init beyond seed noise; gains {span}"
    return bool(k), m, k, lo, hi, why


def _pretrain(metric: str, runs: pd.DataFrame) -> tuple:
    if metric not in PLATEAU_JUDGED:
        return None, 0, 0, np.nan, np.nan, "no random-init score and no floor for it: not judged"
    done = (
        runs[runs["status"].astype(str) == "done"] if {"status", "learned"} <= set(runs.columns) else runs[:0]
    )
    if done.empty:
        return None, 0, 0, np.nan, np.nan, "no finished run: not judged"
    k, m = int((done["learned"].astype(str) == "True").sum()), len(done)
    why = (
        f"{k} of {m} finished runs beat always predicting the most frequent token by > 3 binomial SE "
        f"(the plateau test; random init scores below that floor)"
    )
    return bool(k), m, k, np.nan, np.nan, why


def sees_pretraining(
    baseline: pd.DataFrame,
    runs: pd.DataFrame,
    metrics,
    fmt: Callable[[float], str] = _plain,
) -> pd.DataFrame:
    """One row per (task, mode, metric) in `metrics`: sees_pretraining (True / False / None: not judged),
    levels and levels_beyond (baseline rows, or finished runs, and those beyond the baseline), the gains'
    range over levels (downstream) and the reason in words (`fmt` writes a gain: the report passes
    fmt.fmt_diff, which aggregate cannot import)."""
    out = []
    for task, mode, metric in dict.fromkeys(tuple(k) for k in metrics):
        if metric in COST_METRICS:
            verdict = (None, 0, 0, np.nan, np.nan, "a cost metric: descriptive, not judged")
        elif task == PRETRAIN:
            verdict = _pretrain(metric, runs)
        else:
            rows = baseline
            if not rows.empty:
                rows = rows[(rows["task"] == task) & (rows["mode"] == mode) & (rows["metric"] == metric)]
            verdict = _downstream(rows, fmt)
        out.append((task, mode, metric, *verdict))
    return pd.DataFrame(out, columns=COLUMNS)


def primary_check(primary: tuple[str, str, str], sees: pd.DataFrame) -> dict:
    """The rule "a metric may be primary only where it sees pre-training", applied to the study's primary
    metric: {metric, sees_pretraining, passes, why, sentence}. `passes` is False where it was judged blind
    and None where it was not judged (or not in the tables)."""
    task, mode, metric = primary
    row = sees[(sees["task"] == task) & (sees["mode"] == mode) & (sees["metric"] == metric)]
    verdict = row["sees_pretraining"].iloc[0] if len(row) else None
    verdict = None if verdict is None or (isinstance(verdict, float) and np.isnan(verdict)) else bool(verdict)
    why = row["why"].iloc[0] if len(row) else "not in the study's tables"
    out = {
        "metric": format_metric(task, mode, metric),
        "sees_pretraining": verdict,
        "passes": verdict,
        "why": why,
    }
    return {**out, "sentence": sees_sentence(out)}


def sees_sentence(check: dict) -> str:
    """One sentence for the report: which metric is primary and whether it passes the rule, and why."""
    m, why = check["metric"], check["why"]
    if check["passes"] is None:
        return f"Primary metric {m}: whether it sees pre-training is not judged ({why})."
    if check["passes"]:
        return f"Primary metric {m} sees pre-training ({why}), so it may be primary."
    return (
        f"Primary metric {m} does not see pre-training at this profile ({why}): by the rule it may not be "
        f"primary, and a null between levels on it says little about the factor."
    )


def records(sees: pd.DataFrame) -> list[dict]:
    """The table as JSON-safe records for study.json: NaN gains become null."""
    return [
        {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()}
        for r in sees.to_dict("records")
    ]
