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
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

from study.config import RunConfig
from study.errors import StudyError

T = TypeVar("T")


def check_jobs(jobs: int) -> int:
    if not isinstance(jobs, int) or jobs < 1:
        raise StudyError(f"--jobs must be a positive integer, got {jobs!r}", field="--jobs",
                         allowed=f"1 .. {os.cpu_count() or 1} (the cores of this machine)")
    return jobs


def with_threads(cfg: RunConfig, jobs: int) -> RunConfig:
    """`cfg` with `impl.threads` = cores // jobs (at least 1), unless the config already sets it."""
    if jobs <= 1 or cfg.impl.threads is not None:
        return cfg
    out = cfg.model_copy(deep=True)
    out.impl.threads = max(1, (os.cpu_count() or 1) // jobs)
    return out


def run_all(fn: Callable[..., T], items: Iterable[tuple[Any, tuple]], jobs: int) -> Iterator[tuple[Any, T]]:
    """(key, fn(*args)) for every (key, args) in `items`, in completion order; `fn` must be a module-level
    function (it is pickled by name). jobs == 1 runs in this process, in order, with no pool."""
    items = list(items)
    if check_jobs(jobs) == 1 or len(items) <= 1:
        for key, args in items:
            yield key, fn(*args)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=ctx) as pool:
        futures = {pool.submit(fn, *args): key for key, args in items}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
