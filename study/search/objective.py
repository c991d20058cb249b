"""The optuna objective of a search: one trial = ordinary runs of the harness, one per search seed.

Each trial's config is the spec's resolved defaults plus the sampled values (study/search/configs.py),
trained by `study.pretrain.trainer.train_run` into `results/runs/<run_hash>/` - the same folder a grid
study would use. A config that already has a finished run is reused (its eval curve replayed to the
pruner); a pruned trial leaves a resumable folder (no status.json) that a later trial or `study run`
continues. Run folders are read through study/rundir.py's RunDir, with its error policy.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from study.config import RunConfig
from study.errors import Diverged
from study.io import read_json
from study.lease import lease
from study.metrics import PRETRAIN_METRICS, parse_metric
from study.paths import Layout
from study.provenance import git_info
from study.rundir import RunDir
from study.search.configs import resolve_settings, tidy, trial_config
from study.search.grid import GridPointTaken, grid_point_holder
from study.studies.searchspec import ParamSpec, SearchSpec
from study.studies.spec import Study


class TrialFailed(RuntimeError):
    """A trial that produced no usable value (run failed/diverged, metric missing)."""


def worker_id() -> str:
    """This worker process, as trials record it (`worker` user attr): host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def session_start_tokens(run: RunDir) -> int:
    """Tokens the run had already seen when the current training session started: train_run writes one
    `start` event per session to events.jsonl with the (checkpoint's) token count it resumed from."""
    starts = [ev for ev in run.events() if ev.get("event") == "start"]
    return int(starts[-1].get("tokens") or 0) if starts else 0


@dataclass
class Objective:
    """The optuna objective: sample, build the RunConfig, train (or reuse), evaluate, report."""

    study: Study
    search: SearchSpec
    layout: Layout
    quiet: bool = True
    train_fn: Callable | None = None  # default study.pretrain.trainer.train_run
    finetune_fn: Callable | None = None  # default study.downstream.finetune.finetune_run

    def __call__(self, trial) -> float:
        if self.search.sampler.kind == "grid":
            holder = grid_point_holder(trial)
            if holder is not None:
                trial.set_user_attr("duplicate_of", holder)
                raise GridPointTaken(
                    f"grid point already held by trial {holder}; this duplicate (racing workers "
                    f"both started one) stands aside and is not counted"
                )
        params = {}
        for key, p in self.search.params.items():
            params[key] = self._suggest(trial, key, p)
        settings = resolve_settings(params, self.study.defaults)
        trial.set_user_attr("settings", settings)
        trial.set_user_attr("worker", worker_id())
        trial.set_user_attr("commit", git_info()["commit"])  # the code that ran it (workers may differ)
        step_pruner = self.search.pruner.kind in ("median", "hyperband")
        values, hashes, self._tokens, self._tokens_total = [], [], 0, 0
        reused_all = True
        for k, seed in enumerate(self.search.seeds):
            cfg = trial_config(self.study, settings, seed)
            hashes.append(cfg.run_hash())
            trial.set_user_attr("run_hash", hashes[0])
            trial.set_user_attr("run_hashes", hashes)
            t0 = time.monotonic()
            metrics, reused = self._pretrain(trial, cfg, report_curve=(k == 0 and step_pruner))
            reused_all &= reused
            values.append(self._value(cfg, metrics))
            # one line per run on stderr, as `study pretrain` prints, even with --quiet (DVC passes it on)
            print(
                f"search {self.study.name} trial #{trial.number} seed {seed} ({k + 1}/{len(self.search.seeds)}): "
                f"run {hashes[-1]} {'reused' if reused else 'trained'} in {time.monotonic() - t0:.0f} s, "
                f"value {values[-1]:.4g}, ref acc at [MASK] {_pct(metrics.get('ref_mask_acc'))} "
                f"(floor {_pct(metrics.get('ref_mask_mode_acc'))})  {json.dumps(params, sort_keys=True)}",
                file=sys.stderr,
                flush=True,
            )
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
        return tidy(trial.suggest_float(key, p.low, p.high, step=p.step, log=p.log))

    # -- pre-training
    def _pretrain(self, trial, cfg: RunConfig, report_curve: bool) -> tuple[dict, bool]:
        """Train (or resume, or reuse) one run; returns (metrics.json, reused)."""
        h = cfg.run_hash()
        run = RunDir(self.layout, h)
        # Two trials (two workers) may draw the same config: one trains, the other waits and reuses.
        # train_run has its own lock, but this one also covers the check-then-replay below, so the
        # waiting trial reports the finished run's eval curve to the pruner instead of nothing.
        with lease(self.layout.lease_file(f"run-{h}")):  # across hosts (study/lease.py)
            if run.status().done:
                if report_curve:  # replay its eval curve so the pruner can compare against it
                    for ev in run.history():
                        v = self._intermediate(ev["eval"]) if "eval" in ev else None
                        if v is not None:
                            trial.report(v, int(ev["step"]))
                metrics = run.metrics()
                self._tokens_total += int(metrics.get("tokens_seen") or 0)
                return metrics, True
            start: list[int] = []  # known once training has (re)started; see session_start_tokens

            def on_eval(step: int, tokens: int, eval_metrics: dict) -> None:
                if not start:
                    start.append(session_start_tokens(run))
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
                from study.pretrain.trainer import train_run as train  # torch: only when a trial trains
            try:
                train(cfg, self.layout, quiet=self.quiet, on_eval=on_eval)
            except Diverged as exc:
                trial.set_user_attr("status", "diverged")
                raise TrialFailed(f"run {h} diverged: {exc}") from None
            status = run.status()
            if not status.done:
                trial.set_user_attr("status", status.status)
                raise TrialFailed(
                    f"run {h} ended {status.status}" + (f": {status.error}" if status.error else "")
                )
            metrics = run.metrics()
            end_tokens = int(metrics.get("tokens_seen") or 0)
            self._tokens += max(0, end_tokens - (start[0] if start else session_start_tokens(run)))
            self._tokens_total += end_tokens
            trial.set_user_attr("tokens", self._tokens)
            return metrics, False

    def _record_tokens(self, trial, reused: bool) -> None:
        trial.set_user_attr("tokens", self._tokens)  # trained by this trial
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
        parsed = {m: parse_metric(m, field="search.objective") for m in metrics}  # checked by load_search
        tasks = sorted({p.task for p in parsed.values()})
        cfg = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={"tasks": tasks})})
        fn = self.finetune_fn
        if fn is None:
            from study.downstream.finetune import finetune_run as fn  # torch: only for a downstream objective
        h, fh = cfg.run_hash(), cfg.finetune_hash()
        fn(
            cfg, self.layout, quiet=self.quiet
        )  # locks per (run, task) itself: two workers never duplicate work
        out = {}
        for metric, (task, mode, name) in parsed.items():
            vals = []
            for seed in cfg.finetune.seeds:
                path = self.layout.finetune_dir(h) / task / fh / f"{mode}-seed{seed}.json"
                if not path.exists():
                    raise TrialFailed(f"fine-tuning wrote no {path}")
                rec = read_json(path)
                if "skipped" in rec or "diverged" in rec:
                    raise TrialFailed(
                        f"{task} {'skipped' if 'skipped' in rec else 'diverged'}: "
                        f"{rec.get('skipped') or rec.get('diverged')}"
                    )
                vals.append(float(rec["metrics"][name]))
            out[metric] = float(np.mean(vals))
        return out


def _pct(x) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) and math.isfinite(x) else "-"
