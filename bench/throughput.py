"""Throughput benchmark (not a test): this trainer vs the baseline a user would write, in ONE process.

Baseline: stock `BertForPreTraining` + `DataCollatorForLanguageModeling` (15% Bernoulli, 80/10/10) +
`transformers.Trainer` (AdamW, linear warmup/decay, clipping, same hyper-parameters), fed the same
segment_pair/NSP instances our trainer builds, with the same initial weights and thread count.
Ours: `study.pretrain.trainer.train_run` (sparse MLM head; on CPU dropout masks from whole 64-bit random words,
impl.dropout_masks), in fp32 and with bf16 autocast (attention kernel per ATTENTION; bf16 is proven
loss-neutral by tests/test_model.py::test_bf16_autocast_matches_fp32_curve), and once more in the headline
precision with torch's dropout kernel.

Both are timed over the training loop only (data collation/masking included, evaluation and saving
not): ours is metrics["time_s"], the baseline is on_train_begin -> on_train_end of a callback.
Tokens are non-pad tokens. MFU = model_flops_per_token (useful FLOPs: MLM head on predicted positions
only) x tokens/s / the matmul peak OF THE PRECISION USED, measured in this process
(study.pretrain.evaluate.matmul_peak_flops): a bf16 run against an fp32 peak would read above 1.

The headline compares the two at the SAME precision (`--precision`, fp32 by default; bf16 runs the
baseline with `TrainingArguments(bf16=True)`): ours in bf16 against the baseline in fp32 would credit our
trainer with what the CPU's bf16 units do. Ours is also shown in the other precision and with torch's
dropout kernel, as context, not in the headline.

    python -m bench.throughput [--steps 30] [--threads N] [--precision fp32|bf16]
    python -m bench.throughput --dry   # tiny models, 3 steps, a synthetic corpus: checks the code path

Last line, exactly: `throughput same_precision ratio_a=<x> ratio_b=<y> mfu_b=<z>` (ratio = ours /
baseline tokens/s at the same precision; mfu_b = ours on config b: the baseline's FLOPs per token x ours'
tokens/s / that precision's peak, measured once in this run, the same numbers the baseline's MFU uses).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.common import REPO, SHARED, needs_accelerate, synthetic_corpus, train_ours, trainer_baseline

CONFIGS = {  # the two sizes the issue names: L/H/A/I
    "a": {"layers": 2, "hidden": 128, "heads": 2, "intermediate": 512},
    "b": {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024},
}
DRY_CONFIGS = {
    "a": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64},
    "b": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64},
}


# Ours per precision: eager attention in fp32 (4-10% faster than SDPA there, the measurement),
# SDPA under bf16 autocast (about 15% faster than eager in one standalone model step of config b, measured
# on a loaded machine). Both kernels are loss-neutral by tests/test_model.py::test_sdpa_equals_eager.
ATTENTION = {"auto": "eager", "fp32": "eager", "bf16": "sdpa"}


def run_config(name: str, args, precision: str = "auto", dropout_masks: str = "auto"):
    from study.config import RunConfig

    dry = args.dry
    return RunConfig.model_validate(
        {
            "corpus": {"sources": [args.corpus if dry else {"kind": "wikitext", "path": str(args.corpus)}]},
            "tokenizer": {"vocab_size": 512 if dry else 8192},
            "objective": {"format": "segment_pair", "sentence": "nsp", "max_seq_len": args.seq},
            "model": {**(DRY_CONFIGS if dry else CONFIGS)[name], "max_positions": args.seq},
            "finetune": {"max_length": args.seq},  # never fine-tuned here; valid against max_positions
            "train": {
                "budget": "steps",
                "amount": args.steps,
                "batch_size": 4 if dry else 32,
                "eval_sequences": 8 if dry else 64,
            },
            "impl": {
                "threads": args.threads,
                "precision": precision,
                "attention": ATTENTION[precision],
                "dropout_masks": dropout_masks,
                "progress": False,
                "log_every": 1 if dry else 5,
                "checkpoint_every": 100000,
            },
        }
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--corpus", default=str(SHARED / "wikitext-2-raw"))
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "throughput"))
    ap.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="the precision of BOTH sides of the headline ratio",
    )
    ap.add_argument("--dry", action="store_true", help="tiny models, 3 steps, a synthetic corpus")
    args = ap.parse_args()
    if why := needs_accelerate():
        print(why, file=sys.stderr)
        return 2
    args.seq = 64 if args.dry else 128
    if args.dry:
        args.steps, args.corpus = min(args.steps, 3), synthetic_corpus(Path(args.out) / "corpus", 200)

    import torch

    torch.set_num_threads(args.threads)
    from study.data.prepare import prepare_data
    from study.model.bert import model_flops_per_token
    from study.paths import Layout
    from study.pretrain.evaluate import matmul_peak_flops
    from study.runtime import cpu_has_bf16

    layout = Layout(root=Path(args.out) / "results")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]
    peak = matmul_peak_flops("cpu", dtype=dtype)
    print(
        f"threads {args.threads}; {args.precision} matmul peak {peak / 1e9:.1f} GFLOP/s (2048^3, measured now)"
    )
    prepared = prepare_data(run_config("a", args), layout, progress=False)
    print(f"data: vocab {len(prepared.tokenizer)}, train tokens {prepared.split('train').n_tokens:,}")
    native_bf16 = bool(cpu_has_bf16())
    print(f"native bf16 on this CPU: {native_bf16}; headline: ours and the baseline both in {args.precision}")
    other = "bf16" if args.precision == "fp32" else "fp32"
    contexts = [args.precision, other, f"{args.precision}+torch-dropout"]
    if other == "bf16" and not native_bf16:  # emulated bf16: ~45x slower here, minutes of nothing learned
        contexts.remove(other)
        print("ours in bf16 not run as context: this CPU emulates bf16")
    res = {}
    for name in ("a", "b"):
        ours_by = {}
        # context beside the headline: ours in the other precision, and with torch's own dropout mask kernel
        # (bernoulli_) to show what impl.dropout_masks="bits" (the CPU default) buys
        for prec in contexts:
            p, _, masks = prec.partition("+")
            ours_by[prec] = train_ours(run_config(name, args, p, "torch" if masks else "auto"), layout)
            torch.set_num_threads(args.threads)
        cfg = run_config(name, args)
        b = trainer_baseline(cfg, prepared, args.steps, bf16=args.precision == "bf16")
        fpt = model_flops_per_token(
            cfg.model, args.seq, len(prepared.tokenizer), 0.15 * args.seq, sparse=True
        )
        b["mfu"] = fpt * b["tokens_per_s"] / peak
        # the headline MFU of ours on the same FLOPs per token and the same peak as the baseline's (the
        # trainer's own `mfu` measures its peak again and counts the positions it computed)
        same_mfu = fpt * ours_by[args.precision]["tokens_per_s"] / peak
        res[name] = (ours_by[args.precision], b, same_mfu)
        for prec, o in ours_by.items():
            same = prec == args.precision
            print(
                f"config {name} {cfg.model.layers}L/{cfg.model.hidden}H ours {prec}: {o['tokens_per_s']:,.0f} tok/s "
                f"(loss@{o['steps']} {o['loss']:.3f}, mfu vs its own precision's peak {o['mfu']:.3f}), "
                f"ratio {o['tokens_per_s'] / b['tokens_per_s']:.2f}"
                + ("  <- headline" if same else "  (not the same precision)"),
                flush=True,
            )
        print(
            f"config {name} baseline {args.precision}: {b['tokens_per_s']:,.0f} tok/s "
            f"(loss@{b['steps']} {b['loss']:.3f}, mfu {b['mfu']:.3f})",
            flush=True,
        )
    ra = res["a"][0]["tokens_per_s"] / res["a"][1]["tokens_per_s"]
    rb = res["b"][0]["tokens_per_s"] / res["b"][1]["tokens_per_s"]
    print(
        f"config b ours {args.precision}, MFU on the baseline's FLOPs per token and peak: {res['b'][2]:.3f}"
    )
    print(f"throughput same_precision ratio_a={ra:.2f} ratio_b={rb:.2f} mfu_b={res['b'][2]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
