"""Optuna search over any spec key (issue 6): `study search SPEC` and `study search-best SPEC`.

Each trial is an ordinary run of the harness: the spec's resolved defaults plus the sampled values
give a RunConfig, trained by `study.pretrain.trainer.train_run` into `layout.run_dir(cfg.run_hash())` - the same
folder a grid study would use. A trial whose config already has a finished run reuses it; pruned
trials leave a resumable folder (no status.json) that a later trial or `study run` continues.

Workers are plain processes: N of them, on one or several machines, run `study search SPEC
--storage URL` against one optuna study (SQLite file by default, any RDB URL such as PostgreSQL, or
`journal:///path` for a JournalFileBackend). Each trial sends a heartbeat; a running trial whose
worker died is failed by the next worker that looks and re-queued as a WAITING trial with the same
params (RetryHeartbeatStaleTrialCallback), so nothing is lost and numbers never repeat. The storage
is plain optuna, readable by optuna-dashboard.

optuna is imported lazily: `study --help` and spec validation must stay fast.
"""
from __future__ import annotations

import copy
import csv
import io
import json
import logging
import math
import os
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml
from pydantic import ValidationError

from study.config import RunConfig
from study.errors import Diverged, StudyError
from study.io import atomic_write_json, atomic_write_text, file_lock, read_json
from study.paths import Layout
from study.studies.searchspec import FINETUNE_MODES, PRETRAIN_METRICS, SPLIT_KEYS, ParamSpec, SearchSpec
from study.studies.spec import Study, _known_keys, _pydantic_error, _set_dotted, _suggest, load_study

HEARTBEAT_ATTR = "study:heartbeat"   # journal storage: unix time of the trial's last heartbeat
STORAGE_HELP = "sqlite:///path.db, postgresql://user@host/db, journal:///path/to/file.log"


# --------------------------------------------------------------------------- spec -> configs
def load_search(path: str | Path, profile: str | None = None) -> tuple[Study, SearchSpec]:
    """Load a spec with a `search:` block and check everything that can be checked before training."""
    study = load_study(path, profile=profile)
    search = study.spec.search
    source = str(path)
    if search is None:
        raise StudyError("this spec has no `search:` block", field="search", source=source,
                         allowed="search: {params: {dotted.key: {low, high} | [choices]}, objective, ...}")
    known = _known_keys()
    for key in search.params:
        field = f"search.params.{key}"
        if key == "seed":
            raise StudyError("pre-training seeds are `search.seeds`, not a parameter", field=field, source=source)
        if key not in known and key not in SPLIT_KEYS:
            raise StudyError(f"unknown key{_suggest(key, known + list(SPLIT_KEYS))}", field=field, source=source,
                             allowed="dotted keys such as masking.rate, train.lr, " + ", ".join(SPLIT_KEYS))
    if any(k in search.params for k in SPLIT_KEYS) and \
            any(k in search.params for k in ("masking.mask", "masking.random", "masking.keep")):
        raise StudyError("search the replacement split either through masking.split.* or masking.mask/random/keep,"
                         " not both", field="search.params", source=source)
    if search.n_trials is None and search.timeout is None and search.sampler.kind != "grid":
        raise StudyError("a search needs an end: set n_trials and/or timeout", field="search.n_trials", source=source)
    if search.sampler.kind == "grid":
        for key, p in search.params.items():
            if p.type == "float" and p.step is None:
                raise StudyError("the grid sampler needs a `step` (or a list of choices)",
                                 field=f"search.params.{key}", source=source)
    probes = _probe_configs(study, search, source)
    base = probes[0]
    if search.pruner.kind in ("median", "hyperband") and base.impl.eval_every == 0:
        raise StudyError(f"the {search.pruner.kind} pruner needs intermediate evaluations: set "
                         "defaults.impl.eval_every > 0", field="search.pruner.kind", source=source,
                         allowed="wilcoxon (across seeds), none")
    _check_objective(search, probes, source)
    from study.pretrain.trainer import check_config  # what the trainer itself would refuse (e.g. batch vs grad_accum)
    for cfg in probes:
        try:
            check_config(cfg)
        except StudyError as exc:
            raise StudyError(f"gives a run the trainer refuses: {exc}", field="search.params", source=source) from None
    return study, search


def _corners(p: ParamSpec) -> list[Any]:
    """The values that bound a dimension: if both ends give valid runs, so does everything between."""
    if p.type == "categorical":
        return list(p.choices)
    values = _grid_values(p) if p.step is not None or p.type == "int" else [p.low, p.high]
    return [values[0], values[-1]]


def _probe_configs(study: Study, search: SearchSpec, source: str) -> list[RunConfig]:
    """Validate each dimension's extreme values (others at their first corner); first = the base point."""
    first = {k: _corners(p)[0] for k, p in search.params.items()}
    out = [_checked_config(study, first, search.seeds[0], source, "search.params")]
    for key, p in search.params.items():
        for value in _corners(p)[1:]:
            out.append(_checked_config(study, {**first, key: value}, search.seeds[0], source, f"search.params.{key}",
                                       f" (at {key}={value!r})"))
    return out


def _checked_config(study, params, seed, source, field, where="") -> RunConfig:
    try:
        return trial_config(study, resolve_settings(params, study.defaults), seed)
    except StudyError as exc:
        raise StudyError(f"gives an invalid run{where}: {exc}", field=field, source=source) from None


def _check_objective(search: SearchSpec, probes: list[RunConfig], source: str) -> None:
    """Every objective term must be something every trial's run produces."""
    field = "search.objective"
    for metric in search.terms:
        if metric in PRETRAIN_METRICS:
            if metric == "sentence_acc" and any(c.objective.sentence == "none" for c in probes):
                raise StudyError("sentence_acc is null for runs without a sentence task (objective.sentence: none)",
                                 field=field, source=source)
            continue
        parts = metric.split("/")
        if len(parts) != 3:
            raise StudyError(f"unknown objective metric '{metric}'", field=field, source=source,
                             allowed=", ".join(PRETRAIN_METRICS) + ", or TASK/finetune|probe/METRIC e.g. SST-2/finetune/accuracy")
        from study.downstream.tasks import TASKS  # lazy: GLUE metadata only when a downstream objective is asked for
        task, mode, name = parts
        if task not in TASKS:
            raise StudyError(f"unknown task '{task}' in '{metric}'", field=field, source=source, allowed=", ".join(TASKS))
        if mode not in FINETUNE_MODES:
            raise StudyError(f"unknown mode '{mode}' in '{metric}'", field=field, source=source,
                             allowed=", ".join(FINETUNE_MODES))
        if mode == "probe" and not all(c.finetune.probe for c in probes):
            raise StudyError(f"'{metric}' needs the probe: set defaults.finetune.probe: true", field=field, source=source)
        if name not in TASKS[task].metrics:
            raise StudyError(f"{task} does not report '{name}'", field=field, source=source,
                             allowed=", ".join(TASKS[task].metrics))


def _tidy(v: float) -> float:
    """Round away float noise (0.15000000000000002 -> 0.15) so a trial hashes like the grid's run."""
    return float(f"{v:.10g}")


def _grid_values(p: ParamSpec) -> list[Any]:
    if p.type == "categorical":
        return list(p.choices)
    if p.type == "int":
        return list(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
    n = int(math.floor((p.high - p.low) / p.step + 1e-9))
    return [_tidy(p.low + i * p.step) for i in range(n + 1)]


def resolve_settings(params: dict[str, Any], defaults: dict) -> dict[str, Any]:
    """Sampled params -> real dotted spec keys. The split coordinates become masking.mask/random/keep.

    mask = split.mask; random = (1 - mask) * split.random_share; keep = the rest. Rounded to 6 places so
    mask + random + keep sums to 1 within config.py's tolerance and (0.8, 0.5) hashes as 0.8/0.1/0.1.
    """
    settings = {k: v for k, v in params.items() if k not in SPLIT_KEYS}
    if any(k in params for k in SPLIT_KEYS):
        base = RunConfig.model_validate(copy.deepcopy(defaults)).masking
        rest0 = base.random + base.keep
        mask = float(params.get(SPLIT_KEYS[0], base.mask))
        share = float(params.get(SPLIT_KEYS[1], base.random / rest0 if rest0 > 0 else 0.5))
        mask = round(mask, 6)
        random = round((1.0 - mask) * share, 6)
        keep = round(1.0 - mask - random, 6)
        settings.update({"masking.mask": mask, "masking.random": random, "masking.keep": keep})
    return settings


def trial_config(study: Study, settings: dict[str, Any], seed: int) -> RunConfig:
    """The RunConfig of one trial: exactly what `load_study` would build for a run with `set: settings`."""
    tree = copy.deepcopy(study.defaults)
    for key, value in settings.items():
        _set_dotted(tree, key, value, str(study.path))
    tree["seed"] = seed
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as err:
        raise _pydantic_error(err, str(study.path)) from None


# --------------------------------------------------------------------------- storage
def _storage_classes():
    """A JournalStorage that also speaks optuna's heartbeat protocol.

    optuna's heartbeat (stale-trial detection) exists only for RDBStorage. Journal workers write
    their heartbeat as a trial system attr instead; optuna's own machinery (HeartbeatThread,
    fail_stale_trials, the stale-trial callback) then works unchanged. Worker clocks must agree to
    well within grace_period.
    """
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages._heartbeat import BaseHeartbeat
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
                last = t.system_attrs.get(HEARTBEAT_ATTR)
                if last is None and t.datetime_start is not None:  # died before its first heartbeat
                    last = t.datetime_start.timestamp()
                if last is not None and now - last > self._grace:
                    stale.append(t._trial_id)
            return stale

        def get_heartbeat_interval(self) -> int | None:
            return self._hb_interval

        def get_heartbeat_stale_trial_callback(self):
            return self._hb_callback

    return HeartbeatJournalStorage


def _redact(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for a message
        return url


def open_storage(url: str | None, search: SearchSpec, default_dir: Path):
    """An optuna storage with heartbeats and retry of dead trials. Unreachable -> StudyError, one line."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    if url is None:
        default_dir.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{(default_dir / 'study.db').resolve()}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeats and their retry callback are 'experimental' in optuna
        callback = RetryHeartbeatStaleTrialCallback(max_retry=search.max_retry, inherit_intermediate_values=False)
        if url.startswith("journal:"):
            path = Path(url[len("journal:"):].removeprefix("//"))
            if not path.parent.is_dir():
                raise StudyError(f"journal folder {path.parent} does not exist", field="--storage", allowed=STORAGE_HELP)
            from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
            # A worker killed while it holds the journal's lock file leaves it behind, and the others can't
            # write heartbeats until they break it (optuna waits 30 s by default). Break it well inside the
            # heartbeat grace (stall + one heartbeat interval < grace), or every live trial looks dead the
            # moment the lock frees. A live writer holds the lock only for one append of a few lines.
            lock_grace = max(1, (search.grace - search.heartbeat_interval) // 2)
            lock = JournalFileSymlinkLock(str(path), grace_period=lock_grace)
            try:
                return _storage_classes()(JournalFileBackend(str(path), lock_obj=lock), search.heartbeat_interval,
                                          search.grace, callback)
            except (OSError, ValueError) as exc:
                raise StudyError(f"can't open journal {path}: {exc}", field="--storage", allowed=STORAGE_HELP) from None
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
                with file_lock(lock) if url.startswith("sqlite") else _nullcontext():
                    return optuna.storages.RDBStorage(
                        url, engine_kwargs=engine_kwargs, heartbeat_interval=search.heartbeat_interval,
                        grace_period=search.grace, heartbeat_stale_trial_callback=callback)
            except Exception as exc:  # noqa: BLE001 - sqlalchemy/driver errors become one clear line
                last = exc
                if _unreachable(exc):
                    break
                time.sleep(0.5 * (attempt + 1))
        raise StudyError(f"can't open storage {_redact(url)}: {_one_line(last)}", field="--storage",
                         allowed=STORAGE_HELP)


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _unreachable(exc: Exception) -> bool:
    text = _one_line(exc).lower()
    return any(s in text for s in ("refused", "could not translate", "timeout", "timed out", "no such module",
                                   "could not parse", "unable to open", "does not exist", "authentication",
                                   "can't load plugin", "name or service"))


def _one_line(exc: Exception | None) -> str:
    if exc is None:
        return "unknown error"
    orig = getattr(exc, "orig", None) or exc
    lines = [s.strip() for s in str(orig).splitlines() if s.strip()]
    return f"{type(orig).__name__}: {lines[0] if lines else ''}"


# --------------------------------------------------------------------------- samplers / pruners
def make_sampler(search: SearchSpec):
    import optuna
    s = search.sampler
    if s.kind == "grid":
        space = {k: _grid_values(p) for k, p in search.params.items()}
        return optuna.samplers.GridSampler(space, seed=s.seed)
    if s.kind == "random":
        sampler = optuna.samplers.RandomSampler(seed=s.seed)
    else:
        # constant_liar: running trials count as bad guesses, so parallel workers spread out.
        sampler = optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.n_startup_trials, constant_liar=True)
    return _seed_per_trial(sampler, s.seed)


def _seed_per_trial(sampler, seed: int):
    """Reseed the sampler's RNG from (seed, trial number) before each trial.

    One seed per worker would make N workers started together propose the same first points; one
    stream per trial number keeps the search reproducible for a given history and distinct across
    workers. (Touches optuna's private `_rng`, pinned in pyproject; tested in test_search.py.)
    """
    inner = sampler.before_trial

    def before_trial(study, trial):
        state = int(np.random.SeedSequence([seed, trial.number]).generate_state(1)[0])
        sampler._rng.rng.seed(state)
        rs = getattr(sampler, "_random_sampler", None)
        if rs is not None:
            rs._rng.rng.seed(state)
        inner(study, trial)

    sampler.before_trial = before_trial
    return sampler


def make_pruner(search: SearchSpec, base: RunConfig):
    import optuna
    p = search.pruner
    if p.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps)
    if p.kind == "hyperband":
        max_resource: int | str = int(base.train.amount) if base.train.budget == "steps" else "auto"
        return optuna.pruners.HyperbandPruner(min_resource=max(1, base.impl.eval_every), max_resource=max_resource,
                                              reduction_factor=p.reduction_factor)
    if p.kind == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(p_threshold=p.p_threshold, n_startup_steps=p.n_startup_steps)
    return optuna.pruners.NopPruner()


# --------------------------------------------------------------------------- one trial
class TrialFailed(RuntimeError):
    """A trial that produced no usable value (run failed/diverged, metric missing)."""


def _history(run_dir: Path, name: str = "history.jsonl") -> list[dict]:
    path = run_dir / name
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill
    return out


def _session_start_tokens(run_dir: Path) -> int:
    """Tokens the run had already seen when the current training session started: train_run writes one
    `start` event per session to events.jsonl with the (checkpoint's) token count it resumed from."""
    starts = [ev for ev in _history(run_dir, "events.jsonl") if ev.get("event") == "start"]
    return int(starts[-1].get("tokens") or 0) if starts else 0


def _status(run_dir: Path) -> str:
    try:
        return read_json(run_dir / "status.json")["status"]
    except (OSError, ValueError, KeyError):
        return "pending"


@dataclass
class Objective:
    """The optuna objective: sample, build the RunConfig, train (or reuse), evaluate, report."""

    study: Study
    search: SearchSpec
    layout: Layout
    quiet: bool = True
    train_fn: Callable | None = None      # default study.pretrain.trainer.train_run
    finetune_fn: Callable | None = None   # default study.downstream.finetune.finetune_run

    def __call__(self, trial) -> float:
        import optuna
        if self.search.sampler.kind == "grid":
            holder = _grid_point_holder(trial)
            if holder is not None:
                trial.set_user_attr("duplicate_of", holder)
                raise GridPointTaken(f"grid point already held by trial {holder}; this duplicate (racing workers "
                                     f"both started one) stands aside and is not counted")
        params = {}
        for key, p in self.search.params.items():
            params[key] = self._suggest(trial, key, p)
        settings = resolve_settings(params, self.study.defaults)
        trial.set_user_attr("settings", settings)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        step_pruner = self.search.pruner.kind in ("median", "hyperband")
        values, hashes, self._tokens, self._tokens_total = [], [], 0, 0
        reused_all = True
        for k, seed in enumerate(self.search.seeds):
            cfg = trial_config(self.study, settings, seed)
            hashes.append(cfg.run_hash())
            trial.set_user_attr("run_hash", hashes[0])
            trial.set_user_attr("run_hashes", hashes)
            metrics, reused = self._pretrain(trial, cfg, report_curve=(k == 0 and step_pruner))
            reused_all &= reused
            values.append(self._value(cfg, metrics))
            trial.set_user_attr("seed_values", values)
            if self.search.pruner.kind == "wilcoxon":
                trial.report(values[-1], k)
                if k < len(self.search.seeds) - 1 and trial.should_prune():
                    self._record_tokens(trial, reused_all)
                    raise optuna.TrialPruned(f"pruned after seed {seed} (wilcoxon)")
        self._record_tokens(trial, reused_all)
        return float(np.mean(values))

    # -- sampling
    @staticmethod
    def _suggest(trial, key: str, p: ParamSpec) -> Any:
        if p.type == "categorical":
            return trial.suggest_categorical(key, p.choices)
        if p.type == "int":
            return trial.suggest_int(key, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        return _tidy(trial.suggest_float(key, p.low, p.high, step=p.step, log=p.log))

    # -- pre-training
    def _pretrain(self, trial, cfg: RunConfig, report_curve: bool) -> tuple[dict, bool]:
        """Train (or resume, or reuse) one run; returns (metrics.json, reused)."""
        import optuna
        h = cfg.run_hash()
        run_dir = self.layout.run_dir(h)
        # Two trials (two workers) may draw the same config: one trains, the other waits and reuses.
        # train_run has its own lock, but this one also covers the check-then-replay below, so the
        # waiting trial reports the finished run's eval curve to the pruner instead of nothing.
        with file_lock(self.layout.root / ".locks" / f"run-{h}.lock"):
            if _status(run_dir) == "done":
                if report_curve:  # replay its eval curve so the pruner can compare against it
                    for ev in _history(run_dir):
                        v = self._intermediate(ev["eval"]) if "eval" in ev else None
                        if v is not None:
                            trial.report(v, int(ev["step"]))
                metrics = read_json(run_dir / "metrics.json")
                self._tokens_total += int(metrics.get("tokens_seen") or 0)
                return metrics, True
            start: list[int] = []  # known once training has (re)started; see _session_start_tokens

            def on_eval(step: int, tokens: int, eval_metrics: dict) -> None:
                if not start:
                    start.append(_session_start_tokens(run_dir))
                trained = max(0, int(tokens) - start[0])
                trial.set_user_attr("tokens", self._tokens + trained)
                if not report_curve:
                    return
                v = self._intermediate(eval_metrics)
                if v is None:
                    return
                trial.report(v, int(step))
                if trial.should_prune():
                    self._tokens += trained
                    self._tokens_total += int(tokens)
                    self._record_tokens(trial, False)
                    raise optuna.TrialPruned(f"pruned at step {step} ({self._intermediate_name} {v:.4g})")

            train = self.train_fn
            if train is None:
                from study.pretrain.trainer import train_run as train
            try:
                train(cfg, self.layout, quiet=self.quiet, on_eval=on_eval)
            except Diverged as exc:
                trial.set_user_attr("status", "diverged")
                raise TrialFailed(f"run {h} diverged: {exc}") from None
            status = _status(run_dir)
            if status != "done":
                err = read_json(run_dir / "status.json").get("error") if status != "pending" else None
                trial.set_user_attr("status", status)
                raise TrialFailed(f"run {h} ended {status}" + (f": {err}" if err else ""))
            metrics = read_json(run_dir / "metrics.json")
            end_tokens = int(metrics.get("tokens_seen") or 0)
            self._tokens += max(0, end_tokens - (start[0] if start else _session_start_tokens(run_dir)))
            self._tokens_total += end_tokens
            trial.set_user_attr("tokens", self._tokens)
            return metrics, False

    def _record_tokens(self, trial, reused: bool) -> None:
        trial.set_user_attr("tokens", self._tokens)          # trained by this trial
        trial.set_user_attr("tokens_total", self._tokens_total)  # seen by its runs, reused or not
        trial.set_user_attr("reused", reused)

    # -- values
    @property
    def _pretrain_only(self) -> bool:
        return all(m in PRETRAIN_METRICS for m in self.search.terms)

    @property
    def _intermediate_name(self) -> str:
        return "objective" if self._pretrain_only else "ref_mlm_loss"

    def _intermediate(self, eval_metrics: dict) -> float | None:
        """The value the step pruners see: the objective itself when the eval has it, else the
        reference MLM loss as a proxy (negated when maximizing, so 'better' points the same way)."""
        try:
            if self._pretrain_only:
                v = sum(w * float(eval_metrics[m]) for m, w in self.search.terms.items())
            else:
                sign = 1.0 if self.search.resolved_direction == "minimize" else -1.0
                v = sign * float(eval_metrics["ref_mlm_loss"])
        except (KeyError, TypeError, ValueError):
            return None
        return v if math.isfinite(v) else None

    def _value(self, cfg: RunConfig, metrics: dict) -> float:
        total = 0.0
        downstream = [m for m in self.search.terms if m not in PRETRAIN_METRICS]
        ft = self._finetune(cfg, downstream) if downstream else {}
        for metric, w in self.search.terms.items():
            v = metrics.get(metric) if metric in PRETRAIN_METRICS else ft.get(metric)
            if v is None or not math.isfinite(float(v)):
                raise TrialFailed(f"run {cfg.run_hash()} has no finite {metric} (got {v!r})")
            total += w * float(v)
        return total

    def _finetune(self, cfg: RunConfig, metrics: list[str]) -> dict[str, float]:
        """Fine-tune only the tasks the objective names; average each metric over fine-tune seeds."""
        tasks = sorted({m.split("/")[0] for m in metrics})
        cfg = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={"tasks": tasks})})
        fn = self.finetune_fn
        if fn is None:
            from study.downstream.finetune import finetune_run as fn
        h, fh = cfg.run_hash(), cfg.finetune_hash()
        fn(cfg, self.layout, quiet=self.quiet)  # locks per (run, task) itself: two workers never duplicate work
        out = {}
        for metric in metrics:
            task, mode, name = metric.split("/")
            vals = []
            for seed in cfg.finetune.seeds:
                path = self.layout.finetune_dir(h) / task / fh / f"{mode}-seed{seed}.json"
                if not path.exists():
                    raise TrialFailed(f"fine-tuning wrote no {path}")
                rec = read_json(path)
                if "skipped" in rec:
                    raise TrialFailed(f"{task} skipped: {rec['skipped']}")
                vals.append(float(rec["metrics"][name]))
            out[metric] = float(np.mean(vals))
        return out


# --------------------------------------------------------------------------- the search loop
def create_or_load(storage, study: Study, search: SearchSpec, base: RunConfig):
    import optuna
    ostudy = optuna.create_study(storage=storage, study_name=study.name, direction=search.resolved_direction,
                                 sampler=make_sampler(search), pruner=make_pruner(search, base), load_if_exists=True)
    want = {"objective": search.terms, "direction": search.resolved_direction}
    have = ostudy.user_attrs.get("objective")
    if have is None:
        ostudy.set_user_attr("objective", search.terms)
        ostudy.set_user_attr("direction", search.resolved_direction)
        ostudy.set_user_attr("spec", str(study.path))
        ostudy.set_user_attr("params", sorted(search.params))
    elif have != want["objective"] or ostudy.user_attrs.get("direction") != want["direction"]:
        raise StudyError(f"the storage already holds a study '{study.name}' with objective {have} "
                         f"({ostudy.user_attrs.get('direction')}); this spec asks for {want['objective']} "
                         f"({want['direction']})", field="search.objective",
                         allowed="the same objective, or another --storage / study name")
    return ostudy


def run_search(spec: str | Path, *, storage: str | None = None, n_trials: int | None = None,
               timeout: float | None = None, layout: Layout = Layout(), profile: str | None = None,
               quiet: bool = False, train_fn: Callable | None = None, finetune_fn: Callable | None = None):
    """One worker: run trials until the study has `n_trials` finished (complete or pruned) trials,
    the grid is exhausted, or this worker's `timeout` passes. Returns the optuna study.

    A worker does not leave while other trials are still running: if one of them belongs to a dead
    worker, it is this worker that notices (heartbeat) and runs the retry.
    """
    import optuna
    from optuna.trial import TrialState
    study, search = load_search(spec, profile=profile)
    n_trials = n_trials if n_trials is not None else search.n_trials
    timeout = timeout if timeout is not None else search.timeout
    if n_trials is not None and n_trials < 1:
        raise StudyError("must be >= 1", field="--n-trials")
    base = trial_config(study, resolve_settings({k: _corners(p)[0] for k, p in search.params.items()},
                                                study.defaults), search.seeds[0])
    out_dir = layout.search_dir(study.name)
    store = open_storage(storage, search, out_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING if quiet else optuna.logging.INFO)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    logging.getLogger("optuna.study._optimize").addFilter(_one_line_for_duplicates)
    ostudy = create_or_load(store, study, search, base)
    objective = Objective(study, search, layout, quiet=True if quiet else not sys.stderr.isatty(),
                          train_fn=train_fn, finetune_fn=finetune_fn)
    from tqdm.auto import tqdm
    bar = tqdm(total=n_trials, desc=f"search {study.name}", unit="trial", disable=quiet)
    t0, failures = time.monotonic(), 0
    try:
        while True:
            if timeout is not None and time.monotonic() - t0 >= timeout:
                break
            optuna.storages.fail_stale_trials(ostudy)
            trials = ostudy.get_trials(deepcopy=False)
            counts = {s: sum(t.state == s for t in trials) for s in TrialState}
            finished = counts[TrialState.COMPLETE] + counts[TrialState.PRUNED]
            bar.n = min(finished, n_trials or finished)
            bar.refresh()
            if n_trials is not None and finished >= n_trials and not counts[TrialState.WAITING]:
                break  # a re-queued trial of a dead worker still runs: a retry is never left behind
            if search.sampler.kind == "grid" and not counts[TrialState.WAITING] and \
                    not _grid_open_points(ostudy, trials):
                if not counts[TrialState.RUNNING]:
                    break  # every point was run
                # a new trial would only duplicate a running point; wait (a dead holder's retry comes as WAITING)
                time.sleep(min(search.heartbeat_interval, 2))
                continue
            if n_trials is not None and not counts[TrialState.WAITING] and \
                    finished + counts[TrialState.RUNNING] >= n_trials:
                time.sleep(min(search.heartbeat_interval, 2))  # others are finishing the last trials
                continue
            try:
                ostudy.optimize(objective, n_trials=1, catch=(Exception,))
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
                if not _failed_as_stale(exc):
                    raise
                # our heartbeat was late (machine or storage stalled) and another worker failed the trial as
                # stale; it has been re-queued, so this is not an error of the study
                print(f"warning: {exc} (failed as stale by another worker; re-queued)", file=sys.stderr)
                continue  # not a failure of this worker's trial: the count of failures in a row stays
            last = max((t for t in ostudy.get_trials(deepcopy=False)
                        if t.user_attrs.get("worker") == f"{socket.gethostname()}:{os.getpid()}"),
                       key=lambda t: t.number, default=None)
            if last is not None and "duplicate_of" in last.user_attrs:
                continue  # stood aside for another trial on its grid point: neither a failure nor a success
            failures = failures + 1 if last is not None and last.state == TrialState.FAIL else 0
            if failures >= 3:
                raise StudyError(f"3 trials in a row failed in this worker; last: "
                                 f"{last.system_attrs.get('fail_reason', 'see the log above')}", field="search")
    finally:
        bar.close()
        export_trials(ostudy, out_dir / "trials.csv")
    return ostudy


def _failed_as_stale(exc: Exception) -> bool:
    """optuna's two ways of saying our trial was already finished by someone else: a write to it
    (UpdateFinishedTrialError), or the final tell after the objective failed ("Cannot tell a FAIL trial")."""
    import optuna
    return isinstance(exc, optuna.exceptions.UpdateFinishedTrialError) or \
        str(exc).startswith("Cannot tell a FAIL trial")


class GridPointTaken(Exception):
    """A grid trial whose point another live or finished trial already holds (see _grid_point_holder)."""


def _grid_point_holder(trial) -> int | None:
    """The trial that holds this trial's grid point, if another one does; None if this trial should run it.

    Racing workers can put two trials on one grid point: two that both saw a free slot (optuna's
    GridSampler then re-deals a started point), two that both saw a re-queued trial (one pops it, the
    other creates a new trial), or two stale-trial retries of the same dead trial (SQLite reads the
    state before it locks, so two workers can both fail it). Both would train or reuse the same run and
    the point would be counted twice. The holder is one that finished (complete or pruned), or the one
    that started first among the running ones - an order every worker sees the same way, so exactly
    one of two racing trials goes on, and one whose holder dies gets the holder's retry.
    """
    from optuna.trial import TrialState
    storage, study_id = trial.study._storage, trial.study._study_id
    me = storage.get_trial(trial._trial_id)
    point = me.system_attrs.get("grid_id")
    if point is None:
        return None

    def key(t):  # the order every worker sees the same way (worker clocks must agree, as for heartbeats)
        return (t.datetime_start or datetime.max, t.number)
    for t in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                                       TrialState.RUNNING)):
        if t.number == me.number or t.system_attrs.get("grid_id") != point:
            continue
        if t.state != TrialState.RUNNING or key(t) < key(me):
            return t.number
    return None


def _one_line_for_duplicates(record: logging.LogRecord) -> bool:
    """optuna logs a failed trial with its traceback; a duplicate standing aside is expected: one line."""
    if record.exc_info and isinstance(record.exc_info[1], GridPointTaken):
        record.exc_info = None
    return True


def _grid_open_points(ostudy, trials) -> set[int]:
    """Grid points no trial holds yet (finished, failed, running or queued; duplicates don't hold one)."""
    n = len(ostudy.sampler._all_grids)
    held = {t.system_attrs.get("grid_id") for t in trials if "duplicate_of" not in t.user_attrs}
    return set(range(n)) - held


# --------------------------------------------------------------------------- outputs
TRIAL_COLUMNS = ["number", "state", "value", "params", "run_hash", "tokens", "tokens_total", "reused",
                 "retry_of", "duplicate_of", "worker", "datetime_start", "datetime_complete"]


def trials_rows(ostudy) -> list[dict]:
    rows = []
    for t in ostudy.get_trials(deepcopy=False):
        ua = t.user_attrs
        rows.append({
            "number": t.number, "state": t.state.name, "value": t.value,
            "params": json.dumps(_tidy_params(t.params), sort_keys=True), "run_hash": ua.get("run_hash"),
            "tokens": ua.get("tokens"), "tokens_total": ua.get("tokens_total"), "reused": ua.get("reused"),
            "retry_of": t.system_attrs.get("failed_trial"), "duplicate_of": ua.get("duplicate_of"),
            "worker": ua.get("worker"),
            "datetime_start": t.datetime_start.isoformat() if t.datetime_start else None,
            "datetime_complete": t.datetime_complete.isoformat() if t.datetime_complete else None,
            **{f"param.{k}": v for k, v in _tidy_params(t.params).items()},
        })
    return rows


def _tidy_params(params: dict) -> dict:
    return {k: _tidy(v) if isinstance(v, float) else v for k, v in params.items()}


def export_trials(ostudy, path: Path) -> Path:
    """results/search/<name>/trials.csv: one row per trial, for the report."""
    rows = trials_rows(ostudy)
    cols = TRIAL_COLUMNS + sorted({k for r in rows for k in r if k not in TRIAL_COLUMNS})
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
    import optuna
    study, search = load_search(spec, profile=profile)
    out = Path(out) if out else Path(spec).parent / f"{study.name}-best.yaml"
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


# --------------------------------------------------------------------------- CLI
def _layout(args) -> Layout:
    return Layout(root=Path(args.results), reports=Path(args.reports))


def cmd_search(args) -> int:
    ostudy = run_search(args.spec, storage=args.storage, n_trials=args.n_trials, timeout=args.timeout,
                        layout=_layout(args), profile=args.profile, quiet=args.quiet)
    from optuna.trial import TrialState
    done = [t for t in ostudy.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if done:
        b = ostudy.best_trial
        print(f"search {ostudy.study_name}: {len(done)} complete trials; best #{b.number} value={b.value:.6g} "
              f"params={json.dumps(b.params, sort_keys=True)} run={b.user_attrs.get('run_hash')}")
    else:
        print(f"search {ostudy.study_name}: no complete trial yet")
    return 0


def cmd_search_best(args) -> int:
    out = write_best(args.spec, args.out, storage=args.storage, layout=_layout(args), profile=args.profile)
    print(f"best configuration written to {out} (re-train: study run {out})")
    return 0


def add_parser(sub) -> None:
    """Register `study search` and `study search-best` on the CLI's subparsers."""
    s = sub.add_parser("search", help="optuna search over the spec's `search:` block (one worker)",
                       description="Run one search worker; start several (any machines) with the same --storage.")
    s.add_argument("spec", help="a spec with a `search:` block")
    s.add_argument("--profile", help="a profile defined in the spec")
    s.add_argument("--storage", help=f"optuna storage URL (default: SQLite under results/search/<name>/): {STORAGE_HELP}")
    s.add_argument("--n-trials", type=int, help="finished trials the study stops at (default: search.n_trials)")
    s.add_argument("--timeout", type=float, help="seconds this worker runs at most (default: search.timeout)")
    s.add_argument("--quiet", action="store_true", help="no progress bars or per-trial log")
    s.set_defaults(fn=cmd_search)
    b = sub.add_parser("search-best", help="write the best trial as a spec that `study run` re-trains")
    b.add_argument("spec")
    b.add_argument("--profile")
    b.add_argument("--storage", help=STORAGE_HELP)
    b.add_argument("--out", help="output spec (default: <spec folder>/<name>-best.yaml)")
    b.set_defaults(fn=cmd_search_best)


def main(argv: list[str] | None = None) -> int:
    """`python -m study.search.search search|search-best ...`: the same commands without study/cli.py."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m study.search.search")
    p.add_argument("--results", default="results")
    p.add_argument("--reports", default="reports")
    add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
