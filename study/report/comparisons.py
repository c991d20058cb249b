"""The study's tests: the paired comparison of two levels (comparisons.csv, the study's answer) and what
pre-training bought over a random init (baseline.csv), with the words the report repeats.

Intervals, tests, the Holm correction and the minimum detectable effect come from study.report.stats
(docs/STATISTICS.md): one rule, an interval excludes 0 exactly when its test decides. Levels are matched
with study/levels.py's rule.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from study.errors import StudyError
from study.levels import MISSING, level_key
from study.metrics import COST_METRICS
from study.report import pooled as P
from study.report import stats as S
from study.report.units import one_model, pretrained_units, random_units, replicates

NOISE_WORDS = "indistinguishable from noise"
TOO_FEW_WORDS = "too few seeds for an interval"
SAME_WORDS = "no test of seed noise"
# compare's notes after a verdict, "(paired on k of m seeds)" and "(averaged over X within each seed)":
# the report's headline keeps them when it shortens the verdict (prose._verdict_words)
PAIRED_NOTE, AVERAGED_NOTE = "paired on", "averaged over"


def interpret(
    n: int, lo: float, hi: float, p_decide: float, a: str = "a", b: str = "b", *, method: str = ""
) -> str:
    """Words for a paired difference b - a under the one rule (study.report.stats): beyond seed noise
    exactly when `p_decide` (Holm-adjusted, or raw for the primary comparison) < ALPHA, which is
    exactly when the interval [lo, hi] drawn at the matching level excludes 0. `method` is the
    interval's: S.SAME_DIFF (the same non-zero difference in every seed) gets no test and no direction."""
    if n >= S.MIN_N and method == S.SAME_DIFF:
        return f"the same difference in every seed (n={n}): {SAME_WORDS}"
    if n < S.MIN_N or not (np.isfinite(lo) and np.isfinite(hi)):
        return f"n={n}: {TOO_FEW_WORDS}"
    if lo == hi == 0:  # e.g. the parameter count of two arms that differ only in masking
        return f"no difference in any seed (n={n})"
    if not p_decide < S.ALPHA:
        return f"{NOISE_WORDS} at n={n} seeds"
    return f"{b} {'higher' if lo > 0 else 'lower'} than {a} beyond seed noise at n={n} seeds"


def holm_family(
    keys: list[tuple], ps: list[float], primary: tuple | None, ns: list[int] | None = None
) -> list[dict]:
    """Per row: the p that decides, the interval level that matches it, and the correction's name.

    The family is every row with a test (finite p) except the primary one and cost metrics (speed
    and size are descriptive, not hypotheses); those keep ALPHA and their raw p. A row without a
    test (NaN p) is never rejected and keeps a NaN p_adjusted; `ns` (units per row) tells "n<3" from
    "no test" (the same difference in every seed)."""
    fam = [
        i
        for i, (k, p) in enumerate(zip(keys, ps, strict=True))
        if np.isfinite(p) and k != primary and k[2] not in COST_METRICS
    ]
    adj, lev = S.holm([ps[i] for i in fam]), S.holm_levels([ps[i] for i in fam])
    out = []
    for i, (k, p) in enumerate(zip(keys, ps, strict=True)):
        if i in fam:
            j = fam.index(i)
            out.append(
                {
                    "p_adjusted": float(adj[j]),
                    "alpha": float(lev[j]),
                    "primary": False,
                    "correction": f"Holm over {len(fam)}",
                }
            )
        else:
            why = (
                "none (primary)"
                if k == primary
                else "none (cost metric)"
                if k[2] in COST_METRICS
                else f"none (n<{S.MIN_N})"
                if ns is None or ns[i] < S.MIN_N
                else "none (no test)"
            )
            out.append({"p_adjusted": p, "alpha": S.ALPHA, "primary": k == primary, "correction": why})
    return out


COMPARE_COLS = [
    "task",
    "mode",
    "metric",
    "a",
    "b",
    "mean_a",
    "mean_b",
    "diff",
    "sd_diff",
    "ci_low",
    "ci_high",
    "ci_level",
    "ci_method",
    "n",
    "n_a",
    "n_b",
    "p_value",
    "p_adjusted",
    "correction",
    "primary",
    "mde",
    "test",
    "interpretation",
    "model",  # the pooled level + seed model, or the paired t and why (pooled.pooled_interval's note)
]


def _per_cell_seed(t: pd.DataFrame, spec: dict, others: list[str]) -> pd.DataFrame:
    """The rows at level a or b with a finite value, averaged per (task, mode, metric, side, cell, seed)."""
    fac = spec["factor"]
    # Levels and cells as level keys (study/levels.py): a float64 column (a run without the factor,
    # levels 0.5 and 1) reads 4 as 4.0
    lv = t[fac].map(level_key)  # every level with a value stays: the pooled model's other levels (pooled.py)
    base, treat = compare_sides(spec)  # a: the baseline, b: the treatment (the table keeps a, b)
    side = lv.map({level_key(base): "a", level_key(treat): "b"}).fillna(("=" + lv).where(lv != MISSING))
    cell = t[others].map(level_key).agg("|".join, axis=1) if others else pd.Series("", index=t.index)
    t = t.assign(_side=side, _cell=cell)
    t = t[t["_side"].notna() & np.isfinite(t["value"].to_numpy(dtype=float))]
    # Fine-tune seeds averaged within each (cell, pre-training seed) first, so that every cell weighs the same
    return (
        t.groupby(["task", "mode", "metric", "_side", "_cell", "pretrain_seed"])["value"].mean().reset_index()
    )


def _pairs(per: pd.DataFrame, others: list[str]) -> list[tuple]:
    """Per task/mode/metric with a cell both levels have: ((task, mode, metric), a's and b's values per
    paired seed (cells averaged within it), the seeds a has, b has and either has, and the averaging note)."""
    pairs = []
    for (task, mode, metric), g in per.groupby(["task", "mode", "metric"]):
        shared = sorted(set(g.loc[g["_side"] == "a", "_cell"]) & set(g.loc[g["_side"] == "b", "_cell"]))
        if not shared:
            continue
        seeds = pd.Index(sorted(set(g["pretrain_seed"])))
        wa, wb = (
            g[g["_side"] == x]
            .pivot(index="pretrain_seed", columns="_cell", values="value")
            .reindex(index=seeds, columns=shared)
            for x in ("a", "b")
        )
        has_a, has_b = wa.notna().any(axis=1), wb.notna().any(axis=1)
        # Only seeds with every shared cell at both levels: a seed missing one would compare other cells
        full = wa.notna().all(axis=1) & wb.notna().all(axis=1)
        a, b = wa[full].mean(axis=1).to_numpy(), wb[full].mean(axis=1).to_numpy()
        averaged = f" ({AVERAGED_NOTE} {', '.join(others)} within each seed)" if len(shared) > 1 else ""
        rest = [
            _level_row(g[g["_side"] == x], seeds, shared)[full.to_numpy()]
            for x in sorted(set(g["_side"]) - {"a", "b"})
        ]
        pairs.append(
            (
                (task, mode, metric),
                a,
                b,
                int(has_a.sum()),
                int(has_b.sum()),
                int((has_a | has_b).sum()),
                averaged,
                rest,
            )
        )
    return pairs


def _level_row(rows: pd.DataFrame, seeds: pd.Index, shared: list) -> np.ndarray:
    # One level's value per seed, averaged over the shared cells as compare averages a and b: NaN where the
    # seed lacks a cell, so pooled_interval leaves the level out of the pool (a complete block only)
    w = rows.pivot(index="pretrain_seed", columns="_cell", values="value").reindex(
        index=seeds, columns=shared
    )
    return w.mean(axis=1, skipna=False).to_numpy()


def compare_sides(cmp: dict | None) -> tuple:
    """(baseline, treatment) of a `compare` hint, the answer being treatment - baseline; a plan written
    before the names (or by hand) says a, b (study/studies/hints.py). (None, None) without one."""
    cmp = cmp or {}
    return (cmp["baseline"], cmp["treatment"]) if "baseline" in cmp else (cmp.get("a"), cmp.get("b"))


def compare(
    tidy: pd.DataFrame, spec: dict, primary: tuple | None = None, others: list[str] = ()
) -> pd.DataFrame:
    """Paired difference b - a per task/mode/metric, paired by pre-training seed.

    `primary` (task, mode, metric) is the study's headline: tested at ALPHA alone. Every other
    non-cost row is in one Holm family; its interval is drawn at the level Holm tests it at, so it
    excludes 0 exactly when p_adjusted < ALPHA. `mde`: the smallest difference a paired t-test at the
    row's own alpha (ALPHA for the primary and cost rows, the Holm level for the others) detects with
    80% power at this n, from this row's SD of the differences; NaN for a row without a test.
    `n_a`, `n_b`: the seeds each level has; `n` the seeds both have (the pairs), and the words say
    "(paired on k of m seeds)" when pairing dropped some (a row with no pair is kept, n = 0, and says so).

    `others`: the study's other factors. Only the cells (their value combinations) that both levels have
    are compared: in a one-at-a-time design the runs at a's default level include those that vary
    another factor, which b has no counterpart of, so averaging them in would confound the comparison.
    Where several cells are shared (a grid), fine-tune seeds are averaged within each cell and seed, only
    the seeds that have every shared cell at both levels are paired, each cell weighs the same within a
    seed, and the words say so."""
    fac = spec["factor"]
    if fac not in tidy.columns:
        raise StudyError(
            f"factor {fac!r} is not a factor of any run",
            field="compare.factor",
            allowed=", ".join(c for c in tidy.columns if "." in c) or "none",
        )
    t = tidy[tidy["init"] == "pretrained"]
    others = [k for k in others if k != fac and k in t.columns]
    if t.empty:
        return pd.DataFrame(columns=COMPARE_COLS)
    per = _per_cell_seed(t, spec, others)
    base, treat = compare_sides(spec)
    pairs = _pairs(per, others)
    if not pairs:
        return pd.DataFrame(columns=COMPARE_COLS)
    first = [P.pooled_interval(p[2], p[1], p[7]) for p in pairs]
    fam = holm_family([p[0] for p in pairs], [iv.p for iv in first], primary, [iv.n for iv in first])
    rows = []
    for ((task, mode, metric), a, b, n_a, n_b, n_any, averaged, rest), iv0, h in zip(
        pairs, first, fam, strict=True
    ):
        iv = P.pooled_interval(b, a, rest, level=1 - h["alpha"]) if np.isfinite(iv0.p) else iv0
        words = interpret(iv.n, iv.low, iv.high, h["p_adjusted"], str(base), str(treat), method=iv.method)
        if iv.n < n_any:  # seeds without a counterpart cannot be paired: say so, never drop them silently
            words += f" ({PAIRED_NOTE} {iv.n} of {n_any} seeds)"
        words += averaged
        rows.append(
            {
                "task": task,
                "mode": mode,
                "metric": metric,
                "a": base,
                "b": treat,
                "mean_a": a.mean() if a.size else math.nan,
                "mean_b": b.mean() if b.size else math.nan,
                "diff": iv.estimate,
                "sd_diff": iv.sd,
                "ci_low": iv.low,
                "ci_high": iv.high,
                "ci_level": iv.level,
                "ci_method": iv.method,
                "n": iv.n,
                "n_a": n_a,
                "n_b": n_b,
                "p_value": iv0.p,
                "p_adjusted": h["p_adjusted"],
                "correction": h["correction"],
                "primary": h["primary"],
                # at the alpha this row's test uses (the Holm level for a secondary row); no test, no MDE
                "mde": S.mde(iv.sd, iv.n, alpha=h["alpha"], df=iv.df) if np.isfinite(iv0.p) else float("nan"),
                "test": _test_name(iv.method, "paired t-test"),
                "model": iv.note or "paired t on the two levels",
                "interpretation": words,
            }
        )
    return pd.DataFrame(rows, columns=COMPARE_COLS)


def _test_name(method: str, t_name: str) -> str:
    if method.startswith(P.POOLED):
        return f"t-test ({P.POOLED})"
    if method.startswith(("t on", "Welch")):
        return t_name
    return "inverted BCa interval" if method.startswith("BCa") else method


def _gain_words(iv: S.Interval, p_adjusted: float, n_pre: int, n_rnd: int, one: bool) -> str:
    """baseline.csv's interpretation: the direction only beyond seed noise, with the sizes it rests on."""
    sizes = (
        f"n={n_pre} fine-tuning seeds of one pre-trained model, {n_rnd} random"
        if one
        else f"n={n_pre} pre-trained, {n_rnd} random"
    )
    if iv.method == S.NO_SPREAD:
        return f"every score the same on each side ({sizes}): {SAME_WORDS}"
    if not (np.isfinite(iv.low) and np.isfinite(iv.high)):
        return f"{TOO_FEW_WORDS} ({sizes}; {S.MIN_N} a side needed)"
    if not p_adjusted < S.ALPHA:
        return f"{NOISE_WORDS} ({sizes})"
    return f"pre-training {'raises' if iv.low > 0 else 'lowers'} it beyond seed noise ({sizes})"


# baseline.csv's columns after the task, mode, metric and factor keys
BASELINE_COLS = [
    "mean_pretrained",
    "mean_random",
    "diff",
    "ci_low",
    "ci_high",
    "ci_level",
    "n_pretrained",
    "n_random",
    "p_value",
    "p_adjusted",
    "correction",
    "primary",
    "test",
    "interpretation",
]


def baseline_gain(tidy: pd.DataFrame, factor_keys: list[str], primary: tuple | None = None) -> pd.DataFrame:
    """What pre-training bought: pretrained minus random-init, per task/mode/metric and factor level.

    Unpaired (the baseline has no pre-training seed): Welch's t-interval and test, Holm across the
    table's rows (a family of its own). `primary` (task, mode, metric) is exempt from the correction
    only when one row answers it (a study with one design point, whose headline is this row). The
    unit is the pre-training seed; a level with one pre-training seed falls back to its fine-tune seeds.
    """
    by = ["task", "mode", "metric", *factor_keys]
    t = tidy[tidy["task"] != "pretrain"]
    cols = [*by, *BASELINE_COLS]
    if t.empty or not (t["init"] == "random").any():
        return pd.DataFrame(columns=cols)
    pre = pretrained_units(t[t["init"] == "pretrained"], by)
    rnd = random_units(t, by)
    found = []
    for key, g in pre.groupby(by, dropna=False):
        sel = np.ones(len(rnd), dtype=bool)
        for k, v in zip(by, key, strict=True):
            sel &= (rnd[k].isna() if pd.isna(v) else (rnd[k] == v)).to_numpy()
        if sel.any():
            found.append(
                (
                    key,
                    replicates(g)["value"].to_numpy(),
                    replicates(rnd[sel])["value"].to_numpy(),
                    one_model(g),
                )
            )
    keys = [tuple(k[:3]) for k, *_ in found]
    first = [S.welch_interval(g, r) for _, g, r, _ in found]
    fam = holm_family(
        keys, [iv.p for iv in first], primary if keys.count(primary) == 1 else None, ns=[iv.n for iv in first]
    )
    rows = []
    for (key, g, r, one), iv0, h in zip(found, first, fam, strict=True):
        iv = S.welch_interval(g, r, level=1 - h["alpha"]) if np.isfinite(iv0.p) else iv0
        words = _gain_words(iv, h["p_adjusted"], len(g), len(r), one)
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "mean_pretrained": g.mean(),
                "mean_random": r.mean(),
                "diff": iv.estimate,
                "ci_low": iv.low,
                "ci_high": iv.high,
                "ci_level": iv.level,
                "n_pretrained": len(g),
                "n_random": len(r),
                "p_value": iv0.p,
                "p_adjusted": h["p_adjusted"],
                "correction": h["correction"],
                "primary": h["primary"],
                "test": _test_name(iv.method, "Welch t-test"),
                "interpretation": words,
            }
        )
    return pd.DataFrame(rows, columns=cols)
