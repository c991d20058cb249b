"""The cpu profile's recipe before and after the short-row warmup, trained side by side (docs/RESULTS.md).

    nice .venv/bin/python docs/curves/cpu_before_after.py [--results bench/out/cpu-curves] [--out docs/curves]

The mask_rate study's 15% run (doc_sentences, no sentence task, seed 0) at `--profile cpu`, once as the
profile trains it now (its first 30% of steps on 16-token rows) and once without the short rows
(train.short_fraction 0, everything else equal), an eval every EVERY steps, two processes with one thread
each so their seconds are measured under the same load. Writes a CSV per recipe, one PNG, and prints the
table docs/RESULTS.md quotes: tokens and training seconds to 20% reference accuracy, and the end point
overall and at [MASK] (ref_mask_acc, the score without copying). Finished runs are read back.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from study.paths import Layout
from study.pretrain.curve import learning_curve, write_csv
from study.report.curves import save_curve_png
from study.studies.spec import load_study

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EVERY = 250
SPEC = REPO / "ablations" / "mask_rate.yaml"
RECIPES = {"before: no short rows": {"short_fraction": 0.0},
           "after: 16-token rows for the first 30%": {}}


def config(settings: dict):
    run = next(r for r in load_study(SPEC, "cpu").runs if r.config.masking.rate == 0.15 and r.seed == 0)
    data = run.config.model_dump()
    data["train"].update(settings)
    cfg = type(run.config).model_validate(data)   # validated again: short_fraction 0 drops short_len
    cfg.impl.threads, cfg.impl.progress = 1, False  # speed-only: the run hash is unchanged
    return cfg


def one(args: tuple) -> tuple[str, list[dict], str]:
    label, settings, results = args
    curve = learning_curve(config(settings), Layout(root=results), EVERY, quiet=True)
    return label, curve.rows, curve.run_hash


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "out" / "cpu-curves")  # git-ignored scratch
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    with ProcessPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(one, [(label, s, args.results) for label, s in RECIPES.items()]))
    print("| recipe | run | steps | tokens | train s | overall | at [MASK] | [MASK] floor | 20% overall at |")
    print("|---|---|---|---|---|---|---|---|---|")
    curves = {}
    for i, (label, rows, run_hash) in enumerate(done):
        curves[label] = rows
        write_csv(rows, args.out / f"cpu_{i}_{run_hash}.csv")
        last = rows[-1]
        hit = next((r for r in rows if r["ref_mlm_acc"] >= 0.20), None)
        at = f"{hit['tokens'] / 1e6:.1f}M tokens, {hit['train_s']:.0f} s" if hit else "never"
        print(f"| {label} | {run_hash} | {last['step']} | {last['tokens'] / 1e6:.1f}M | {last['train_s']:.0f} | "
              f"{100 * last['ref_mlm_acc']:.1f}% | {100 * last['ref_mask_acc']:.1f}% | "
              f"{100 * last['ref_mask_mode_acc']:.1f}% | {at} |")
    png = save_curve_png(curves, args.out / "cpu_before_after.png",
                         title="cpu profile, mask_rate 15% run (seed 0): before and after, side by side")
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
