"""Several runs of one study at once, each in its own process (`study run/pretrain/finetune --jobs N`).

Why: the cpu profile's models are small, and torch's intra-op threading scales poorly on them. On the
2-core machine of docs/RESULTS.md one L2/H128 run trained at ~25k tokens/s on two threads, while two
runs side by side on one thread each trained at ~17k tokens/s apiece (35k together). A study is many
independent runs, so running them side by side is the cheaper way to use the cores.

What it changes: only `impl.threads` of each run (cores // jobs unless the config sets it), a speed-only
setting outside the run hash. A different thread count reorders float sums, so a run trained with
--jobs 2 agrees with the same run trained alone to float rounding, not bitwise (as any thread count).
Every run keeps its own seed, data order and folder; the per-run lock in the trainer still guards a
run that two commands start at once.

Processes are spawned, not forked: the parent may already hold OpenMP threads, and a forked OpenMP
runtime can hang.

Stopping (SIGTERM or Ctrl-C to the command, SIGTERM to one worker, or the parent killed): the whole
command stops, and every run in flight checkpoints (with jobs == 1 the run is in this process, and the
trainer's own handlers do that for SIGTERM and Ctrl-C; nothing can for a kill). A pool's workers would otherwise outlive a killed
parent (measured here: orphans trained on for minutes, halving the next command's speed), and a worker
whose run was interrupted would take the next queued run. So:
- the parent turns SIGTERM into `Interrupted`; on it, on Ctrl-C, or on any error it cancels the runs not
  started, sends SIGTERM to the workers (the trainer finishes its step, checkpoints and raises
  `Interrupted`; again each second until the worker exits, then SIGKILL after `stop_timeout`), waits for
  them, and raises Interrupted (Ctrl-C's KeyboardInterrupt too): the CLI exits 143 and the next command
  resumes;
- a worker dies with its parent (Linux: PR_SET_PDEATHSIG delivers SIGTERM, so it checkpoints too),
  ignores SIGINT (Ctrl-C reaches the whole process group; the parent decides), and once a run of its own
  was interrupted it starts no other.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from study.config import RunConfig
from study.errors import EXIT_INTERRUPTED, Interrupted, StudyError

T = TypeVar("T")


def check_jobs(jobs: int) -> int:
    if not isinstance(jobs, int) or jobs < 1:
        raise StudyError(
            f"must be a positive integer or auto, got {jobs!r}",
            field="--jobs",
            allowed=f"auto, or a positive integer (this machine has {os.cpu_count() or 1} cores)",
        )
    return jobs


def resolve_jobs(value: int | str, configs: list[RunConfig]) -> int:
    """--jobs as given (a positive integer, or `auto`) -> the number of worker processes. auto, given the
    configs of the runs left to do: one per core, at most one per run, when every run trains on the CPU
    (the small models of the smoke and cpu profiles train faster side by side than threaded: module doc);
    1 when any run would use an accelerator (runs side by side would share one device). The generated
    DVC stages use auto."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        from study.runtime import resolve_device  # lazy: torch; cli.py imports this module for --help

        if any(resolve_device(c.impl.device).type != "cpu" for c in configs):
            return 1
        return max(1, min(os.cpu_count() or 1, len(configs)))
    try:
        jobs = int(value)
    except (TypeError, ValueError):
        jobs = value
    return check_jobs(jobs)


def with_threads(cfg: RunConfig, jobs: int) -> RunConfig:
    """`cfg` with `impl.threads` = cores // jobs (at least 1), unless the config already sets it."""
    if jobs <= 1 or cfg.impl.threads is not None:
        return cfg
    out = cfg.model_copy(deep=True)
    out.impl.threads = max(1, (os.cpu_count() or 1) // jobs)
    return out


def run_all(
    fn: Callable[..., T], items: Iterable[tuple[Any, tuple]], jobs: int, stop_timeout: float = 300.0
) -> Iterator[tuple[Any, T]]:
    """(key, fn(*args)) for every (key, args) in `items`, in completion order; `fn` must be a module-level
    function (it is pickled by name). jobs == 1 runs in this process, in order, with no pool. With a pool,
    a stop (module doc) SIGTERMs the workers and waits up to `stop_timeout` s for their checkpoints."""
    items = list(items)
    if check_jobs(jobs) == 1 or len(items) <= 1:
        for key, args in items:
            yield key, fn(*args)
        return
    ctx = multiprocessing.get_context("spawn")
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=ctx, initializer=_worker_init)
    signalled: list[int] = []
    restore = _on_sigterm(signalled)
    try:
        futures = {pool.submit(_call, fn, args): key for key, args in items}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    except BaseException as exc:  # SIGTERM, Ctrl-C, a worker's Interrupted or error, or the caller stopped
        pool.shutdown(wait=False, cancel_futures=True)
        _stop([p for p in multiprocessing.active_children() if p not in before], stop_timeout)
        if isinstance(exc, BrokenProcessPool) and signalled:  # a worker killed outside a run's training
            raise Interrupted(None) from None
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Interrupted):
            raise Interrupted(None) from None  # Ctrl-C: every run in flight was stopped as by SIGTERM
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        restore()


def _on_sigterm(signalled: list[int]) -> Callable[[], None]:
    """SIGTERM raises Interrupted in this (main) thread while the pool runs; returns the restorer."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        signalled.append(signum)
        raise Interrupted(None)

    old = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, old)


def _stop(workers: list, timeout: float) -> None:
    """SIGTERM each live worker, again every second until it exits, and SIGKILL what is left after
    `timeout` s. Why again: a run in flight takes every SIGTERM as the same stop request (it checkpoints
    once), but a SIGTERM that arrives during the run is spent, and the idle worker then waits on the call
    queue for good; that wait can be blocked by a queue lock that a sibling killed mid-get still holds (the
    executor says so itself), so no sentinel ever reaches it. Seen in CI: a worker alive a minute later,
    and the interpreter hung at exit joining it. A worker killed between its run's end and its result
    message loses only that message, which a stopping command does not read."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in workers if p.is_alive()]
        left = deadline - time.monotonic()
        if not alive or left <= 0:
            break
        for p in alive:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        multiprocessing.connection.wait([p.sentinel for p in alive], min(1.0, left))
    for p in alive:  # past the timeout: a run that cannot checkpoint in time loses its last steps
        print(
            f"study: worker {p.pid} did not stop within {timeout:.0f} s of SIGTERM; killing it",
            file=sys.stderr,
        )
        p.kill()
    for p in workers:
        p.join(10)


# --------------------------------------------------------------------------- in the workers
_INTERRUPTED = False  # this worker's run was interrupted: it starts no other
_PARENT = None  # the command's pid, to tell that it is gone


def _worker_init() -> None:
    global _PARENT
    _PARENT = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):  # die with the parent, by SIGTERM, so a run in flight checkpoints
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl: nobody is left to report to
            os._exit(1)


def _call(fn: Callable[..., T], args: tuple) -> T:
    global _INTERRUPTED
    if _INTERRUPTED:
        raise Interrupted(None)
    try:
        return fn(*args)
    except Interrupted:
        _INTERRUPTED = True
        if os.getppid() != _PARENT:  # the command was killed: the checkpoint is written, nobody waits for us
            os._exit(EXIT_INTERRUPTED)
        raise
