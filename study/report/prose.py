"""The report's sentences: the answer (one sentence with its CI, or why there is none), the methods
(the statistics stated once) and the recipe (what was pre-trained and how it was fine-tuned)."""

from __future__ import annotations

import re
from typing import Any

from study.metrics import COST_METRICS, finite, lower_is_better, parse_metric
from study.report import stats as S
from study.report.comparisons import AVERAGED_NOTE, NOISE_WORDS, PAIRED_NOTE, TOO_FEW_WORDS
from study.report.fmt import fmt_ci, fmt_diff, fmt_value
from study.report.levelnames import metric_label, run_labels, select, with_levels
from study.report.pooled import model_sentence
from study.report.problems import left_out, plateau_runs
from study.report.sees import beats_random
from study.report.studyfiles import StudyFiles

NOTES = f"(?:{PAIRED_NOTE}|{AVERAGED_NOTE})"  # comparisons.compare's notes after the verdict


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
    (study.studies.specfile.recipe_values). A setting that differs between runs lists every value ("2 / 4 / 6
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


def answer_sentence(sf: StudyFiles) -> dict:
    """The study's answer in ONE sentence with its CI, or why there is none yet; and, whatever the answer
    (too few seeds, a plateau), a second when every pre-trained level scored below random init on the
    primary metric: pre-training that hurt is a finding the headline must not leave to a lower table."""
    ans = _answer(sf)
    task, mode, metric = parse_metric(sf.plan.get("primary_metric"), field="report.primary_metric")
    span = _below_random(sf, task, mode, metric)
    if span and BELOW_RANDOM not in ans["text"]:
        what = metric_label(task, mode, metric)
        ans["text"] += f" {BELOW_RANDOM[0].upper()}{BELOW_RANDOM[1:]} on {what} (gains {span})."
    return ans


BELOW_RANDOM = "every pre-trained level scored below random init"


def _below_random(sf: StudyFiles, task: str, mode: str, metric: str) -> str | None:
    """The gains' span when every pre-trained level's mean is below its random-init baseline, else None."""
    b = sf.baseline
    if task == "pretrain" or b.empty or "diff" not in b:
        return None
    b = b[(b["task"] == task) & (b["mode"] == mode) & (b["metric"] == metric) & b["diff"].map(finite)]
    if b.empty or not (b["diff"] < 0).all():
        return None
    lo, hi = fmt_diff(b["diff"].min(), metric), fmt_diff(b["diff"].max(), metric)
    return lo if lo == hi else f"{lo} to {hi}"


def _answer(sf: StudyFiles) -> dict:
    plan, ans = sf.plan, sf.study.get("answer")
    task, mode, metric = parse_metric(plan.get("primary_metric"), field="report.primary_metric")
    what = metric_label(task, mode, metric)
    if ans and (finite(ans.get("diff")) or ans.get("n") == 0):  # n = 0: no seed at both levels, said below
        return _paired_answer(sf, ans, (task, mode, metric), what)
    s = select(sf.summary, task, mode, metric) if not sf.summary.empty else sf.summary
    flat = plateau_runs(sf)
    if len(s) >= 1 and flat:
        return {
            "text": f"not trained past the plateau: {len(flat)} of {len(sf.runs)} runs ({', '.join(flat)}) score "
            f"no better on the reference MLM than always predicting the most frequent token, so the "
            f"levels' {what} would measure how fast they left it; no best level is named.",
            "kind": "plateau",
        }
    if len(s) >= 1:
        return _levels_answer(sf, s, (task, mode, metric), what)
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
                f" On {metric_label(task, r.mode, metric)}: {fmt_diff(r.diff, metric)}, CI "
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
    # Pre-training that left every level below random init is a finding: said as such in the answer
    worse = BELOW_RANDOM if _below_random(sf, task, mode, metric) else ""
    return (
        f"; {worse or 'no pre-trained level beats random init'} on it"
        f"{'' if worse else ' beyond seed noise'} (gains {span}, see What pre-training bought), so it may not "
        "reflect what pre-training learned"
    )


def _paired_answer(sf: StudyFiles, ans: dict, key: tuple[str, str, str], what: str) -> dict:
    """The answer from the primary paired comparison (study.json's `answer`)."""
    plan, (task, mode, metric) = sf.plan, key
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
        # enough seeds, but no test (the same difference in every seed: comparisons.interpret says so)
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


def _levels_answer(sf: StudyFiles, s, key: tuple[str, str, str], what: str) -> dict:
    """Without a paired comparison: the best level by its mean, its CI set beside the others' (no test)."""
    plan, (task, mode, metric) = sf.plan, key
    lower_better = lower_is_better(metric)
    s = with_levels(s, sf.factor_keys, run_labels(plan, sf.factor_keys)).sort_values(
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
