"""Sharing the CPU: the `--threads` option, its override of impl.threads, and the load warning.

Torch-free on purpose: the CLI's parser adds the option and `study --help` must not load torch.

The other half of the contention default is in study/__init__.py: OMP_WAIT_POLICY=PASSIVE, which has to
be in the environment before torch loads libgomp (it reads the variable once, when the library loads).
Measured on 2 cores with one other CPU-bound process, an L2/H128 BERT step: 2 threads spinning (OpenMP's
default wait) 3,219 tokens/s, 1 thread 5,272, 2 threads passive 5,448; idle, 2 threads 9,043 spinning and
8,786 passive (issue 46; bench/contention.py measures it again, in one run). A spinning thread holds its
core while it waits for the others, so when a competitor has taken one of the cores, every parallel region
waits for a thread that the scheduler has parked behind the spinner: the run collapses to below one
thread's speed. A passive thread sleeps instead and gives the core back.

`--threads auto` asks for the cores found free when the command starts (the idle share of /proc/stat over
half a second, at least 1 thread): on 2 cores with one competitor that is 1 thread. It is opt-in, not the
default: a thread count that follows the machine's load would make the same command on the same machine
give other bits from one day to the next (a different count reorders float sums), and the passive wait
policy alone already keeps two threads at one thread's speed under contention (the numbers above). Without
--threads: impl.threads, else the --jobs share (cores / N), else torch's own count, as before.

--threads N sets torch's thread count for everything the command computes (training, fine-tuning, scoring,
plan's step timing), above impl.threads and the --jobs share. It travels as the STUDY_THREADS variable so
that --jobs workers (spawned processes) get it too. Like impl.threads it is speed only: outside the run
hash; a different count reorders float sums (results agree to rounding, tests/test_train.py). The count a
run actually used is in its provenance (torch_threads).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator

from study.errors import StudyError

THREADS_ENV = "STUDY_THREADS"  # --threads N: above impl.threads
FREE_ENV = "STUDY_FREE_THREADS"  # the command's default from the free cores: below impl.threads
COMMAND_ENV = "STUDY_COMMAND_PID"  # the process of the command: it alone prints the load warning
_WARNED: list[bool] = []  # once per process


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=threads_arg,
        metavar="N|auto",
        help="torch threads per process for this command (overrides impl.threads and the --jobs share; "
        "speed only: run hashes unchanged; 'auto': the cores found free at start). "
        "Default: impl.threads, else cores / --jobs",
    )


def threads_arg(value: str) -> int | str:
    """--threads' value: a whole number or 'auto' (argparse refuses other text; command_threads refuses a
    number below 1 as a StudyError naming the option)."""
    return value if value == "auto" else int(value)


def threads_override() -> int | None:
    """The thread count --threads asked for (this process or its parent command), None when not given."""
    value = os.environ.get(THREADS_ENV)
    return int(value) if value else None


def threads_default() -> int | None:
    """`--threads auto`: the cores the command found free when it started, below impl.threads (None
    without it: the --jobs share or torch's own default stays)."""
    value = os.environ.get(FREE_ENV)
    return int(value) if value else None


def free_cores(window_s: float = 0.5) -> float | None:
    """Cores idle right now: the idle share of all CPU time over `window_s` seconds (/proc/stat, Linux)
    times the machine's cores; None where there is no /proc/stat. Instantaneous, unlike the load average,
    which lags a minute behind a competitor that just started."""

    def idle_total() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v[:8])  # idle + iowait; user..steal

    try:
        i0, t0 = idle_total()
        time.sleep(window_s)
        i1, t1 = idle_total()
    except (OSError, ValueError, IndexError):
        return None
    return (i1 - i0) / (t1 - t0) * (os.cpu_count() or 1) if t1 > t0 else None


def cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (runnable processes), None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None


def load_warning(n_cores: int | None = None, load: float | None = None) -> str | None:
    """One line when the 1-minute load average says at least half the cores were already busy (before this
    command's own work), else None."""
    n = n_cores or cores()
    load = load_average() if load is None else load
    if load is None or load < max(1.0, n / 2):
        return None
    return (
        f"study: load average {load:.1f} on {n} cores: other work is running, so this command runs slower "
        f"than on an idle machine and its tokens/s do not compare with idle runs (--threads N or --jobs N "
        f"set how many cores it uses)"
    )


def warn_if_busy() -> None:
    """The load warning, printed once, by the command's own process (not its --jobs workers), when it
    starts computing (study.runtime.threads calls this)."""
    if not _WARNED and os.environ.get(COMMAND_ENV) == str(os.getpid()):
        _WARNED.append(True)
        if warning := load_warning():
            print(warning, file=sys.stderr)


@contextlib.contextmanager
def threads_from_args(args: argparse.Namespace) -> Iterator[None]:
    """For a command that has --threads: command_threads(args.threads); other commands: nothing."""
    if not hasattr(args, "threads"):
        yield
        return
    with command_threads(args.threads):
        yield


@contextlib.contextmanager
def command_threads(n: int | str | None) -> Iterator[None]:
    """The thread settings of one command that computes, for its duration (the caller's environment
    restored after, so an in-process caller keeps its own): --threads `n` when given; 'auto', the cores
    found free now (at least 1), which impl.threads and the --jobs share still override; and the load
    warning once it computes (warn_if_busy: an error before that stays one line)."""
    if isinstance(n, int) and n < 1:
        raise StudyError(f"must be at least 1, got {n}", field="--threads", allowed="a positive integer")
    old = {k: os.environ.get(k) for k in (THREADS_ENV, FREE_ENV, COMMAND_ENV)}
    os.environ[COMMAND_ENV] = str(os.getpid())
    if isinstance(n, int):
        os.environ[THREADS_ENV] = str(n)
    elif n == "auto" and (free := free_cores()) is not None:
        os.environ[FREE_ENV] = str(max(1, min(cores(), round(free))))
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
