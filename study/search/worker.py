"""One search worker: `run_search` runs trials against a shared optuna study until the study is done.

Workers are plain processes: N of them, on one or several machines, run `study search SPEC --storage
URL` against one optuna study (study/search/storage.py). Each trial sends a heartbeat; a running trial
whose worker died is failed by the next worker that looks and re-queued with the same params, so
nothing is lost and numbers never repeat. On a grid, racing workers never finish one point twice
(study/search/grid.py). The storage is plain optuna, readable by optuna-dashboard.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import TrialState
from tqdm.auto import tqdm

from study.config import RunConfig
from study.errors import StudyError
from study.paths import Layout
from study.search.checks import load_search
from study.search.configs import base_point, resolve_settings, search_fingerprint, trial_config
from study.search.grid import grid_open_points, one_line_for_duplicates
from study.search.objective import Objective, worker_id
from study.search.samplers import make_pruner, make_sampler
from study.search.storage import check_fingerprint, open_storage
from study.search.trials import export_trials
from study.studies.searchspec import SearchSpec
from study.studies.spec import Study


def create_or_load(storage, study: Study, search: SearchSpec, base: RunConfig):
    """The optuna study of this spec in `storage`; one that holds another objective, or trials of another
    space or other settings (search_fingerprint), is a StudyError."""
    fingerprint = search_fingerprint(study, search)  # before the storage is written: a bad spec fails first
    ostudy = optuna.create_study(
        storage=storage,
        study_name=study.name,
        direction=search.resolved_direction,
        sampler=make_sampler(search),
        pruner=make_pruner(search, base),
        load_if_exists=True,
    )
    want = {"objective": search.terms, "direction": search.resolved_direction}
    have = ostudy.user_attrs.get("objective")
    if have is None:
        ostudy.set_user_attr("objective", search.terms)
        ostudy.set_user_attr("direction", search.resolved_direction)
        ostudy.set_user_attr("spec", str(study.path))
        ostudy.set_user_attr("params", sorted(search.params))
    elif have != want["objective"] or ostudy.user_attrs.get("direction") != want["direction"]:
        raise StudyError(
            f"the storage already holds a study '{study.name}' with objective {have} "
            f"({ostudy.user_attrs.get('direction')}); this spec asks for {want['objective']} "
            f"({want['direction']})",
            field="search.objective",
            allowed="the same objective, or another --storage / study name",
        )
    check_fingerprint(ostudy, fingerprint)
    if "fingerprint" not in ostudy.user_attrs:  # a new study (or one from before fingerprints: from now on)
        ostudy.set_user_attr("fingerprint", fingerprint)
    return ostudy


def run_search(
    spec: str | Path,
    *,
    storage: str | None = None,
    n_trials: int | None = None,
    timeout: float | None = None,
    layout: Layout = Layout(),
    profile: str | None = None,
    quiet: bool = False,
    train_fn: Callable | None = None,
    finetune_fn: Callable | None = None,
):
    """One worker: run trials until the study has `n_trials` finished (complete or pruned) trials and
    none running or queued, the grid is exhausted, or this worker's `timeout` passes. Returns the
    optuna study.

    A worker does not leave while other trials are still running: if one of them belongs to a dead
    worker, it is this worker that notices (heartbeat) and runs the retry.
    """

    study, search = load_search(spec, profile=profile)
    n_trials = n_trials if n_trials is not None else search.n_trials
    timeout = timeout if timeout is not None else search.timeout
    if n_trials is not None and n_trials < 1:
        raise StudyError(
            f"got {n_trials}", field="--n-trials", allowed="an integer >= 1 (default: search.n_trials)"
        )
    if timeout is not None and not timeout > 0:  # 0 or less would end the search before its first trial
        raise StudyError(f"got {timeout:g}", field="--timeout", allowed="seconds > 0")
    base = trial_config(study, resolve_settings(base_point(search.params), study.defaults), search.seeds[0])
    out_dir = layout.search_dir(study.name)
    store = open_storage(storage, search, out_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING if quiet else optuna.logging.INFO)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    logging.getLogger("optuna.study._optimize").addFilter(one_line_for_duplicates)
    ostudy = create_or_load(store, study, search, base)
    objective = Objective(
        study,
        search,
        layout,
        quiet=True if quiet else not sys.stderr.isatty(),
        train_fn=train_fn,
        finetune_fn=finetune_fn,
    )
    bar = tqdm(total=n_trials, desc=f"search {study.name}", unit="trial", disable=quiet)
    t0, failures = time.monotonic(), 0
    try:
        while timeout is None or time.monotonic() - t0 < timeout:
            action = _next_action(ostudy, search, n_trials, bar)
            if action == "stop":
                break
            if action == "wait":  # others are finishing the last trials, or a grid point's holder runs
                time.sleep(min(search.heartbeat_interval, 2))
                continue
            failures = _one_trial(ostudy, objective, failures)
    finally:
        bar.close()
        export_trials(ostudy, layout.search_trials(study.name))
    return ostudy


def _next_action(ostudy, search: SearchSpec, n_trials: int | None, bar) -> str:
    """ "stop", "wait" or "run" a trial, from the trials' states in the storage (the bar shows them)."""
    optuna.storages.fail_stale_trials(ostudy)
    trials = ostudy.get_trials(deepcopy=False)
    counts = {s: sum(t.state == s for t in trials) for s in TrialState}
    finished = counts[TrialState.COMPLETE] + counts[TrialState.PRUNED]
    bar.n = min(finished, n_trials or finished)
    bar.refresh()
    waiting, running = counts[TrialState.WAITING], counts[TrialState.RUNNING]
    if n_trials is not None and finished >= n_trials and not waiting and not running:
        # Not while a trial still runs, even with enough finished: its worker may be dead, and once
        # the last worker has left nobody fails it by heartbeat (it stayed RUNNING for ever: seen in
        # CI, journal storage). The waits below run until it ends or its retry comes as WAITING.
        return "stop"
    if search.sampler.kind == "grid" and not waiting and not grid_open_points(ostudy, trials):
        # every point was run; or a new trial would only duplicate a running point: wait (a dead
        # holder's retry comes as WAITING)
        return "wait" if running else "stop"
    if n_trials is not None and not waiting and finished + running >= n_trials:
        return "wait"  # others are finishing the last trials
    return "run"


def _one_trial(ostudy, objective, failures: int) -> int:
    """Run one trial of this worker; the number of this worker's trials in a row that failed, a
    StudyError at 3."""
    try:
        ostudy.optimize(objective, n_trials=1, catch=(Exception,))
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
        if not _failed_as_stale(exc):
            raise
        # our heartbeat was late (machine or storage stalled) and another worker failed the trial as
        # stale; it has been re-queued (up to search.max_retry times), so not an error of this worker
        print(f"warning: {exc} (failed as stale by another worker; {_requeued(ostudy)})", file=sys.stderr)
        return failures  # not a failure of this worker's trial: the count of failures in a row stays
    last = max(
        (t for t in ostudy.get_trials(deepcopy=False) if t.user_attrs.get("worker") == worker_id()),
        key=lambda t: t.number,
        default=None,
    )
    if last is not None and "duplicate_of" in last.user_attrs:
        return failures  # stood aside for another trial on its grid point: neither a failure nor a success
    failures = failures + 1 if last is not None and last.state == TrialState.FAIL else 0
    if failures >= 3:
        raise StudyError(
            f"3 trials in a row failed in this worker; last: "
            f"{last.system_attrs.get('fail_reason', 'see the log above')}",
            field="search",
        )
    return failures


def _requeued(ostudy) -> str:
    """What became of this worker's last trial after another worker failed it as stale."""

    # FAIL only: a retry is created with the dead trial's user attrs, this worker's id among them
    mine = [
        t
        for t in ostudy.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if t.user_attrs.get("worker") == worker_id()
    ]
    if not mine:
        return "re-queued"
    last = max(mine, key=lambda t: t.number)
    retried = any(
        last.number in t.system_attrs.get("retry_history", ()) for t in ostudy.get_trials(deepcopy=False)
    )
    return (
        f"trial {last.number} re-queued"
        if retried
        else f"trial {last.number} not re-queued: search.max_retry reached"
    )


def _failed_as_stale(exc: Exception) -> bool:
    """optuna's two ways of saying our trial was already finished by someone else: a write to it
    (UpdateFinishedTrialError), or the final tell after the objective failed ("Cannot tell a FAIL trial")."""

    return isinstance(exc, optuna.exceptions.UpdateFinishedTrialError) or str(exc).startswith(
        "Cannot tell a FAIL trial"
    )
