"""`--executor slurm --wait`: block until the submitted tasks (and any run another command trains) end,
printing a line per run as it ends, then aggregate and report where the command runs (as `--jobs` does).

Polls `squeue` every POLL_S seconds; never sacct. A task that requeued itself after its time-limit
warning is held by Slurm for two minutes (its BeginTime); the waiting command releases it at once
(`scontrol update StartTime=now`), since the hold only guards against a requeue loop it cannot have:
the task checkpointed, and resumes where it stopped.
"""

from __future__ import annotations

import subprocess
import sys
import time

from study.executors import Steps
from study.executors.status import alive_jobs, run_state
from study.paths import Layout

POLL_S = 2.0
ENDED = ("done", "diverged", "failed")


def _release_requeued(jobs: set[str]) -> None:
    out = subprocess.run(["squeue", "-h", "-r", "-t", "PD", "-o", "%i %r"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        jid, _, reason = line.partition(" ")
        if jid in jobs and reason.strip() == "BeginTime":
            subprocess.run(["scontrol", "update", f"jobid={jid}", "StartTime=now"], capture_output=True)


def wait_and_finish(args, study, layout: Layout, jobs: list[str], steps: Steps) -> int:
    """Wait (module doc); then aggregate and report when every run ended, else exit 1 naming the rest."""
    mine, runs = set(jobs), study.select(getattr(args, "run", None))
    seen: dict[str, str] = {}
    t0 = time.monotonic()
    while True:
        alive = alive_jobs() & mine
        states = {r.run_hash: run_state(layout, r.run_hash, alive) for r in runs}
        for run in runs:
            st = states[run.run_hash]
            if st.name in ENDED and seen.get(run.run_hash) != st.name:
                seen[run.run_hash] = st.name
                first = st.describe().splitlines()[0]
                print(
                    f"pretrain {len(seen)}/{len(runs)} {run.run_hash} {first} "
                    f"({time.monotonic() - t0:.0f} s since submit)  {run.label} seed{run.seed}",
                    file=sys.stderr,
                    flush=True,
                )
        if not alive and not any(s.name == "running" for s in states.values()):
            break
        _release_requeued(alive)
        time.sleep(POLL_S)
    left = [f"{h} {s.describe()}" for h, s in states.items() if s.name not in ENDED]
    if args.command == "finetune" or left:
        for line in left:
            print(f"not finished: {line} (run the same command again to resume it)", file=sys.stderr)
        return 1 if left else 0
    if args.command == "run":
        steps.aggregate(args)
        steps.report(args)
    bad = [h for h, s in states.items() if s.name != "done"]
    return 0 if args.command == "run" or not bad else 1
