"""The search in a study's report: the trials table with the plateau guard per trial, the best trial and
its parameters, the parameter importances, and the headline a search spec gets (its best trial and
whether it learned) instead of "No answer yet" about the spec's own, often untrained, default run.

Input: results/search/<name>/trials.csv (the search stage's table: study/metrics.py's TRIAL_COLUMNS and
`params_<key>` columns) and, where `study report` has them, the trials' run folders: the guard is
report/collect.py's rule (`learned` per run, `plateau_hashes` over them), applied here, never restated.
The report imports no search stage (tests/test_architecture.py): the search's `search-best` calls
`not_learned` below, so both say the same thing about a trial.
"""

from __future__ import annotations

import json
import sys
import warnings

import pandas as pd

from study.metrics import finite, param_columns
from study.paths import Layout
from study.report.aggregate import aggregate_study
from study.report.collect import learned, plateau_hashes
from study.report.plotting import Drawn, new_figure
from study.rundir import RunDir

FLOOR = "always predicting the most frequent token"


# --------------------------------------------------------------------------- the plateau guard per trial
def run_guard(run_hashes: list[str], layout: Layout) -> pd.DataFrame:
    """run_hash, status, learned (report/collect.py's rule) of each run folder: plateau_hashes' input."""
    return pd.DataFrame(
        [
            {
                "run_hash": h,
                "status": RunDir(layout, h).status().status,
                "learned": learned(RunDir(layout, h).metrics()),
            }
            for h in dict.fromkeys(run_hashes)
        ],
        columns=["run_hash", "status", "learned"],
    )


def not_learned(run_hashes: list[str], layout: Layout) -> list[str]:
    """The runs of a trial that finished without learning past the floor: the report's plateau guard."""
    return sorted(plateau_hashes(run_guard(run_hashes, layout)))


def trial_runs(row) -> list[str]:
    """A trials.csv row's runs: every seed's (run_hashes, a JSON list), else its first (run_hash)."""
    raw = row.get("run_hashes")
    if isinstance(raw, str) and raw.strip():
        try:
            return [str(h) for h in json.loads(raw)]
        except ValueError:
            pass
    h = row.get("run_hash")
    return [str(h)] if isinstance(h, str) and h else []


def with_guard(trials: pd.DataFrame, layout: Layout) -> pd.DataFrame:
    """The trials table plus `not_learned` (the trial's runs on the plateau, space-separated) and `learned`
    (False: one of its runs is on the plateau; True: every run finished and beat the floor; None: not
    scored, e.g. unfinished runs or runs from before the floor existed)."""
    hashes = [trial_runs(r) for r in trials.to_dict("records")]
    guard = run_guard([h for hs in hashes for h in hs], layout)
    flat = plateau_hashes(guard)
    ok = set(guard.loc[(guard["status"] == "done") & (guard["learned"] == True), "run_hash"])  # noqa: E712
    return trials.assign(
        not_learned=[" ".join(h for h in hs if h in flat) for hs in hashes],
        learned=[False if flat & set(hs) else (True if hs and set(hs) <= ok else None) for hs in hashes],
    )


def search_inputs(plan: dict, layout: Layout, quiet: bool = False) -> pd.DataFrame | None:
    """What `study report` on a search spec needs: the aggregate (written first when there is none, so the
    search renders without a hand-run `study aggregate`) and the trials table with the guard, read from
    the run folders (None when the search has written no trials.csv yet)."""
    if not (layout.study_dir(plan["name"]) / "study.json").exists():
        out = aggregate_study(plan, layout)
        if not quiet:
            print(f"no aggregate yet: written to {out} for the report", file=sys.stderr)
    path = layout.search_trials(plan["name"])
    return with_guard(pd.read_csv(path), layout) if path.exists() else None


# --------------------------------------------------------------------------- the section and the headline
def _done(trials: pd.DataFrame) -> pd.DataFrame:
    state = (
        trials["state"].astype(str).str.upper()
        if "state" in trials
        else pd.Series("COMPLETE", index=trials.index)
    )
    if "value" not in trials:
        return trials.iloc[:0]
    return trials[state.str.contains("COMPLETE") & trials["value"].notna()]


def _guard_word(v) -> str:
    return {"True": "yes", "False": "no"}.get(str(v), "–")


def _row(r: dict, best: int | None) -> dict:
    return {
        "number": r.get("number"),
        "state": str(r.get("state", "COMPLETE")).lower(),
        "value": f"{r['value']:.4g}" if finite(r.get("value")) else "–",
        "params": ", ".join(f"{k}={r[c]}" for k, c in param_columns(r).items() if not pd.isna(r[c])),
        "runs": " ".join(trial_runs(r)),
        "learned": _guard_word(r.get("learned")),
        "best": best is not None and r.get("number") == best,
    }


def search_summary(trials: pd.DataFrame | None, direction: str = "minimize") -> dict | None:
    """Counts, the best trial (number, value, params, the guard) and one row per trial of a trials table
    (number, state, value, params_<key>...; run_hashes and learned when it has them).

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
    done, best = _done(trials), None
    if not done.empty:
        b = done.loc[done["value"].idxmin() if direction == "minimize" else done["value"].idxmax()]
        best = {
            "number": int(b["number"]) if "number" in b and finite(b["number"]) else None,
            "value": f"{b['value']:.4g}",
            "params": {key: b[col] for key, col in param_columns(b.index).items()},
            "learned": b.get("learned"),
            "not_learned": b.get("not_learned") if isinstance(b.get("not_learned"), str) else "",
        }
    rows = trials.sort_values("number") if "number" in trials else trials
    return {
        "n": len(trials),
        "n_done": len(done),
        "counts": state.value_counts().to_dict(),
        "best": best,
        "direction": direction,
        "rows": [_row(r, best and best["number"]) for r in rows.to_dict("records")],
        "guarded": "learned" in trials,
    }


def search_answer(answer: dict, search: dict | None) -> dict:
    """The headline of a study with a search: its best trial and whether it learned, then the study's own
    answer when there is one (an answer of kind "none" about the spec's default run is left out)."""
    if not search:
        return answer
    b = search["best"]
    if b is None:
        text = f"Search: {search['n']} trials, none complete with a value yet."
    else:
        params = ", ".join(f"{k}={v}" for k, v in b["params"].items()) or "no parameters"
        text = (
            f"Search: the best of {search['n_done']} complete trials is #{b['number']} "
            f"(value {b['value']}, {search['direction']}d) with {params}; "
        )
        if str(b["learned"]) == "False":
            text += (
                f"it did NOT learn: its run(s) {b['not_learned']} score no better on the reference MLM than "
                f"{FLOOR}, so its value ranks how fast trials left the plateau, not the settings."
            )
        elif str(b["learned"]) == "True":
            text += f"it learned past {FLOOR} (the plateau guard)."
        else:
            text += "whether it learned is unknown here (its runs are not scored against the floor)."
    if answer.get("kind") != "none":
        text += " " + answer["text"]
    return {**answer, "text": text, "kind": "search" if answer.get("kind") == "none" else answer["kind"]}


# --------------------------------------------------------------------------- the importance figure
def importances(trials: pd.DataFrame, direction: str = "minimize") -> dict[str, float]:
    """optuna's fANOVA importance (seeded: the same table, the same numbers) of the searched parameters
    over the complete trials, computed on an in-memory optuna study rebuilt from the table: the report
    needs only trials.csv, not the search's storage. {} with fewer than 2 complete trials or 2 varying
    parameters (one parameter's importance is 1 by construction)."""
    import optuna  # 1 s with sklearn's forest: only for a report that has a search

    done, dists = _done(trials), {}
    for key, col in param_columns(done.columns).items():
        vals = done[col].dropna()
        num = pd.to_numeric(vals, errors="coerce")
        if vals.nunique() < 2:
            continue  # a parameter that never varied has no importance to estimate
        if num.notna().all():
            dists[key] = optuna.distributions.FloatDistribution(float(num.min()), float(num.max()))
        else:
            dists[key] = optuna.distributions.CategoricalDistribution(sorted(vals.astype(str).unique()))
    if len(done) < 2 or len(dists) < 2:
        return {}
    cols = param_columns(done.columns)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created in memory" line in a report
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ostudy = optuna.create_study(direction=direction)
            for r in done.to_dict("records"):
                params = {
                    k: (
                        float(r[cols[k]])
                        if isinstance(d, optuna.distributions.FloatDistribution)
                        else str(r[cols[k]])
                    )
                    for k, d in dists.items()
                    if not pd.isna(r[cols[k]])
                }
                ostudy.add_trial(
                    optuna.trial.create_trial(
                        params=params, distributions={k: dists[k] for k in params}, value=float(r["value"])
                    )
                )
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
            return dict(optuna.importance.get_param_importances(ostudy, evaluator=evaluator))
    finally:
        optuna.logging.set_verbosity(verbosity)


def search_importance(trials: pd.DataFrame | None, direction: str = "minimize") -> Drawn:
    """A bar per searched parameter: its share of the objective's variance over the complete trials."""
    d = Drawn(
        "search_importance",
        "Search: parameter importance",
        "optuna's fANOVA importance of each searched parameter (its share of the objective's variance over "
        "the complete trials, seeded); with few trials it is a rough ranking, not a measurement.",
    )
    imp = importances(trials, direction) if trials is not None and not trials.empty else {}
    if not imp:
        d.skipped = "importance needs 2 complete trials and 2 searched parameters that varied"
        return d
    keys = sorted(imp, key=imp.get)
    fig, (ax,) = new_figure(1, width=6.0, height=1.2 + 0.35 * len(keys))
    ax.barh(keys, [imp[k] for k in keys], color="C0")
    ax.set_xlabel("importance (fANOVA)")
    ax.set_xlim(0, 1)
    d.caption += " " + ", ".join(f"{k} {imp[k]:.2f}" for k in reversed(keys)) + "."
    d.fig = fig
    return d
