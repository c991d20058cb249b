"""GPU benchmark (not a test): ours against transformers.Trainer on one CUDA device, in ONE process.

Parts, in this order, each written to <out>/gpu.json as soon as it is measured (a timeout still leaves
data):
1. peak: the bf16 matmul peak, best of timed 8192^3 matmuls, measured here, now; every MFU below is
   against it (useful FLOPs: study.model.bert.model_flops_per_token, MLM head on the 15% predicted
   positions only, the same count for both sides, as bench/throughput.py).
2. per model, BERT-base (L12/H768/A12/I3072) and the gpu profile's model (ablations/base/bert.yaml
   `--profile gpu`: L4/H512/A8/I2048), both V30522 (the tokenizer trained here asks for 30522; the model
   has what it reaches), seq 128, batch 256, segment_pair + NSP, lr 5e-4:
   - ours: `study.pretrain.trainer.train_run` at its GPU settings (bf16 autocast, SDPA, sparse MLM head,
     fused AdamW, impl.workers 1 as the gpu profile); tokens/s over its training loop (metrics time_s);
   - baseline: stock `BertForPreTraining` (SDPA, the same initial weights) + `DataCollatorForLanguageModeling`
     + `transformers.Trainer` (bf16, `adamw_torch_fused`, 4 dataloader workers), fed the same
     segment_pair/NSP instances; on_train_begin -> on_train_end (device synced); tokens are the non-pad
     tokens its forward saw (a forward pre-hook: the collator runs in the workers).
   - ours' fine-tuning: steps/s of one batched-seeds step (impl.finetune_batched_seeds: the gpu profile's
     5 seeds in one vmapped step, batch 32, max_length 128, the model's dropout) and, beside it, of the
     sequential per-seed step (study.downstream.classifier.finetune_step), on SST-2-like rows (lengths drawn
     from a fixed lognormal, median 22 tokens: no GLUE files needed); seed-steps/s = K x steps/s.
Tokens are non-pad tokens on both sides. Each side is also clocked after its first --warm steps (20: ours'
log windows after that step; the Trainer from a callback at that step, device synced); the last line
uses these steady-state rates (a compiled step spends its first steps compiling). ratio = ours / baseline.

    python -m bench.gpu [--steps 100] [--out bench/out/gpu] [--corpus KIND:PATH ...]
    python -m bench.gpu --dry      # CPU, fp32, tiny shapes, a few steps, a synthetic corpus: checks the
                                   # code path anywhere

Last line, exactly: `gpu ratio_base=<x> ratio_gpu=<y> mfu_base=<a> mfu_gpu=<b>` (mfu: ours).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from itertools import pairwise
from pathlib import Path

from bench.common import REPO, SHARED, needs_accelerate, synthetic_corpus, timed, train_ours, trainer_baseline

MODELS = {  # L/H/A/I
    "base": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072},
    "gpu": {"layers": 4, "hidden": 512, "heads": 8, "intermediate": 2048},  # ablations/base/bert.yaml gpu
}
DRY_MODELS = {
    "base": {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 256},
    "gpu": {"layers": 1, "hidden": 64, "heads": 2, "intermediate": 256},
}
FT_SEEDS = 5  # the gpu profile's finetune.seeds
FT_BATCH = 32  # the recipe's batch (config default)


def _corpus_default() -> list[str]:
    for root in (REPO / ".gpudata", SHARED):
        # relative to the repository root where possible: the same source strings as bench/gpu_learn.yaml,
        # hence the same data_hash, so a data folder prepared for it (bench/gpu_check.sh --stage) is reused
        found = [
            f"{kind}:{os.path.relpath(root / name, REPO) if root == REPO / '.gpudata' else root / name}"
            for kind, name in (("gutenberg", "gutenberg"), ("wikitext", "wikitext-2-raw"))
            if (root / name).is_dir()
        ]
        if found:
            return found
    return ["embedded"]


def run_config(model: dict, args, steps: int):
    from study.config import RunConfig
    from study.data.corpus import with_fingerprint

    return with_fingerprint(
        RunConfig.model_validate(
            {
                "corpus": {"sources": args.corpus},
                "tokenizer": {"vocab_size": args.vocab},
                "objective": {"format": "segment_pair", "sentence": "nsp", "max_seq_len": args.seq},
                "model": {**model, "max_positions": max(128, args.seq)},
                "train": {
                    "budget": "steps",
                    "amount": steps,
                    "batch_size": args.batch,
                    "lr": 5.0e-4,
                    "eval_sequences": 64,
                },
                "finetune": {
                    "seeds": list(range(FT_SEEDS if not args.dry else 2)),
                    "batch_size": FT_BATCH,
                    "max_length": min(128, args.seq),
                    "epochs": 3,
                    "lr": 1.0e-4,
                },
                "impl": {
                    "device": args.device,
                    "precision": args.precision,
                    "attention": "sdpa",
                    "workers": 1,
                    "fused_optimizer": True,
                    "progress": False,
                    "log_every": max(1, min(10, steps)),
                    "checkpoint_every": 100000,
                    **args.impl,
                },
            }
        )
    )


def steady_ours(history: list[dict], warm: int) -> float | None:
    """Ours' tokens/s over the log windows after step `warm` (compilation, allocator and loader warm-up
    left out): each history line holds its window's tokens/s, and the windows' tokens add up."""
    lines = [h for h in history if "loss" in h and h.get("tokens") is not None]
    toks = secs = 0.0
    for prev, cur in pairwise(lines):
        if prev["step"] >= warm and cur.get("tokens_per_s"):
            d = cur["tokens"] - prev["tokens"]
            toks, secs = toks + d, secs + d / cur["tokens_per_s"]
    return toks / secs if secs else None


def finetune_speed(cfg, vocab: int, steps: int, warm: int) -> dict:
    """Steps/s of ours' fine-tuning: the batched-seeds step (K seeds) and the sequential per-seed step."""
    import numpy as np
    import torch

    from study.downstream.batched import SeedBatch, collate_seeds
    from study.downstream.classifier import Classifier, finetune_optimizer, finetune_step
    from study.downstream.encode import Encoded, collate, epoch_batches
    from study.model.bert import build_model
    from study.pretrain.evaluate import device_sync
    from study.runtime import resolve

    ft, rt = cfg.finetune, resolve(cfg.impl)
    rng = np.random.default_rng(0)
    n = FT_BATCH * (steps + warm)
    lengths = np.clip(np.round(rng.lognormal(np.log(22), 0.5, n)), 5, ft.max_length).astype(int)
    rows = Encoded(
        [rng.integers(5, vocab, k, dtype=np.int32) for k in lengths],
        [np.zeros(k, np.int8) for k in lengths],
        rng.integers(0, 2, n),
    )
    bert = build_model(cfg.model, vocab, False, cfg.impl, seed=0).bert
    seeds, labels = list(ft.seeds), torch.from_numpy(rows.labels)
    per_seed = [epoch_batches(rows, ft, s, 0) for s in seeds]

    def steps_per_s(fn) -> float:
        for b in range(warm):
            fn(b)
        device_sync(rt.device)

        def run() -> None:
            for b in range(warm, warm + steps):
                fn(b)
            device_sync(rt.device)

        return steps / timed(run).wall

    sb = SeedBatch(cfg, bert, 2, seeds, rt, total_steps=10**6, warmup=10)
    idx = lambda b: [batches[b] for batches in per_seed]
    batched = steps_per_s(
        lambda b: sb.step(
            b,
            collate_seeds(rows, idx(b), rt.device),
            torch.stack([labels[torch.from_numpy(i)] for i in idx(b)]).to(rt.device),
            False,
        )
    )
    sb = None  # frees the batched model before the sequential one is timed
    model = Classifier(
        bert, 2, cfg.model.dropout, cfg.model.init_range, torch.Generator().manual_seed(0), ft.pooling
    ).to(rt.device)
    model.train()
    opt = finetune_optimizer(model, ft)
    seq = steps_per_s(
        lambda b: finetune_step(
            model,
            opt,
            collate(rows, per_seed[0][b], rt.device),
            labels[torch.from_numpy(per_seed[0][b])].to(rt.device),
            False,
            rt.autocast,
        ).item()
    )
    k = len(seeds)
    return {
        "seeds": k,
        "batch": FT_BATCH,
        "dropout": cfg.model.dropout,
        "batched_steps_per_s": batched,
        "batched_seed_steps_per_s": k * batched,
        "sequential_seed_steps_per_s": seq,
        "speedup": k * batched / seq,
        "mean_row_tokens": float(lengths.mean()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100, help="pre-training steps per side and model")
    ap.add_argument(
        "--warm", type=int, default=20, help="steps before the steady-state clock starts, both sides"
    )
    ap.add_argument("--ft-steps", type=int, default=30, help="timed fine-tuning steps (after warm-up)")
    ap.add_argument(
        "--corpus", nargs="+", default=None, help="corpus sources (kind:path), as a spec writes them"
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "gpu"))
    ap.add_argument(
        "--results", default=None, help="results folder whose prepared data to reuse (default: <out>/results)"
    )
    ap.add_argument(
        "--impl",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="ours' speed settings on top of the defaults above, e.g. compile=true pad_to=max",
    )
    ap.add_argument("--workers", type=int, default=4, help="the baseline's dataloader workers")
    ap.add_argument("--only", choices=sorted(MODELS), nargs="+", default=sorted(MODELS, reverse=True))
    ap.add_argument("--dry", action="store_true", help="CPU, fp32, tiny shapes, a few steps")
    args = ap.parse_args()
    if why := needs_accelerate():
        print(why, file=sys.stderr)
        return 2
    import torch

    from study.data.prepare import prepare_data
    from study.model.bert import model_flops_per_token
    from study.paths import Layout
    from study.pretrain.evaluate import matmul_peak_flops

    args.impl = dict(kv.split("=", 1) for kv in args.impl)  # pydantic parses "true", "max", "2"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.corpus = args.corpus or ([synthetic_corpus(out / "corpus", 200)] if args.dry else _corpus_default())
    if args.dry:
        args.device, args.precision, args.vocab, args.seq, args.batch = "cpu", "fp32", 2048, 64, 8
        args.steps, args.ft_steps, models, n, dtype, warm = (
            min(args.steps, 4),
            min(args.ft_steps, 3),
            DRY_MODELS,
            512,
            torch.float32,
            1,
        )
        args.warm, args.impl = 1, {"log_every": 1, **args.impl}
    else:
        if not torch.cuda.is_available():
            print("no CUDA device here: run with --dry for the CPU check", file=sys.stderr)
            return 2
        args.device, args.precision, args.vocab, args.seq, args.batch = "cuda", "bf16", 30522, 128, 256
        models, n, dtype, warm = MODELS, 8192, torch.bfloat16, 5
    res: dict = {"args": {k: v for k, v in vars(args).items()}, "parts": {}}

    def save(part: str, value) -> None:
        res["parts"][part] = value
        tmp = out / "gpu.json.tmp"
        tmp.write_text(json.dumps(res, indent=1, default=str))
        tmp.replace(out / "gpu.json")

    device = torch.device(args.device)
    if device.type == "cuda":
        save(
            "device",
            {
                "name": torch.cuda.get_device_name(device),
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
            },
        )
    peak = matmul_peak_flops(str(device) if device.type == "cuda" else "cpu", n=n, budget_s=2.0, dtype=dtype)
    save("peak", {"flops": peak, "kind": f"{args.precision} matmul {n}^3"})
    print(
        f"{args.device} {args.precision} matmul peak {peak / 1e12:.3g} TFLOP/s ({n}^3, measured now)",
        flush=True,
    )
    layout = Layout(root=Path(args.results) if args.results else out / "results")
    summary = {}
    for name in args.only:
        cfg = run_config(models[name], args, args.steps)
        prepared = prepare_data(cfg, layout, progress=False)
        vocab = len(prepared.tokenizer)
        fpt = model_flops_per_token(cfg.model, args.seq, vocab, 0.15 * args.seq, sparse=True)
        print(
            f"[{name}] {models[name]} vocab {vocab}, seq {args.seq}, batch {args.batch}, {args.steps} steps",
            flush=True,
        )
        o = train_ours(cfg, layout)
        hist = o.pop("history")
        o["steady_tokens_per_s"], o["warm_steps"] = steady_ours(hist, args.warm), args.warm
        o["mfu_vs_peak"] = fpt * o["tokens_per_s"] / peak
        o["steady_mfu_vs_peak"] = fpt * o["steady_tokens_per_s"] / peak if o["steady_tokens_per_s"] else None
        save(f"{name}/ours", o)
        st = lambda r, k: f"{r[k]:,.0f}" if r.get(k) else "-"
        print(
            f"[{name}] ours     {o['tokens_per_s']:,.0f} tok/s over the run, {st(o, 'steady_tokens_per_s')} after "
            f"step {args.warm}  mfu {o['mfu_vs_peak']:.3f} / {o['steady_mfu_vs_peak'] or float('nan'):.3f}  "
            f"(loss@{o['steps']} {o['loss']:.3f})",
            flush=True,
        )
        torch.cuda.empty_cache() if device.type == "cuda" else None
        b = trainer_baseline(
            cfg,
            prepared,
            args.steps,
            device=device,
            bf16=device.type == "cuda",
            workers=args.workers,
            warm=args.warm,
            log_every=10,
        )
        b["mfu_vs_peak"] = fpt * b["tokens_per_s"] / peak
        b["steady_mfu_vs_peak"] = fpt * b["steady_tokens_per_s"] / peak if b["steady_tokens_per_s"] else None
        save(f"{name}/baseline", b)
        print(
            f"[{name}] Trainer  {b['tokens_per_s']:,.0f} tok/s over the run, {st(b, 'steady_tokens_per_s')} after "
            f"step {args.warm}  mfu {b['mfu_vs_peak']:.3f} / {b['steady_mfu_vs_peak'] or float('nan'):.3f}  "
            f"(loss@{b['steps']} {b['loss'] if b['loss'] is None else round(b['loss'], 3)})",
            flush=True,
        )
        # the headline: steady state on both sides (a compiled step spends its first steps compiling)
        key = (
            "steady_tokens_per_s" if o["steady_tokens_per_s"] and b["steady_tokens_per_s"] else "tokens_per_s"
        )
        mfu = o["steady_mfu_vs_peak"] if key == "steady_tokens_per_s" else o["mfu_vs_peak"]
        print(f"[{name}] ratio {o[key] / b[key]:.2f} ({key})", flush=True)
        summary[name] = (o[key] / b[key], mfu)
        torch.cuda.empty_cache() if device.type == "cuda" else None
        f = finetune_speed(cfg, vocab, args.ft_steps, warm)
        save(f"{name}/finetune", f)
        print(
            f"[{name}] fine-tune: {f['batched_steps_per_s']:.2f} batched steps/s x {f['seeds']} seeds = "
            f"{f['batched_seed_steps_per_s']:.1f} seed-steps/s; sequential {f['sequential_seed_steps_per_s']:.1f} "
            f"seed-steps/s ({f['speedup']:.2f}x)",
            flush=True,
        )
        shutil.rmtree(layout.run_dir(cfg.run_hash()), ignore_errors=True)
    fmt = lambda name, i: f"{summary[name][i]:.3f}" if name in summary else "nan"
    save("summary", {k: {"ratio": v[0], "mfu": v[1]} for k, v in summary.items()})
    print(
        f"gpu ratio_base={fmt('base', 0)} ratio_gpu={fmt('gpu', 0)} mfu_base={fmt('base', 1)} mfu_gpu={fmt('gpu', 1)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
