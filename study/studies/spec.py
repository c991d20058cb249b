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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from study.config import RunConfig
from study.errors import StudyError
from study.paths import Layout
from study.report import references
from study.studies.searchspec import SearchSpec


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
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    report: ReportHints = Field(default_factory=ReportHints)
    search: SearchSpec | None = None  # an optuna search over spec keys (study/search/search.py)


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
        path = layout.run_dir(self.run_hash) / "status.json"
        if not path.exists():
            return "pending"
        import json
        try:
            return json.loads(path.read_text())["status"]
        except (ValueError, KeyError):
            return "pending"


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

    def plan_dict(self, layout: Layout) -> dict:
        """The input of aggregation: what was asked and which runs answer it."""
        r = self.spec.report
        from study.downstream.finetune import baseline_key  # lazy: spec parsing must not import torch
        runs = [{"run_hash": p.run_hash, "label": p.label, "seed": p.seed, "factors": p.factors,
                 "status": p.status(layout),
                 "baseline_key": baseline_key(p.config) if p.config.finetune.baseline else None}
                for p in self.runs]
        return {"name": self.name, "question": self.spec.question, "kind": r.kind,
                "primary_metric": r.primary_metric, "x": r.x, "hue": r.hue, "compare": r.compare,
                "references": r.references, "spec": str(self.path), "profile": self.profile,
                "finetune_hash": self.runs[0].config.finetune_hash() if self.runs else None,
                "runs": runs}


# --------------------------------------------------------------------------- helpers
def _known_keys() -> list[str]:
    """Every dotted key a spec may set, e.g. 'masking.rate'."""
    keys = ["seed"]
    for section, info in RunConfig.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += [f"{section}.{k}" for k in ann.model_fields]
    return keys


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _set_dotted(tree: dict, key: str, value: Any, source: str) -> None:
    known = _known_keys()
    if key not in known:
        raise StudyError(f"unknown key{_suggest(key, known)}", field=key, source=source,
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


def _pydantic_error(err: ValidationError, source: str, prefix: str = "") -> StudyError:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
    loc = f"{prefix}{loc}" if prefix else loc
    msg, allowed = e["msg"], None
    if e["type"] == "extra_forbidden":
        parent = loc.rsplit(".", 1)[0] if "." in loc else ""
        options = [k for k in _known_keys() if k.startswith(parent + ".")] if parent else \
            list(SpecFile.model_fields) + list(RunConfig.model_fields)
        msg = f"unknown key{_suggest(loc, options)}"
        allowed = ", ".join(o.rsplit(".", 1)[-1] for o in options)
    elif e["type"] == "literal_error":
        allowed = e["ctx"]["expected"]
        msg = f"got {e['input']!r}"
    elif "ctx" in e and e["type"] in ("greater_than", "less_than", "greater_than_equal", "less_than_equal"):
        msg = f"got {e['input']!r}: {msg}"
    return StudyError(msg, field=loc or None, allowed=allowed, source=source)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load keeps the last of two equal keys silently; a spec with the same factor twice is a mistake."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict:
    if not path.exists():
        raise StudyError("spec file does not exist", source=str(path))
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise StudyError(f"YAML syntax error{where}: {getattr(exc, 'problem', exc)}", source=str(path)) from None
    except UnicodeDecodeError as exc:
        raise StudyError(f"not UTF-8 ({exc.reason} at byte {exc.start})", source=str(path)) from None
    if not isinstance(data, dict):
        raise StudyError("a spec must be a YAML mapping with at least `name`", source=str(path))
    return data


def _resolve_defaults(path: Path, chain: tuple[Path, ...] = ()) -> tuple[SpecFile, dict]:
    """Read a spec and fold its `base` chain into one defaults tree (cycles rejected).

    Profiles are inherited too: a base's `cpu` profile applies unless the spec redefines keys of it.
    The returned SpecFile carries the merged profiles."""
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise StudyError(f"cycle of bases: {cycle}", field="base", source=str(chain[0]))
    raw = _read_yaml(path)
    try:
        spec = SpecFile.model_validate(raw)
    except ValidationError as err:
        raise _pydantic_error(err, str(path)) from None
    defaults: dict = {}
    profiles: dict = {}
    if spec.base:
        base_path = (path.parent / spec.base)
        if not base_path.exists():
            raise StudyError(f"base spec '{spec.base}' does not exist (looked at {base_path})",
                             field="base", source=str(path))
        base_spec, defaults = _resolve_defaults(base_path, (*chain, path))
        profiles = copy.deepcopy(base_spec.profiles)
    for section in spec.defaults:
        if section not in RunConfig.model_fields:
            raise StudyError(f"unknown section{_suggest(section, list(RunConfig.model_fields))}",
                             field=f"defaults.{section}", source=str(path),
                             allowed=", ".join(RunConfig.model_fields))
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
            _set_dotted(defaults, key, value, source)
    known_refs = references.available()
    for ref in spec.report.references:
        if ref not in known_refs:
            raise StudyError(f"unknown paper reference {ref!r}{_suggest(ref, known_refs)}",
                             field="report.references", source=source, allowed=", ".join(known_refs))
    study = Study(path=path, spec=spec, defaults=defaults, profile=profile)
    seen: dict[str, str] = {}
    for label, setting in _design_points(spec, source):
        for seed in spec.seeds:
            tree = copy.deepcopy(defaults)
            for key, value in setting.items():
                _set_dotted(tree, key, value, source)
            tree["seed"] = seed
            try:
                cfg = RunConfig.model_validate(tree)
            except ValidationError as err:
                where = f"run '{label}'" if setting else "defaults"
                exc = _pydantic_error(err, source)
                raise StudyError(f"{exc} (in {where})") from None
            run = PlannedRun(label=label, seed=seed, factors=setting, config=cfg)
            if run.run_hash in seen and spec.design == "one_at_a_time" and not spec.runs:
                continue  # a level equal to the base point is the base point
            if run.run_hash in seen and seen[run.run_hash] != label:
                raise StudyError(f"runs '{seen[run.run_hash]}' and '{label}' resolve to the same config",
                                 field="factors", source=source)
            seen[run.run_hash] = label
            study.runs.append(run)
    return study
