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
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from study.errors import StudyError
from study.io import atomic_dir, atomic_write_json, atomic_write_text, read_json
from study.levels import level_key
from study.metrics import COST_METRICS, finite, is_bounded, lower_is_better, param_columns, parse_metric
from study.report import figures as F
from study.report import stats as S
from study.report.aggregate import AVERAGED_NOTE, NOISE_WORDS, PAIRED_NOTE, TOO_FEW_WORDS, plateau_hashes
from study.report.fmt import fmt_ci, fmt_diff, fmt_value
from study.report.papers import reference_sections
from study.report.pooled import model_sentence
from study.report.provenance import provenance_section, records
from study.report.sees import beats_random

TEMPLATES = Path(__file__).resolve().parent / "templates"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


# --------------------------------------------------------------------------- loading
def _read_csv(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame()
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


@dataclass
class StudyFiles:
    """The aggregate of one study, as the report sees it."""

    dir: Path
    study: dict
    summary: pd.DataFrame
    comparisons: pd.DataFrame
    baseline: pd.DataFrame
    runs: pd.DataFrame
    curves: pd.DataFrame
    trials: pd.DataFrame | None = None
    factor_keys: list[str] = field(default_factory=list)

    @property
    def plan(self) -> dict:
        return self.study["plan"]


def load_study_dir(study_dir: str | Path) -> StudyFiles:
    study_dir = Path(study_dir)
    try:  # missing, truncated or hand-edited (a JSONDecodeError traceback before): exit 2 naming the file
        study = read_json(study_dir / "study.json")
        if not isinstance(study, dict) or not isinstance(study.get("plan"), dict):
            raise ValueError("not an aggregate's study.json")
    except (OSError, ValueError) as exc:
        what = "missing" if isinstance(exc, FileNotFoundError) else f"unreadable: {exc}"
        raise StudyError(
            f"no aggregate at {study_dir} (study.json {what}); run `study aggregate` to write it",
            source=str(study_dir / "study.json"),
        ) from None
    keys = study.get("factor_keys") or sorted(
        {k for r in study["plan"].get("runs", []) for k in r.get("factors", {})}
    )
    tpath = study_dir.parent.parent / "search" / str(study["plan"].get("name")) / "trials.csv"
    trials = _read_csv(tpath) if tpath.exists() else None
    return StudyFiles(
        dir=study_dir,
        study=study,
        summary=_read_csv(study_dir / "summary.csv"),
        comparisons=_read_csv(study_dir / "comparisons.csv"),
        baseline=_read_csv(study_dir / "baseline.csv"),
        runs=_read_csv(study_dir / "runs.csv"),
        curves=_read_csv(study_dir / "curves.csv"),
        trials=trials,
        factor_keys=list(keys),
    )


NOTES = f"(?:{PAIRED_NOTE}|{AVERAGED_NOTE})"  # aggregate.compare's notes after the verdict


def _notes(interpretation: Any) -> str:
    """compare's "(paired on k of m seeds)" and "(averaged over ...)" notes, each with a leading space."""
    return "".join(f" {m}" for m in re.findall(rf"\({NOTES} [^()]*\)", str(interpretation or "")))


def _verdict_words(interpretation: str) -> str:
    s = str(interpretation or "")
    if NOISE_WORDS in s:
        return NOISE_WORDS + _notes(s)
    return re.sub(rf"\s+at n=\d+ seeds(?=$| \({NOTES})", "", s) or "no verdict"


def methods_sentence(sf: StudyFiles) -> str:
    """The report's statistics stated once: the rule, the correction, the bootstrap threshold, the MDE."""
    st = sf.study.get("statistics")
    if not st:  # an aggregate written before study.report.stats: say what it used instead
        return f"Statistics of this (older) aggregate: {sf.study.get('ci_method')}; {sf.study.get('test')}."
    a = f"{st['alpha']:g}"
    text = (
        f"Statistics: the unit is the pre-training seed (fine-tune seeds averaged within it). One rule: a "
        f"difference is beyond seed noise exactly when its interval excludes 0, which is exactly when its "
        f"two-sided t-test gives p < {a} (t-interval on n−1 df; Welch's for pre-trained vs random init; "
        f"a BCa bootstrap, whose p inverts its interval, only from n={st['bootstrap_min_n']}; below "
        f"n={st['min_n']} no interval, no test and no direction). The primary comparison is tested alone "
        f"at {a}; "
    )
    fam = st.get("family") or 0
    text += (
        f"the other {fam} paired comparisons (cost metrics excluded) are Holm-corrected, each interval drawn "
        f"at the level Holm tests it at, so it excludes 0 exactly when its Holm-adjusted p < {a}."
        if fam
        else _untested_others(sf, st["min_n"])
    )
    pr = st.get("primary")
    if pr and finite(pr.get("mde")):
        text += (
            f" With n={pr['n']} seeds and SD {fmt_diff(pr['sd_diff'], pr['metric']).lstrip('+')} of the "
            f"paired differences, this study could detect differences of ≥ "
            f"{fmt_diff(pr['mde'], pr['metric']).lstrip('+')} at {100 * st['power']:.0f}% power "
            f"(two-sided paired t-test, α = {a}); `study plan --detect` says how many seeds a smaller one needs."
        ) + model_sentence(pr.get("model"))
    elif pr:
        why = (
            f"n<{st['min_n']}"
            if pr["n"] < st["min_n"]
            else "the same difference in every seed, so no measure of seed noise"
        )
        text += f" With n={pr['n']} seeds the primary comparison has no minimum detectable effect ({why})."
    return text


def _untested_others(sf: StudyFiles, min_n: int) -> str:
    """No Holm family: say whether that is because no other comparison exists or none could be tested."""
    c = sf.comparisons
    if c.empty:
        return "there are no other paired comparisons to correct for."
    o = c[~c["metric"].isin(COST_METRICS) & (c["primary"].astype(str) != "True")]
    if o.empty:
        return "there are no other paired comparisons to correct for."
    why = f"n<{min_n}" if (o["n"] < min_n).all() else "no interval"
    rows = f"{len(o)} other row{'s' if len(o) > 1 else ''}"
    return (
        f"no other comparison could be tested ({why}; {rows} in the table), so there is nothing to correct."
    )


def recipe_sentence(plan: dict, eval_rows: dict | None = None) -> str:
    """What was pre-trained (one sentence) and how it was fine-tuned (another), from the plan's recipe
    (study.studies.spec.recipe_values). A setting that differs between runs lists every value ("2 / 4 / 6
    layers"). Empty for an aggregate written before plans carried the recipe. `eval_rows` (study.json's,
    {task: [dev rows scored]}) gives each task's own count: a cap is only an upper bound (MRPC's dev has 408)."""
    r = plan.get("recipe")
    if not r:
        return ""

    def v(key: str, fmt=lambda x: f"{x:g}" if isinstance(x, float) else str(x), sep: str = " / ") -> str:
        return sep.join(fmt(x) for x in r.get(key) or []) or "?"

    def pct(x: float) -> str:
        return f"{100 * x:g}%"

    def split(s: list) -> str:
        # recorded as [mask, random, keep] (the config's order); written in BERT Table 8's MASK/SAME/RND
        # order, the one the replacement study's labels use
        mask, random, keep = s
        return "/".join(f"{100 * x:g}" for x in (mask, keep, random))

    arch = {"post_ln": "post-LN (BERT's)", "pre_ln": "pre-LN"}

    def sd(x: float) -> str:
        return f"{x:g} (BERT's)" if x == 0.02 else f"{x:g} (BERT: 0.02)"

    # plans written before the init scale was recorded have none: say nothing rather than "?"
    init = f", weights initialised with SD {v('model.init_range', sd)}" if r.get("model.init_range") else ""
    text = (
        f"Pre-training: a {v('model.arch', lambda a: arch.get(a, a))} encoder of {v('model.layers')} layers, "
        f"hidden {v('model.hidden')}, {v('model.heads')} heads, FFN {v('model.intermediate')}, dropout "
        f"{v('model.dropout')}{init}; WordPiece vocabulary {v('tokenizer.vocab_size')}; "
        f"{v('objective.format')} rows of {v('objective.max_seq_len')} tokens, sentence task {v('objective.sentence')}; "
        f"{v('masking.rate', pct)} of the tokens asked ({v('masking.unit')} units), shown as "
        f"[MASK]/unchanged/random {v('masking.split', split, ', ')}; "
        f"{v('train.amount', lambda x: f'{x:,.0f}')} {v('train.budget')} of {v('train.batch_size')} rows"
    )
    if any(r.get("train.short_fraction") or []):
        text += (
            f", the first {v('train.short_fraction', pct)} of them on {v('train.short_len')}-token rows "
            f"(as many tokens per step)"
        )
    text += (
        f"; AdamW at peak lr {v('train.lr')}, warmup {v('train.warmup', pct)} of the budget, "
        f"{v('train.schedule')} schedule."
    )
    if r.get("finetune.pooling"):  # plans written before the fine-tuning keys were recorded have none
        pool = {
            "cls": "the pooled [CLS] (BERT's)",
            "mean": "the mean of the last layer over the row's tokens",
        }
        rows = v("finetune.max_train_examples", lambda x: "all" if x is None else f"{x:,}")
        text += (
            f" Fine-tuning reads {v('finetune.pooling', lambda p: pool.get(p, p))}; "
            f"AdamW at lr {v('finetune.lr')} for {v('finetune.epochs')} epochs of {rows} training rows per task"
        )
        if r.get("finetune.seeds"):  # plans written before the seeds and the probe were recorded have none
            counts = [f"{' / '.join(f'{n:,}' for n in ns)} ({t})" for t, ns in (eval_rows or {}).items()]
            whole = lambda x: "the whole dev set" if x is None else f"at most {x:,} dev rows per task"
            dev = " / ".join(counts) + " dev rows" if counts else v("finetune.max_eval_examples", whole)
            text += (
                f", {v('finetune.seeds', lambda s: str(len(s)))} fine-tune seeds per encoder, scored on {dev}"
            )
        if any(r.get("finetune.probe") or []):
            text += (
                f". The probe: a logistic regression (ridge for regression tasks) on standardised features of "
                f"the frozen encoder's last {v('finetune.probe_layers')} layer(s), each pooled the same way "
                f"and concatenated"
            )
        text += "."
    return text + (
        " Where runs differ, every value is listed." if any(len(x) > 1 for x in r.values()) else ""
    )


# --------------------------------------------------------------------------- content
def answer_sentence(sf: StudyFiles) -> dict:
    """The study's answer in ONE sentence with its CI, or why there is none yet."""
    plan, ans = sf.plan, sf.study.get("answer")
    task, mode, metric = parse_metric(plan.get("primary_metric"), field="report.primary_metric")
    what = F.metric_label(task, mode, metric)
    if ans and (finite(ans.get("diff")) or ans.get("n") == 0):  # n = 0: no seed at both levels, said below
        fac = (plan.get("compare") or {}).get("factor", "")
        a, b = ans.get("a"), ans.get("b")
        n = int(ans.get("n") or 0)
        flat = plateau_runs(sf, fac, (a, b))
        if flat:
            return {
                "text": f"{b} minus {a} ({fac}) on {what}: not trained past the plateau: {len(flat)} of the "
                f"compared runs ({', '.join(flat)}) score no better on the reference MLM than always "
                f"predicting the most frequent token, so a difference would measure how fast they left "
                f"it, not the factor; no direction is claimed.",
                "kind": "plateau",
            }
        if n >= S.MIN_N and not (finite(ans.get("ci_low")) and finite(ans.get("ci_high"))):
            # enough seeds, but no test (the same difference in every seed: aggregate.interpret says so)
            return {
                "text": f"{b} minus {a} ({fac}) on {what}: {fmt_diff(ans['diff'], metric)}, n={n} seeds: "
                f"{ans.get('interpretation')}; no direction is claimed.",
                "kind": "paired",
            }
        if n < S.MIN_N or not (finite(ans.get("ci_low")) and finite(ans.get("ci_high"))):
            return {
                "text": f"{b} minus {a} ({fac}) on {what}: n={n}: {TOO_FEW_WORDS} ({S.MIN_N} needed)"
                f"{_notes(ans.get('interpretation'))}, so no direction is claimed.",
                "kind": "paired",
            }
        verdict = _verdict_words(ans.get("interpretation"))
        text = (
            f"{b} minus {a} ({fac}) on {what}: {fmt_diff(ans['diff'], metric)}, 95% CI "
            f"{fmt_ci(ans.get('ci_low'), ans.get('ci_high'), metric, diff=True)}, n={n} seeds"
            f"{left_out(sf, fac, (a, b))}: {verdict}"
        )
        if all(finite(ans.get(k)) and ans[k] == 0 for k in ("diff", "ci_low", "ci_high")):
            # A zero-width CI at exactly 0: every seed scored the same (often the majority-class rate).
            text += f" (every seed of both levels scored exactly {fmt_value(ans.get('mean_a'), metric)})"
        elif verdict.startswith(NOISE_WORDS) and finite(ans.get("mde")):  # a note may follow the words
            # "no difference seen" is not "no difference": say how large a difference could have hidden
            text += f"; it could detect only differences of ≥ {fmt_diff(ans['mde'], metric).lstrip('+')}"
        text += _no_gain_over_random(sf, task, mode, metric) + "." + _other_mode(sf, task, mode, metric)
        return {"text": text, "kind": "paired"}
    s = F.select(sf.summary, task, mode, metric) if not sf.summary.empty else sf.summary
    flat = plateau_runs(sf)
    if len(s) >= 1 and flat:
        return {
            "text": f"not trained past the plateau: {len(flat)} of {len(sf.runs)} runs ({', '.join(flat)}) score "
            f"no better on the reference MLM than always predicting the most frequent token, so the "
            f"levels' {what} would measure how fast they left it; no best level is named.",
            "kind": "plateau",
        }
    if len(s) >= 1:
        lower_better = lower_is_better(metric)
        s = F.with_levels(s, sf.factor_keys, F.run_labels(plan, sf.factor_keys)).sort_values(
            "mean", ascending=lower_better
        )
        best, rest = s.iloc[0], s.iloc[1:]
        head = (
            f"best {', '.join(sf.factor_keys) or 'run'} for {what}: {best['level']} "
            f"({fmt_value(best['mean'], metric)}, 95% CI {fmt_ci(best['ci_low'], best['ci_high'], metric)}, "
            f"n={int(best['n'])} seeds)"
        )
        if rest.empty:  # one design point: what it can be compared with is the random-init baseline
            b = sf.baseline
            b = b[(b["task"] == task) & (b["mode"] == mode) & (b["metric"] == metric)] if not b.empty else b
            if not b.empty and finite(b.iloc[0]["diff"]):
                r = b.iloc[0]
                return {
                    "text": f"{head}; pre-trained minus random init: {fmt_diff(r['diff'], metric)}, 95% CI "
                    f"{fmt_ci(r['ci_low'], r['ci_high'], metric, diff=True)}: {r['interpretation']}.",
                    "kind": "baseline",
                }
            return {"text": head + "; only one design point, so nothing to compare.", "kind": "single"}
        if not (finite(best["ci_low"]) and finite(best["ci_high"])):
            return {"text": f"{head}: {TOO_FEW_WORDS}.", "kind": "levels"}
        # A CI of no width (every seed the same) measures no seed noise: it is set beside no other one
        same = [r["level"] for _, r in rest.iterrows() if S.zero_width(r["ci_low"], r["ci_high"])]
        overl = [
            r["level"]
            for _, r in rest.iterrows()
            if finite(r["ci_low"])
            and r["level"] not in same
            and not (r["ci_low"] > best["ci_high"] or r["ci_high"] < best["ci_low"])
        ]
        # Separate intervals that overlap are not a test of the difference (a paired one can still find it):
        # no verdict either way without a `report.compare`, whose paired test is the study's answer.
        if S.zero_width(best["ci_low"], best["ci_high"]):
            tail = ": every seed at it scored the same, so its CI is set beside no other level's"
        else:
            tail = (
                f": its CI overlaps {', '.join(map(str, overl))}'s"
                if overl
                else ": its CI is clear of every other level's"
                if len(rest) > len(same)
                else ""
            )
            tail += (
                f"; every seed of {', '.join(map(str, same))} scored the same (no CI to set beside)"
                if same
                else ""
            )
        tail += " (separate intervals, not a test; `report.compare` in the spec names a paired comparison)"
        return {"text": head + tail + _no_gain_over_random(sf, task, mode, metric) + ".", "kind": "levels"}
    total = len(sf.runs)
    done = int((sf.runs["status"] == "done").sum()) if total else 0
    bad = int(sf.runs["status"].isin(["failed", "diverged"]).sum()) if total else 0
    return {
        "text": f"No answer yet: {done} of {total} runs finished ({bad} failed or diverged) and the "
        f"primary metric {plan.get('primary_metric')!r} has no values.",
        "kind": "none",
    }


def _other_mode(sf: StudyFiles, task: str, mode: str, metric: str) -> str:
    """The same comparison on the task's other downstream mode (fine-tune beside a probe answer, or the
    reverse) as a second sentence: a question about both modes should not read as answered by one. It
    is a secondary row (Holm-corrected), so its interval may be drawn at another level."""
    c = sf.comparisons
    if task == "pretrain" or c.empty:
        return ""
    c = c[(c["task"] == task) & (c["metric"] == metric) & (c["mode"] != mode) & (c["mode"] != "pretrain")]
    out = ""
    for r in c.itertuples():
        if finite(r.diff):
            out += (
                f" On {F.metric_label(task, r.mode, metric)}: {fmt_diff(r.diff, metric)}, CI "
                f"{fmt_ci(r.ci_low, r.ci_high, metric, diff=True, level=getattr(r, 'ci_level', None))}: "
                f"{_verdict_words(r.interpretation)}."
            )
    return out


def _no_gain_over_random(sf: StudyFiles, task: str, mode: str, metric: str) -> str:
    """A clause for the answer when no pre-trained level beats its random-init baseline on the answer's
    downstream metric beyond seed noise: then the metric may not see pre-training at all, and a null
    between levels says little about the factor. Empty where one level does, or there is no baseline."""
    b = sf.baseline
    if task == "pretrain" or b.empty or "ci_low" not in b:
        return ""
    b = b[(b["task"] == task) & (b["mode"] == mode) & (b["metric"] == metric) & b["diff"].map(finite)]
    if b.empty or beats_random(b).any():  # the one rule of "sees pre-training" (sees.py)
        return ""
    lo, hi = fmt_diff(b["diff"].min(), metric), fmt_diff(b["diff"].max(), metric)
    span = lo if lo == hi else f"{lo} to {hi}"
    return (
        f"; no pre-trained level beats random init on it beyond seed noise (gains {span}, see What "
        f"pre-training bought), so it may not reflect what pre-training learned"
    )


def _summary_rows(sf: StudyFiles) -> list[dict]:
    s = sf.summary
    if s.empty:
        return []
    s = F.with_levels(
        s[s["init"] == "pretrained"] if "init" in s else s,
        sf.factor_keys,
        F.run_labels(sf.plan, sf.factor_keys),
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
        }
        for r in c.itertuples()
    ]


STATS_COLS = ("ci_level", "p_adjusted", "correction", "primary", "mde")


def _fmt_p(p: Any) -> str:
    return ("< 0.001" if p < 0.001 else f"{p:.3f}") if finite(p) else "–"


def _baseline_rows(sf: StudyFiles) -> list[dict]:
    b = sf.baseline
    if b.empty:
        return []
    keys = [k for k in sf.factor_keys if k in b]
    b = F.with_levels(b, keys, F.run_labels(sf.plan, keys))
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


def _problem_runs(sf: StudyFiles) -> dict:
    # fine-tune seeds that diverged (aggregate.collect): left out of every mean, listed with their error
    ft = sorted(
        sf.study.get("finetune_problems") or [], key=lambda x: (x["label"], x["init"], x["task"], x["seed"])
    )
    r = sf.runs
    if r.empty:
        return {"bad": [], "pending": [], "collapsed": [], "finetune": ft}
    rec, flat = records(r), plateau_hashes(r)
    return {
        "bad": [x for x in rec if x.get("status") in ("failed", "diverged")],
        "pending": [x for x in rec if x.get("status") not in ("failed", "diverged", "done")],
        # collapsed: finished runs not beyond always predicting the most frequent token (the one rule)
        "collapsed": [x for x in rec if str(x.get("run_hash")) in flat],
        "finetune": ft,
    }


def plateau_runs(sf: StudyFiles, factor: str | None = None, levels: tuple = ()) -> list[str]:
    """The floor guard: finished runs that did not learn past always predicting the most frequent token
    (`learned` False in runs.csv), as "label seed k"; with a factor, only those at the given levels of it
    (the two sides of the primary comparison). A study answered from such runs gets no direction."""
    bad = plateau_hashes(sf.runs)
    return [f"{r['label']} seed {r['seed']}" for r in _runs_at(sf, factor, levels) if r["run_hash"] in bad]


def left_out(sf: StudyFiles, factor: str, levels: tuple) -> str:
    """The runs at the compared levels that are not in the answer (failed, diverged or unfinished), as a
    clause for the answer sentence: a level compared on its survivors reads otherwise as if all ran.
    Empty when every run at those levels finished."""
    if sf.runs.empty or not factor:
        return ""
    status = {str(h): str(st) for h, st in zip(sf.runs["run_hash"], sf.runs["status"], strict=True)}
    out = []
    for lev in levels:
        runs = _runs_at(sf, factor, (lev,))
        bad = [
            f"seed {r['seed']} {status.get(r['run_hash'], 'pending')}"
            for r in runs
            if status.get(r["run_hash"]) != "done"
        ]
        if bad:
            out.append(f"{len(bad)} of {len(runs)} runs at {lev}: {', '.join(bad)}")
    return f" (left out: {'; '.join(out)})" if out else ""


def _runs_at(sf: StudyFiles, factor: str | None, levels: tuple) -> list[dict]:
    """The plan's runs at the given levels of `factor` ("label" or a factor key); every run without one."""
    want = {level_key(v) for v in levels}  # level_key: a level read back as 4.0 is the plan's 4
    return [
        r
        for r in sf.plan.get("runs", [])
        if factor is None
        or level_key(r.get("label") if factor == "label" else (r.get("factors") or {}).get(factor)) in want
    ]


def collapse_warning(bad: list[dict], n_runs: int) -> str | None:
    """One sentence for the top of the report when some runs (`_problem_runs`'s collapsed) learned
    nothing beyond one token."""
    if not bad:
        return None
    labels = sorted({str(x.get("label")) for x in bad})
    return (
        f"Warning: {len(bad)} of {n_runs} runs ({', '.join(labels)}) score no better on the reference "
        f"MLM than always predicting the most frequent token: they collapsed or have not trained long "
        f"enough, so a difference involving them measures that, not the factor (see Problems)."
    )


def search_summary(trials: pd.DataFrame | None, direction: str = "minimize") -> dict | None:
    """Counts and the best trial of a trials table (number, state, value, params_<key>...).

    The columns are study/metrics.py's: the search stage's trials.csv and optuna's
    `Study.trials_dataframe()` both fit as they are; `direction` is the study's (minimize/maximize).
    """
    if trials is None or trials.empty:
        return None
    state = (
        trials["state"].astype(str).str.upper()
        if "state" in trials
        else pd.Series("COMPLETE", index=trials.index)
    )
    counts = state.value_counts().to_dict()
    done = (
        trials[state.str.contains("COMPLETE") & trials["value"].notna()]
        if "value" in trials
        else trials.iloc[:0]
    )
    best = None
    if not done.empty:
        b = done.loc[done["value"].idxmin() if direction == "minimize" else done["value"].idxmax()]
        best = {
            "number": int(b["number"]) if "number" in b and finite(b["number"]) else None,
            "value": f"{b['value']:.4g}",
            "params": {key: b[col] for key, col in param_columns(b.index).items()},
        }
    return {"n": len(trials), "counts": counts, "best": best}


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
            direction=search_direction,
        )
        # alt: what the figure shows in one line (title + the caption's first sentence), not just its name
        figs = [
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
    answer = answer_sentence(sf)
    problems = _problem_runs(sf)
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
            recipe=recipe_sentence(sf.plan, sf.study.get("eval_rows")),
            factor_keys=sf.factor_keys,
            summary=_summary_rows(sf),
            comparisons=_comparison_rows(sf),
            baseline=_baseline_rows(sf),
            figures=figs,
            references=sections,
            problems=problems,
            provenance=provenance_section(sf),
            search=search_summary(sf.trials, search_direction),
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
