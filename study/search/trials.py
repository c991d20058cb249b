"""What a search leaves for people and for the report: trials.csv, best.json and the best trial as a spec.

results/search/<name>/trials.csv has one row per trial, with the columns study/metrics.py defines
(TRIAL_COLUMNS, then one `params_<key>` column per searched key): the
report reads it with the same names. `study search-best` writes a self-contained spec that re-trains the
best trial's configuration with `search.best_seeds`, and best.json: the best trial with what produced it.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import sys
import tempfile
import textwrap
from pathlib import Path

import yaml

from study.errors import StudyError
from study.io import atomic_write_json, atomic_write_text
from study.metrics import TRIAL_COLUMNS, param_column
from study.paths import Layout
from study.search.checks import load_search
from study.search.configs import resolve_settings, search_fingerprint, tidy_params
from study.search.storage import check_fingerprint, open_storage
from study.studies.searchspec import SearchSpec
from study.studies.spec import Study, load_study


def trials_rows(ostudy) -> list[dict]:
    """One dict per trial: TRIAL_COLUMNS, then `params_<key>` for each sampled key."""
    rows = []
    for t in ostudy.get_trials(deepcopy=False):
        ua = t.user_attrs
        params = tidy_params(t.params)
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value,
                "params": json.dumps(params, sort_keys=True),
                "run_hash": ua.get("run_hash"),
                "tokens": ua.get("tokens"),
                "tokens_total": ua.get("tokens_total"),
                "reused": ua.get("reused"),
                "retry_of": t.system_attrs.get("failed_trial"),
                "duplicate_of": ua.get("duplicate_of"),
                "worker": ua.get("worker"),
                "datetime_start": t.datetime_start.isoformat() if t.datetime_start else None,
                "datetime_complete": t.datetime_complete.isoformat() if t.datetime_complete else None,
                "run_hashes": json.dumps(ua["run_hashes"]) if "run_hashes" in ua else None,
                "commit": ua.get("commit"),
                **{param_column(k): v for k, v in params.items()},
            }
        )
    return rows


def export_trials(ostudy, path: Path) -> Path:
    """results/search/<name>/trials.csv: one row per trial, for the report."""
    rows = trials_rows(ostudy)
    cols = list(TRIAL_COLUMNS) + sorted({k for r in rows for k in r if k not in TRIAL_COLUMNS})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())
    return path


def best_spec(study: Study, search: SearchSpec, ostudy) -> dict:
    """A self-contained spec that re-trains the best trial's configuration with `best_seeds`."""
    try:
        best = ostudy.best_trial
    except ValueError:
        raise StudyError(f"search '{study.name}' has no complete trial yet", field="search") from None
    settings = best.user_attrs.get("settings") or resolve_settings(best.params, study.defaults)
    objective = search.objective if isinstance(search.objective, str) else "ref_ppl"
    what = (
        search.objective
        if isinstance(search.objective, str)
        else " + ".join(f"{w:g}*{m}" for m, w in search.terms.items())
    )
    return {
        "name": f"{study.name}-best",
        "question": (
            f"Re-train the best configuration of search '{study.name}' (trial {best.number}: "
            f"{what} = {best.value:.6g}, {search.resolved_direction}d) "
            f"with {len(search.best_seeds)} seeds."
        ),
        # Resolved defaults (base chain and profile folded in) so the file stands alone.
        "defaults": copy.deepcopy(study.defaults),
        "runs": [{"label": "best", "set": settings}],
        "seeds": list(search.best_seeds),
        "report": {"primary_metric": objective},
    }


def write_best(
    spec: str | Path,
    out: str | Path | None = None,
    *,
    storage: str | None = None,
    layout: Layout = Layout(),
    profile: str | None = None,
) -> Path:
    """`study search-best`: the best trial as a spec (default <spec folder>/<name>-best.yaml), plus
    trials.csv and best.json under results/search/<name>/."""
    import optuna  # only once a search is read: this package is imported by the CLI

    from study.provenance import provenance  # hardware imports torch: only once there is a best to write

    study, search = load_search(spec, profile=profile)
    out = Path(out) if out else Path(spec).parent / f"{study.name}-best.yaml"
    store = open_storage(
        storage, search, layout.search_dir(study.name), create=False
    )  # none there: StudyError
    try:
        ostudy = optuna.load_study(study_name=study.name, storage=store)
    except KeyError:
        raise StudyError(
            f"no search '{study.name}' in this storage; run `study search {spec}` first",
            field="--storage",
            allowed="the --storage URL the search used",
        ) from None
    # trials of another space or other settings: their best is not this spec's (a value outside its range)
    check_fingerprint(ostudy, search_fingerprint(study, search))
    doc = best_spec(study, search, ostudy)
    text = f"# Written by `study search-best {spec}` from optuna study '{study.name}'.\n" + yaml.safe_dump(
        doc, sort_keys=False
    )
    with tempfile.TemporaryDirectory() as tmp:  # a valid spec before anything is written
        (Path(tmp) / out.name).write_text(text)
        load_study(Path(tmp) / out.name)  # raises StudyError naming the field if not
    best = ostudy.best_trial
    # the report's plateau guard, one rule (report/searchreport.py); pandas: only once a best is written (0.5 s)
    from study.report.searchreport import not_learned

    flat = not_learned(best.user_attrs.get("run_hashes") or [best.user_attrs.get("run_hash")], layout)
    if flat:  # the search's best may be the least bad of trials that all stayed on the plateau
        warning = (
            f"the best trial (#{best.number}) did not learn: its run(s) {', '.join(flat)} score no better on "
            "the reference MLM at [MASK] than always predicting the most frequent token (the report's plateau "
            "guard), so its value ranks how fast trials left the plateau, not the settings; train longer "
            "(train.amount) or widen the search before re-training this"
        )
        print(f"warning: {warning}", file=sys.stderr)
        text = "".join(f"# WARNING: {line}\n" for line in textwrap.wrap(warning, 100)) + text
    info = {
        "number": best.number,
        "value": best.value,
        "params": best.params,
        "run_hash": best.user_attrs.get("run_hash"),
        "run_hashes": best.user_attrs.get("run_hashes"),
        "spec": str(out),
        "search_spec": str(spec),
        "profile": profile,
        "seeds": list(search.seeds),
        "not_learned": flat,  # the best trial's runs on the plateau (empty: it learned, or not scored here)
        "provenance": provenance(),
    }
    atomic_write_text(out, text)
    export_trials(ostudy, layout.search_trials(study.name))
    atomic_write_json(layout.search_dir(study.name) / "best.json", info)
    return out
