"""Trainer speed under the speed-only impl settings (a benchmark, not a test), on this machine's device.

The first run of a spec (default bench/gpu_smoke.yaml: the gpu profile's model and batch) is trained for
--steps steps once per variant in ONE process: the default impl, a prefetch worker (impl.workers=1,
batches built and masked on a thread while the device computes), SDPA attention, and both. Also printed:
`study plan`'s step time for the same config (study.studies.cost), to show what the plan leaves out. Ratios are
tokens/s against the default measured in the same run; the losses show the variants train the same.

    python -m bench.impl_speed [--spec bench/gpu_smoke.yaml] [--results .gpudata/results] [--steps 150]
    python -m bench.impl_speed --dry   # the smoke spec's first run shrunk (bench.common.tiny), 3 steps

Last line, exactly: `impl_speed workers1=<x> sdpa=<y> workers1_sdpa=<z> plan_step_ratio=<measured/plan>`.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from bench.common import REPO, tiny

VARIANTS = {
    "default": {},
    "workers1": {"workers": 1},
    "sdpa": {"attention": "sdpa"},
    "workers1_sdpa": {"workers": 1, "attention": "sdpa"},
}


def variant(cfg, steps: int, impl: dict):
    from study.config import RunConfig

    d = cfg.model_dump(mode="json")
    d["train"]["amount"] = steps
    d["impl"].update(progress=False, checkpoint_every=10**6, **impl)
    return RunConfig.model_validate(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(REPO / "bench/gpu_smoke.yaml"))
    ap.add_argument("--results", default=".gpudata/results", help="where the spec's data is (or goes)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--dry", action="store_true", help="the smoke spec's first run shrunk, 3 steps")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.dry:
            args.spec, args.results, args.steps = str(REPO / "ablations/smoke.yaml"), tmp, min(args.steps, 3)
        measure(args, Path(tmp) if args.dry else None)


def measure(args, dry: Path | None) -> None:

    from study.data.prepare import prepare_data
    from study.paths import Layout
    from study.pretrain.trainer import train_run
    from study.studies.cost import time_pretrain_step
    from study.studies.spec import load_study

    base = load_study(args.spec).runs[0].config
    if dry:
        base = tiny(base, dry)
    prepared = prepare_data(base, Layout(root=Path(args.results)), progress=False)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, impl in VARIANTS.items():
            cfg = variant(base, args.steps, impl)
            assert cfg.data_hash() == prepared.dir.name  # only train.amount and impl changed
            lay = Layout(root=Path(tmp) / name)
            shutil.copytree(prepared.dir, lay.data_dir(cfg.data_hash()))
            m = out[name] = train_run(cfg, lay, quiet=True)
            print(
                f"{name:14} {m['tokens_per_s']:>10.0f} tok/s  {1e3 * m['time_s'] / m['steps']:6.1f} ms/step  "
                f"mfu {m['mfu']:.3f} ({m['peak_kind']}, {m['peak_flops'] / 1e12:.1f} TFLOP/s)  "
                f"final loss {m['final_loss']:.4f}  ref loss {m['ref_mlm_loss']:.4f}  {m['device']} "
                f"{m['precision']}",
                flush=True,
            )
    plan = time_pretrain_step(variant(base, args.steps, {}))
    measured = out["default"]["time_s"] / out["default"]["steps"]
    print(f"plan's step {1e3 * plan:.1f} ms vs measured {1e3 * measured:.1f} ms (default impl)")
    ref = out["default"]["tokens_per_s"]
    ratios = " ".join(f"{k}={out[k]['tokens_per_s'] / ref:.3f}" for k in VARIANTS if k != "default")
    print(f"impl_speed {ratios} plan_step_ratio={measured / plan:.3f}")


if __name__ == "__main__":
    main()
