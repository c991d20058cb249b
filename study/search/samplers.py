"""The sampler and the pruner of a search, from its spec (`search.sampler`, `search.pruner`)."""

from __future__ import annotations

import numpy as np
import optuna

from study.config import RunConfig
from study.search.configs import grid_values
from study.studies.searchspec import SearchSpec


def make_sampler(search: SearchSpec):
    s = search.sampler
    if s.kind == "grid":
        space = {k: grid_values(p) for k, p in search.params.items()}
        return optuna.samplers.GridSampler(space, seed=s.seed)
    if s.kind == "random":
        sampler = optuna.samplers.RandomSampler(seed=s.seed)
    else:
        # constant_liar: running trials count as bad guesses, so parallel workers spread out.
        sampler = optuna.samplers.TPESampler(
            seed=s.seed, n_startup_trials=s.n_startup_trials, constant_liar=True
        )
    return _seed_per_trial(sampler, s.seed)


def _seed_per_trial(sampler, seed: int):
    """Reseed the sampler's RNG from (seed, trial number) before each trial.

    One seed per worker would make N workers started together propose the same first points; one
    stream per trial number keeps the search reproducible for a given history and distinct across
    workers. (Touches optuna's private `_rng`, pinned in pyproject; tested in test_search.py.)
    """
    inner = sampler.before_trial

    def before_trial(study, trial):
        state = int(np.random.SeedSequence([seed, trial.number]).generate_state(1)[0])
        sampler._rng.rng.seed(state)
        rs = getattr(sampler, "_random_sampler", None)
        if rs is not None:
            rs._rng.rng.seed(state)
        inner(study, trial)

    sampler.before_trial = before_trial
    return sampler


def make_pruner(search: SearchSpec, base: RunConfig):
    """median/hyperband prune on the trainer's eval curve (`base` sizes hyperband's resource);
    wilcoxon prunes across pre-training seeds."""
    p = search.pruner
    if p.kind == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps
        )
    if p.kind == "hyperband":
        max_resource: int | str = int(base.train.amount) if base.train.budget == "steps" else "auto"
        return optuna.pruners.HyperbandPruner(
            min_resource=max(1, base.impl.eval_every),
            max_resource=max_resource,
            reduction_factor=p.reduction_factor,
        )
    if p.kind == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(p_threshold=p.p_threshold, n_startup_steps=p.n_startup_steps)
    return optuna.pruners.NopPruner()
