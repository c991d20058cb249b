"""Deterministic fault injection for the fault suite (tests/test_faults.py): SIGKILL at a named point.

    STUDY_KILL_AT="io.replace:12"   kill this process the 12th time it reaches point("io.replace")
    STUDY_KILL_AT="io.replace@results/finetune:2"
                                    ... the 2nd time it reaches it with "results/finetune" in the detail

Killing at "the n-th atomic write" or "the n-th training step" lands a kill at a reproducible place
in any stage (data preparation, a checkpoint write, mid-step, a fine-tuning result, the aggregate,
the report), which a timer-based kill could not. With the variable unset, point() returns at once. STUDY_TRACE=<file> appends every point reached
to that file instead (the concurrency tests count training starts with it).
"""

from __future__ import annotations

import os
import signal
import sys

_seen: dict[str, int] = {}  # per-process counters: each restarted process counts from zero


def point(name: str, detail: str = "") -> None:
    trace = os.environ.get("STUDY_TRACE")
    if trace:  # the lock test counts how often each run started training, across processes
        with open(trace, "a") as f:
            f.write(f"{os.getpid()} {name} {detail}\n")
    spec = os.environ.get("STUDY_KILL_AT")
    if not spec:
        return
    target, _, nth = spec.rpartition(":")
    target, _, where = target.partition("@")
    if target != name or where not in detail:
        return
    _seen[spec] = _seen.get(spec, 0) + 1
    if _seen[spec] == int(nth):
        # say where, so the fault suite can check that its kills landed in every stage
        print(f"fault: SIGKILL at {name} #{nth} {detail}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
