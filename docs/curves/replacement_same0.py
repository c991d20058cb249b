"""Why the replacement study's SAME-0 splits stay on the plateau: recipe changes tried on them (docs/RESULTS.md).

    nice .venv/bin/python docs/curves/replacement_same0.py [--results bench/out/replacement-curves] [--out docs/curves]
    nice .venv/bin/python docs/curves/replacement_same0.py --plan      # the run hashes only, nothing trained
    nice .venv/bin/python docs/curves/replacement_same0.py --group replacement_warmup   # one group only

Runs of ablations/replacement.yaml at `--profile cpu` with base/bert.yaml's 16-token warmup rows and BERT's
init_range 0.02 (BASE, so that every group keeps its run hashes; the study itself has taken 8-token rows and
init_range 0.05 since), some with one recipe setting changed (the same change
for every split it is tried on; all at the profile's budget except the "longer" group, which doubles it), an
eval every EVERY steps (the groups in EVERY_IN: every 100, to see the warmup's 900 steps of short rows), two
processes with one thread each. Writes a CSV per run (`<group>_<run_hash>.csv`),
one PNG per group, and prints the table docs/RESULTS.md quotes. Finished runs in --results are read back, not retrained.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path

from study.paths import Layout
from study.pretrain.curve import learning_curve, write_csv
from study.report.curves import save_curve_png
from study.rundir import RunDir
from study.studies.spec import load_study, set_dotted

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EVERY = 250
EVERY_IN = {"replacement_warmup": 100, "replacement_short8": 100, "replacement_short8_seeds": 100,
            "replacement_init": 100}
SPEC = REPO / "ablations" / "replacement.yaml"
# figure name -> runs as (split label, seed, recipe change); the cpu recipe is lr 2e-3, warmup 6%, post-LN and,
# for these groups, base/bert.yaml's 16-token warmup rows and init_range 0.02 (BASE): the study's own cpu profile
# has had 8-token rows and init_range 0.05 since
BASE = {"train.short_len": 16, "model.init_range": 0.02}
SPLITS = ("MASK100/SAME0/RND0", "MASK80/SAME0/RND20", "MASK0/SAME0/RND100", "MASK80/SAME10/RND10")
GROUPS = {
    "replacement_same0": [
        ("MASK80/SAME0/RND20", 1, {}),
        ("MASK80/SAME0/RND20", 1, {"train.lr": 1.0e-3}),
        ("MASK80/SAME0/RND20", 1, {"model.arch": "pre_ln"}),
        ("MASK80/SAME0/RND20", 1, {"train.warmup": 0.2}),
        ("MASK0/SAME0/RND100", 0, {"train.lr": 1.0e-3}),
        ("MASK0/SAME0/RND100", 0, {"train.warmup": 0.2}),
        ("MASK80/SAME10/RND10", 0, {"train.lr": 1.0e-3}),
    ],
    # every seed of BERT's split and of the three SAME-0 splits, pre-LN (the cpu recipe otherwise)
    "replacement_preln": [(label, seed, {"model.arch": "pre_ln"}) for label in SPLITS for seed in (0, 1, 2)],
    # the cpu recipe at twice the steps (its short-row phase is 30% of them, so twice as long too)
    "replacement_longer": [("MASK80/SAME0/RND20", 1, {"train.amount": 6000.0}),
                           ("MASK0/SAME0/RND100", 0, {"train.amount": 6000.0})],
    # the cpu recipe again, with the short-row reference (short_mask_acc): does the 16-token warmup teach context?
    "replacement_warmup": [("MASK80/SAME10/RND10", 0, {}), ("MASK80/SAME20/RND0", 0, {}), ("MASK80/SAME0/RND20", 1, {}),
                           ("MASK0/SAME0/RND100", 0, {}), ("MASK100/SAME0/RND0", 1, {}), ("MASK100/SAME0/RND0", 2, {})],
    # the warmup's rows at 8 tokens instead of 16 (the same 30% of the steps, the same token slots per step)
    "replacement_short8": [(label, seed, {"train.short_len": 8}) for label, seed in
                           (("MASK80/SAME10/RND10", 0), ("MASK80/SAME0/RND20", 1), ("MASK100/SAME0/RND0", 2),
                            ("MASK0/SAME0/RND100", 0))],
    # ... and on the other seeds of the two SAME-0 splits it took off the floor
    "replacement_short8_seeds": [(label, seed, {"train.short_len": 8}) for label, seed in
                                 (("MASK100/SAME0/RND0", 0), ("MASK100/SAME0/RND0", 1), ("MASK80/SAME0/RND20", 0),
                                  ("MASK80/SAME0/RND20", 2))],
    # the study's recipe (8-token warmup rows) with BERT's init_range 0.02 raised to 0.05 (and one run with
    # gradients clipped at 0.25 instead): the two changes of a 700-step screen on MASK0/SAME0/RND100 seed 0 that
    # kept it from collapsing (docs/RESULTS.md)
    "replacement_init": [(label, seed, {"train.short_len": 8, **change}) for label, seed, change in
                         (("MASK0/SAME0/RND100", 0, {"model.init_range": 0.05}),
                          ("MASK80/SAME10/RND10", 0, {"model.init_range": 0.05}),
                          ("MASK0/SAME0/RND100", 0, {"train.clip": 0.25}),
                          ("MASK0/SAME0/RND100", 1, {"model.init_range": 0.05}),
                          ("MASK0/SAME0/RND100", 2, {"model.init_range": 0.05}),
                          ("MASK80/SAME0/RND20", 1, {"model.init_range": 0.05}),
                          ("MASK80/SAME0/RND20", 2, {"model.init_range": 0.05}),
                          ("MASK100/SAME0/RND0", 2, {"model.init_range": 0.05}))],
}
TITLES = {"replacement_same0": "replacement splits (MASK/SAME/RND), cpu profile: one recipe setting changed",
          "replacement_preln": "replacement splits (MASK/SAME/RND), cpu profile, pre-LN: every seed",
          "replacement_longer": "replacement SAME-0 splits, cpu recipe at 6,000 steps (twice the budget)",
          "replacement_warmup": "replacement splits (MASK/SAME/RND), cpu recipe: dash-dot, [MASK] on the 16-token rows",
          "replacement_short8": "replacement splits (MASK/SAME/RND), warmup on 8-token rows: dash-dot, [MASK] on them",
          "replacement_short8_seeds": "replacement SAME-0 splits, other seeds, warmup on 8-token rows: dash-dot, "
                                      "[MASK] on them",
          "replacement_init": "replacement, 8-token warmup rows, init_range 0.05 (one run: clip 0.25 instead)"}


@cache
def study():
    """The spec at --profile cpu, loaded once per process (loading fingerprints the whole corpus)."""
    return load_study(SPEC, "cpu")


def config(label: str, seed: int, change: dict):
    run = next(r for r in study().runs if r.label == label and r.seed == seed)
    data = run.config.model_dump()
    for key, value in {**BASE, **change}.items():
        set_dotted(data, key, value, source=__file__)  # the spec's own rule for a dotted key
    cfg = type(run.config).model_validate(data)   # validated again, like a spec's `set`
    cfg.impl.threads, cfg.impl.progress = 1, False  # speed-only: the run hash is unchanged
    return cfg


def name(label: str, seed: int, change: dict) -> str:
    what = ", ".join(f"{k.split('.')[1]} {v:g}" if isinstance(v, (int, float)) else f"{v}" for k, v in change.items())
    return f"{label.replace('MASK', '').replace('SAME', '').replace('RND', '')} s{seed}: {what or 'cpu recipe'}"


def one(args: tuple) -> tuple[str, list[dict], str, float]:
    """(legend name, curve rows, run hash, accuracy on the reference's kept positions: how much it copies)."""
    group, (label, seed, change), results = args
    layout = Layout(root=results)
    curve = learning_curve(config(label, seed, change), layout, EVERY_IN.get(group, EVERY), quiet=True)
    return name(label, seed, change), curve.rows, curve.run_hash, RunDir(layout, curve.run_hash).metrics()["ref_keep_acc"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "out" / "replacement-curves")  # git-ignored
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--plan", action="store_true", help="print the run hashes and stop")
    ap.add_argument("--group", action="append", choices=sorted(GROUPS), help="only these groups (repeatable)")
    args = ap.parse_args()
    groups = {g: GROUPS[g] for g in args.group} if args.group else GROUPS   # in the order asked
    runs = [(group, run) for group, members in groups.items() for run in members]
    if args.plan:
        for group, run in runs:
            print(config(*run).run_hash(), group, name(*run))
        return
    with ProcessPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(one, [(group, run, args.results) for group, run in runs]))
    print("| split (MASK/SAME/RND), seed: recipe | run | overall | at [MASK] | kept | [MASK] floor | [MASK] 2x floor at step |")
    print("|---|---|---|---|---|---|---|")
    curves: dict[str, dict] = {group: {} for group in groups}
    for (group, _), (label, rows, run_hash, keep) in zip(runs, done):
        curves[group][label] = rows
        write_csv(rows, args.out / f"{group}_{run_hash}.csv")
        last = rows[-1]
        hit = next((r for r in rows if r["ref_mask_acc"] >= 2 * r["ref_mask_mode_acc"]), None)
        print(f"| {label} | {run_hash} | {100 * last['ref_mlm_acc']:.1f}% | {100 * last['ref_mask_acc']:.1f}% | "
              f"{100 * keep:.1f}% | {100 * last['ref_mask_mode_acc']:.1f}% | {hit['step'] if hit else 'never'} |")
    # the groups evaluated every 100 steps (EVERY_IN): what the warmup taught on its own rows, and the spread
    warm = [(label, rows) for (group, _), (label, rows, _, _) in zip(runs, done) if group in EVERY_IN]
    if warm:
        print("\n| split, seed: recipe | on the short rows: [MASK] at step 300 / 600 / 900 | floor "
              "| spread at 300 / 900 | spread at the end (128 tokens) |")
        print("|---|---|---|---|---|")
        for label, rows in warm:
            at = {r["step"]: r for r in rows}
            acc = " / ".join(f"{100 * at[k]['short_mask_acc']:.1f}" for k in (300, 600, 900))
            spr = " / ".join(f"{at[k]['short_spread']:.2f}" for k in (300, 900))
            floor = 100 * rows[-1]["short_mask_mode_acc"]
            print(f"| {label} | {acc} | {floor:.1f}% | {spr} | {rows[-1]['ref_spread']:.2f} |")
    for group, by_label in curves.items():
        png = save_curve_png(by_label, args.out / f"{group}.png", title=TITLES[group])
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
