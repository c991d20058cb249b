"""Racing workers on a grid: which trial holds a grid point, and which points are still open.

Racing workers can put two trials on one grid point: two that both saw a free slot (optuna's
GridSampler then re-deals a started point), two that both saw a re-queued trial (one pops it, the
other creates a new trial), or two stale-trial retries of the same dead trial (SQLite reads the state
before it locks, so two workers can both fail it). Both would train or reuse the same run and the
point would be counted twice; the later one stands aside (GridPointTaken), marked `duplicate_of`.
"""

from __future__ import annotations

import logging
from datetime import datetime

from optuna.trial import TrialState


class GridPointTaken(Exception):
    """A grid trial whose point another live or finished trial already holds (see grid_point_holder)."""


def grid_point_holder(trial) -> int | None:
    """The trial that holds this trial's grid point, if another one does; None if this trial should run it.

    The holder is one that finished (complete or pruned), or the one that started first among the
    running ones - an order every worker sees the same way, so exactly one of two racing trials goes
    on, and one whose holder dies gets the holder's retry.
    """
    storage, study_id = trial.study._storage, trial.study._study_id
    me = storage.get_trial(trial._trial_id)
    point = me.system_attrs.get("grid_id")
    if point is None:
        return None

    def key(t):  # the order every worker sees the same way (worker clocks must agree, as for heartbeats)
        return (t.datetime_start or datetime.max, t.number)

    for t in storage.get_all_trials(
        study_id, deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    ):
        if t.number == me.number or t.system_attrs.get("grid_id") != point:
            continue
        if t.state != TrialState.RUNNING or key(t) < key(me):
            return t.number
    return None


def grid_open_points(ostudy, trials) -> set[int]:
    """Grid points no trial holds yet (finished, failed, running or queued; duplicates don't hold one)."""
    n = len(ostudy.sampler._all_grids)
    held = {t.system_attrs.get("grid_id") for t in trials if "duplicate_of" not in t.user_attrs}
    return set(range(n)) - held


def one_line_for_duplicates(record: logging.LogRecord) -> bool:
    """A logging filter: optuna logs a failed trial with its traceback; a duplicate standing aside is
    expected, so it gets one line."""
    if record.exc_info and isinstance(record.exc_info[1], GridPointTaken):
        record.exc_info = None
    return True
