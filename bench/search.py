"""Does a pruned optuna search find the grid's best masking rate for less than half the tokens?

One small mask-rate problem, two ways, each in its own results folder (so neither reuses the other's runs):
  grid    every level of masking.rate trained to the end (an ordinary `factors:` study)
  search  `study search`'s defaults, TPE + median pruner on the trainer's eval curve, over
          masking.rate in [0.05, 0.5] step 0.05; a trial's bucket is the nearest grid level.
Objective for both: the fixed-reference MLM loss (ref_mlm_loss, lower is better).
Tokens: grid = sum of metrics.json tokens_seen; search = sum of the tokens each trial trained
(pruned trials stop at their last eval; a repeated config reuses its run and trains nothing).

    python -m bench.search [--steps 200] [--trials 8] [--work DIR]
    python -m bench.search --dry   # 8 steps a run, 3 trials, the synthetic corpus: checks the code path

Last line, exactly: `search tokens_ratio=<search tokens / grid tokens> best_bucket_match=<yes|no>`.
Corpus: WikiText-2 valid (../shared/data) when present, else a synthetic corpus (stated in the output).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import SHARED, single_threaded, synthetic_corpus

single_threaded()
WIKI = SHARED / "wikitext-2-raw" / "wiki.valid.raw"
GRID = [0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5]


def write_spec(path: Path, source: str, steps: int, trials: int, dry: bool = False) -> Path:
    import yaml

    eval_every = max(1, steps // 10)
    doc = {
        "name": "bench-mask-rate",
        "question": "Which masking rate gives the lowest reference MLM loss for a tiny BERT?",
        "defaults": {
            "corpus": {"sources": [source], "valid_fraction": 0.1, "test_fraction": 0.05},
            "tokenizer": {"vocab_size": 2048},
            "objective": {"format": "doc_sentences", "sentence": "none", "max_seq_len": 64},
            "model": {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 256, "max_positions": 64},
            # fine-tuning is never run here (the objective is a pre-training metric), but the spec must
            # validate: finetune.max_length defaults to 128, more positions than this model has
            "finetune": {"max_length": 64},
            "train": {
                "budget": "steps",
                "amount": steps,
                "batch_size": 16,
                "lr": 2e-3,
                "eval_sequences": 16 if dry else 128,
            },
            "impl": {
                "eval_every": eval_every,
                "checkpoint_every": eval_every * 5,
                "threads": 1,
                "progress": False,
            },
        },
        "factors": {"masking.rate": GRID},
        "search": {
            "objective": "ref_mlm_loss",
            "n_trials": trials,
            "sampler": {"kind": "tpe", "seed": 0, "n_startup_trials": 3},
            "pruner": {"kind": "median", "n_startup_trials": 2, "n_warmup_steps": 2 * eval_every},
            "params": {"masking.rate": {"low": 0.05, "high": 0.5, "step": 0.05}},
        },
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def bucket(rate: float) -> float:
    return min(GRID, key=lambda g: (abs(g - rate), g))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--work", type=Path, help="working folder (default: a temp folder, removed)")
    ap.add_argument("--dry", action="store_true", help="8 steps a run, 3 trials, the synthetic corpus")
    args = ap.parse_args()
    if args.dry:
        args.steps, args.trials = min(args.steps, 8), min(args.trials, 3)
    import torch

    torch.set_num_threads(1)
    from optuna.trial import TrialState

    from study.data.prepare import prepare_data
    from study.paths import Layout
    from study.pretrain.trainer import train_run
    from study.search import run_search
    from study.studies.spec import load_study

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-search-"))
    work.mkdir(parents=True, exist_ok=True)
    source = (
        f"wikitext:{WIKI}"
        if WIKI.exists() and not args.dry
        else synthetic_corpus(work / "corpus", 300 if args.dry else 1500)
    )
    print(f"corpus: {source}  steps/run: {args.steps}  search trials: {args.trials}  grid: {GRID}")
    spec = write_spec(work / "bench.yaml", source, args.steps, args.trials, args.dry)
    study = load_study(spec)
    grid_l, search_l = Layout(root=work / "grid"), Layout(root=work / "search")
    prepare_data(study.runs[0].config, grid_l, progress=False)
    # the same prepared data for both (data prep is not training; sharing it only saves time)
    (work / "search").mkdir(exist_ok=True)
    if not (work / "search" / "data").exists():
        os.symlink(work / "grid" / "data", work / "search" / "data")

    t0 = time.perf_counter()
    grid, grid_tokens = {}, 0
    for run in study.runs:
        m = train_run(run.config, grid_l, quiet=True)
        grid[run.factors["masking.rate"]] = m["ref_mlm_loss"]
        grid_tokens += int(m["tokens_seen"])
        print(
            f"grid  masking.rate={run.factors['masking.rate']:<5} ref_mlm_loss={m['ref_mlm_loss']:.4f} "
            f"tokens={int(m['tokens_seen'])}",
            flush=True,
        )
    t_grid = time.perf_counter() - t0
    grid_best = min(grid, key=grid.get)

    t0 = time.perf_counter()
    ostudy = run_search(spec, layout=search_l, quiet=True)
    t_search = time.perf_counter() - t0
    search_tokens = 0
    for t in ostudy.get_trials():
        tok = int(t.user_attrs.get("tokens") or 0)
        search_tokens += tok
        rate = t.user_attrs.get("settings", {}).get("masking.rate")
        last = max(t.intermediate_values) if t.intermediate_values else None
        print(
            f"trial {t.number:>2} {t.state.name:8} masking.rate={rate:<5} bucket={bucket(rate):<5} "
            f"value={t.value if t.value is not None else float('nan'):.4f} last_step={last} tokens={tok}"
            f"{' (reused)' if t.user_attrs.get('reused') else ''}"
        )
    # cross-check from the run folders alone: the tokens each search run folder has seen
    folder_tokens = 0
    for d in (work / "search" / "runs").iterdir():
        if d.is_dir():
            hist = [json.loads(x) for x in (d / "history.jsonl").read_text().splitlines()]
            folder_tokens += max(int(e.get("tokens") or 0) for e in hist)
    complete = [t for t in ostudy.get_trials() if t.state == TrialState.COMPLETE]
    best = min(complete, key=lambda t: t.value)
    best_rate = best.user_attrs["settings"]["masking.rate"]
    ratio = search_tokens / grid_tokens
    print(
        f"grid:   {len(study.runs)} runs, {grid_tokens:,} tokens, {t_grid:.0f}s; best masking.rate={grid_best} "
        f"(ref_mlm_loss {grid[grid_best]:.4f})"
    )
    print(
        f"search: {len(ostudy.get_trials())} trials ({len(complete)} complete), {search_tokens:,} tokens "
        f"(run folders: {folder_tokens:,}), {t_search:.0f}s; best masking.rate={best_rate} -> bucket "
        f"{bucket(best_rate)} (ref_mlm_loss {best.value:.4f})"
    )
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"search tokens_ratio={ratio:.3f} best_bucket_match={'yes' if bucket(best_rate) == grid_best else 'no'}"
    )


if __name__ == "__main__":
    main()
