"""The optuna storage a search's workers share: SQLite (default), any RDB URL, or a journal file.

Every storage gets heartbeats and the retry of dead trials: a running trial whose worker died is failed
by the next worker that looks and re-queued as a WAITING trial with the same params
(RetryHeartbeatStaleTrialCallback). An unreachable storage is one StudyError line naming `--storage`,
with the password of its URL redacted.

optuna and sqlalchemy are imported inside the functions: `study --help` and spec validation must
stay fast, and they import this module.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path
from typing import Any

from study.errors import StudyError
from study.io import file_lock
from study.studies.searchspec import SearchSpec

HEARTBEAT_ATTR = "study:heartbeat"  # journal storage: unix time of the trial's last heartbeat
STORAGE_HELP = "sqlite:///path.db, postgresql://user@host/db, journal:///path/to/file.log"


def heartbeat_journal_class():
    """A JournalStorage that also speaks optuna's heartbeat protocol.

    optuna's heartbeat (stale-trial detection) exists only for RDBStorage. Journal workers write
    their heartbeat as a trial system attr instead; optuna's own machinery (HeartbeatThread,
    fail_stale_trials, the stale-trial callback) then works unchanged. Worker clocks must agree to
    well within grace_period. (Built in a function: optuna is imported only when a search runs.)
    """
    # lazy: optuna (~1 s): search/cli.py imports this module for study --help
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages._heartbeat import BaseHeartbeat  # optuna's heartbeat interface (pinned in pyproject)
    from optuna.trial import TrialState

    class HeartbeatJournalStorage(optuna.storages.JournalStorage, BaseHeartbeat):
        def __init__(self, backend, heartbeat_interval: int, grace_period: int, callback):
            super().__init__(backend)
            self._hb_interval, self._grace, self._hb_callback = heartbeat_interval, grace_period, callback

        def record_heartbeat(self, trial_id: int) -> None:
            try:
                self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
            except (UpdateFinishedTrialError, KeyError):
                pass  # another worker already failed it as stale; our tell will say so

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            now, stale = time.time(), []
            for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                # a retry is created with its dead trial's system attrs, heartbeat included: a beat from
                # before this trial started is not this trial's (the retry would look dead the moment it
                # starts, and be failed again before its first beat). No beat yet: its start time.
                beats = [
                    t.system_attrs.get(HEARTBEAT_ATTR),
                    t.datetime_start and t.datetime_start.timestamp(),
                ]
                last = max((b for b in beats if b is not None), default=None)
                if last is not None and now - last > self._grace:
                    stale.append(t._trial_id)
            return stale

        def get_heartbeat_interval(self) -> int | None:
            return self._hb_interval

        def get_heartbeat_stale_trial_callback(self):
            return self._hb_callback

    return HeartbeatJournalStorage


def redact(url: str) -> str:
    """The URL with its password hidden, for a message."""
    try:
        from sqlalchemy.engine import make_url  # optuna's dependency; imported with it, only when needed

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for a message
        return url


def open_storage(url: str | None, search: SearchSpec, default_dir: Path, create: bool = True):
    """An optuna storage with heartbeats and retry of dead trials. Unreachable -> StudyError, one line.

    create=False (`study search-best`, which only reads): a SQLite or journal file that does not exist is a
    StudyError, and nothing is written (opening it would create an empty storage, and the init lock)."""
    # lazy: optuna (~1 s): search/cli.py imports this module for study --help
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    if url is None:
        if create:
            default_dir.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{(default_dir / 'study.db').resolve()}"
    if not create:
        _must_exist(url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeats and their retry callback are 'experimental' in optuna
        callback = RetryHeartbeatStaleTrialCallback(
            max_retry=search.max_retry, inherit_intermediate_values=False
        )
        if url.startswith("journal:"):
            return _open_journal(_journal_path(url), search, callback)
        if "://" not in url:
            raise StudyError(f"not a storage URL: {url!r}", field="--storage", allowed=STORAGE_HELP)
        engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if url.startswith("sqlite"):
            # Several worker processes share one file: wait for the write lock instead of failing.
            engine_kwargs["connect_args"] = {"timeout": 120}
        elif url.startswith("postgres"):
            engine_kwargs["connect_args"] = {"connect_timeout": 10}
        lock = default_dir.parent / ".storage-init.lock"
        last: Exception | None = None
        for attempt in range(5):
            try:
                # Table creation by several fresh workers at once can race; the lock covers one machine,
                # the retry covers several.
                with file_lock(lock) if url.startswith("sqlite") and create else contextlib.nullcontext():
                    return optuna.storages.RDBStorage(
                        url,
                        engine_kwargs=engine_kwargs,
                        heartbeat_interval=search.heartbeat_interval,
                        grace_period=search.grace,
                        heartbeat_stale_trial_callback=callback,
                    )
            except Exception as exc:  # noqa: BLE001 - sqlalchemy/driver errors become one clear line
                last = exc
                if _unreachable(exc):
                    break
                time.sleep(0.5 * (attempt + 1))
        raise StudyError(
            f"can't open storage {redact(url)}: {one_line(last)}", field="--storage", allowed=STORAGE_HELP
        )


def _journal_path(url: str) -> Path:
    return Path(url[len("journal:") :].removeprefix("//"))


def _must_exist(url: str) -> None:
    """A storage to read must be there: the file of a SQLite or journal URL (a server's database is
    not checked here: opening it is the check)."""
    path = None
    if url.startswith("journal:"):
        path = _journal_path(url)
    elif url.startswith("sqlite"):
        from sqlalchemy.engine import make_url  # optuna's dependency; imported with it, only when needed

        try:
            db = make_url(url).database
        except Exception:  # noqa: BLE001 - a malformed URL is refused when opened, with its own message
            return
        path = Path(db) if db and db != ":memory:" else None
    if path is not None and not path.is_file():
        raise StudyError(
            f"no search storage at {path}; run `study search` first",
            field="--storage",
            allowed="the --storage URL the search used, or the default after a `study search`",
        )


def check_fingerprint(ostudy, want: dict[str, str]) -> None:
    """The storage's study must hold trials of this very search (study/search/configs.py's
    search_fingerprint); a field that changed since it was created is a StudyError naming it. A study
    created before fingerprints were kept has none to compare."""
    have = ostudy.user_attrs.get("fingerprint")
    if have is None:
        return
    changed = [k for k in want if have.get(k) != want[k]]
    if changed:
        raise StudyError(
            f"the storage's search '{ostudy.study_name}' ran its trials with another "
            f"{', '.join(changed)} than this spec now has: its trials and best value belong to "
            "that search",
            field=changed[0],
            allowed="the same space and settings, or another --storage",
        )


def _open_journal(path: Path, search: SearchSpec, callback):
    # lazy: optuna (~1 s): search/cli.py imports this module for study --help
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    if not path.parent.is_dir():
        raise StudyError(
            f"journal folder {path.parent} does not exist", field="--storage", allowed=STORAGE_HELP
        )
    # A worker killed while it holds the journal's lock file leaves it behind, and the others can't
    # write heartbeats until they break it (optuna waits 30 s by default). Break it well inside the
    # heartbeat grace (stall + one heartbeat interval < grace), or every live trial looks dead the
    # moment the lock frees. A live writer holds the lock only for one append of a few lines.
    lock_grace = max(1, (search.grace - search.heartbeat_interval) // 2)
    lock = JournalFileSymlinkLock(str(path), grace_period=lock_grace)
    try:
        return heartbeat_journal_class()(
            JournalFileBackend(str(path), lock_obj=lock), search.heartbeat_interval, search.grace, callback
        )
    except (OSError, ValueError) as exc:
        raise StudyError(
            f"can't open journal {path}: {exc}", field="--storage", allowed=STORAGE_HELP
        ) from None


def _unreachable(exc: Exception) -> bool:
    text = one_line(exc).lower()
    return any(
        s in text
        for s in (
            "refused",
            "could not translate",
            "timeout",
            "timed out",
            "no such module",
            "could not parse",
            "unable to open",
            "does not exist",
            "authentication",
            "can't load plugin",
            "name or service",
        )
    )


def one_line(exc: Exception | None) -> str:
    """A driver error as one line: its type and the first line of its text."""
    if exc is None:
        return "unknown error"
    orig = getattr(exc, "orig", None) or exc
    lines = [s.strip() for s in str(orig).splitlines() if s.strip()]
    return f"{type(orig).__name__}: {lines[0] if lines else ''}"
