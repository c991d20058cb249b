"""BLiMP scoring speed (study/zeroshot/), a benchmark: pairs/s, and the cost as a fraction of the run's pre-training.

One run of a spec and profile (default: nsp at the cpu profile, its first run) is scored on BLiMP at the
profile's sample (`zeroshot.blimp_pairs` per paradigm, or --pairs) with the scorer the pipeline uses
(study.zeroshot.pll, the same batching), on --threads threads, in fp32. The model is the run's own when its
folder holds one, else a seeded random-init model of the same architecture with the run's tokenizer (the data
folder's; prepared if missing): the same shapes, so the same cost per pair. The fraction divides the scoring
time by the run's pre-training wall time (metrics.json `wall_s`), or by --pretrain-s where the run is not
trained here (default 840 s: the ~14 min of an nsp cpu run that issue 45 measured, said so in the output).
Timings on a shared machine move with its load: the CPU seconds are printed beside the wall time (on an
idle machine wall ~ CPU / threads), so a loaded machine shows as wall >> CPU / threads.

    python -m bench.blimp [--spec ablations/nsp.yaml] [--profile cpu] [--pairs N] [--threads 2]
    python -m bench.blimp --dry     # the smoke spec, 2 pairs per paradigm: checks the wiring in seconds
    --crosssent                      # also time cross-sentence scoring (zeroshot.crosssent_pairs)

Last line, exactly: `blimp pairs=<n> seconds=<s> cpu_s=<c> pairs_per_s=<x> pretrain_s=<p> fraction=<f>`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.common import REPO


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(REPO / "ablations/nsp.yaml"))
    ap.add_argument("--profile", default="cpu", help="'none' for a spec's defaults (the smoke study)")
    ap.add_argument("--results", default="results", help="the results folder the run (and its data) live in")
    ap.add_argument("--pairs", type=int, default=None, help="pairs per paradigm (default: the profile's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--pretrain-s", type=float, default=840.0, help="pre-training wall time when not trained here"
    )
    ap.add_argument("--dry", action="store_true", help="the smoke spec, 2 pairs per paradigm")
    ap.add_argument("--crosssent", action="store_true", help="also time the cross-sentence evaluation")
    args = ap.parse_args()
    if args.dry:
        args.spec, args.profile, args.pairs = str(REPO / "ablations/smoke.yaml"), None, 2

    import torch

    from study.data.prepare import prepare_data
    from study.data.tokenizer import continuation_mask, special_ids
    from study.downstream.models import pretrained_model, random_model
    from study.paths import Layout
    from study.rundir import RunDir
    from study.studies.spec import load_study
    from study.zeroshot import blimp, crosssent
    from study.zeroshot.pll import pll, sentence_rows
    from study.zeroshot_config import PAIR_FORMATS

    run = load_study(args.spec, None if args.profile in (None, "none") else args.profile).runs[0]
    cfg = run.config.model_copy(deep=True)
    cfg.impl.threads, cfg.impl.precision, cfg.impl.device = args.threads, "fp32", "cpu"
    n = args.pairs if args.pairs is not None else cfg.zeroshot.blimp_pairs
    pairs = blimp.read_pairs(cfg.zeroshot.blimp_zip, n)  # a missing zip fails before any data is prepared
    layout = Layout(Path(args.results))
    rd = RunDir(layout, cfg.run_hash())
    trained = rd.has_model()
    tok, model, source = (pretrained_model if trained else random_model)(cfg, layout, True)
    wall = rd.metrics().get("wall_s") if trained else None
    pretrain_s, where = (float(wall), "the run's metrics.json") if wall else (args.pretrain_s, "--pretrain-s")
    torch.set_num_threads(args.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    rows = sentence_rows(tok, [s for p in pairs for s in (p.good, p.bad)], cfg.model.max_positions)
    scores = pll(model, rows, tok.mask_token_id, metric=cfg.zeroshot.pll)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    acc = blimp.summary(blimp.pair_results(pairs, scores))["accuracy"]
    print(
        f"{run.label} seed{run.seed} ({source}): {len(pairs):,} pairs ({n} per paradigm, {cfg.zeroshot.pll}) "
        f"in {seconds:.1f} s wall ({cpu:.1f} s CPU) on {args.threads} threads, accuracy {100 * acc:.1f}%; "
        f"pre-training {pretrain_s:.0f} s (from {where})",
        flush=True,
    )
    if args.crosssent:  # the other zero-shot evaluation, on the run's held-out test documents
        split = prepare_data(cfg, layout, progress=False).split("test")
        ts = crosssent.triples(split, cfg.zeroshot.crosssent_pairs)
        t1, c1 = time.perf_counter(), time.process_time()
        segments = cfg.objective.format in PAIR_FORMATS
        cs = crosssent.rows(
            split, ts, special_ids(tok), continuation_mask(tok), segments, cfg.objective.max_seq_len
        )
        gain = crosssent.summary(crosssent.pair_results(ts, split, pll(model, cs, tok.mask_token_id)))["gain"]
        print(
            f"cross-sentence: {len(ts)} pairs in {time.perf_counter() - t1:.1f} s wall "
            f"({time.process_time() - c1:.1f} s CPU), gain {gain:.4f} nats/token"
        )
    print(
        f"blimp pairs={len(pairs)} seconds={seconds:.2f} cpu_s={cpu:.2f} pairs_per_s={len(pairs) / seconds:.1f} "
        f"pretrain_s={pretrain_s:.0f} fraction={seconds / pretrain_s:.3f}"
    )


if __name__ == "__main__":
    main()
