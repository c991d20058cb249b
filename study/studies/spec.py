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
and is raised before anything is written.
"""
from __future__ import annotations

import copy
import difflib
import itertools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from study.config import CROSS_FIELD, SEEDS_ALLOWED, RunConfig, SeedList
from study.data.corpus import with_fingerprint
from study.downstream.tasks import get_task
from study.errors import StudyError
from study.metrics import parse_metric
from study.paths import Layout
from study.report import references
from study.rundir import RunDir
from study.studies.searchspec import SearchSpec
from study.studies.specyaml import clip, read_yaml, short


class ReportHints(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["nsp", "mask_rate", "replacement", "depth", "generic"] = "generic"
    primary_metric: str = "ref_ppl"
    x: str | None = None
    hue: str | None = None
    compare: dict[str, Any] | None = None  # {"factor": dotted key, "a": level, "b": level}
    references: list[str] = Field(default_factory=list)


class RunEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str
    set: dict[str, Any] = Field(default_factory=dict)


class SpecFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    question: str = ""
    base: str | None = None
    defaults: dict[str, Any] = Field(default_factory=dict)
    factors: dict[str, list[Any]] = Field(default_factory=dict)
    design: Literal["grid", "one_at_a_time"] = "grid"
    runs: list[RunEntry] = Field(default_factory=list)
    seeds: SeedList = Field(default_factory=lambda: [0], min_length=1)  # distinct, 0 <= seed < 2**32
    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    report: ReportHints = Field(default_factory=ReportHints)
    search: SearchSpec | None = None  # an optuna search over spec keys (study/search/)


@dataclass
class PlannedRun:
    label: str
    seed: int
    factors: dict[str, Any]
    config: RunConfig

    @property
    def run_hash(self) -> str:
        return self.config.run_hash()

    def status(self, layout: Layout) -> str:
        """pending | done | diverged | failed, read as study/rundir.py's policy says."""
        return RunDir(layout, self.run_hash).status().status


@dataclass
class Study:
    path: Path
    spec: SpecFile
    defaults: dict[str, Any]
    profile: str | None = None
    runs: list[PlannedRun] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The study's name; a profile is part of it (results/studies/nsp-cpu, reports/nsp-cpu)."""
        return f"{self.spec.name}-{self.profile}" if self.profile else self.spec.name

    def select(self, which: list[str] | None) -> list[PlannedRun]:
        """The runs the CLI's repeatable `--run` names, in the spec's order (None: every run). Each name is
        a run hash or a label; a label names every seed of it. One place for this rule: pretrain,
        finetune, rescore and curve all select through it."""
        if not which:
            return list(self.runs)
        known = {r.run_hash for r in self.runs} | {r.label for r in self.runs}
        bad = [w for w in which if w not in known]
        if bad:
            choices = [f"{r.run_hash} ({r.label}, seed {r.seed})" for r in self.runs]
            raise StudyError(f"no run with hash or label {bad[0]!r} in this spec", field="--run",
                             allowed=", ".join(choices))
        return [r for r in self.runs if r.run_hash in which or r.label in which]

    def plan_dict(self, layout: Layout) -> dict:
        """The input of aggregation: what was asked and which runs answer it."""
        r = self.spec.report
        # fine-tune seeds and tasks are not in the finetune_hash: the aggregate reads only these
        runs = [{"run_hash": p.run_hash, "label": p.label, "seed": p.seed, "factors": p.factors,
                 "status": p.status(layout),
                 "baseline_key": p.config.baseline_key() if p.config.finetune.baseline else None,
                 "finetune_seeds": list(p.config.finetune.seeds), "finetune_tasks": list(p.config.finetune.tasks)}
                for p in self.runs]
        return {"name": self.name, "question": self.spec.question, "kind": r.kind,
                "primary_metric": r.primary_metric, "x": r.x, "hue": r.hue, "compare": r.compare,
                "references": r.references, "spec": str(self.path), "profile": self.profile,
                "finetune_hash": self.runs[0].config.finetune_hash() if self.runs else None,
                "recipe": recipe_values([p.config for p in self.runs]), "runs": runs}


# The recipe a report's methods paragraph states (study.report.render.recipe_sentence): the settings a reader
# needs to know what was pre-trained and how it was fine-tuned, whether or not a factor varies them.
RECIPE_KEYS = ("model.arch", "model.layers", "model.hidden", "model.heads", "model.intermediate", "model.dropout",
               "model.init_range", "tokenizer.vocab_size", "objective.format", "objective.sentence",
               "objective.max_seq_len", "masking.rate", "masking.split", "masking.unit",
               "train.budget", "train.amount", "train.batch_size", "train.short_len", "train.short_fraction",
               "train.lr", "train.warmup", "train.schedule",
               "finetune.pooling", "finetune.lr", "finetune.epochs", "finetune.max_train_examples",
               "finetune.max_eval_examples", "finetune.seeds", "finetune.probe", "finetune.probe_layers")


def recipe_values(configs: list[RunConfig]) -> dict[str, list]:
    """{dotted key: its distinct values over the runs, in run order}: one value where every run shares it,
    several where a factor (or a run's `set`) varies it. masking.split is [mask, random, keep], kept together
    because the three only mean something as one split."""
    out: dict[str, list] = {}
    for key in RECIPE_KEYS:
        section, name = key.split(".")
        vals: list = []
        for cfg in configs:
            m = cfg.masking
            v = [m.mask, m.random, m.keep] if key == "masking.split" else getattr(getattr(cfg, section), name)
            if v not in vals:
                vals.append(v)
        out[key] = vals
    return out


# --------------------------------------------------------------------------- helpers (public: search uses them)
def known_keys() -> list[str]:
    """Every dotted key a spec may set, e.g. 'masking.rate'."""
    keys = ["seed"]
    for section, info in RunConfig.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += [f"{section}.{k}" for k in ann.model_fields]
    return keys


def suggest(word: str, options: list[str]) -> str:
    """'; did you mean X?' for the closest option, or '' when none is close."""
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def set_dotted(tree: dict, key: str, value: Any, source: str) -> None:
    """Set a dotted spec key (`masking.rate`) in a config tree; an unknown key is a StudyError."""
    known = known_keys()
    if key not in known:
        raise StudyError(f"unknown key{suggest(key, known)}", field=key, source=source,
                         allowed="dotted keys such as masking.rate, objective.sentence, model.layers")
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


def pydantic_error(err: ValidationError, source: str, prefix: str = "",
                   model: type[BaseModel] | None = None) -> StudyError:
    """The first error of a pydantic validation as a StudyError naming the dotted field and what is allowed."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
    msg, allowed = e["msg"], None
    if e["type"] == CROSS_FIELD:  # a rule between fields (config.py) names the field it blames itself
        loc, allowed = e["ctx"]["field"], e["ctx"]["allowed"]
    loc = f"{prefix}{loc}" if prefix else loc
    if e["type"] == "extra_forbidden":
        parent = loc.rsplit(".", 1)[0] if "." in loc else ""
        options = [k for k in known_keys() if k.startswith(parent + ".")] if parent else \
            list(SpecFile.model_fields) + list(RunConfig.model_fields)
        msg = f"unknown key{suggest(loc, options)}"
        allowed = ", ".join(o.rsplit(".", 1)[-1] for o in options)
    elif e["type"] == "literal_error":
        allowed = e["ctx"]["expected"]
        msg = f"got {short(e['input'])}"
    elif "ctx" in e and e["type"] in _BOUNDS:
        msg = f"got {short(e['input'])}: {msg}"
        allowed = " ".join(f"{_BOUNDS[t]} {e['ctx'][c]}" for t, c in _BOUND_CTX if c in e["ctx"])
    elif e["type"] not in (CROSS_FIELD, "missing") and "input" in e and not isinstance(e["input"], dict):
        msg = f"got {short(e['input'])}: {msg}"  # bounded: the input may be a whole (aliased) subtree
        if e["type"].endswith(_TYPE_ERRORS):  # pydantic names the type it wanted, not the field's range
            allowed = accepts(model, [p for p in e["loc"] if not str(p).startswith("function-")])
    if set(str(p) for p in e["loc"]) & _SEED_FIELDS:
        allowed = SEEDS_ALLOWED
    return StudyError(msg, field=loc or None, allowed=allowed, source=source)


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_BOUND_CTX = (("greater_than", "gt"), ("greater_than_equal", "ge"), ("less_than", "lt"), ("less_than_equal", "le"))
_SEED_FIELDS = {"seed", "seeds", "split_seed", "best_seeds"}
_TYPE_ERRORS = ("_parsing", "_type", "_from_float")
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


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


def build_run_config(defaults: dict, settings: dict[str, Any], seed: int, source: str) -> RunConfig:
    """The RunConfig of one run: the resolved `defaults` with the dotted `settings` set and `seed`.

    The one construction of a run from a spec: `load_study` builds every planned run with it and a
    search trial too (study/search/objective.py), so a trial with a grid run's values is that run.
    An unknown key or an invalid value is a StudyError naming the dotted field and `source`.
    """
    tree = copy.deepcopy(defaults)
    for key, value in settings.items():
        set_dotted(tree, key, value, source)
    tree["seed"] = seed
    try:
        cfg = RunConfig.model_validate(tree)
    except ValidationError as err:
        raise pydantic_error(err, source, model=RunConfig) from None
    return with_fingerprint(cfg, source)  # the corpus contents enter the run hash; a missing source fails here


# Keys a spec may not set: resolved from the files when runs are built (study/config.py says why).
RESOLVED_KEYS = ("corpus.fingerprint",)


def _reject_resolved_keys(spec: SpecFile, source: str) -> None:
    """A fingerprint written by hand would name data the files may not hold: refuse it wherever a spec
    can set a key (defaults, profiles, factors, runs, search parameters)."""
    where: list[tuple[str, dict]] = [("defaults.", {f"{sec}.{k}": v for sec, d in spec.defaults.items()
                                                     if isinstance(d, dict) for k, v in d.items()}),
                                     ("factors.", spec.factors)]
    where += [(f"profiles.{name}.", keys) for name, keys in spec.profiles.items()]
    where += [(f"runs[{i}].set.", run.set) for i, run in enumerate(spec.runs)]
    if spec.search is not None:
        where.append(("search.params.", spec.search.params))
    for prefix, keys in where:
        for key in RESOLVED_KEYS:
            if key in keys:
                raise StudyError("is computed from the corpus files when the runs are built, never written in a "
                                 "spec", field=prefix + key, source=source,
                                 allowed="corpus.sources and the other corpus keys; remove this one")


def _base_file(path: Path, spec: SpecFile) -> Path:
    """Where `base` points: a .yaml file, relative to the spec's folder. Checked before it is read."""
    src = str(path)
    if not spec.base or not spec.base.strip():
        raise StudyError("is empty", field="base", source=src, allowed="a spec file path relative to this spec")
    base = path.parent / spec.base
    if base.suffix not in (".yaml", ".yml"):
        raise StudyError(f"'{spec.base}' is not a spec file", field="base", source=src,
                         allowed="a .yaml / .yml spec file, relative to this spec's folder")
    if not base.exists():
        raise StudyError(f"base spec '{spec.base}' does not exist (looked at {base})", field="base", source=src,
                         allowed="an existing .yaml spec file, relative to this spec's folder")
    if not base.is_file():
        raise StudyError(f"'{spec.base}' is not a file ({base})", field="base", source=src,
                         allowed="a .yaml spec file, relative to this spec's folder")
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
    _reject_resolved_keys(spec, str(path))
    defaults: dict = {}
    profiles: dict = {}
    if spec.base is not None:
        base_path = _base_file(path, spec)
        try:
            base_spec, defaults = _resolve_defaults(base_path, (*chain, path))
        except StudyError as exc:
            if exc.source == str(base_path.resolve()) and exc.field is None:  # the file is not a spec at all
                raise StudyError(f"'{spec.base}' is not a readable spec: {exc.message}", field="base",
                                 source=str(path), allowed="a spec YAML mapping with at least `name`") from None
            if exc.field == "base" and exc.message.startswith("cycle of bases"):
                raise
            raise StudyError(f"{exc.message} (in the base of {path})", field=exc.field, allowed=exc.allowed,
                             source=exc.source) from None
        profiles = copy.deepcopy(base_spec.profiles)
    for section, keys in spec.defaults.items():
        if section not in RunConfig.model_fields:
            raise StudyError(f"unknown section{suggest(str(section), list(RunConfig.model_fields))}",
                             field=f"defaults.{clip(str(section))}", source=str(path),
                             allowed=", ".join(RunConfig.model_fields))
        # unknown keys here, so that a typo in a base names the base file (values are checked per run)
        model = RunConfig.model_fields[section].annotation
        if isinstance(keys, dict) and isinstance(model, type) and issubclass(model, BaseModel):
            for key in keys:
                if key not in model.model_fields:
                    raise StudyError(f"unknown key{suggest(f'{section}.{key}', known_keys())}",
                                     field=f"defaults.{section}.{clip(str(key))}", source=str(path),
                                     allowed=", ".join(model.model_fields))
    for name, settings in spec.profiles.items():
        profiles[name] = {**profiles.get(name, {}), **settings}
    spec.profiles = profiles
    return spec, _deep_merge(defaults, spec.defaults)


def _design_points(spec: SpecFile, source: str) -> list[tuple[str, dict[str, Any]]]:
    for key, levels in spec.factors.items():
        if not levels:
            raise StudyError("empty list of levels", field=f"factors.{key}", source=source)
        if len({repr(v) for v in levels}) != len(levels):
            raise StudyError("duplicate levels", field=f"factors.{key}", source=source)
        if key == "seed":
            raise StudyError("use `seeds:` for pre-training seeds, not a factor", field="factors.seed", source=source)
    points: list[tuple[str, dict[str, Any]]] = []
    keys = list(spec.factors)
    if keys and spec.design == "grid":
        for combo in itertools.product(*(spec.factors[k] for k in keys)):
            setting = dict(zip(keys, combo))
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
    dupes = {l for l in labels if labels.count(l) > 1}
    if dupes:
        raise StudyError(f"duplicate run labels {sorted(dupes)}", field="runs", source=source)
    return points


def _same_level(a: Any, b: Any) -> bool:
    """Level equality across the YAML -> JSON -> CSV round trip: 2 == 2.0, but 'nsp' != 'none'."""
    numeric = (int, float)
    if isinstance(a, numeric) and isinstance(b, numeric) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


# A factor key that changes nothing unless another setting has one of these values: varying it elsewhere
# trains identical models under different run hashes and compares noise with itself.
INERT_UNLESS = {"masking.span_p": ("masking.unit", ("span",)), "masking.span_max": ("masking.unit", ("span",)),
                "objective.short_seq_prob": ("objective.format", ("segment_pair",))}  # instances.target_len


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
                raise StudyError(f"has no effect in run '{short(run.label, 60)}': its {gov} is {have}, so the "
                                 f"runs that differ only here would be the same model", field=key,
                                 source=str(study.path), allowed=f"{gov}: {' or '.join(live)} in the runs that "
                                                                  f"set it, or drop {key} from the factors")


def check_one_finetune_recipe(first: PlannedRun, run: PlannedRun, source: str) -> None:
    """Every run of a study is fine-tuned with one recipe: the plan holds one finetune_hash and the aggregate
    reads results under it only, so a run with another would silently lose its fine-tune rows. Checked on
    every design point as it is built, before one that only changes fine-tuning is merged as the same run."""
    if first.config.finetune_hash() == run.config.finetune_hash():
        return
    fa, fb = first.config.finetune, run.config.finetune
    key = next((k for k in type(fa).model_fields
                if k not in ("seeds", "tasks", "glue_dir") and getattr(fa, k) != getattr(fb, k)), "recipe")
    raise StudyError(f"runs '{clip(first.label)}' ({short(getattr(fa, key, '...'), 40)}) and '{clip(run.label)}' "
                     f"({short(getattr(fb, key, '...'), 40)}) differ here: every run of a study is fine-tuned with one "
                     f"recipe (one finetune_hash), so the report would drop the other runs' fine-tune results",
                     field=f"finetune.{key}", source=source,
                     allowed="one value for every run (set it in defaults); vary it across specs")


def check_report_hints(study: Study) -> None:
    """report.x, hue, compare and primary_metric checked against what the study's runs will produce.

    The aggregate (study/report/aggregate.py `collect`) makes one column per factor key, i.e. every
    dotted key a design point sets, next to `label`; the figures draw against `x` among those columns
    (a search also against its searched keys), and `compare` pairs level `a` with level `b` of one
    column by pre-training seed. Checked here, a typo costs a second instead of a whole study: the
    aggregate would only find it after every run and fine-tuning, and stop with partial tables.
    """
    hints, source = study.spec.report, str(study.path)
    levels: dict[str, list[Any]] = {"label": []}
    for run in study.runs:
        for key, value in (("label", run.label), *run.factors.items()):
            if not any(_same_level(value, seen) for seen in levels.setdefault(key, [])):
                levels[key].append(value)
    columns = sorted(k for k in levels if k != "label") + ["label"]
    searched = list(study.spec.search.params) if study.spec.search is not None else []
    for name in ("x", "hue"):
        value = getattr(hints, name)
        if value is not None and value not in columns + searched:
            raise StudyError(f"'{short(value, 60)}' is not a factor of this study{suggest(value, columns + searched)}",
                             field=f"report.{name}", source=source, allowed=", ".join(columns + searched))
    if hints.compare is not None:
        _check_compare(hints.compare, levels, columns, source)
    tasks: dict[str, tuple[str, ...]] = {}
    for run in study.runs:
        tasks.update({t: get_task(t).metrics for t in run.config.finetune.tasks})
    metric = parse_metric(hints.primary_metric, field="report.primary_metric", source=source, tasks=tasks)
    if metric.name == "sentence_acc" and all(r.config.objective.sentence == "none" for r in study.runs):
        raise StudyError("no run has a sentence task (objective.sentence is none everywhere)",
                         field="report.primary_metric", source=source,
                         allowed="ref_ppl, ref_mlm_loss, ref_mlm_acc or a downstream TASK/MODE/METRIC")
    if metric.mode == "probe" and not any(r.config.finetune.probe for r in study.runs):
        raise StudyError(f"'{hints.primary_metric}' is a probe score but finetune.probe is false in every run",
                         field="report.primary_metric", source=source,
                         allowed=f"{metric.task}/finetune/{metric.name}, or set finetune.probe: true")


def _check_compare(compare: dict[str, Any], levels: dict[str, list[Any]], columns: list[str], source: str) -> None:
    for key in compare:
        if key not in ("factor", "a", "b"):
            raise StudyError(f"unknown key{suggest(str(key), ['factor', 'a', 'b'])}",
                             field=f"report.compare.{clip(str(key))}", source=source, allowed="factor, a, b")
    for key in ("factor", "a", "b"):
        if key not in compare:
            raise StudyError("missing: compare needs a factor and two of its levels", field=f"report.compare.{key}",
                             source=source, allowed="{factor: KEY, a: LEVEL, b: LEVEL}")
    factor = compare["factor"]
    if not isinstance(factor, str) or factor not in columns:
        raise StudyError(f"{short(factor, 60)} is not a factor of this study{suggest(str(factor), columns)}",
                         field="report.compare.factor", source=source, allowed=", ".join(columns))
    shown = ", ".join(short(v, 40) for v in levels[factor][:20]) + (" ..." if len(levels[factor]) > 20 else "")
    for key in ("a", "b"):
        if not any(_same_level(compare[key], v) for v in levels[factor]):
            raise StudyError(f"{short(compare[key], 60)} is not a level of {factor}", field=f"report.compare.{key}",
                             source=source, allowed=shown)
    if _same_level(compare["a"], compare["b"]):
        raise StudyError("a and b are the same level: the paired difference would be zero by construction",
                         field="report.compare.b", source=source, allowed=f"a level of {factor} other than a")


def load_study(path: str | Path, profile: str | None = None) -> Study:
    """Parse, resolve and validate a spec; every run's config is checked here, before any work."""
    path = Path(path)
    spec, defaults = _resolve_defaults(path)
    source = str(path)
    if profile is not None:
        if profile not in spec.profiles:
            raise StudyError(f"unknown profile '{profile}'", field="profiles", source=source,
                             allowed=", ".join(spec.profiles) or "(this spec defines none)")
        for key, value in spec.profiles[profile].items():
            set_dotted(defaults, key, value, source)
    known_refs = references.available()
    for ref in spec.report.references:
        if ref not in known_refs:
            raise StudyError(f"unknown paper reference {ref!r}{suggest(ref, known_refs)}",
                             field="report.references", source=source, allowed=", ".join(known_refs))
    study = Study(path=path, spec=spec, defaults=defaults, profile=profile)
    seen: dict[str, str] = {}
    for label, setting in _design_points(spec, source):
        for seed in spec.seeds:
            try:
                cfg = build_run_config(defaults, setting, seed, source)
            except StudyError as exc:
                where = f"run '{label}'" if setting else "defaults"
                raise StudyError(f"{exc} (in {where})") from None
            run = PlannedRun(label=label, seed=seed, factors=setting, config=cfg)
            check_one_finetune_recipe(study.runs[0] if study.runs else run, run, source)
            if run.run_hash in seen and spec.design == "one_at_a_time" and not spec.runs:
                continue  # a level equal to the base point is the base point
            if run.run_hash in seen and seen[run.run_hash] != label:
                raise StudyError(f"runs '{seen[run.run_hash]}' and '{label}' resolve to the same config",
                                 field="factors", source=source)
            seen[run.run_hash] = label
            study.runs.append(run)
    check_inert_factors(study)
    check_report_hints(study)
    return study
