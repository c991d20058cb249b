"""Our results beside the papers': which of a study's levels a published table's rows match, our
scale against theirs, and a row per paper difference with ours next to it and a verdict.

The matching and verdicts are study/report/references/'s; this module turns a study's aggregate
(studyfiles.StudyFiles) into what the report's "beside the papers" sections show.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from study.levels import level_key
from study.metrics import finite, is_bounded
from study.report import references as R
from study.report import stats as S
from study.report.collect import plateau_hashes
from study.report.comparisons import NOISE_WORDS, SAME_WORDS, compare_sides
from study.report.fmt import fmt_ci, fmt_diff, human
from study.report.levelnames import level_label, run_labels


def _level_dicts(sf) -> tuple[list[dict], pd.DataFrame]:
    s = sf.summary
    if s.empty or not sf.factor_keys:
        return [], s
    s = s[s["init"] == "pretrained"] if "init" in s else s
    levels = s[sf.factor_keys].drop_duplicates().to_dict("records")
    return levels, s


def _level_index(sf, levels: list[dict], value: Any) -> int | None:
    """Which level a `compare` value names: a level of the single factor, or a run label."""
    cmp = sf.plan.get("compare") or {}
    fac = cmp.get("factor")
    if value is None or fac is None:
        return None
    if fac == "label":
        run = next((r for r in sf.plan.get("runs", []) if level_key(r["label"]) == level_key(value)), None)
        if run is None:
            return None
        want = {k: run.get("factors", {}).get(k) for k in sf.factor_keys}
    elif sf.factor_keys == [fac]:
        want = {fac: value}
    else:
        return None
    for idx, lv in enumerate(levels):
        if all(level_key(lv.get(k)) == level_key(v) for k, v in want.items()):
            return idx
    return None


def _ours_by_level(sf, levels: list[dict], s: pd.DataFrame) -> dict:
    ours: dict = {}
    for i, lv in enumerate(levels):
        m = pd.Series(True, index=s.index)
        for k, v in lv.items():
            m &= s[k].isna() if pd.isna(v) else s[k] == v
        for r in s[m].itertuples(index=False):
            ours[(i, r.task, r.mode, r.metric)] = {"mean": r.mean, "ci_low": r.ci_low, "ci_high": r.ci_high}
    cmp = sf.plan.get("compare") or {}
    pairs = None
    i, j = (_level_index(sf, levels, v) for v in compare_sides(cmp))
    if cmp and i is not None and j is not None and not sf.comparisons.empty:
        pairs = [(i, j)]
        for r in sf.comparisons.itertuples(index=False):
            if not finite(r.diff):  # no seed at both levels (n = 0): the per-level CIs judge it instead
                continue
            noise = (
                None
                if not (finite(r.ci_low) and finite(r.ci_high))
                else (NOISE_WORDS in str(r.interpretation))
            )
            same = getattr(r, "ci_method", "") == S.SAME_DIFF or SAME_WORDS in str(r.interpretation)
            ours[("diff", i, j, r.task, r.mode, r.metric)] = {
                "diff": r.diff,
                "ci_low": r.ci_low,
                "ci_high": r.ci_high,
                "noise": noise,
                "why": "no test: the same difference in every seed" if same else None,
                "ci_level": getattr(r, "ci_level", None),  # absent from an aggregate older than stats.py
                "basis": "paired by seed: t-interval at the level of its test",
            }
    return {"ours": ours, "pairs": pairs}


def our_scale(sf) -> dict:
    """What we trained: parameters, tokens seen, corpus, model shapes (from the aggregate only).

    Ranges when they vary across runs (a depth study); ratios against a paper use our LARGEST run,
    so "they used N× our parameters" is never overstated.
    """
    runs, configs = sf.runs, sf.study.get("configs") or {}
    col = lambda c: runs[c].dropna() if c in runs and runs[c].notna().any() else pd.Series(dtype=float)
    params, tokens = col("params"), col("tokens_seen")
    corpus, shapes = "unknown (no run config in the aggregate)", []
    for c in configs.values():
        srcs = (c.get("corpus") or {}).get("sources") or []
        corpus = (
            " + ".join(
                s.get("kind", "?")
                + (f":{Path(s['path']).name}" if s.get("path") else "")
                + (f":{s['name']}" if s.get("name") else "")
                for s in srcs
            )
            or corpus
        )
        m = c.get("model") or {}
        shape = (m.get("layers") or 0, m.get("hidden") or 0, m.get("heads") or 0)
        if m and shape not in shapes:
            shapes.append(shape)
        t, o = c.get("train") or {}, c.get("objective") or {}
        if tokens.empty and t.get("budget") == "steps" and o.get("max_seq_len"):
            tokens = pd.Series([t["amount"] * t["batch_size"] * o["max_seq_len"]], dtype=float)

    def rng(x: pd.Series) -> str:
        if x.empty:
            return "unknown"
        lo, hi = x.min(), x.max()
        return human(hi) if math.isclose(lo, hi, rel_tol=0.01) else f"{human(lo)}–{human(hi)}"

    return {
        "params": params.max() if len(params) else None,
        "tokens": tokens.max() if len(tokens) else None,
        "params_s": rng(params),
        "tokens_s": rng(tokens),
        "corpus": corpus,
        # smallest to largest, whatever order the runs came in
        "model": "; ".join(f"L={ly} H={h} A={a}" for ly, h, a in sorted(shapes))
        if shapes
        else "shape unknown",
    }


def scale_statement(ours: dict, ref: R.Reference) -> str:
    sc = ref.scale
    parts = [
        f"Ours: {ours['params_s']} parameters ({ours['model']}), {ours['tokens_s']} training "
        f"tokens, corpus {ours['corpus']}. Theirs: {human(sc.params)} parameters ({sc.model}), "
        f"{human(sc.train_tokens)} training tokens, {sc.corpus}."
    ]
    if finite(ours["params"]) and sc.params:
        parts.append(f"They used {sc.params / ours['params']:,.0f}× the parameters of our largest run")
        if finite(ours["tokens"]) and sc.train_tokens:
            parts[-1] += f" and {sc.train_tokens / ours['tokens']:,.0f}× its training tokens"
        parts[-1] += "; a direction that agrees is weak support, one that disagrees may be a scale effect."
    if not sc.verified:
        parts.append(f"(Their scale is partly unverified: {sc.provenance}.)")
    return " ".join(parts)


PLATEAU = "not trained past the plateau"


def paper_diff_s(diff: float, metric: str) -> str:
    """The paper's difference in our unit rule (fmt_diff): tables print scores in percent, we store fractions."""
    return fmt_diff(diff / 100 if is_bounded(metric) else diff, metric)


def _plateau_levels(sf, levels: list[dict]) -> set[int]:
    """Indices of the levels with a finished run that did not learn past the most frequent token: the
    answer's guard (problems.plateau_runs), applied to each level's runs (all its factor values match)."""
    bad = plateau_hashes(sf.runs)
    runs = [r for r in sf.plan.get("runs", []) if r["run_hash"] in bad]
    return {
        i
        for i, lv in enumerate(levels)
        if any(
            all(level_key((r.get("factors") or {}).get(k)) == level_key(v) for k, v in lv.items())
            for r in runs
        )
    }


def reference_sections(sf) -> list[dict]:
    plan = sf.plan
    refs = R.for_study(plan.get("kind", "generic"), plan.get("references"))
    levels, s = _level_dicts(sf)
    od = _ours_by_level(sf, levels, s) if levels else {"ours": {}, "pairs": None}
    ours_sc = our_scale(sf)
    flat = _plateau_levels(sf, levels)
    out = []
    for ref in refs:
        cmp = (
            R.paper_vs_ours(ref, levels, od["ours"], pairs=od["pairs"])
            if levels
            else {
                "rows": [],
                "confounders": [],
                "matched": {},
                "note": "no finished runs to compare with",
                "trend": None,
            }
        )
        rows, unmeasured = [], []
        for r in cmp["rows"]:
            o = r["ours"]
            if o is None:  # listed in one line instead of a table row per column
                what = f"{r['column']} ({r['task']} {r['metric']})"
                if what not in unmeasured:
                    unmeasured.append(what)
                continue
            if (
                r["i"] in flat or r["j"] in flat
            ):  # the answer's floor guard: a difference measures the plateau
                r = {**r, "verdict": PLATEAU}
            rows.append(
                {
                    **r,
                    "paper_diff_s": paper_diff_s(r["paper_diff"], r["metric"]),
                    "ours_diff_s": fmt_diff(o["diff"], r["metric"]) if o else "not measured",
                    "ours_ci_s": (
                        fmt_ci(
                            o.get("ci_low"), o.get("ci_high"), r["metric"], diff=True, level=o.get("ci_level")
                        )
                        if o and o.get("ci_low") is not None
                        else (o or {}).get("basis", "")
                    ),
                    "klass": {"agrees": "good", "disagrees": "bad"}.get(r["verdict"], "meh"),
                }
            )
        v = ref.verification.verified
        out.append(
            {
                "ref": ref,
                "citation": ref.citation,
                "scale": scale_statement(ours_sc, ref),
                "rows": rows,
                "unmeasured": unmeasured,
                "trend": cmp.get("trend"),
                "verified": {True: "verified", False: "NOT verified", "partial": "partly verified"}[v],
                "note": cmp["note"],
                "confounders": cmp["confounders"],
                "matched": {
                    level_label(levels[i], sf.factor_keys, run_labels(plan, sf.factor_keys)): lab
                    for i, lab in cmp["matched"].items()
                },
                "table_cols": [c.name for c in ref.columns],
                "table_rows": [
                    {
                        "label": r.label,
                        "verified": r.verified,
                        "cells": [
                            ("–" if r.values.get(c.name) is None else str(r.values[c.name]))
                            for c in ref.columns
                        ],
                    }
                    for r in ref.rows
                ],
            }
        )
    return out


def papers_markdown(sf) -> str:
    """The report's "beside the papers" comparison rows as Markdown, for a results page that gathers
    several studies (`study papers SPEC`; docs/RESULTS.md's replication table). Same rows and verdicts
    as the HTML report: both come from reference_sections."""
    name = sf.plan.get("name", "?")
    out = []
    for s in reference_sections(sf):
        out += [f"**{name}** beside {s['citation']} ({s['verified']}). {s['scale']}", ""]
        if s["matched"]:
            out += [
                "Matched levels: "
                + "; ".join(f'ours `{ours}` = paper "{paper}"' for ours, paper in s["matched"].items())
                + ".",
                "",
            ]
        if s["rows"]:
            out += [
                "| column | ours: task / metric | paper: from -> to | paper diff | ours diff | ours CI | direction |",
                "|---|---|---|---|---|---|---|",
            ]
            for r in s["rows"]:
                unver = "" if r["paper_verified"] else " (unverified)"
                out.append(
                    f"| {r['column']} | {r['task']} {r['mode']} {r['metric']} | {r['paper_a_label']} "
                    f"{r['paper_a']} -> {r['paper_b_label']} {r['paper_b']}{unver} | {r['paper_diff_s']} | "
                    f"{r['ours_diff_s']} | {r['ours_ci_s']} | {r['verdict']} |"
                )
        else:
            out.append(f"No row to compare: {s['note'] or 'no level of ours matches a paper row'}.")
        if s["unmeasured"]:
            out += ["", "Not measured in this study: " + ", ".join(s["unmeasured"]) + "."]
        out.append("")
    return "\n".join(out) if out else f"**{name}**: no published table is attached to this study's kind.\n"
