"""The units of work `study pretrain`, `study finetune` and `study run` hand to study/parallel.py: one run
(or one encoder's fine-tuning) in this process or a `--jobs` worker, a failed run recorded without
stopping the others, and one progress line per finished unit. The CLI's side of the stages, like cli.py:
it imports a stage only inside the function that runs it (`study --help` must not import torch)."""

from __future__ import annotations

import sys
import time

from study.errors import EXIT_DIVERGED, Diverged, StudyError, environmental
from study.io import atomic_write_json
from study.paths import Layout
from study.rundir import RunDir


def pretrain_one(cfg, layout: Layout, quiet: bool, label: str) -> tuple[int, float]:
    """One run, in this process or a --jobs worker: (exit code, seconds)."""
    from study.pretrain.trainer import train_run  # lazy: torch (see the module doc)

    t0 = time.monotonic()
    # train_run holds a per-run lock: a second `study run` of the same spec waits, then reuses
    code = guarded(RunDir(layout, cfg.run_hash()), lambda: train_run(cfg, layout, quiet=quiet), label)
    return code, time.monotonic() - t0


def finetune_one(kind: str, cfg, layout: Layout, quiet: bool) -> tuple[list[dict], float]:
    """Fine-tune one run's model ("run") or its random-init baseline ("baseline"), then score it zero-shot
    (BLiMP, cross-sentence: study/zeroshot/): (results, seconds)."""
    from study.downstream.finetune import finetune_baseline, finetune_run  # lazy: torch (module doc)
    from study.zeroshot import zeroshot_baseline, zeroshot_run  # lazy: torch (module doc)

    t0 = time.monotonic()
    fn, zs = (finetune_run, zeroshot_run) if kind == "run" else (finetune_baseline, zeroshot_baseline)
    return fn(cfg, layout, quiet=quiet) + zs(cfg, layout, quiet=quiet), time.monotonic() - t0


def guarded(run: RunDir, fn, label: str) -> int:
    """A failing run is recorded as failed with its error and does not stop the others."""
    try:
        fn()
        return 0
    except StudyError:
        raise
    except Diverged as exc:  # train_run already wrote status "diverged" with the step
        print(f"run {label} diverged: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    except Exception as exc:  # noqa: BLE001 - recorded, reported, and the study goes on
        if environmental(exc):  # a full disk is not this run's failure: stop (errors.run_main), it resumes
            raise
        run.write_status("failed", error=f"{type(exc).__name__}: {exc}")
        print(f"run {label} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def finetune_items(
    study, layout: Layout, runs: list | None, baselines: list[str] | None, quiet: bool
) -> list:
    """(progress label, finetune_one's arguments) for each encoder to fine-tune: the baselines named, or
    the finished runs among `runs` (the others get a skipped.json) and, for a whole study (`runs` None),
    its random-init baselines."""
    items = []
    for key in baselines or []:
        matches = [r for r in study.runs if r.config.finetune.baseline and r.config.baseline_key() == key]
        if not matches:
            raise StudyError(
                f"no run of this spec has the baseline {key}",
                field="--baseline",
                allowed=", ".join(sorted({r.config.baseline_key() for r in study.runs})) or "none",
            )
        layouts = {tuple(sorted(m.config.zeroshot_hashes().values())): m.config for m in matches}
        items += [(f"baseline {key}", ("baseline", cfg, layout, quiet)) for cfg in layouts.values()]
    if baselines:
        return items
    for run in study.runs if runs is None else runs:
        status = run.status(layout)
        if status != "done":
            # the folder must exist for DVC (a declared output); the reason is kept in it
            atomic_write_json(
                layout.finetune_dir(run.run_hash) / "skipped.json",
                {"run_key": run.run_hash, "skipped": f"pre-training is {status}"},
            )
            print(f"skip fine-tuning {run.label}: pre-training is {status}", file=sys.stderr)
            continue
        items.append(
            (f"finetune {run.run_hash} {run.label} seed{run.seed}", ("run", run.config, layout, quiet))
        )
    if runs is None:  # a whole study: its random-init baselines too
        seen = set()
        for run in study.runs:
            # once per zero-shot identity too: a baseline shared by a pair and a packed format is scored
            # in each row layout (its fine-tune results are found done the second time)
            key = (run.config.baseline_key(), *sorted(run.config.zeroshot_hashes().values()))
            if run.config.finetune.baseline and key not in seen:
                seen.add(key)
                items.append(
                    (f"baseline {run.config.baseline_key()}", ("baseline", run.config, layout, quiet))
                )
    return items


def progress(line: str) -> None:
    """One line per finished unit of work on stderr, even with --quiet (which only drops progress bars):
    DVC passes a stage's stderr through, so a long `dvc repro` shows where it is."""
    print(line, file=sys.stderr, flush=True)


def pct(x) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "-"


def ft_summary(results: list[dict]) -> str:
    """Mean primary metric per task and mode of one encoder's fine-tuning results, e.g. `SST-2 finetune 51.2%`,
    `CoLA finetune matthews_corr 0.123` (a correlation is no percentage)."""
    by: dict[tuple, list[float]] = {}
    for r in results:
        if "primary" in r and isinstance(r["primary"], (int, float)):
            by.setdefault((r["task"], r["mode"], r.get("primary_metric")), []).append(r["primary"])
    skipped = sorted({r["task"] for r in results if "skipped" in r})
    diverged = sorted((r["task"], r["seed"]) for r in results if "diverged" in r)
    parts = [
        f"{t} {m} {pct(sum(v) / len(v))}"
        if pm in ("accuracy", "f1", None)
        else f"{t} {m} {pm} {sum(v) / len(v):.3f}"
        for (t, m, pm), v in sorted(by.items(), key=lambda kv: kv[0][:2])
    ]
    return (
        ", ".join(parts + [f"{t} skipped" for t in skipped] + [f"{t} seed {s} DIVERGED" for t, s in diverged])
        or "no results"
    )


def rescore_runs(runs: list, layout: Layout, quiet: bool) -> tuple[int, int]:
    """`study rescore`: score each finished run again, one line each; (runs whose stored scores did not
    reproduce, runs that gained metrics fields)."""
    from study.pretrain.rescore import rescore_run  # lazy: torch (module doc)

    failed = added = 0
    for run in runs:
        status = run.status(layout)
        if status != "done":
            print(f"{run.run_hash}  skip: {status}  {run.label}")
            continue
        res = rescore_run(run.config, layout, quiet=quiet)
        moved = ", ".join(f"{k} {v:.2g}" for k, v in res.deviation.items() if v)
        if not res.ok:
            failed += 1
            print(
                f"{run.run_hash}  MISMATCH {', '.join(res.mismatch)} (|stored - now|: {moved}; trained on "
                f"{res.trained_on}, scored on {res.scored_on}); left as it was  {run.label}"
            )
            continue
        RunDir(layout, run.run_hash).publish()
        added += bool(res.added)
        what = f"added {', '.join(res.added)}" if res.added else "up to date"
        print(f"{run.run_hash}  {what}; stored scores reproduced ({moved or 'exactly'})  {run.label}")
    return failed, added
