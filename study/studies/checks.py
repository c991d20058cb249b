"""Checks of a study spec beyond its schema (split from spec.py, which builds the runs).

Spec-level checks (run on every file of a `base` chain, before any run is built): safe names, keys a spec
may not set (a fingerprint, a seed outside `seeds:`); finite numbers are the schema's (study/schema.py).
Study-level checks (on the built runs): factors that cannot change a run, one fine-tuning recipe, report
hints.
Each raises a StudyError naming the file, the dotted field and what is allowed.
"""

from __future__ import annotations

import difflib
from typing import Any

from study.downstream.tasks import get_task
from study.errors import StudyError
from study.levels import same_level  # the one level rule (spec.py imports it from here)
from study.metrics import ZEROSHOT_METRICS, parse_metric
from study.paths import SAFE_NAME_ALLOWED, safe_name
from study.studies.hints import COMPARE_KEYS
from study.studies.specfile import PlannedRun, SpecFile, Study
from study.studies.specyaml import clip, short


def suggest(word: str, options: list[str]) -> str:
    """'; did you mean X?' for the closest option, or '' when none is close."""
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


# Keys a spec may not set: resolved from the files when runs are built (study/config.py says why).
RESOLVED_KEYS = ("corpus.fingerprint",)


def reject_resolved_keys(spec: SpecFile, source: str) -> None:
    """A fingerprint written by hand would name data the files may not hold: refuse it wherever a spec
    can set a key (defaults, profiles, factors, runs, search parameters)."""
    where: list[tuple[str, dict]] = [
        (
            "defaults.",
            {
                f"{sec}.{k}": v
                for sec, d in spec.defaults.items()
                if isinstance(d, dict)
                for k, v in d.items()
            },
        ),
        ("factors.", spec.factors),
    ]
    where += [(f"profiles.{name}.", keys) for name, keys in spec.profiles.items()]
    where += [(f"runs[{i}].set.", run.set) for i, run in enumerate(spec.runs)]
    if spec.search is not None:
        where.append(("search.params.", spec.search.params))
    for prefix, keys in where:
        for key in RESOLVED_KEYS:
            if key in keys:
                raise StudyError(
                    "is computed from the corpus files when the runs are built, never written in a spec",
                    field=prefix + key,
                    source=source,
                    allowed="corpus.sources and the other corpus keys; remove this one",
                )


def check_names(spec: SpecFile, source: str) -> None:
    """`name` and every profile key name folders (results/studies/<name>-<profile>) and go into dvc.yaml's
    commands: one safe path component each, never `.` or `..` (which would write outside the roots)."""
    if not safe_name(spec.name):
        raise StudyError(
            f"{short(spec.name, 60)} is not a usable study name",
            field="name",
            source=source,
            allowed=SAFE_NAME_ALLOWED,
        )
    for key in spec.profiles:
        if not safe_name(key):
            raise StudyError(
                f"{short(key, 60)} is not a usable profile name",
                field=f"profiles.{clip(str(key))}",
                source=source,
                allowed=SAFE_NAME_ALLOWED,
            )


SEEDS_ONLY = "the spec's `seeds:` list"


def reject_seed_keys(spec: SpecFile, source: str) -> None:
    """Every run's seed comes from `seeds:` (load_study sets it last): a `seed` elsewhere was silently
    overwritten, so the runs were not the ones the spec asked for."""
    where = [("defaults.seed", spec.defaults), ("factors.seed", spec.factors)]
    where += [(f"profiles.{clip(str(p))}.seed", keys) for p, keys in spec.profiles.items()]
    where += [(f"runs[{i}].set.seed", run.set) for i, run in enumerate(spec.runs)]
    for field, keys in where:
        if "seed" in keys:
            raise StudyError(
                "use `seeds:` for pre-training seeds: every run's seed comes from there",
                field=field,
                source=source,
                allowed=SEEDS_ONLY,
            )


# A factor key that changes nothing unless another setting has one of these values: varying it elsewhere
# trains identical models under different run hashes and compares noise with itself.
INERT_UNLESS = {
    "masking.span_p": ("masking.unit", ("span",)),
    "masking.span_max": ("masking.unit", ("span",)),
    "objective.short_seq_prob": ("objective.format", ("segment_pair",)),
}  # instances.target_len


def check_inert_factors(study: Study) -> None:
    """A design point that sets an INERT_UNLESS key where its governing setting makes it inert is an error."""
    for run in study.runs:
        for key in run.factors:
            if key not in INERT_UNLESS:
                continue
            gov, live = INERT_UNLESS[key]
            section, name = gov.split(".")
            have = getattr(getattr(run.config, section), name)
            if have not in live:
                raise StudyError(
                    f"has no effect in run '{short(run.label, 60)}': its {gov} is {have}, so the "
                    f"runs that differ only here would be the same model",
                    field=key,
                    source=str(study.path),
                    allowed=f"{gov}: {' or '.join(live)} in the runs that "
                    f"set it, or drop {key} from the factors",
                )


def check_one_finetune_recipe(first: PlannedRun, run: PlannedRun, source: str) -> None:
    """Every run of a study is fine-tuned with one recipe: the plan holds one finetune_hash and the aggregate
    reads results under it only, so a run with another would silently lose its fine-tune rows. Checked on
    every design point as it is built, before one that only changes fine-tuning is merged as the same run."""
    if first.config.finetune_hash() == run.config.finetune_hash():
        return
    fa, fb = first.config.finetune, run.config.finetune
    key = next(
        (
            k
            for k in type(fa).model_fields
            if k not in ("seeds", "tasks", "glue_dir") and getattr(fa, k) != getattr(fb, k)
        ),
        "recipe",
    )
    raise StudyError(
        f"runs '{clip(first.label)}' ({short(getattr(fa, key, '...'), 40)}) and '{clip(run.label)}' "
        f"({short(getattr(fb, key, '...'), 40)}) differ here: every run of a study is fine-tuned with one "
        f"recipe (one finetune_hash), so the report would drop the other runs' fine-tune results",
        field=f"finetune.{key}",
        source=source,
        allowed="one value for every run (set it in defaults); vary it across specs",
    )


def check_report_hints(study: Study) -> None:
    """report.x, hue, compare and primary_metric checked against what the study's runs will produce.

    The aggregate (study/report/collect.py `collect`) makes one column per factor key, i.e. every
    dotted key a design point sets, next to `label`; the figures draw against `x` among those columns
    (a search also against its searched keys), and `compare` pairs its baseline with its treatment level of one
    column by pre-training seed. Checked here, a typo costs a second instead of a whole study: the
    aggregate would only find it after every run and fine-tuning, and stop with partial tables.
    """
    hints, source = study.spec.report, str(study.path)
    levels: dict[str, list[Any]] = {"label": []}
    for run in study.runs:
        for key, value in (("label", run.label), *run.factors.items()):
            if not any(same_level(value, seen) for seen in levels.setdefault(key, [])):
                levels[key].append(value)
    columns = sorted(k for k in levels if k != "label") + ["label"]
    searched = list(study.spec.search.params) if study.spec.search is not None else []
    for name in ("x", "hue"):
        value = getattr(hints, name)
        if value is not None and value not in columns + searched:
            raise StudyError(
                f"'{short(value, 60)}' is not a factor of this study{suggest(value, columns + searched)}",
                field=f"report.{name}",
                source=source,
                allowed=", ".join(columns + searched),
            )
    if hints.compare is not None:
        _check_compare(hints.compare, levels, columns, source)
    tasks: dict[str, tuple[str, ...]] = {}
    for run in study.runs:
        tasks.update({t: get_task(t).metrics for t in run.config.finetune.tasks})
        tasks.update({e: ZEROSHOT_METRICS[e] for e in run.config.zeroshot_hashes()})  # BLiMP, cross-sentence
    metric = parse_metric(hints.primary_metric, field="report.primary_metric", source=source, tasks=tasks)
    if metric.name == "sentence_acc" and all(r.config.objective.sentence == "none" for r in study.runs):
        raise StudyError(
            "no run has a sentence task (objective.sentence is none everywhere)",
            field="report.primary_metric",
            source=source,
            allowed="ref_ppl, ref_mlm_loss, ref_mlm_acc or a downstream TASK/MODE/METRIC",
        )
    if metric.mode == "probe" and not any(r.config.finetune.probe for r in study.runs):
        raise StudyError(
            f"'{hints.primary_metric}' is a probe score but finetune.probe is false in every run",
            field="report.primary_metric",
            source=source,
            allowed=f"{metric.task}/finetune/{metric.name}, or set finetune.probe: true",
        )


def _check_compare(
    compare: dict[str, Any], levels: dict[str, list[Any]], columns: list[str], source: str
) -> None:
    for key in compare:
        if key not in COMPARE_KEYS:
            raise StudyError(
                f"unknown key{suggest(str(key), list(COMPARE_KEYS))}",
                field=f"report.compare.{clip(str(key))}",
                source=source,
                allowed=", ".join(COMPARE_KEYS),
            )
    for key in COMPARE_KEYS:
        if key not in compare:
            raise StudyError(
                "missing: compare needs a factor and two of its levels",
                field=f"report.compare.{key}",
                source=source,
                allowed="{factor: KEY, baseline: LEVEL, treatment: LEVEL} (the answer: treatment minus baseline)",
            )
    factor = compare["factor"]
    if not isinstance(factor, str) or factor not in columns:
        raise StudyError(
            f"{short(factor, 60)} is not a factor of this study{suggest(str(factor), columns)}",
            field="report.compare.factor",
            source=source,
            allowed=", ".join(columns),
        )
    shown = ", ".join(short(v, 40) for v in levels[factor][:20]) + (
        " ..." if len(levels[factor]) > 20 else ""
    )
    for key in COMPARE_KEYS[1:]:
        if not any(same_level(compare[key], v) for v in levels[factor]):
            raise StudyError(
                f"{short(compare[key], 60)} is not a level of {factor}",
                field=f"report.compare.{key}",
                source=source,
                allowed=shown,
            )
    if same_level(compare["baseline"], compare["treatment"]):
        raise StudyError(
            "baseline and treatment are the same level: the paired difference would be zero by construction",
            field="report.compare.treatment",
            source=source,
            allowed=f"a level of {factor} other than the baseline",
        )
