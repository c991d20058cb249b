"""`study status SPEC [--profile P]`: every run's state, read from the run folders (never sacct: many
clusters, and CI's, keep no accounting database), whichever executor trains it.

    running      its trainer holds the run's lease (study/lease.py); step, tokens/s and ETA from the last
                 line of history.jsonl, how long ago that was from the file's time
    done / diverged (at step k) / failed (its error and the last lines of its Slurm log)
    interrupted  checkpoints and no holder: "resumable from step k" (the newest checkpoint), and the Slurm
                 task that will resume it when one is queued
    queued       a Slurm task recorded in the folder's slurm.json is in `squeue` (when squeue is here)
    pending      nothing yet
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from study.executors.task import record_path
from study.io import read_json
from study.lease import live_holder, train_lease_path
from study.paths import Layout
from study.pretrain.checkpoint import checkpoint_files
from study.rundir import RunDir
from study.studies.spec import load_study

LOG_LINES = 5  # of a failed task's log


def alive_jobs() -> set[str]:
    """Ids (ARRAY_TASK, or plain) of every job Slurm still has queued or running; empty without squeue."""
    if shutil.which("squeue") is None:
        return set()
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=60)
    return set(out.stdout.split()) if out.returncode == 0 else set()


@dataclass(frozen=True)
class RunState:
    name: str  # running, done, diverged, failed, interrupted, queued, pending
    detail: str = ""
    job: str | None = None

    def describe(self) -> str:
        job = f" [job {self.job}]" if self.job else ""
        return f"{self.name}{', ' + self.detail if self.detail else ''}{job}"


def _eta(cfg: dict, last: dict) -> str:
    train, tps = cfg.get("train") or {}, last.get("tokens_per_s")
    step, tokens = int(last.get("step") or 0), int(last.get("tokens") or 0)
    if not tps or not step:
        return ""
    if train.get("budget") == "steps":
        left = (float(train["amount"]) - step) * tokens / step
    elif train.get("budget") == "tokens":
        left = float(train["amount"]) - tokens
    else:
        return ""
    m, s = divmod(max(0, int(left / tps)), 60)
    return f", ETA {m} min {s:02d} s"


def _log_tail(layout: Layout, job: str | None, n: int = LOG_LINES) -> list[str]:
    if not job:
        return []
    log = layout.slurm_dir("logs") / job / f"{job}_0_log.err"
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return []
    return lines[-n:]


def run_state(layout: Layout, run_hash: str, alive: set[str] | None = None) -> RunState:
    """One run's state (module doc). `alive`: alive_jobs(), read once by the caller."""
    rd = RunDir(layout, run_hash)
    try:
        rec = read_json(record_path(rd.path))
    except (OSError, ValueError):
        rec = {}
    job = rec.get("job") if isinstance(rec, dict) else None
    holder = live_holder(train_lease_path(layout, run_hash))
    if holder is not None:
        hist = rd.history()
        last = next((h for h in reversed(hist) if "loss" in h), {})
        ago = f", logged {time.time() - rd.history_path.stat().st_mtime:.0f} s ago" if hist else ""
        tps = f", {last['tokens_per_s']:,.0f} tokens/s" if last.get("tokens_per_s") else ""
        detail = f"step {last.get('step', 0)}{tps}{_eta(rd.config(), last)}{ago} on {holder.host}"
        return RunState("running", detail, holder.job)
    st = rd.status()
    if st.status == "done":
        return RunState("done", "", job)
    if st.status == "diverged":
        return RunState("diverged", f"at step {st.step}", job)
    queued = job is not None and alive is not None and job in alive
    if st.status == "failed":
        tail = _log_tail(layout, job)
        return RunState("failed", (st.error or "") + "".join(f"\n      | {line}" for line in tail), job)
    ckpts = checkpoint_files(rd.ckpt_dir) if rd.ckpt_dir.is_dir() else []
    if ckpts:
        step = max(s for s, _ in ckpts)
        return RunState("interrupted", f"resumable from step {step}" + (", queued" if queued else ""), job)
    if queued:
        return RunState("queued", "", job)
    return RunState("pending")


def cmd_status(args) -> int:
    study = load_study(args.spec, profile=args.profile)
    layout = Layout(root=Path(args.results), reports=Path(args.reports))
    alive = alive_jobs()
    counts: dict[str, int] = {}
    for run in study.runs:
        state = run_state(layout, run.run_hash, alive)
        counts[state.name] = counts.get(state.name, 0) + 1
        print(f"{run.run_hash}  {state.describe()}  {run.label} seed{run.seed}")
    print(f"{len(study.runs)} runs: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 0
