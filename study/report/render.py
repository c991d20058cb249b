"""One self-contained HTML report per study, rendered from the aggregate files only.

Input: `results/studies/<name>/` as written by `study.report.aggregate.aggregate_study` (study.json,
summary.csv, comparisons.csv, baseline.csv, runs.csv, curves.csv, results.parquet) and, when the
search stage wrote one, `results/search/<name>/trials.csv`. Output: `out_dir/index.html` (figures
embedded as data: URIs, CSS inline, a Content-Security-Policy that forbids every network load, so it
opens from file:// anywhere), `out_dir/figures/*.png|svg`, and `out_dir/report.json` (the headline,
for `render_index`).

Deliberately no torch / transformers / training imports (a test checks sys.modules): a report must
be re-renderable on any machine from the tables alone. Every label that came from a user (study
name, question, run labels, errors) goes through jinja2 autoescaping.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from study.errors import StudyError
from study.io import atomic_dir, atomic_write_json, atomic_write_text
from study.metrics import COST_METRICS, finite, is_bounded, parse_metric
from study.report import figures as F
from study.report import stats as S
from study.report.fmt import fmt_ci, fmt_diff, fmt_value
from study.report.levelnames import run_labels, with_levels
from study.report.papers import reference_sections
from study.report.problems import collapse_warning, problem_runs
from study.report.prose import answer_sentence, methods_sentence, recipe_sentence
from study.report.provenance import provenance_section
from study.report.searchreport import search_answer, search_summary
from study.report.studyfiles import StudyFiles, load_study_dir
from study.report.zeroshot_view import section as zeroshot_section

TEMPLATES = Path(__file__).resolve().parent / "templates"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


# --------------------------------------------------------------------------- tables
def _summary_rows(sf: StudyFiles) -> list[dict]:
    s = sf.summary
    if s.empty:
        return []
    s = with_levels(
        s[s["init"] == "pretrained"] if "init" in s else s,
        sf.factor_keys,
        run_labels(sf.plan, sf.factor_keys),
    )
    task, mode, metric = parse_metric(sf.plan.get("primary_metric"), field="report.primary_metric")
    s = s.assign(
        is_other=~((s["task"] == task) & (s["mode"] == mode) & (s["metric"] == metric)),
        is_cost=s["metric"].isin(COST_METRICS),
    )
    s = s.sort_values(["is_other", "is_cost", "task", "mode", "metric", "level"])
    return [
        {
            "level": r.level,
            "task": r.task,
            "mode": r.mode,
            "metric": r.metric,
            "primary": not r.is_other,
            "mean": fmt_value(r.mean, r.metric),
            "ci": fmt_ci(r.ci_low, r.ci_high, r.metric),
            "std": fmt_value(r.std, r.metric)
            if not is_bounded(r.metric)
            else (f"{100 * r.std:.1f}" if finite(r.std) else "–"),
            "n": int(r.n),
        }
        for r in s.itertuples()
    ]


def _comparison_rows(sf: StudyFiles) -> list[dict]:
    c = sf.comparisons
    if c.empty:
        return []
    # Downstream first, then pre-training quality, then cost (speed, size) which is rarely the question.
    c = c.assign(
        order=[
            2 if m in COST_METRICS else (1 if t == "pretrain" else 0)
            for t, m in zip(c["task"], c["metric"], strict=True)
        ]
    )
    c = c.sort_values(["order", "task", "mode", "metric"], kind="stable")
    c = c.reindex(
        columns=[*c.columns, *(k for k in STATS_COLS if k not in c)]
    )  # an older aggregate lacks them
    return [
        {
            "task": r.task,
            "mode": r.mode,
            "metric": r.metric,
            "a": r.a,
            "b": r.b,
            "mean_a": fmt_value(r.mean_a, r.metric),
            "mean_b": fmt_value(r.mean_b, r.metric),
            "diff": fmt_diff(r.diff, r.metric),
            "ci": "none (the same difference in every seed)"
            if getattr(r, "ci_method", "") == S.SAME_DIFF
            else fmt_ci(r.ci_low, r.ci_high, r.metric, diff=True, level=r.ci_level),
            "n": int(r.n),
            "p": _fmt_p(r.p_value),
            "p_adj": _fmt_p(r.p_adjusted),
            "correction": r.correction if isinstance(r.correction, str) else "–",
            "primary": str(r.primary) == "True",
            "mde": fmt_diff(r.mde, r.metric).lstrip("+"),
            "interpretation": r.interpretation,
            "sees": _fmt_sees(getattr(r, "sees_pretraining", None)),
            "model": r.model if isinstance(getattr(r, "model", None), str) else "–",
        }
        for r in c.itertuples()
    ]


STATS_COLS = ("ci_level", "p_adjusted", "correction", "primary", "mde")


def _fmt_sees(v: Any) -> str:
    """comparisons.csv's sees_pretraining (True/False, or empty where not judged) as the table shows it."""
    return {"True": "yes", "False": "no"}.get(str(v), "not judged")


def _primary_note(sf: StudyFiles) -> str:
    """The rule's verdict on the primary metric (sees.py's sentence) and the spec's own reason for it."""
    check = sf.study.get("primary_sees_pretraining") or {}
    why = (sf.plan.get("primary_why") or "").strip()
    return " ".join(x for x in (check.get("sentence", ""), f"Chosen because: {why}" if why else "") if x)


def _fmt_p(p: Any) -> str:
    return ("< 0.001" if p < 0.001 else f"{p:.3f}") if finite(p) else "–"


def _baseline_rows(sf: StudyFiles) -> list[dict]:
    b = sf.baseline
    if b.empty:
        return []
    keys = [k for k in sf.factor_keys if k in b]
    b = with_levels(b, keys, run_labels(sf.plan, keys))
    b = b.reindex(columns=[*b.columns, *(k for k in STATS_COLS if k not in b)])
    return [
        {
            "level": r.level,
            "task": r.task,
            "mode": r.mode,
            "metric": r.metric,
            "pre": fmt_value(r.mean_pretrained, r.metric),
            "rnd": fmt_value(r.mean_random, r.metric),
            "diff": fmt_diff(r.diff, r.metric),
            "ci": fmt_ci(r.ci_low, r.ci_high, r.metric, diff=True, level=r.ci_level),
            "n": f"{int(r.n_pretrained)} / {int(r.n_random)}",
            "p": _fmt_p(getattr(r, "p_value", None)),
            "p_adj": _fmt_p(r.p_adjusted),
            "interpretation": r.interpretation,
        }
        for r in b.itertuples()
    ]


# --------------------------------------------------------------------------- rendering
def _env() -> jinja2.Environment:
    # autoescape=True for every template: study names, questions, labels and errors are user text.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pct"] = lambda v: f"{100 * v:.1f}%" if finite(v) else "-"  # a fraction; None or NaN as "-"
    return env


def _figures(sf: StudyFiles, out_dir: Path, direction: str) -> list[dict]:
    """Draw the study's figures into out_dir/figures (atomically) and return them as the template shows
    them: embedded PNG, title, caption, alt text, or why one was skipped."""
    with atomic_dir(out_dir / "figures") as tmp:
        files = F.make_figures(
            sf.plan,
            sf.factor_keys,
            sf.summary,
            sf.comparisons,
            sf.curves,
            tmp,
            runs=sf.runs,
            trials=sf.trials,
            direction=direction,
        )
        # alt: what the figure shows in one line (title + the caption's first sentence), not just its name
        return [
            {
                "name": f.name,
                "title": f.title,
                "caption": f.caption,
                "skipped": f.skipped,
                "alt": f"{f.title}: {f.caption.split('. ')[0].rstrip('.')}." if f.caption else f.title,
                "src": "data:image/png;base64," + base64.b64encode(f.png.read_bytes()).decode("ascii")
                if f.png
                else None,
                "files": [p.name for p in (f.png, f.svg) if p],
            }
            for f in files
        ]


def render_report(
    study_dir: str | Path,
    out_dir: str | Path,
    search_trials: pd.DataFrame | None = None,
    search_direction: str = "minimize",
) -> Path:
    """Write out_dir/index.html (self-contained), out_dir/figures/*.png|svg and out_dir/report.json.

    `search_trials` (an optuna trials table: number, state, value, params_*, tokens or
    user_attrs_tokens) adds a search section and figure; without it, results/search/<name>/trials.csv
    is used when present.
    """
    if search_direction not in ("minimize", "maximize"):
        raise StudyError(f"got {search_direction!r}", field="search_direction", allowed="minimize, maximize")
    sf = load_study_dir(study_dir)
    if search_trials is not None:
        sf.trials = search_trials
    out_dir = Path(out_dir)
    sections = reference_sections(sf)  # raises StudyError for an unknown reference before writing
    figs = _figures(sf, out_dir, search_direction)
    search = search_summary(sf.trials, search_direction)
    answer = search_answer(answer_sentence(sf), search)  # a search's best trial leads the headline
    problems = problem_runs(sf)
    warning = collapse_warning(problems["collapsed"], len(sf.runs))
    plan = sf.plan
    html = (
        _env()
        .get_template("report.html")
        .render(
            csp=CSP,
            plan=plan,
            name=plan["name"],
            question=plan.get("question") or "(no question in the spec)",
            answer=answer,
            warning=warning,
            methods=methods_sentence(sf),
            primary_note=_primary_note(sf),
            recipe=recipe_sentence(sf.plan, sf.study.get("eval_rows")),
            factor_keys=sf.factor_keys,
            summary=_summary_rows(sf),
            comparisons=_comparison_rows(sf),
            baseline=_baseline_rows(sf),
            zeroshot=zeroshot_section(sf.dir, sf.plan, sf.factor_keys),
            figures=figs,
            references=sections,
            problems=problems,
            provenance=provenance_section(sf),
            search=search,
            n_runs=len(sf.runs),
            n_done=int((sf.runs["status"] == "done").sum()) if len(sf.runs) else 0,
            generated=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        )
    )
    atomic_write_text(out_dir / "index.html", html)
    atomic_write_json(
        out_dir / "report.json",
        {
            "name": plan["name"],
            "question": plan.get("question"),
            "answer": answer["text"],
            "warning": warning,
            "kind": plan.get("kind"),
            "runs": len(sf.runs),
            "figures": [f["name"] for f in figs if f["src"]],
        },
    )
    return out_dir / "index.html"


def render_index(reports_root: str | Path) -> Path:
    """reports/index.html: one line per study report found under reports_root (via its report.json)."""
    root = Path(reports_root)
    entries = []
    for rj in sorted(root.glob("*/report.json")):
        try:
            meta = json.loads(rj.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (rj.parent / "index.html").exists():
            entries.append({**meta, "href": f"{rj.parent.name}/index.html"})
    html = _env().get_template("index.html").render(csp=CSP, entries=entries)
    atomic_write_text(root / "index.html", html)
    return root / "index.html"
