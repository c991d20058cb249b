"""The training step with the MLM loss in row chunks vs over the whole logits (`impl.mlm_loss`), a benchmark.

For one run per masking rate of a spec (default: the mask_rate study's cpu profile, seed 0), the trainer's own
step (`study.studies.cost.time_pretrain_step`: the model, optimizer and step function training uses, on
synthetic full-length batches with the run's masking rate) is timed with `impl.mlm_loss: torch` and
`chunked`, alternating, each the fastest of --steps steps, on --threads threads. Ratios are torch's step time
over chunked's, measured in the same process; both are fp32. That the two give the same loss is a test
(tests/test_model.py, tests/test_train.py), not this script's business.

    python -m bench.mlm_loss [--spec ablations/mask_rate.yaml] [--profile cpu] [--steps 8] [--threads 1]
    python -m bench.mlm_loss --dry   # the smoke spec's one rate, 2 steps, one round

Last line, exactly: `mlm_loss ratio_<rate>=<torch/chunked> ...` for each rate, e.g. ratio_0.15=1.21.
"""

from __future__ import annotations

import argparse

from bench.common import REPO


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(REPO / "ablations/mask_rate.yaml"))
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="torch/chunked alternations per rate")
    ap.add_argument("--dry", action="store_true", help="the smoke spec, 2 steps, one round")
    args = ap.parse_args()
    if args.dry:
        args.spec, args.profile, args.steps, args.rounds = str(REPO / "ablations/smoke.yaml"), None, 2, 1

    from study.studies.cost import time_pretrain_step
    from study.studies.spec import load_study

    runs, seen = [], set()
    for run in load_study(args.spec, args.profile).runs:
        if run.config.masking.rate not in seen:
            seen.add(run.config.masking.rate)
            runs.append(run)
    ratios = {}
    for run in runs:
        best = {}
        for _ in range(args.rounds):
            for choice in ("torch", "chunked"):
                cfg = run.config.model_copy(deep=True)
                cfg.impl.mlm_loss, cfg.impl.threads, cfg.impl.precision = choice, args.threads, "fp32"
                t = time_pretrain_step(cfg, n=args.steps)
                best[choice] = min(best.get(choice, t), t)
        rate = run.config.masking.rate
        ratios[rate] = best["torch"] / best["chunked"]
        print(
            f"rate {rate:g}: step {1e3 * best['torch']:.1f} ms (torch) vs {1e3 * best['chunked']:.1f} ms "
            f"(chunked), ratio {ratios[rate]:.2f}",
            flush=True,
        )
    print("mlm_loss " + " ".join(f"ratio_{r:g}={v:.2f}" for r, v in ratios.items()))


if __name__ == "__main__":
    main()
