"""The pooled level + seed model for a paired comparison in a study of k levels x n seeds
(docs/STATISTICS.md, "Pooled level + seed model"). Pure numpy/scipy, beside study.report.stats, whose
one rule it keeps: its interval excludes 0 exactly when its t-test gives p < 1 - level.

y[level, seed] = mu + level + seed + e. The residual variance pooled over every level has (k-1)(n-1) df
(10 for 6 x 3) where a paired t on the two compared levels has n-1 (2), so the t quantile drops from 4.30
to 2.23. Its premise is that every level varies alike across seeds (sphericity, in repeated-measures
terms): by simulation a pair whose SD is 3x the other levels' is covered only 79-81% at k = 6. So the
pooled error is used only where the pair's own paired variance agrees with the other levels' residual
variance (an F-test, independent of the pair), and the fallback is the paired t. The check costs most of
the gain; it is what keeps every cell of the simulation at >= 94% with SD ratios up to 3.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from scipy import stats

from study.report.stats import ALPHA, Interval, paired_interval

POOL_MIN_LEVELS = 4  # the pair and >= 2 others: a residual variance outside the pair to check it against
# Pool when F = (s_d^2 / 2) / s_rest^2 lies between these quantiles of F(n-1, (k-3)(n-1)): above the median
# the pair may vary more than the rest (the pooled interval would be too narrow); in the lowest 5% the pair
# varies far less (pooling would blur a clear paired difference). Of the bands bench/stats_coverage.py --grid
# tries, the one with the most power at equal SDs whose worst cell covers >= 94% by 2 Monte Carlo SE.
# Measured (--grid, 20,000 replicates): worst cell 0.944; power at k=6 n=3 0.227 where the paired t has 0.193.
POOL_CHECK = (0.05, 0.5)
POOLED = "pooled level + seed model"


def additive_residual_var(y: np.ndarray) -> tuple[np.ndarray, int]:
    """Residual variance of the additive level + seed fit to complete blocks (..., levels, seeds), and its df."""
    k, n = y.shape[-2:]
    r = y - y.mean(-1, keepdims=True) - y.mean(-2, keepdims=True) + y.mean((-2, -1), keepdims=True)
    df = (k - 1) * (n - 1)
    return (r**2).sum((-2, -1)) / df, df


def pooled_rows(
    b: np.ndarray, a: np.ndarray, rest: np.ndarray, level: float = 1 - ALPHA, check: tuple = POOL_CHECK
):
    """Row-wise b - a from complete blocks: b, a (..., n), the other levels rest (..., k-2, n), k >= 4.
    Returns (mean, low, high, p, pooled, F): the pooled interval where the variance check passes, else the
    paired t. Vectorised so the coverage simulation runs this code (`check`: another pass band, for its grid);
    `pooled_interval` is its one caller."""
    d = b - a
    n = d.shape[-1]
    m, sd2 = d.mean(-1), d.var(-1, ddof=1)
    s2, df = additive_residual_var(np.concatenate([a[..., None, :], b[..., None, :], rest], axis=-2))
    s2_rest, df_rest = additive_residual_var(rest)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = sd2 / 2 / s2_rest
    lo, hi = stats.f.ppf([check[0], 1 - check[1]], n - 1, df_rest)
    ok = (f >= lo) & (f <= hi)  # NaN (no spread in the rest) fails: no check, no pooling
    se, dfs = np.where(ok, np.sqrt(2 * s2 / n), np.sqrt(sd2 / n)), np.where(ok, df, n - 1)
    half = stats.t.ppf(1 - (1 - level) / 2, dfs) * se
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 2 * stats.t.sf(np.abs(m) / se, dfs)
    return m, m - half, m + half, p, ok, f


def pooled_interval(b, a, rest=(), level: float = 1 - ALPHA, **kw) -> Interval:
    """Interval for mean(b - a) over the seeds both levels have, from the level + seed model of every
    level that has all those seeds, or the paired t (`paired_interval`) with `note` saying why:
    k = 2 (they are the same); fewer than POOL_MIN_LEVELS complete levels; n < MIN_N, n >= BOOTSTRAP_MIN_N
    or the same difference in every seed (paired's rules); the variance check failed. `rest`: the other
    levels' values, one row per level, aligned with b and a by seed (NaN where a level lacks the seed)."""
    paired = paired_interval(b, a, level, **kw)
    b, a = np.asarray(b, dtype=float), np.asarray(a, dtype=float)
    rest = np.asarray(rest, dtype=float)
    rest = rest.reshape(-1, b.size) if rest.size else np.empty((0, b.size))
    k = rest.shape[0] + 2
    if k == 2:
        return paired
    pair = np.isfinite(b) & np.isfinite(a)
    rest = rest[np.isfinite(rest[:, pair]).all(axis=1)][:, pair]
    kk, n = rest.shape[0] + 2, int(pair.sum())

    def fallback(why: str) -> Interval:
        return replace(paired, note=f"paired t on the two levels: {why}")

    if kk < POOL_MIN_LEVELS:
        return fallback(
            f"{kk} levels with every seed of the pair ({k} in all); the pooled model needs "
            f"{POOL_MIN_LEVELS}, two beside the pair to check its variance against"
        )
    if not paired.method.startswith("t on"):  # n < 3, the same difference in every seed, or BCa at n >= 50
        return fallback(paired.method)
    m, lo, hi, p, ok, f = (x[0] for x in pooled_rows(b[pair][None], a[pair][None], rest[None], level))
    if not ok:
        q = stats.f.ppf([POOL_CHECK[0], 1 - POOL_CHECK[1]], n - 1, (kk - 3) * (n - 1))
        return fallback(
            f"variance check failed: half the pair's paired variance is {f:.2g}x the other {kk - 2} levels' "
            f"residual variance, outside [{q[0]:.2g}, {q[1]:.2g}] (the {100 * POOL_CHECK[0]:g}% and "
            f"{100 * (1 - POOL_CHECK[1]):g}% points of F({n - 1}, {(kk - 3) * (n - 1)}))"
        )
    s2, df = additive_residual_var(np.vstack([a[pair], b[pair], rest]))
    return Interval(
        float(m),
        float(lo),
        float(hi),
        float(p),
        n,
        float(math.sqrt(2 * s2)),
        level,
        f"{POOLED}: t on {df} df",
        df=float(df),
        note=f"{POOLED} over {kk} levels x {n} seeds ({df} df; variance check passed)",
    )


def model_sentence(model: str | None) -> str:
    """The methods line's clause on where the primary comparison's interval, SD and MDE come from (the
    comparison's `model` column: `pooled_interval`'s note); empty for an aggregate written before it."""
    return f" The primary comparison's interval, SD and MDE come from the {model}." if model else ""
