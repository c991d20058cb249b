"""What the benchmarks share: their environment, one clock (`timed`), ours' training run and the one
`transformers.Trainer` baseline that bench/throughput.py (CPU) and bench/gpu.py (CUDA) compare against.

Importing this module sets the environment every bench wants before torch or tokenizers load (offline hub,
no tokenizers thread pool); a bench that wants one OpenMP thread calls `single_threaded()` before it
imports torch. torch and transformers are imported inside the functions that need them, so a bench's
`--help` stays instant.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"  # the real data, beside the repository (never copied into it)


def single_threaded() -> None:
    """One OpenMP thread unless the caller's environment says otherwise; before torch is imported."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


class Timing(NamedTuple):
    result: Any
    wall: float  # seconds
    cpu: float  # user + system seconds of this process and of the children it waited for


def timed(fn: Callable[[], Any], repeat: int = 1, best: str = "wall") -> Timing:
    """The best of `repeat` calls of `fn` by wall or CPU time (`best`), with that call's result and other
    clock. CPU time counts waited-for child processes too (a `dvc status` run by subprocess), and on a
    shared machine it is the steadier number: wall time includes waiting for other jobs' turns on a core."""
    out = None
    for _ in range(max(1, repeat)):
        c0, k0, w0 = time.process_time(), os.times(), time.perf_counter()
        result = fn()
        w, c1, k1 = time.perf_counter() - w0, time.process_time(), os.times()
        # this process at process_time's resolution, children at os.times' (clock ticks: they run seconds)
        cpu = c1 - c0 + (k1.children_user - k0.children_user) + (k1.children_system - k0.children_system)
        t = Timing(result, w, cpu)
        if out is None or getattr(t, best) < getattr(out, best):
            out = t
    return out


def synthetic_corpus(folder: Path, n_docs: int = 1500) -> str:
    """A corpus source (`text:<folder>`) of `n_docs` generated documents of 3-7 simple sentences: a few
    seconds to prepare, where the embedded Wikipedia sample takes a minute (its markup and sentence split)."""
    import numpy as np

    rng = np.random.default_rng(0)
    subj = "the cat|the dog|a bird|my friend|the teacher|a child|the farmer|our neighbor".split("|")
    verb = "sees|likes|finds|takes|wants|brings|makes|holds".split("|")
    obj = "a red ball|the old book|some fresh bread|a small box|the green apple|a long letter".split("|")
    adv = "today|again|quickly|at home|in the park|after lunch|every day|with care".split("|")
    docs = []
    for _ in range(n_docs):
        sents = []
        for _ in range(int(rng.integers(3, 8))):
            i = int(rng.integers(len(subj)))
            sents.append(
                f"{subj[i].capitalize()} {verb[(i + int(rng.integers(2))) % 8]} "
                f"{obj[int(rng.integers(len(obj)))]} {adv[i]}."
            )
        docs.append(" ".join(sents))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "synthetic.txt").write_text("\n\n".join(docs) + "\n")
    return f"text:{folder}"


def train_ours(cfg, layout) -> dict:
    """`study.pretrain.trainer.train_run` from scratch (a cached run folder is removed first): tokens/s over
    its training loop (metrics time_s), the last logged loss, and its history lines."""
    from study.pretrain.trainer import train_run

    run_dir = layout.run_dir(cfg.run_hash())
    shutil.rmtree(run_dir, ignore_errors=True)  # train now, not a cached result
    m = train_run(cfg, layout, quiet=True)
    hist = [json.loads(h) for h in (run_dir / "history.jsonl").read_text().splitlines()]
    return {
        "tokens_per_s": m["tokens_per_s"],
        "loss": next((h["loss"] for h in reversed(hist) if "loss" in h), None),
        "mfu": m["mfu"],
        "steps": m["steps"],
        "tokens": m["tokens_seen"],
        "seconds": m["time_s"],
        "history": hist,
    }


def trainer_baseline(
    cfg,
    prepared,
    steps: int,
    *,
    device=None,
    bf16: bool = False,
    workers: int = 0,
    warm: int = 0,
    log_every: int = 5,
) -> dict:
    """The baseline a user would write: stock `BertForPreTraining` (SDPA, the same initial weights as ours)
    + `DataCollatorForLanguageModeling` (15% Bernoulli, 80/10/10) + `transformers.Trainer` with cfg's
    hyper-parameters (fused AdamW, transformers' default with this torch; linear warmup/decay; clipping), fed the segment_pair/NSP instances ours builds.

    Warmup: train.warmup is a fraction of the budget (config.py), and ours warms up over that fraction of
    its steps (pretrain/schedule.py), so the Trainer gets ceil(warmup x steps) steps: the whole number of
    steps nearest above ours' warmup, and what transformers itself makes of a fraction. (bench/throughput.py
    used to pass the fraction as `warmup_steps`, right only because transformers 5 reads a value below 1 as
    a ratio; bench/gpu.py floored it and forced at least 1 step, a warmup ours does not have at warmup 0.)

    Clocked from on_train_begin to on_train_end (device synced), and from step `warm` on for the steady
    state; tokens are the non-pad tokens its forward saw (a forward pre-hook: with dataloader workers the
    collator runs in other processes)."""
    import torch
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

    from study.config import ImplConfig
    from study.data.instances import build_instances
    from study.model.bert import build_model
    from study.pretrain.evaluate import device_sync

    device = device or torch.device("cpu")
    inst = build_instances(prepared.split("train"), cfg.objective, prepared.special, cfg.seed, epoch=0)
    feats = []
    for i in range(len(inst)):
        n = int(inst.lengths[i])
        feats.append(
            {
                "input_ids": inst.input_ids[i, :n].tolist(),
                "token_type_ids": inst.token_type_ids[i, :n].tolist(),
                "attention_mask": [1] * n,
                "next_sentence_label": int(inst.sentence_label[i]),
            }
        )
    model = build_model(cfg.model, len(prepared.tokenizer), True, ImplConfig(attention="sdpa"), seed=cfg.seed)
    tokens = []  # device tensors, read once after training (no sync per step)
    model.register_forward_pre_hook(
        lambda m, a, kw: tokens.append(kw["attention_mask"].sum()), with_kwargs=True
    )
    collator = DataCollatorForLanguageModeling(prepared.tokenizer, mlm_probability=0.15, seed=cfg.seed)
    clock: dict[str, float] = {}
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            device_sync(device)
            clock["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step == warm:  # the steady-state clock starts after `warm` steps, as ours'
                device_sync(device)
                clock["tw"] = time.perf_counter()

        def on_train_end(self, args, state, control, **kw):
            device_sync(device)
            clock["t1"] = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    t = cfg.train
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=t.batch_size,
            max_steps=steps,
            learning_rate=t.lr,
            warmup_steps=math.ceil(t.warmup * steps),
            lr_scheduler_type="linear",
            weight_decay=t.weight_decay,
            adam_beta1=t.beta1,
            adam_beta2=t.beta2,
            adam_epsilon=t.eps,
            max_grad_norm=t.clip,
            logging_steps=min(log_every, steps),
            save_strategy="no",
            report_to=[],
            use_cpu=device.type != "cuda",
            bf16=bf16,
            optim="adamw_torch_fused",
            dataloader_num_workers=workers,
            disable_tqdm=True,
            seed=cfg.seed,
            remove_unused_columns=False,
        )
        Trainer(
            model=model, args=targs, train_dataset=feats, data_collator=collator, callbacks=[Clock()]
        ).train()
    counts = [int(x.item()) for x in tokens[:steps]]
    n_tokens, late = sum(counts), sum(counts[warm:])
    secs = clock["t1"] - clock["t0"]
    steady = late / (clock["t1"] - clock["tw"]) if "tw" in clock and late else None
    return {
        "tokens_per_s": n_tokens / secs,
        "steady_tokens_per_s": steady,
        "warm_steps": warm,
        "loss": losses[-1] if losses else None,
        "steps": steps,
        "tokens": n_tokens,
        "seconds": secs,
    }


def needs_accelerate() -> str | None:
    """Why transformers.Trainer cannot start here (None when it can): it refuses without `accelerate`."""
    try:
        import accelerate  # noqa: F401 - only whether it imports
    except ImportError:
        return "the baseline uses transformers.Trainer, which needs `accelerate` (pip install -e '.[bench]')"
    return None


def tiny(cfg, work: Path):
    """`cfg` shrunk for a --dry run (seconds on a CPU): a synthetic corpus in `work`, a 512-word vocab, one
    32-wide layer, 32-token rows, batch 4, no sequence-length warmup; impl settings kept."""
    from study.config import RunConfig
    from study.data.corpus import with_fingerprint

    d = cfg.model_dump(mode="json")
    d["corpus"] = {"sources": [synthetic_corpus(work / "corpus", 200)]}
    d["tokenizer"]["vocab_size"] = 512
    d["objective"]["max_seq_len"] = 32
    d["model"].update(layers=1, hidden=32, heads=2, intermediate=64, max_positions=32)
    d["train"].update(batch_size=4, eval_sequences=8, short_fraction=0.0)
    d["finetune"]["max_length"] = 32
    return with_fingerprint(RunConfig.model_validate(d))


def repeat_args(doc: str, dry_help: str):
    """The data benches' options: --repeat (best of), --max-seq-len, and --dry (which also means one repeat)."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-seq-len", type=int, default=128)
    ap.add_argument("--dry", action="store_true", help=dry_help)
    args = ap.parse_args()
    args.repeat = 1 if args.dry else args.repeat
    return args
