"""What a search leaves for people and for the report: trials.csv, best.json and the best trial as a spec.

results/search/<name>/trials.csv has one row per trial, with the columns study/metrics.py defines
(TRIAL_COLUMNS, then one `params_<key>` column per searched key): the report reads it with the same
names. `study search-best` writes a self-contained spec that re-trains the best trial's configuration
with `search.best_seeds`.
"""
from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import yaml

from study.errors import StudyError
from study.io import atomic_write_json, atomic_write_text
from study.metrics import TRIAL_COLUMNS, param_column
from study.paths import Layout
from study.search.checks import load_search
from study.search.configs import resolve_settings, tidy_params
from study.search.storage import open_storage
from study.studies.searchspec import SearchSpec
from study.studies.spec import Study, load_study


def trials_rows(ostudy) -> list[dict]:
    """One dict per trial: TRIAL_COLUMNS, then `params_<key>` for each sampled key."""
    rows = []
    for t in ostudy.get_trials(deepcopy=False):
        ua = t.user_attrs
        params = tidy_params(t.params)
        rows.append({
            "number": t.number, "state": t.state.name, "value": t.value,
            "params": json.dumps(params, sort_keys=True), "run_hash": ua.get("run_hash"),
            "tokens": ua.get("tokens"), "tokens_total": ua.get("tokens_total"), "reused": ua.get("reused"),
            "retry_of": t.system_attrs.get("failed_trial"), "duplicate_of": ua.get("duplicate_of"),
            "worker": ua.get("worker"),
            "datetime_start": t.datetime_start.isoformat() if t.datetime_start else None,
            "datetime_complete": t.datetime_complete.isoformat() if t.datetime_complete else None,
            **{param_column(k): v for k, v in params.items()},
        })
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
    what = search.objective if isinstance(search.objective, str) else \
        " + ".join(f"{w:g}*{m}" for m, w in search.terms.items())
    return {
        "name": f"{study.name}-best",
        "question": (f"Re-train the best configuration of search '{study.name}' (trial {best.number}: "
                     f"{what} = {best.value:.6g}, {search.resolved_direction}d) "
                     f"with {len(search.best_seeds)} seeds."),
        # Resolved defaults (base chain and profile folded in) so the file stands alone.
        "defaults": copy.deepcopy(study.defaults),
        "runs": [{"label": "best", "set": settings}],
        "seeds": list(search.best_seeds),
        "report": {"primary_metric": objective},
    }


def write_best(spec: str | Path, out: str | Path | None = None, *, storage: str | None = None,
               layout: Layout = Layout(), profile: str | None = None) -> Path:
    """`study search-best`: the best trial as a spec (default <spec folder>/<name>-best.yaml), plus
    trials.csv and best.json under results/search/<name>/."""
    import optuna  # only once a search is read: this package is imported by the CLI
    study, search = load_search(spec, profile=profile)
    out = Path(out) if out else Path(spec).parent / f"{study.name}-best.yaml"
    default_db = layout.search_dir(study.name) / "study.db"
    if storage is None and not default_db.is_file():   # opening it would create an empty storage
        raise StudyError(f"no search storage at {default_db}; run `study search {spec}` first", field="--storage",
                         allowed="the --storage URL the search used, or the default after a `study search`")
    store = open_storage(storage, search, layout.search_dir(study.name))
    try:
        ostudy = optuna.load_study(study_name=study.name, storage=store)
    except KeyError:
        raise StudyError(f"no search '{study.name}' in this storage; run `study search {spec}` first",
                         field="--storage") from None
    doc = best_spec(study, search, ostudy)
    text = (f"# Written by `study search-best {spec}` from optuna study '{study.name}'.\n"
            + yaml.safe_dump(doc, sort_keys=False))
    atomic_write_text(out, text)
    load_study(out)  # what we wrote must be a valid spec; raises StudyError naming the field if not
    export_trials(ostudy, layout.search_dir(study.name) / "trials.csv")
    atomic_write_json(layout.search_dir(study.name) / "best.json",
                      {"number": ostudy.best_trial.number, "value": ostudy.best_value,
                       "params": ostudy.best_params, "run_hash": ostudy.best_trial.user_attrs.get("run_hash"),
                       "spec": str(out)})
    return out
