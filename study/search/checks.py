"""`load_search`: a spec with a `search:` block, checked before any training.

Every check names the dotted field (`search.params.masking.rate`, `search.objective`, ...) and raises
StudyError, so `study validate` and `study search` exit 2 with nothing written: unknown keys, ranges
whose extremes give an invalid run (or one the trainer refuses), an objective no trial's run produces,
a step pruner without intermediate evaluations.
"""

from __future__ import annotations

from pathlib import Path

from study.config import RunConfig
from study.downstream.tasks import TASKS
from study.errors import StudyError
from study.metrics import PRETRAIN_METRICS, parse_metric
from study.pretrain.checks import check_config  # what the trainer itself would refuse at runtime
from study.search.configs import base_point, corners, resolve_settings, trial_config
from study.studies.checks import suggest
from study.studies.searchspec import SPLIT_KEYS, SearchSpec
from study.studies.spec import Study, known_keys, load_study


def load_search(path: str | Path, profile: str | None = None) -> tuple[Study, SearchSpec]:
    """Load a spec with a `search:` block and check everything that can be checked before training."""
    study = load_study(path, profile=profile)
    search = study.spec.search
    source = str(path)
    if search is None:
        raise StudyError(
            "this spec has no `search:` block",
            field="search",
            source=source,
            allowed="search: {params: {dotted.key: {low, high} | [choices]}, objective, ...}",
        )
    known = known_keys()
    for key in search.params:
        field = f"search.params.{key}"
        if key == "seed":
            raise StudyError(
                "pre-training seeds are `search.seeds`, not a parameter", field=field, source=source
            )
        if key not in known and key not in SPLIT_KEYS:
            raise StudyError(
                f"unknown key{suggest(key, known + list(SPLIT_KEYS))}",
                field=field,
                source=source,
                allowed="dotted keys such as masking.rate, train.lr, " + ", ".join(SPLIT_KEYS),
            )
    if any(k in search.params for k in SPLIT_KEYS) and any(
        k in search.params for k in ("masking.mask", "masking.random", "masking.keep")
    ):
        raise StudyError(
            "search the replacement split either through masking.split.* or masking.mask/random/keep,"
            " not both",
            field="search.params",
            source=source,
        )
    if search.n_trials is None and search.timeout is None and search.sampler.kind != "grid":
        raise StudyError(
            "a search needs an end: set n_trials and/or timeout", field="search.n_trials", source=source
        )
    if search.sampler.kind == "grid":
        for key, p in search.params.items():
            if p.type == "float" and p.step is None:
                raise StudyError(
                    "the grid sampler needs a `step` (or a list of choices)",
                    field=f"search.params.{key}",
                    source=source,
                )
    probes = probe_configs(study, search, source)
    base = probes[0]
    if search.pruner.kind in ("median", "hyperband") and base.impl.eval_every == 0:
        raise StudyError(
            f"the {search.pruner.kind} pruner needs intermediate evaluations: set "
            "defaults.impl.eval_every > 0",
            field="search.pruner.kind",
            source=source,
            allowed="wilcoxon (across seeds), none",
        )
    check_objective(search, probes, source)
    for cfg in probes:
        try:
            check_config(cfg)
        except StudyError as exc:
            raise StudyError(
                f"gives a run the trainer refuses: {exc}", field="search.params", source=source
            ) from None
    return study, search


def probe_configs(study: Study, search: SearchSpec, source: str) -> list[RunConfig]:
    """Validate each dimension's extreme values (others at their first corner); first = the base point."""
    first = base_point(search.params)
    out = [_checked_config(study, first, search.seeds[0], source, "search.params")]
    for key, p in search.params.items():
        for value in corners(p)[1:]:
            out.append(
                _checked_config(
                    study,
                    {**first, key: value},
                    search.seeds[0],
                    source,
                    f"search.params.{key}",
                    f" (at {key}={value!r})",
                )
            )
    return out


def _checked_config(
    study: Study, params: dict, seed: int, source: str, field: str, where: str = ""
) -> RunConfig:
    try:
        return trial_config(study, resolve_settings(params, study.defaults), seed)
    except StudyError as exc:
        raise StudyError(f"gives an invalid run{where}: {exc}", field=field, source=source) from None


def check_objective(search: SearchSpec, probes: list[RunConfig], source: str) -> None:
    """Every objective term must be something every trial's run produces."""
    field = "search.objective"
    tasks = {name: t.metrics for name, t in TASKS.items()}
    for term in search.terms:
        metric = parse_metric(term, field=field, source=source, pretrain=PRETRAIN_METRICS, tasks=tasks)
        if (
            metric.name == "sentence_acc"
            and metric.is_pretrain
            and any(c.objective.sentence == "none" for c in probes)
        ):
            raise StudyError(
                "sentence_acc is null for runs without a sentence task (objective.sentence: none)",
                field=field,
                source=source,
            )
        if metric.mode == "probe" and not all(c.finetune.probe for c in probes):
            raise StudyError(
                f"'{term}' needs the probe: set defaults.finetune.probe: true", field=field, source=source
            )
