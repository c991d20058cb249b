"""The learning-rate schedule of pre-training, as a function of budget progress.

Progress is steps/amount, tokens/amount or seconds/amount (train.budget), so the schedule follows the
budget whatever unit it is given in: a tokens budget decays over tokens, a seconds budget over time.
"""

from __future__ import annotations

import math

from study.config import RunConfig


class Schedule:
    """LR factor as a function of budget progress p in [0, 1]: linear warmup, then linear/cosine/constant.

    Warmup uses the progress after the update (the first step gets a small, non-zero LR); decay
    uses the progress before it. A seconds budget estimates a step's progress by the step before it, so
    there a run's very first step has LR 0 (nothing is known of its length yet): it only feeds AdamW's
    moments, and it is the same in every run of the study.
    """

    def __init__(self, kind: str, warmup: float):
        self.kind, self.warmup = kind, warmup

    def factor(self, p_before: float, p_after: float) -> float:
        w = self.warmup
        if w > 0 and p_before < w:
            return min(1.0, p_after / w)
        q = min(max((p_before - w) / (1.0 - w), 0.0), 1.0)
        if self.kind == "linear":
            return 1.0 - q
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * q))
        return 1.0


def budget_progress(cfg: RunConfig, steps: int, tokens: int, seconds: float) -> float:
    """How much of the budget is spent: steps/ceil(amount), tokens/amount or seconds/amount."""
    t = cfg.train
    done = {"steps": steps, "tokens": tokens, "seconds": seconds}[t.budget]
    return done / (math.ceil(t.amount) if t.budget == "steps" else t.amount)


def lr_curve(cfg: RunConfig, steps: int | None = None) -> list[float]:
    """The LR of every step of a `steps` budget (for plots and the schedule test)."""
    n = steps or math.ceil(cfg.train.amount)
    s = Schedule(cfg.train.schedule, cfg.train.warmup)
    return [cfg.train.lr * s.factor(i / n, (i + 1) / n) for i in range(n)]
