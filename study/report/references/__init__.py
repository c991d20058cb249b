"""Published ablation tables as data, and how a study's results line up with them.

Each `<id>.yaml` here is one paper table: where it comes from (paper, arXiv id, table number), what
its columns mean, the scale it was measured at, which of our dotted config keys its rows vary
(`setting`), and whether each number was checked against a copy of the paper (`verified`).
A number that could not be checked is either left out or carries `verified: false`; the report
prints that flag next to it.

`paper_vs_ours` puts a table beside a study's summary: for the levels both vary, does the paper's
difference point the same way as ours, and is ours distinguishable from seed noise at all?
Nothing here imports torch: the report is rendered from aggregate files only.
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from study.errors import StudyError
from study.levels import same_level
from study.metrics import finite
from study.report.stats import zero_width

REFERENCE_DIR = Path(__file__).resolve().parent
# Which tables a study of each kind is compared with when its spec names none.
KIND_DEFAULTS = {
    "nsp": ["bert_table5", "albert_table5", "roberta_table2"],
    "mask_rate": ["wettig_masking"],
    "replacement": ["bert_table8"],
    "depth": ["bert_table6"],
    "generic": [],
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Column(_Strict):
    name: str
    task: str  # our task name (SST-2, MNLI, ...) or "pretrain"
    metric: str  # our metric name (accuracy, f1, ref_ppl, ...)
    mode: Literal["finetune", "probe", "pretrain"] | None = (
        None  # None: finetune (pretrain for task=pretrain)
    )
    higher_is_better: bool

    @property
    def our_mode(self) -> str:
        return self.mode or ("pretrain" if self.task == "pretrain" else "finetune")


class Row(_Strict):
    label: str
    setting: dict[str, Any]  # our dotted keys (or a paper-only key such as `direction`) -> value
    values: dict[str, float | None]
    verified: bool


class Scale(_Strict):
    model: str
    params: int | None
    corpus: str
    train_tokens: int | None
    note: str | None = None
    verified: bool
    provenance: str


class Claim(_Strict):
    text: str
    verified: bool


class Verification(_Strict):
    verified: bool | Literal["partial"]
    checked: str
    how: str

    @field_validator("checked", mode="before")
    @classmethod
    def _date(cls, v: Any) -> Any:
        return v.isoformat() if isinstance(v, (_dt.date, _dt.datetime)) else v


class Reference(_Strict):
    id: str = Field(pattern=r"^[a-z0-9_]+$")
    paper: str
    authors: str
    year: int = Field(ge=2000, le=2100)
    arxiv: str = Field(pattern=r"^\d{4}\.\d{4,5}$")
    table: str
    caption: str
    columns_mean: str
    scale: Scale
    factor: str | list[str]
    columns: list[Column] = Field(min_length=1)
    rows: list[Row] = Field(min_length=1)
    claims: list[Claim] = Field(default_factory=list)
    verification: Verification

    @model_validator(mode="after")
    def _values_name_columns(self) -> Reference:
        names = {c.name for c in self.columns}
        for r in self.rows:
            extra = set(r.values) - names
            if extra:
                raise ValueError(f"row {r.label!r} has values for unknown columns {sorted(extra)}")
        return self

    @property
    def factors(self) -> list[str]:
        return [self.factor] if isinstance(self.factor, str) else list(self.factor)

    @property
    def citation(self) -> str:
        where = f"Table {self.table}" if self.table[:1].isdigit() else self.table
        return f"{self.authors.split(',')[0]} et al. {self.year}, arXiv:{self.arxiv}, {where}"


def available() -> list[str]:
    return sorted(p.stem for p in REFERENCE_DIR.glob("*.yaml"))


def load_reference(ref_id: str, directory: Path = REFERENCE_DIR) -> Reference:
    path = directory / f"{ref_id}.yaml"
    if not path.exists():
        raise StudyError(
            f"unknown paper reference {ref_id!r}",
            field="report.references",
            allowed=", ".join(sorted(p.stem for p in directory.glob("*.yaml"))),
        )
    try:
        ref = Reference.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except ValidationError as err:
        e = err.errors()[0]
        raise StudyError(f"{e['msg']}", field=".".join(str(p) for p in e["loc"]), source=str(path)) from None
    if ref.id != path.stem:
        raise StudyError(f"id {ref.id!r} differs from the file name", field="id", source=str(path))
    return ref


def for_study(kind: str, ids: list[str] | None) -> list[Reference]:
    """The spec's references first, then the kind's defaults; unknown ids raise StudyError."""
    seen: list[str] = []
    for i in [*(ids or []), *KIND_DEFAULTS.get(kind, [])]:
        if i not in seen:
            seen.append(i)
    return [load_reference(i) for i in seen]


# --------------------------------------------------------------------------- paper vs ours
def _level_key(level: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in level.items())


def match_levels(ref: Reference, levels: list[dict[str, Any]]) -> tuple[dict[int, Row], list[str]]:
    """Map our levels (dicts over our factor keys) to paper rows.

    A row matches a level when every factor key the row sets equals ours. Rows usually also fix
    keys we do not vary (BERT Table 6 fixes hidden size): we use ONE such signature for all levels
    when one covers at least two levels, so the paper's difference changes only what ours changes.
    Otherwise rows from different signatures are paired and the extra keys are returned as
    confounders, to be printed beside the direction.
    """
    keys = sorted({k for lv in levels for k in lv})
    by_sig: dict[tuple, dict[int, Row]] = {}
    for row in ref.rows:
        shared = [k for k in keys if k in row.setting]
        if not shared:
            continue
        extras = tuple(sorted((k, str(v)) for k, v in row.setting.items() if k not in keys))
        for i, lv in enumerate(levels):
            if all(same_level(row.setting[k], lv.get(k)) for k in shared) and all(k in lv for k in shared):
                by_sig.setdefault(extras, {}).setdefault(i, row)
    if not by_sig:
        return {}, []
    best = max(by_sig, key=lambda s: (len(by_sig[s]), -len(s)))
    if len(by_sig[best]) >= 2 or len(by_sig) == 1:
        return by_sig[best], []
    mixed: dict[int, Row] = {}
    for sig in sorted(by_sig, key=len):
        for i, row in by_sig[sig].items():
            mixed.setdefault(i, row)
    return mixed, _differing_extras(mixed.values(), levels)  # keys the rows share are no confounder


def trend_pair(ref: Reference, levels: list[dict[str, Any]]) -> tuple[dict[int, Row], str] | None:
    """When no two of our levels appear in the table (layers 1/2/4 vs BERT's 3/6/12), compare the
    TREND instead: our lowest to highest level against the paper's lowest to highest row of one
    signature (e.g. hidden 768 throughout). Only for a single numeric factor."""
    keys = sorted({k for lv in levels for k in lv})
    if len(keys) != 1:
        return None
    k = keys[0]
    try:
        xs = [float(lv[k]) for lv in levels]
    except (TypeError, ValueError):
        return None
    groups: dict[tuple, list[Row]] = {}
    for row in ref.rows:
        if k in row.setting:
            sig = tuple(sorted((kk, str(v)) for kk, v in row.setting.items() if kk != k))
            groups.setdefault(sig, []).append(row)
    groups = {s_: g for s_, g in groups.items() if len({float(r.setting[k]) for r in g}) >= 2}
    if not groups or len(set(xs)) < 2:
        return None
    g = max(groups.values(), key=len)
    lo_r, hi_r = min(g, key=lambda r: float(r.setting[k])), max(g, key=lambda r: float(r.setting[k]))
    lo_i, hi_i = xs.index(min(xs)), xs.index(max(xs))
    note = (
        f"our levels of {k} are not in this table, so the TREND is compared: ours {k} "
        f"{levels[lo_i][k]} → {levels[hi_i][k]} against the paper's {lo_r.label} → {hi_r.label}"
    )
    return {lo_i: lo_r, hi_i: hi_r}, note


def _sign(x: float, tol: float = 1e-12) -> int:
    return 0 if abs(x) <= tol else (1 if x > 0 else -1)


def _verdict(paper_diff: float, ours: dict | None) -> str:
    if ours is None or ours.get("diff") is None or not math.isfinite(ours["diff"]):
        return "not measured here"
    ps, os_ = _sign(paper_diff), _sign(ours["diff"])
    if ps == 0:
        return "paper: no difference"
    if os_ == 0:
        return "ours shows no difference at all"
    same = ps == os_
    if ours.get("noise") is None:  # `why`: no test for another reason than too few seeds
        return f"{'same' if same else 'opposite'} direction, but {ours.get('why') or 'ours has no CI (too few seeds)'}"
    point = f"point estimate {'agrees' if same else 'disagrees'}"
    if ours["noise"] and ours.get("basis") == OVERLAP:
        # two levels' separate intervals overlapping is not a test (paired by seed they may still differ)
        return f"not resolved: the per-level CIs overlap, no paired test ({point})"
    if ours["noise"]:
        return f"ours is within seed noise ({point})"
    return "agrees" if same else "disagrees"


OVERLAP = "per-level 95% CIs overlap"
SAME_SCORE = "no test: every seed at a level scored the same"


def unpaired(a: dict, b: dict) -> dict:
    """b - a from two per-level summaries. Separated 95% CIs give a direction (conservatively); overlapping
    ones are no verdict either way (`_verdict`: "not resolved"), since they are not a test. A CI of no
    width (every seed the same) measures no seed noise: no test, as for the paired SAME_DIFF."""
    noise = None
    if finite(a.get("ci_low"), a.get("ci_high"), b.get("ci_low"), b.get("ci_high")):
        if zero_width(a["ci_low"], a["ci_high"]) or zero_width(b["ci_low"], b["ci_high"]):
            return {
                "diff": b["mean"] - a["mean"],
                "ci_low": None,
                "ci_high": None,
                "noise": None,
                "why": SAME_SCORE,
                "basis": "per-level 95% CIs",
            }
        noise = not (b["ci_low"] > a["ci_high"] or b["ci_high"] < a["ci_low"])
    return {
        "diff": b["mean"] - a["mean"],
        "ci_low": None,
        "ci_high": None,
        "noise": noise,
        "basis": OVERLAP if noise else "per-level 95% CIs",
    }


def _default_pairs(matched: dict[int, Row], levels: list[dict[str, Any]], b: int) -> list[tuple[int, int]]:
    """Base level vs every other paper row, each row represented by the level CLOSEST to the base
    (fewest differing factor values): with 6 NSP-study runs and ALBERT's 3 rows, 'NSP -> None' is our
    segment_pair+nsp -> segment_pair, not -> doc_sentences (which also changes the format)."""
    chosen: dict[int, tuple[int, int]] = {}
    for j in sorted(matched):
        if j == b or matched[j] is matched[b]:
            continue
        dist = sum(
            not same_level(levels[j].get(k), levels[b].get(k)) for k in set(levels[j]) | set(levels[b])
        )
        rid = id(matched[j])
        if rid not in chosen or dist < chosen[rid][0]:
            chosen[rid] = (dist, j)
    return [(b, j) for _, j in sorted(chosen.values(), key=lambda t: t[1])]


def _differing_extras(rows, levels: list[dict[str, Any]]) -> list[str]:
    """Keys we do not vary on which the given paper rows disagree: what confounds their difference."""
    keys = {k for lv in levels for k in lv}
    rows = list(rows)
    extra = {k for r in rows for k in r.setting if k not in keys}
    return sorted(k for k in extra if len({str(r.setting.get(k)) for r in rows}) > 1)


def paper_vs_ours(
    ref: Reference,
    levels: list[dict[str, Any]],
    ours: dict,
    base: int = 0,
    pairs: list[tuple[int, int]] | None = None,
) -> dict:
    """Paper numbers beside ours for the levels both vary, with a direction verdict per column.

    `ours[(level_index, task, mode, metric)] = {"mean", "ci_low", "ci_high"}`: our summary per level.
    A paired comparison may add `ours[("diff", i, j, task, mode, metric)] = {"diff", "ci_low",
    "ci_high", "noise", "basis"}` (and `why` when noise is None for another reason than n < 3);
    without it the difference is judged from the two levels' CIs.
    Differences are level j minus level i, for `pairs` (default: every matched level vs `base`).
    """
    matched, confounders = match_levels(ref, levels)
    trend = None
    if len(matched) < 2 and (t := trend_pair(ref, levels)):
        matched, trend = t
        lo_i, hi_i = sorted(matched, key=lambda i: float(matched[i].setting[next(iter(levels[i]))]))
        pairs = [(lo_i, hi_i)]
        confounders = _differing_extras(matched.values(), levels)  # match_levels' were for other rows
    out = {
        "reference": ref,
        "matched": {i: r.label for i, r in matched.items()},
        "confounders": confounders,
        "rows": [],
        "note": None,
        "trend": trend,
    }
    if len(matched) < 2:
        out["note"] = (
            "fewer than two of this study's levels appear in this table, so no direction can be "
            "compared; the paper's numbers are shown for scale"
        )
        return out
    idx = sorted(matched)
    if pairs is not None and not all(i in matched and j in matched for i, j in pairs):
        base, pairs = pairs[0][0], None  # the study's own pair is not in this table: start from its `a`
    if pairs is None:
        pairs = _default_pairs(matched, levels, base if base in matched else idx[0])
    elif trend is None:  # the study's pair first, then the table's other rows against its `a`
        seen = {id(matched[j]) for _, j in pairs}
        pairs = pairs + [
            (i, j) for i, j in _default_pairs(matched, levels, pairs[0][0]) if id(matched[j]) not in seen
        ]
    for i, j in pairs:
        if i not in matched or j not in matched:
            continue
        ri, rj = matched[i], matched[j]
        for col in ref.columns:
            vi, vj = ri.values.get(col.name), rj.values.get(col.name)
            if vi is None or vj is None:
                continue
            key = (col.task, col.our_mode, col.metric)
            d = ours.get(("diff", i, j, *key))
            if d is None and (i, *key) in ours and (j, *key) in ours:
                d = unpaired(ours[(i, *key)], ours[(j, *key)])
            out["rows"].append(
                {
                    "column": col.name,
                    "task": col.task,
                    "mode": col.our_mode,
                    "metric": col.metric,
                    "a": _level_key(levels[i]),
                    "b": _level_key(levels[j]),
                    "i": i,
                    "j": j,
                    "paper_a_label": ri.label,
                    "paper_b_label": rj.label,
                    "paper_a": vi,
                    "paper_b": vj,
                    "paper_diff": vj - vi,
                    "paper_verified": ri.verified and rj.verified,
                    "ours": d,
                    "verdict": _verdict(vj - vi, d),
                }
            )
    return out
