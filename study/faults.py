"""Deterministic fault injection for the fault suite (tests/test_faults.py): SIGKILL at a named point.

    STUDY_KILL_AT="io.replace:12"   kill this process the 12th time it reaches point("io.replace")
    STUDY_KILL_AT="io.replace@results/finetune:2"
                                    ... the 2nd time it reaches it with "results/finetune" in the detail

Killing at "the n-th atomic write" or "the n-th training step" lands a kill at a reproducible place
in any stage (data preparation, a checkpoint write, mid-step, a fine-tuning result, the aggregate,
the report), which a timer-based kill could not. With the variable unset, point() returns at once. STUDY_TRACE=<file> appends every point reached
to that file instead (the concurrency tests count training starts with it). STUDY_FAIL_AT (same syntax)
raises OSError ENOSPC there instead of killing: a disk that fills up at that write.
"""

from __future__ import annotations

import errno
import os
import signal
import sys

_seen: dict[str, int] = {}  # per-process counters: each restarted process counts from zero


def point(name: str, detail: str = "") -> None:
    trace = os.environ.get("STUDY_TRACE")
    if trace:  # the lock test counts how often each run started training, across processes
        with open(trace, "a") as f:
            f.write(f"{os.getpid()} {name} {detail}\n")
    if _reached("STUDY_FAIL_AT", name, detail):  # a full disk at a reproducible place (tests/test_errors.py)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), detail or None)
    if _reached("STUDY_KILL_AT", name, detail):
        # say where, so the fault suite can check that its kills landed in every stage
        nth = os.environ["STUDY_KILL_AT"].rpartition(":")[2]
        print(f"fault: SIGKILL at {name} #{nth} {detail}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def _reached(var: str, name: str, detail: str) -> bool:
    """True the n-th time this process reaches point `name` (with `where` in its detail), as env `var` says."""
    spec = os.environ.get(var)
    if not spec:
        return False
    target, _, nth = spec.rpartition(":")
    target, _, where = target.partition("@")
    if target != name or where not in detail:
        return False
    _seen[spec] = _seen.get(spec, 0) + 1
    return _seen[spec] == int(nth)
