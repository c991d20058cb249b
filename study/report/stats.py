"""The report's statistics at the number of seeds that actually ran (docs/STATISTICS.md).

Pure numpy/scipy. The unit of replication is the pre-training seed (fine-tune seeds are averaged
within it by aggregate); every function here takes one value per unit.

ONE decision rule. A difference is "beyond seed noise" exactly when its interval excludes 0, and
the interval is built from the same distribution and the same level as the test that decides:

- t-interval on n-1 df for a mean or a paired difference (Welch's df for two unpaired samples);
  excluding 0 at level 1-alpha <=> the two-sided t-test gives p < alpha, by construction.
- At n >= BOOTSTRAP_MIN_N a BCa bootstrap replaces t for one-sample intervals, and its p-value is
  the inverted interval (the smallest alpha whose interval excludes 0), so the two still agree.
  The threshold is high on purpose: by simulation (tests/test_stats.py) the t-interval covers at
  least as well as the percentile and BCa bootstraps for n <= 30; only for strongly skewed data at
  large n does BCa pull ahead.
- At n < MIN_N (3): no interval and no test, hence no direction.
- A paired difference that is the same in every unit (its SD zero, or float leftovers of zero:
  `same_spread`) is not a test: sd = 0 would make p = 0 at any n, and scores in steps of 1/N hit it
  by chance. `paired_interval` then returns p = NaN and no interval (method SAME_DIFF), unless the
  difference is 0 in every unit: that stays the exact [0, 0] with p = 1. Likewise `welch_interval`
  when neither side varies (method NO_SPREAD).
- Holm across a study's secondary comparisons; the primary comparison stays at alpha. Each
  secondary row's interval is drawn at the level Holm's step-down tests it at (`holm_levels`), so
  its interval excludes 0 <=> its Holm-adjusted p < alpha.

Minimum detectable effect: the noncentral t power of a two-sided paired t-test, at the alpha the
row's own test uses (aggregate passes the Holm level for a secondary row); none when the paired SD is 0.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from study.errors import StudyError

ALPHA = 0.05
MIN_N = 3  # fewer units: no interval at all (a t-interval on 1 df is +-12.7 SE wide)
BOOTSTRAP_MIN_N = 50  # from here on one-sample intervals are BCa bootstraps
N_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
POWER = 0.80
# Pilot SD of a paired difference between pre-training seeds on a score in [0, 1], used by
# `study plan --detect` when the study has no results yet and no --sd: 1 pp, the order of the
# seed-to-seed spread of small-BERT fine-tuning scores (Dodge et al. 2020 report 1-2 pp on GLUE
# tasks for fine-tuning seeds alone). A stated guess, not a measurement: pass --sd to override.
PILOT_SD_BOUNDED = 0.01
# A paired difference whose SD is at most this times its scale (1, |mean|, the largest |score|) is the
# same in every unit: floating-point leftovers of an SD of 0 (b = a + 0.3 for a = 0.1, 0.2, 0.7 gives
# differences apart in the 17th digit, an SD of 4e-17 and, as a t-test, p = 6e-33), not spread.
SAME_SPREAD_RTOL = 1e-12
SAME_DIFF = "none (the same difference in every seed)"
NO_SPREAD = "none (no spread on either side)"  # welch_interval's SAME_DIFF: every unit of each side equal


@dataclass(frozen=True)
class Interval:
    """An estimate with its interval at `level` and the two-sided p-value of "it is 0"."""

    estimate: float
    low: float
    high: float
    p: float
    n: int
    sd: float
    level: float
    method: str
    df: float = math.nan  # the t distribution's df where the test is a t-test with other than n-1 (pooled)
    note: str = ""  # which model gave it and why (pooled, or paired and the reason): the report states it

    @property
    def excludes_zero(self) -> bool:
        return bool(np.isfinite(self.low) and np.isfinite(self.high) and (self.low > 0 or self.high < 0))


def _none(x: np.ndarray, level: float, n: int | None = None) -> Interval:
    est = float(x.mean()) if x.size else float("nan")
    sd = float(x.std(ddof=1)) if x.size > 1 else float("nan")
    return Interval(
        est,
        float("nan"),
        float("nan"),
        float("nan"),
        x.size if n is None else n,
        sd,
        level,
        f"none (n<{MIN_N})",
    )


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise StudyError(
            f"confidence level {level!r} is not in (0, 1)", field="level", allowed="0 < level < 1"
        )


def mean_interval(
    values, level: float = 1 - ALPHA, *, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> Interval:
    """Interval for the mean of one value per unit: t on n-1 df, BCa bootstrap at n >= BOOTSTRAP_MIN_N."""
    _check_level(level)
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < MIN_N:
        return _none(x, level)
    m, sd, n = float(x.mean()), float(x.std(ddof=1)), x.size
    if sd == 0:  # every unit scored the same: the interval is that value, and it is 0 or it is not
        return Interval(m, m, m, 1.0 if m == 0 else 0.0, n, 0.0, level, "exact (zero spread)")
    if n >= BOOTSTRAP_MIN_N:
        return _bca(x, level, n_resamples, seed)
    _, lo, hi, p = t_rows(x[None, :], level)
    return Interval(m, float(lo[0]), float(hi[0]), float(p[0]), n, sd, level, f"t on {n - 1} df")


def t_rows(x: np.ndarray, level: float = 1 - ALPHA) -> tuple[np.ndarray, ...]:
    """Row-wise t-interval and two-sided p of the mean for a (replicates, n) array: (mean, low, high, p).
    The one implementation of the t-interval; vectorised so the coverage simulation runs this code."""
    n = x.shape[1]
    m, se = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)
    half = stats.t.ppf(1 - (1 - level) / 2, n - 1) * se
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 2 * stats.t.sf(np.abs(m) / se, n - 1)
    return m, m - half, m + half, p


def paired_interval(b, a, level: float = 1 - ALPHA, **kw) -> Interval:
    """Interval for mean(b - a) over units measured under both a and b (the same pre-training seed).

    A difference that is the same in every unit (`same_spread`) gets no test: p = NaN, no interval,
    method SAME_DIFF; a difference of 0 in every unit is the exact [0, 0] with p = 1."""
    _check_level(level)
    b, a = np.asarray(b, dtype=float), np.asarray(a, dtype=float)
    if b.shape != a.shape:
        raise StudyError(f"paired samples differ in length ({b.size} vs {a.size})", field="pairs")
    ok = np.isfinite(b) & np.isfinite(a)
    d, scale = (b - a)[ok], max(1.0, float(np.abs(a[ok]).max(initial=0)), float(np.abs(b[ok]).max(initial=0)))
    if d.size >= MIN_N:
        if float(np.abs(d).max()) <= SAME_SPREAD_RTOL * scale:  # 0 in every unit, up to float leftovers
            return Interval(0.0, 0.0, 0.0, 1.0, d.size, 0.0, level, "exact (zero spread)")
        m, sd = float(d.mean()), float(d.std(ddof=1))
        if same_spread(sd, m, scale):
            return Interval(m, float("nan"), float("nan"), float("nan"), d.size, sd, level, SAME_DIFF)
    return mean_interval(d, level, **kw)


def same_spread(sd: float, mean: float, scale: float = 1.0) -> bool:
    """Is an SD of differences zero or negligible: sd <= SAME_SPREAD_RTOL x max(1, |mean|, scale)?"""
    return bool(sd <= SAME_SPREAD_RTOL * max(1.0, abs(mean), scale))


def zero_width(low, high) -> bool:
    """A finite interval of no width (up to float leftovers): every unit scored the same (`mean_interval`'s
    exact case). It measures no seed noise, so setting it beside another interval is no test."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return False
    return bool(high - low <= SAME_SPREAD_RTOL * max(1.0, abs(low), abs(high)))


def welch_interval(x, y, level: float = 1 - ALPHA) -> Interval:
    """Interval for mean(x) - mean(y), two UNPAIRED samples: Welch's t at every n (the BCa bootstrap
    is one-sample only; Welch is exact for normal data and robust at large n)."""
    _check_level(level)
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    d = float(x.mean() - y.mean()) if x.size and y.size else float("nan")
    if min(x.size, y.size) < MIN_N:
        return Interval(
            d,
            float("nan"),
            float("nan"),
            float("nan"),
            min(x.size, y.size),
            float("nan"),
            level,
            f"none (n<{MIN_N} on a side)",
        )
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(vx + vy)
    scale = max(1.0, float(np.abs(x).max()), float(np.abs(y).max()))
    if same_spread(se, d, scale):  # no spread on either side: as in paired_interval, no test (p would be 0)
        if abs(d) <= SAME_SPREAD_RTOL * scale:
            return Interval(0.0, 0.0, 0.0, 1.0, min(x.size, y.size), 0.0, level, "exact (zero spread)")
        return Interval(
            d, float("nan"), float("nan"), float("nan"), min(x.size, y.size), se, level, NO_SPREAD
        )
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    half = stats.t.ppf(1 - (1 - level) / 2, df) * se
    p = float(2 * stats.t.sf(abs(d) / se, df))
    return Interval(d, d - half, d + half, p, min(x.size, y.size), se, level, f"Welch t on {df:.1f} df")


# --------------------------------------------------------------------------- BCa bootstrap
def _bca(x: np.ndarray, level: float, n_resamples: int, seed: int) -> Interval:
    """BCa interval of the mean (Efron 1987) with the p-value that inverts it.

    Endpoints use the empirical quantile that is an actual resample (inverted CDF) and the upper one
    is taken on -theta*, so "lower > 0" and "upper < 0" are the same events as "p < alpha" below.
    """
    n, m = x.size, float(x.mean())
    rng = np.random.default_rng(seed)
    boot = x[rng.integers(0, n, size=(n_resamples, n))].mean(axis=1)
    z0 = stats.norm.ppf(np.clip((boot < m).mean(), 1 / n_resamples, 1 - 1 / n_resamples))
    jack = (x.sum() - x) / (n - 1)
    dev = jack.mean() - jack
    a = float((dev**3).sum() / (6 * (dev**2).sum() ** 1.5))
    q = (1 - level) / 2

    def beta(z: float) -> float:  # the bootstrap quantile BCa reads for the normal quantile z
        return float(stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z))))

    lo = float(np.quantile(boot, beta(stats.norm.ppf(q)), method="inverted_cdf"))
    hi = float(-np.quantile(-boot, 1 - beta(stats.norm.ppf(1 - q)), method="inverted_cdf"))

    def solve(g: float) -> float:
        # The normal quantile z with beta(z) = g (beta's inverse), +-inf where g is outside beta's range.
        if g <= 0 or g >= 1:
            return -math.inf if g <= 0 else math.inf
        w = float(stats.norm.ppf(g)) - z0
        if 1 + a * w <= 0:
            return -math.inf if w < 0 else math.inf
        return w / (1 + a * w) - z0

    # lower > 0 <=> P*(theta* <= 0) < beta(z_{alpha/2}); upper < 0 <=> P*(theta* >= 0) < 1 - beta(z_{1-alpha/2})
    p_lo = 2 * float(stats.norm.cdf(solve(float((boot <= 0).mean()))))
    p_hi = 2 * float(stats.norm.sf(solve(1 - float((boot >= 0).mean()))))
    p = min(1.0, p_lo, p_hi)
    return Interval(m, lo, hi, p, n, float(x.std(ddof=1)), level, f"BCa bootstrap, {n_resamples:,} resamples")


# --------------------------------------------------------------------------- multiple comparisons
def holm(pvalues) -> np.ndarray:
    """Holm-adjusted p-values. NaN entries are not tests (n < MIN_N, or the same difference in every
    unit): they are never rejected, stay NaN and do not count in m."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    if idx.size:
        order = idx[np.argsort(p[idx], kind="stable")]
        m = order.size
        adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
        out[order] = np.minimum(adj, 1.0)
    return out


def holm_levels(pvalues, alpha: float = ALPHA) -> np.ndarray:
    """The per-row alpha that Holm's step-down tests each row at: alpha/(m-k+1) for the k-th smallest
    p, and once a row is not rejected every later row keeps that row's alpha. Then raw p < level
    <=> Holm-adjusted p < alpha, row by row, so an interval at 1 - level agrees with the decision."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m, stop = order.size, None
    for k, i in enumerate(order):
        level = alpha / (m - k)
        if stop is None and p[i] >= level:
            stop = level
        out[i] = level if stop is None else stop
    return out


# --------------------------------------------------------------------------- power
def power_paired(effect: float, sd: float, n: int, alpha: float = ALPHA, df: float | None = None) -> float:
    """Power of a two-sided paired t-test (n units, SD of the differences `sd`) against `effect`; `df`: the
    t's degrees of freedom when not n-1 (the pooled level + seed model's (k-1)(n-1), `pooled_interval`)."""
    df, nc = (n - 1 if df is None or not math.isfinite(df) else df), abs(effect) / sd * math.sqrt(n)
    tc = stats.t.ppf(1 - alpha / 2, df)
    pw = float(stats.nct.sf(tc, df, nc) + stats.nct.cdf(-tc, df, nc))
    # scipy's nct returns NaN far in the tail (nc in the tens); there the normal approximation is exact
    # to many digits, and power is 1 for all practical purposes.
    return pw if math.isfinite(pw) else float(stats.norm.sf(tc - nc) + stats.norm.cdf(-tc - nc))


def mde(sd: float, n: int, alpha: float = ALPHA, power: float = POWER, df: float | None = None) -> float:
    """Smallest difference a two-sided paired t-test at `alpha` detects with `power` at n units; NaN when
    sd is 0 (the same difference in every unit measures no noise, so it bounds no hidden effect). `df`:
    the test's df when not n-1 (a pooled interval's `Interval.df`), `sd` then the SD it used."""
    if not (np.isfinite(sd) and sd > 0) or n < MIN_N:
        return float("nan")
    # Power rises monotonically in the effect: bracket by doubling (scipy's nct turns NaN far out in
    # the tail, so no fixed huge upper bound), then solve in units of one SD.
    hi = 1.0
    while power_paired(hi, 1.0, n, alpha, df) < power:
        hi *= 2
    return (
        float(optimize.brentq(lambda e: power_paired(e, 1.0, n, alpha, df) - power, 0.0, hi, xtol=1e-12)) * sd
    )


def seeds_needed(
    effect: float, sd: float, alpha: float = ALPHA, power: float = POWER, max_n: int = 10_000
) -> int | None:
    """Fewest units (>= MIN_N) for a paired t-test to detect `effect` with `power`; None beyond max_n."""
    if not (np.isfinite(effect) and effect != 0):
        raise StudyError(
            f"effect {effect!r} must be a non-zero number", field="--detect", allowed="e.g. 1pp, 0.01, 0.5"
        )
    if not (np.isfinite(sd) and sd > 0):
        raise StudyError(f"standard deviation {sd!r} must be positive", field="--sd", allowed="a number > 0")
    if power_paired(effect, sd, max_n, alpha) < power:
        return None
    lo, hi = MIN_N, max_n  # power rises with n: bisect for the first n that reaches it
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power_paired(effect, sd, mid, alpha) >= power else (mid + 1, hi)
    return lo


def parse_effect(text: str) -> tuple[float, bool]:
    """'1pp' -> (0.01, True) (percentage points of a score in [0, 1]); '0.5' -> (0.5, False)."""
    s = str(text).strip().lower()
    mt = re.fullmatch(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*(pp)?", s)
    if not mt:
        raise StudyError(
            f"cannot read effect {text!r}",
            field="--detect",
            allowed="a number in the metric's units (0.01, 0.5) or percentage points (1pp)",
        )
    v = float(mt.group(1))
    return (v / 100, True) if mt.group(2) else (v, False)


def detect_plan(
    effect_text: str,
    *,
    sd: float | None,
    measured: dict | None,
    bounded: bool,
    alpha: float = ALPHA,
    power: float = POWER,
    span: float = 1.0,
) -> dict:
    """`study plan --detect`: pre-training seeds a paired t-test needs to detect an effect.

    The SD of paired differences comes from `--sd` when given, else the study's own measurement
    (`measured`: the primary comparison's sd_diff and n from its aggregate), else the stated pilot
    default, which exists only for a score in [0, 1] (`bounded`). `span`: the widest difference a bounded
    metric allows (1 for a proportion, 2 for a correlation in [-1, 1])."""
    effect, in_pp = parse_effect(effect_text)
    if in_pp and not bounded:
        raise StudyError(
            f"{effect_text!r} is in percentage points but the primary metric is not a score in [0, 1]",
            field="--detect",
            allowed="a number in the metric's own units, e.g. 0.5",
        )
    if (
        bounded and abs(effect) > span
    ):  # 200pp on a proportion answered "3 seeds": no two levels differ so much
        raise StudyError(
            f"{effect_text!r} is wider than the metric's whole range",
            field="--detect",
            allowed=f"a difference of at most {100 * span:g}pp ({span:g} in the metric's units), e.g. 1pp",
        )
    if sd is not None:
        source, s = "--sd", float(sd)
    elif measured:
        source, s = f"measured in this study at n={measured['n']} seeds", float(measured["sd_diff"])
    elif bounded:
        source, s = "pilot default: no results yet, pass --sd to override", PILOT_SD_BOUNDED
    else:
        raise StudyError(
            "no measured SD yet and no pilot default for a metric outside [0, 1]",
            field="--sd",
            allowed="the SD of paired differences between pre-training seeds, in the metric's units",
        )
    return {
        "effect": abs(effect),
        "sd": s,
        "sd_source": source,
        "alpha": alpha,
        "power": power,
        "seeds": seeds_needed(effect, s, alpha, power),
    }
