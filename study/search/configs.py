"""A search's space -> RunConfigs: sampled values, the replacement-split coordinates, a trial's config.

A trial is built by study/studies/spec.py's `build_run_config`, the very construction `load_study` uses
for a planned run, so a trial with a grid run's values hashes to that run and reuses its folder.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from study.config import SEMANTIC_SECTIONS, RunConfig
from study.io import hash_obj
from study.metrics import PRETRAIN_METRICS
from study.studies.searchspec import SPLIT_KEYS, ParamSpec, SearchSpec
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


def search_fingerprint(study: Study, search: SearchSpec) -> dict[str, str]:
    """What a storage's trials were run for, one hash per spec field an error names: the space
    (`search.params`), the pre-training seeds (`search.seeds`), and everything else a trial's value
    depends on (`defaults`: the base trial's resolved config, base chain, profile and corpus contents
    included, without the searched keys and the seed; the fine-tuning recipe only for a downstream
    objective). The optuna study keeps it from its creation (user attr `fingerprint`): trials of a
    narrowed range or of other defaults are another search, whose best `search-best` must not report."""
    settings = resolve_settings(base_point(search.params), study.defaults)
    dump = trial_config(study, settings, search.seeds[0]).model_dump(mode="json")
    sections = [*SEMANTIC_SECTIONS]
    if any(m not in PRETRAIN_METRICS for m in search.terms):
        sections.append("finetune")
        dump["finetune"] = {k: v for k, v in dump["finetune"].items() if k not in ("glue_dir", "tasks")}
    rest = {k: dump[k] for k in sections}
    for key in settings:  # the searched keys (the split coordinates as masking.mask/random/keep)
        *parents, leaf = key.split(".")
        node = rest
        for part in parents:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return {
        "search.params": hash_obj({k: p.model_dump(mode="json") for k, p in sorted(search.params.items())}),
        "search.seeds": hash_obj(list(search.seeds)),
        "defaults": hash_obj(rest),
    }
