"""What the report flags before its answer: runs that failed, diverged or are pending, fine-tune seeds that
diverged, and runs that did not learn past always predicting the most frequent token (the floor guard:
an answer that rests on them claims no direction)."""

from __future__ import annotations

from study.levels import level_key
from study.report.collect import plateau_hashes
from study.report.provenance import records
from study.report.studyfiles import StudyFiles


def problem_runs(sf: StudyFiles) -> dict:
    # fine-tune seeds that diverged (collect.collect): left out of every mean, listed with their error
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
    """One sentence for the top of the report when some runs (`problem_runs`'s collapsed) learned
    nothing beyond one token."""
    if not bad:
        return None
    labels = sorted({str(x.get("label")) for x in bad})
    return (
        f"Warning: {len(bad)} of {n_runs} runs ({', '.join(labels)}) score no better on the reference "
        f"MLM than always predicting the most frequent token: they collapsed or have not trained long "
        f"enough, so a difference involving them measures that, not the factor (see Problems)."
    )
