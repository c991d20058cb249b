"""Study specs: a YAML file in ablations/ -> a validated list of fully resolved runs.

A spec holds
  name, question        what the study asks (the report's first line)
  base                  another spec file (path relative to this one) whose `defaults` we start from
  defaults              per-section overrides of study/config.py's defaults (corpus, model, train, ...)
  factors               {dotted.key: [levels]} expanded by `design`: grid (full product) or one_at_a_time
  runs                  an explicit list instead of / besides factors: [{label: ..., set: {dotted.key: value}}]
  seeds                 pre-training seeds; every design point is trained once per seed
  profiles              {name: {dotted.key: value}}: e.g. `cpu` / `gpu` budgets, chosen with --profile
  report                hints for aggregation and the report (primary metric, x, hue, paired comparison)

Every error names the file and the dotted path, suggests the closest key for a typo,
and is raised before anything is written. The schema (SpecFile) and what loading gives (Study, PlannedRun)
are in specfile.py; the checks beyond the schema in checks.py.
"""

from __future__ import annotations

import copy
import itertools
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from study.config import RunConfig
from study.data.corpus import with_fingerprint
from study.errors import StudyError
from study.report import references
from study.schema import CROSS_FIELD, SEEDS_ALLOWED
from study.studies.checks import (
    check_inert_factors,
    check_names,
    check_one_finetune_recipe,
    check_report_hints,
    reject_resolved_keys,
    reject_seed_keys,
    same_level,
    suggest,
)
from study.studies.hints import canonical_compare
from study.studies.specfile import PlannedRun, SpecFile, Study
from study.studies.specyaml import clip, read_yaml, short


# --------------------------------------------------------------------------- helpers (public: search uses them)
def known_keys() -> list[str]:
    """Every dotted key a spec may set, e.g. 'masking.rate'."""
    keys = ["seed"]
    for section, info in RunConfig.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += [f"{section}.{k}" for k in ann.model_fields]
    return keys


def set_dotted(tree: dict, key: str, value: Any, source: str) -> None:
    """Set a dotted spec key (`masking.rate`) in a config tree; an unknown key is a StudyError."""
    known = known_keys()
    if key not in known:
        raise StudyError(
            f"unknown key{suggest(key, known)}",
            field=key,
            source=source,
            allowed="dotted keys such as masking.rate, objective.sentence, model.layers",
        )
    section, _, leaf = key.partition(".")
    if not leaf:
        tree[section] = value
        return
    tree.setdefault(section, {})
    if not isinstance(tree[section], dict):
        raise StudyError("must be a mapping", field=section, source=source)
    tree[section][leaf] = value


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def pydantic_error(
    err: ValidationError, source: str, prefix: str = "", model: type[BaseModel] | None = None
) -> StudyError:
    """The first error of a pydantic validation as a StudyError naming the dotted field and what is allowed."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
    msg, allowed = e["msg"], None
    if e["type"] == CROSS_FIELD:  # a rule between fields (config.py) names the field it blames itself
        loc, allowed = e["ctx"]["field"], e["ctx"]["allowed"]
    loc = f"{prefix}{loc}" if prefix else loc
    parts = [p for p in e["loc"] if not str(p).startswith("function-")]
    if e["type"] == "extra_forbidden":
        parent = loc.rsplit(".", 1)[0] if "." in loc else ""
        fields = _fields_at(model, parts)  # the keys of the section the unknown key sits in
        options = (
            [f"{parent}.{f}" if parent else f for f in fields]
            if fields is not None
            else [k for k in known_keys() if k.startswith(parent + ".")]
            if parent
            else list(SpecFile.model_fields)
        )
        msg = f"unknown key{suggest(loc, options)}"
        allowed = ", ".join(o.rsplit(".", 1)[-1] for o in options)
    elif e["type"] == "literal_error":
        allowed = e["ctx"]["expected"]
        msg = f"got {short(e['input'])}"
    elif "ctx" in e and e["type"] in _BOUNDS:
        msg = f"got {short(e['input'])}: {msg}"  # both bounds where the field has two (0 < rate < 1)
        allowed = accepts(model, parts) or " ".join(
            f"{_BOUNDS[t]} {e['ctx'][c]}" for t, c in _BOUND_CTX if c in e["ctx"]
        )
    elif e["type"] not in (CROSS_FIELD, "missing") and "input" in e and not isinstance(e["input"], dict):
        msg = f"got {short(e['input'])}: {msg}"  # bounded: the input may be a whole (aliased) subtree
        if e["type"].endswith(_TYPE_ERRORS):  # pydantic names the type it wanted, not the field's range
            allowed = accepts(model, parts)
        elif e["type"] == "finite_number":  # .inf / .nan (study/schema.py's Strict models refuse them)
            allowed = (accepts(model, parts) or "a number").replace("a number", "a finite number", 1)
    if set(str(p) for p in e["loc"]) & _SEED_FIELDS:
        allowed = SEEDS_ALLOWED
    return StudyError(msg, field=loc or None, allowed=allowed, source=source)


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_BOUND_CTX = (
    ("greater_than", "gt"),
    ("greater_than_equal", "ge"),
    ("less_than", "lt"),
    ("less_than_equal", "le"),
)
_SEED_FIELDS = {"seed", "seeds", "split_seed", "best_seeds"}
_TYPE_ERRORS = ("_parsing", "_type", "_from_float")
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _fields_at(model: Any, loc: list) -> list[str] | None:
    """The field names of the model holding loc's last key (through nested models, lists, dicts and
    optionals); None where the path leaves the models."""
    ann, parts = model, list(loc[:-1])
    while True:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if typing.get_origin(ann) in (list, dict):
            if not parts:
                return None
            ann, parts = args[-1], parts[1:]  # past an index or a key
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            if not parts:
                return list(ann.model_fields)
            if str(parts[0]) not in ann.model_fields:
                return None
            ann, parts = ann.model_fields[str(parts[0])].annotation, parts[1:]
        elif typing.get_origin(ann) is not None and len(args) == 1:  # X | None
            ann = args[0]
        else:
            return None


def accepts(model: type[BaseModel] | None, loc: list) -> str | None:
    """What the field at `loc` of `model` accepts, from its annotation and bounds (\"an integer >= 1 and
    <= 48\"); None where the path leaves the models or the type is not a plain scalar."""
    info = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not isinstance(fields, dict) or str(part) not in fields:
            return None
        info = fields[str(part)]
        model = info.annotation
    if info is None:
        return None
    args = [a for a in typing.get_args(info.annotation) if a is not type(None)]
    optional = len(args) == 1 and type(None) in typing.get_args(info.annotation)
    kind = _KINDS.get(args[0] if optional else info.annotation)
    if kind is None:
        return None
    bounds = [f"{_BOUNDS[t]} {getattr(m, c)}" for m in info.metadata for t, c in _BOUND_CTX if hasattr(m, c)]
    text = kind + (" " + " and ".join(bounds) if bounds else "")
    return text + (", or null" if optional else "")


def build_run_config(
    defaults: dict, settings: dict[str, Any], seed: int, source: str, fingerprint: bool = True
) -> RunConfig:
    """The RunConfig of one run: the resolved `defaults` with the dotted `settings` set and `seed`.

    The one construction of a run from a spec: `load_study` builds every planned run with it and a
    search trial too (study/search/objective.py), so a trial with a grid run's values is that run.
    An unknown key or an invalid value is a StudyError naming the dotted field and `source`.
    fingerprint=False leaves corpus.fingerprint unset (no file read): for checking values only.
    """
    tree = copy.deepcopy(defaults)
    for key, value in settings.items():
        set_dotted(tree, key, value, source)
    tree["seed"] = seed
    try:
        cfg = RunConfig.model_validate(tree)
    except ValidationError as err:
        raise pydantic_error(err, source, model=RunConfig) from None
    if not fingerprint:
        return cfg
    return with_fingerprint(
        cfg, source
    )  # the corpus contents enter the run hash; a missing source fails here


def _base_file(path: Path, spec: SpecFile) -> Path:
    """Where `base` points: a .yaml file, relative to the spec's folder. Checked before it is read."""

    def bad(message: str, allowed: str) -> StudyError:
        return StudyError(message, field="base", source=str(path), allowed=allowed)

    if not spec.base or not spec.base.strip():
        raise bad("is empty", "a spec file path relative to this spec")
    base = path.parent / spec.base
    if base.suffix not in (".yaml", ".yml"):
        raise bad(
            f"'{spec.base}' is not a spec file", "a .yaml / .yml spec file, relative to this spec's folder"
        )
    if not base.exists():
        raise bad(
            f"base spec '{spec.base}' does not exist (looked at {base})",
            "an existing .yaml spec file, relative to this spec's folder",
        )
    if not base.is_file():
        raise bad(
            f"'{spec.base}' is not a file ({base})", "a .yaml spec file, relative to this spec's folder"
        )
    return base


def _resolve_defaults(path: Path, chain: tuple[Path, ...] = ()) -> tuple[SpecFile, dict]:
    """Read a spec and fold its `base` chain into one defaults tree (cycles rejected).

    Profiles are inherited too: a base's `cpu` profile applies unless the spec redefines keys of it.
    The returned SpecFile carries the merged profiles. An error inside a base names the base file and
    its field, and says which spec's `base` led there."""
    try:
        path = path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise StudyError(f"cannot resolve the path ({exc})", source=str(path)) from None
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise StudyError(f"cycle of bases: {cycle}", field="base", source=str(chain[0]))
    raw = read_yaml(path)
    try:
        spec = SpecFile.model_validate(raw)
    except ValidationError as err:
        raise pydantic_error(err, str(path), model=SpecFile) from None
    for check in (check_names, reject_resolved_keys, reject_seed_keys):
        check(spec, str(path))
    defaults: dict = {}
    profiles: dict = {}

    def unknown(what: str, name: str, options: list[str], field: str, allowed: str) -> StudyError:
        return StudyError(
            f"unknown {what}{suggest(name, options)}", field=field, source=str(path), allowed=allowed
        )

    if spec.base is not None:
        base_path = _base_file(path, spec)
        try:
            base_spec, defaults = _resolve_defaults(base_path, (*chain, path))
        except StudyError as exc:
            if exc.source == str(base_path.resolve()) and exc.field is None:  # the file is not a spec at all
                raise StudyError(
                    f"'{spec.base}' is not a readable spec: {exc.message}",
                    field="base",
                    source=str(path),
                    allowed="a spec YAML mapping with at least `name`",
                ) from None
            if exc.field == "base" and exc.message.startswith("cycle of bases"):
                raise
            raise exc.replace(message=f"{exc.message} (in the base of {path})") from None
        profiles = copy.deepcopy(base_spec.profiles)
    for section, keys in spec.defaults.items():
        if section not in RunConfig.model_fields:
            sections = list(RunConfig.model_fields)
            raise unknown(
                "section", str(section), sections, f"defaults.{clip(str(section))}", ", ".join(sections)
            )
        # unknown keys here, so that a typo in a base names the base file (values are checked per run)
        model = RunConfig.model_fields[section].annotation
        if isinstance(keys, dict) and isinstance(model, type) and issubclass(model, BaseModel):
            for key in keys:
                if key not in model.model_fields:
                    field = f"defaults.{section}.{clip(str(key))}"
                    raise unknown(
                        "key", f"{section}.{key}", known_keys(), field, ", ".join(model.model_fields)
                    )
    known = known_keys()
    for name, settings in spec.profiles.items():
        # here, so that a typo in a profile no command selects still fails, naming its file
        for key in settings:
            if key not in known:
                field = f"profiles.{name}.{clip(str(key))}"
                raise unknown("key", str(key), known, field, "dotted keys such as masking.rate, model.layers")
        profiles[name] = {**profiles.get(name, {}), **settings}
    spec.profiles = profiles
    return spec, _deep_merge(defaults, spec.defaults)


def _design_points(spec: SpecFile, source: str) -> list[tuple[str, dict[str, Any]]]:
    if "runs" in spec.model_fields_set and not spec.runs:  # it planned the base run alone, silently
        raise StudyError(
            "an empty list names no run",
            field="runs",
            source=source,
            allowed="one or more {label, set} entries, or no `runs:` key (then `factors`, or the base run)",
        )
    for key, levels in spec.factors.items():
        if not levels:
            raise StudyError("empty list of levels", field=f"factors.{key}", source=source)
        for i, v in enumerate(
            levels
        ):  # 1 and 1.0 are one level once resolved (as aggregate rows compare them too)
            j = next((j for j in range(i) if same_level(levels[j], v)), None)
            if j is not None:
                raise StudyError(
                    f"levels {short(levels[j], 40)} and {short(v, 40)} are equal once resolved: the same "
                    "runs twice",
                    field=f"factors.{key}",
                    source=source,
                    allowed="distinct values",
                )
    points: list[tuple[str, dict[str, Any]]] = []
    keys = list(spec.factors)
    if keys and spec.design == "grid":
        for combo in itertools.product(*(spec.factors[k] for k in keys)):
            setting = dict(zip(keys, combo, strict=True))
            points.append((",".join(f"{k}={v}" for k, v in setting.items()), setting))
    elif keys:  # one_at_a_time: the base point, then each level of each factor alone
        points.append(("base", {}))
        for k in keys:
            for v in spec.factors[k]:
                points.append((f"{k}={v}", {k: v}))
    for entry in spec.runs:
        points.append((entry.label, dict(entry.set)))
    if not points:
        points.append(("base", {}))
    labels = [p[0] for p in points]
    dupes = {lb for lb in labels if labels.count(lb) > 1}
    if dupes:
        raise StudyError(f"duplicate run labels {sorted(dupes)}", field="runs", source=source)
    return points


def _same_run(first: tuple[str, dict], second: tuple[str, dict], spec: SpecFile, source: str) -> None:
    """Two design points that build one config: name the factor whose levels collapse where it is one."""
    (la, a), (lb, b) = first, second
    keys = [k for k in {**a, **b} if k not in a or k not in b or a[k] != b[k]]
    if len(keys) == 1 and keys[0] in spec.factors:
        raise StudyError(
            f"levels {short(a.get(keys[0]), 40)} and {short(b.get(keys[0]), 40)} give the same run "
            f"config (runs '{la}' and '{lb}'): another setting makes this key inert, or the value "
            "is normalised to another level",
            field=f"factors.{keys[0]}",
            source=source,
            allowed="levels that change the run",
        )
    raise StudyError(
        f"runs '{la}' and '{lb}' resolve to the same config",
        field="factors",
        source=source,
        allowed="design points that differ in the run",
    )


def load_study(path: str | Path, profile: str | None = None, fingerprint: bool = True) -> Study:
    """Parse, resolve and validate a spec; every run's config is checked here, before any work.
    fingerprint=False: every check but the corpus files' (their fingerprint stays unset, so do the hashes)."""
    path = Path(path)
    spec, defaults = _resolve_defaults(path)
    source = str(path)
    if profile is not None:
        if profile not in spec.profiles:
            raise StudyError(
                f"unknown profile '{profile}'",
                field="profiles",
                source=source,
                allowed=", ".join(spec.profiles) or "(this spec defines none)",
            )
        for key, value in spec.profiles[profile].items():
            set_dotted(defaults, key, value, source)
    spec.report.compare = canonical_compare(spec.report.compare, source)  # a/b: deprecated names
    spec.report.compare = canonical_compare(spec.report.compare, source)  # a/b: deprecated names
    known_refs = references.available()
    for ref in spec.report.references:
        if ref not in known_refs:
            raise StudyError(
                f"unknown paper reference {ref!r}{suggest(ref, known_refs)}",
                field="report.references",
                source=source,
                allowed=", ".join(known_refs),
            )
    study = Study(path=path, spec=spec, defaults=defaults, profile=profile)
    seen: dict[str, tuple[str, dict]] = {}
    for label, setting in _design_points(spec, source):
        for seed in spec.seeds:
            try:
                cfg = build_run_config(defaults, setting, seed, source, fingerprint)
            except StudyError as exc:
                where = f"run '{label}'" if setting else "defaults"
                if profile is not None and exc.field in spec.profiles[profile] and exc.field not in setting:
                    raise StudyError(
                        f"{exc.message} (in {where}, set by profile {profile})",
                        allowed=exc.allowed,
                        field=f"profiles.{profile}.{exc.field}",
                        source=exc.source,
                    ) from None
                raise StudyError(f"{exc} (in {where})") from None
            run = PlannedRun(label=label, seed=seed, factors=setting, config=cfg)
            check_one_finetune_recipe(study.runs[0] if study.runs else run, run, source)
            if run.run_hash in seen and spec.design == "one_at_a_time" and not spec.runs:
                continue  # a level equal to the base point is the base point
            if run.run_hash in seen and seen[run.run_hash][0] != label:
                _same_run(seen[run.run_hash], (label, setting), spec, source)
            seen[run.run_hash] = (label, setting)
            study.runs.append(run)
    check_inert_factors(study)
    check_report_hints(study)
    return study
