"""A search's space -> RunConfigs: sampled values, the replacement-split coordinates, a trial's config.

A trial is built by study/studies/spec.py's `build_run_config`, the very construction `load_study` uses
for a planned run, so a trial with a grid run's values hashes to that run and reuses its folder.
"""
from __future__ import annotations

import copy
import math
from typing import Any

from study.config import RunConfig
from study.studies.searchspec import SPLIT_KEYS, ParamSpec
from study.studies.spec import Study, build_run_config


def tidy(v: float) -> float:
    """Round away float noise (0.15000000000000002 -> 0.15) so a trial hashes like the grid's run."""
    return float(f"{v:.10g}")


def tidy_params(params: dict) -> dict:
    return {k: tidy(v) if isinstance(v, float) else v for k, v in params.items()}


def grid_values(p: ParamSpec) -> list[Any]:
    """Every value of a dimension on a grid (a float range needs a step)."""
    if p.type == "categorical":
        return list(p.choices)
    if p.type == "int":
        return list(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
    n = int(math.floor((p.high - p.low) / p.step + 1e-9))
    return [tidy(p.low + i * p.step) for i in range(n + 1)]


def corners(p: ParamSpec) -> list[Any]:
    """The values that bound a dimension: if both ends give valid runs, so does everything between."""
    if p.type == "categorical":
        return list(p.choices)
    values = grid_values(p) if p.step is not None or p.type == "int" else [p.low, p.high]
    return [values[0], values[-1]]


def base_point(params: dict[str, ParamSpec]) -> dict[str, Any]:
    """Each dimension at its first corner: the search's reference point (probes, pruner sizing)."""
    return {k: corners(p)[0] for k, p in params.items()}


def resolve_settings(params: dict[str, Any], defaults: dict) -> dict[str, Any]:
    """Sampled params -> real dotted spec keys. The split coordinates become masking.mask/random/keep.

    mask = split.mask; random = (1 - mask) * split.random_share; keep = the rest. Rounded to 6 places so
    mask + random + keep sums to 1 within config.py's tolerance and (0.8, 0.5) hashes as 0.8/0.1/0.1.
    """
    settings = {k: v for k, v in params.items() if k not in SPLIT_KEYS}
    if any(k in params for k in SPLIT_KEYS):
        base = RunConfig.model_validate(copy.deepcopy(defaults)).masking
        rest0 = base.random + base.keep
        mask = float(params.get(SPLIT_KEYS[0], base.mask))
        share = float(params.get(SPLIT_KEYS[1], base.random / rest0 if rest0 > 0 else 0.5))
        mask = round(mask, 6)
        random = round((1.0 - mask) * share, 6)
        keep = round(1.0 - mask - random, 6)
        settings.update({"masking.mask": mask, "masking.random": random, "masking.keep": keep})
    return settings


def trial_config(study: Study, settings: dict[str, Any], seed: int) -> RunConfig:
    """The RunConfig of one trial: exactly what `load_study` builds for a run with `set: settings`."""
    return build_run_config(study.defaults, settings, seed, str(study.path))
