"""Learning curves of the smoke recipe before and after issue 21, trained side by side (docs/CURVES.md).

    nice .venv/bin/python docs/curves/before_after.py [--results bench/out/curves-results] [--out docs/curves]

Trains the first run (NSP, seed 0) of each recipe below with an eval every EVERY steps, two processes
at a time with one thread each, so their seconds are measured under the same load; then writes one CSV
per recipe, one PNG with all of them, and prints the table docs/CURVES.md quotes. Runs already trained
in --results are read back, not retrained (study.pretrain.curve).
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from study.paths import Layout
from study.pretrain.curve import first_reaching, learning_curve, write_csv
from study.report.curves import save_curve_png
from study.studies.spec import load_study

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EVERY = 25
BEFORE, AFTER = HERE / "smoke_before.yaml", REPO / "ablations" / "smoke.yaml"


def recipes() -> dict[str, tuple[Path, dict]]:
    """label -> (spec, settings on top of it). smoke_before.yaml is ablations/smoke.yaml as it was before
    the change; the middle recipe is the old one trained as long as the new one, which separates "train
    longer" from "the new lr and no dropout"."""
    steps = load_study(AFTER).runs[0].config.train.amount
    return {"before: 150 steps, lr 2e-3, dropout 0.1": (BEFORE, {}),
            f"old recipe, {steps:g} steps": (BEFORE, {"train.amount": steps}),
            "after: ablations/smoke.yaml": (AFTER, {})}


def config(spec: Path, settings: dict):
    cfg = load_study(spec).runs[0].config.model_copy(deep=True)
    for key, value in settings.items():
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, value)
    cfg.impl.threads = 1  # two side by side on two cores; speed-only, the run hash is unchanged
    cfg.impl.progress = False
    return cfg


def one(args: tuple) -> tuple[str, list[dict], str]:
    label, spec, settings, results = args
    cfg = config(spec, settings)
    curve = learning_curve(cfg, Layout(root=results), EVERY, quiet=True)
    return label, curve.rows, curve.run_hash


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "out" / "curves-results")  # git-ignored scratch
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    jobs = [(label, spec, settings, args.results) for label, (spec, settings) in recipes().items()]
    with ProcessPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(one, jobs))
    curves = {}
    print(f"| recipe | run | steps | tokens | train s | ref MLM acc | floor | acc/floor | 2x floor at |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, (label, rows, run_hash) in enumerate(done):
        curves[label] = rows
        write_csv(rows, args.out / f"smoke_{i}_{run_hash}.csv")
        last, hit = rows[-1], first_reaching(rows, 2.0)
        at = f"{hit['tokens'] / 1e6:.2f}M tokens, {hit['train_s']:.0f} s" if hit else "never"
        print(f"| {label} | {run_hash} | {last['step']} | {last['tokens'] / 1e6:.2f}M | {last['train_s']:.0f} | "
              f"{100 * last['ref_mlm_acc']:.2f}% | {100 * last['ref_mode_acc']:.2f}% | "
              f"{last['ref_mlm_acc'] / last['ref_mode_acc']:.2f} | {at} |")
    png = save_curve_png(curves, args.out / "smoke_before_after.png",
                         title="smoke (NSP, seed 0): reference MLM accuracy and loss, trained side by side")
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
