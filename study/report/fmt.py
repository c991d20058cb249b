"""How the report writes numbers: scores in percent, differences in percentage points (pp), intervals with their level.

Shared by the report's tables and sentences (render.py) and its paper comparisons (papers.py).
"""

from __future__ import annotations

from typing import Any

from study.metrics import finite, is_bounded
from study.report import stats as S


def fmt_value(x: Any, metric: str) -> str:
    """Scores in percent (one decimal), counts with separators, other values (perplexity, loss) one decimal
    from 10 up and two below: the same for a mean and the ends of its interval (111.0 [88.9, 132.0])."""
    return _number(x, metric, sign="", score_unit="")


def fmt_diff(x: Any, metric: str) -> str:
    """A difference with fmt_value's precision (so "+3.2" never stands beside a mean of "41.3" as "+3.21"),
    scores in pp."""
    return _number(x, metric, sign="+", score_unit=" pp")


def _number(x: Any, metric: str, sign: str, score_unit: str) -> str:
    """The one precision rule of fmt_value and fmt_diff; `sign` "+" writes the sign of positive values too."""
    if not finite(x):
        return "–"
    if is_bounded(metric):
        return f"{100 * x:{sign}.1f}{score_unit}"
    if metric in ("params", "tokens_seen", "tokens_per_s", "steps"):
        return f"{x:{sign},.0f}"
    if metric == "wall_s":
        return f"{x:{sign},.1f}"
    return f"{x:{sign}.1f}" if abs(x) >= 10 else f"{x:{sign}.2f}"


def fmt_ci(lo: Any, hi: Any, metric: str, diff: bool = False, level: Any = None) -> str:
    """[lo, hi]; the level is appended only when it is not 95% (a Holm-level interval)."""
    if not (finite(lo) and finite(hi)):
        return f"no interval (n<{S.MIN_N})"
    f = (lambda v: fmt_diff(v, metric).replace(" pp", "")) if diff else (lambda v: fmt_value(v, metric))
    at = f" at {100 * level:.4g}%" if finite(level) and abs(level - 0.95) > 1e-9 else ""
    return f"[{f(lo)}, {f(hi)}]{at}"


def human(n: Any) -> str:
    if not finite(n):
        return "unknown"
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.3g}"
