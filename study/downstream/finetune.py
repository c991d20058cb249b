"""Downstream evaluation of a pre-trained run: GLUE fine-tuning, a feature-based probe, a random-init baseline.

One recipe for every task (cfg.finetune: epochs, lr, batch, warmup, weight decay, max_length, example
caps), as cramming does, so that differences between runs come from pre-training, not from per-task tuning.

- finetune: the pre-trained encoder + a linear head on the pooled [CLS] (BERT's pooler, exactly as
  `BertForSequenceClassification`) or, with finetune.pooling "mean", on the mean of the last layer over the
  row's tokens; all weights trained with AdamW, linear warmup then linear decay.
- probe: the frozen encoder's [CLS] vectors (or token means) from the last `probe_layers` layers, concatenated, and a
  scikit-learn logistic (classification) or ridge (regression) head: BERT Table 8's feature-based
  column. The encoder is frozen and in eval mode, so the probe is deterministic given the encoder; it
  is fitted once per task and the same result is written for every seed (aggregation averages
  fine-tuning seeds within a pre-training seed, so the copies add no false precision).
- random baseline: the same architecture and tokenizer with freshly seeded weights, the same recipe.
  It says how much of a GLUE score pre-training explains at all.

Results: `layout.finetune_dir(run_key)/<task>/<finetune_hash>/<mode>-seed<k>.json`, one file per
(task, mode, seed), written atomically as soon as it is known; an existing result is returned, not
recomputed. A task without a train or dev split, or whose (capped) training split has a single label,
gets a `{"run_key", "task", "skipped": reason}` file in the same place (re-checked on every call, so it
disappears once the data is there). A seed whose loss or dev predictions turn non-finite gets a
`{..., "diverged": reason}` file and the other seeds, tasks and models go on (the report lists it);
fine-tuning is deterministic, so it is kept like a result: delete the file to retry. Each result and
diverged file also records the resolved recipe (`recipe`: cfg.finetune without seeds and tasks).

Randomness: the fine-tuning seed fixes the head init (explicit generator), the batch order (numpy
SeedSequence; `epoch_batches`, length-grouped when finetune.length_groups is set) and dropout (torch's
default generator, forked and seeded for the duration of one fine-tune, so the caller's RNG state is
untouched). Which rows a `max_*_examples` cap keeps does not depend on the seed or the model: every run
and the baseline see the same examples.

impl.finetune_batched_seeds trains a task's missing seeds as one stacked model (study/downstream/batched.py):
the same batches, head inits and updates per seed; dropout masks from each seed's own generator.

This file is the orchestration (which results are missing, loading the encoder, one result file each) and
the sequential fine-tuning loop; the result files (paths, records, reuse) are in results.py, the model and
its step in classifier.py, the tokenized rows and batches in encode.py, the probe in probe.py.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from study.config import RunConfig
from study.downstream import batched
from study.downstream.classifier import Classifier, finetune_optimizer, finetune_step, lr_lambda
from study.downstream.encode import Encoded, cap_rows, collate, encode, epoch_batches, eval_batches
from study.downstream.models import pretrained_model, random_model
from study.downstream.probe import probe
from study.downstream.results import (
    TaskRecords,
    degenerate,
    encoder_digest,
    existing_result,
    recipe,
    result_path,
    task_digest,
    unavailable,
)
from study.downstream.tasks import HUB, TaskData, TaskSpec, compute_metrics, get_task, load_task
from study.errors import StudyError
from study.io import atomic_write_json
from study.lease import lease
from study.paths import Layout
from study.provenance import provenance
from study.rundir import RunDir
from study.runtime import Runtime, resolve, threads


# --------------------------------------------------------------------------- public API
def finetune_run(cfg: RunConfig, layout: Layout, quiet: bool = False) -> list[dict]:
    """Fine-tune (and probe) the pre-trained model of `cfg` on every task x seed of cfg.finetune."""
    model_dir = RunDir(layout, cfg.run_hash()).model_dir

    def load() -> Encoder:
        tok, model, source = pretrained_model(cfg, layout, quiet)
        return Encoder(tok, model.bert, source)  # fine-tuning keeps the encoder (with its pooler)

    return _run_all(cfg, layout, cfg.run_hash(), "pretrained", load, quiet, encoder_digest(model_dir))


def finetune_baseline(cfg: RunConfig, layout: Layout, quiet: bool = False) -> list[dict]:
    """The same architecture with random (seeded) weights, the same recipe; init "random"."""

    def load() -> Encoder:
        tok, model, source = random_model(cfg, layout, quiet)
        return Encoder(tok, model.bert, source)

    return _run_all(cfg, layout, cfg.baseline_key(), "random", load, quiet)


# --------------------------------------------------------------------------- encoder + tokenizer
@dataclass
class Encoder:
    """What a task is fine-tuned from: the tokenizer, the encoder (deep-copied per fine-tune) and where
    they came from (a checkpoint folder or "random init ..."), recorded in every result."""

    tokenizer: object
    bert: torch.nn.Module  # transformers BertModel (with pooler)
    source: str


# --------------------------------------------------------------------------- fine-tuning
def _predict(model: torch.nn.Module, e: Encoded, rt: Runtime) -> np.ndarray:
    model.eval()
    out: list[tuple[np.ndarray, np.ndarray]] = []
    with torch.no_grad(), rt.autocast():
        for idx in eval_batches(e):
            out.append((idx, model(**collate(e, idx, rt.device)).float().cpu().numpy()))
    k = out[0][1].shape[1]
    preds = np.zeros((len(e), k), dtype=np.float32)
    for idx, logits in out:
        preds[idx] = logits
    return preds


def _finetune_one(
    cfg: RunConfig,
    spec: TaskSpec,
    bert: torch.nn.Module,
    train: Encoded,
    dev: Encoded,
    seed: int,
    rt: Runtime,
    desc: str,
    quiet: bool,
) -> dict:
    ft = cfg.finetune
    t0 = time.time()
    steps_per_epoch = math.ceil(len(train) / ft.batch_size)
    total = max(1, math.ceil(ft.epochs * steps_per_epoch))
    warmup = int(round(ft.warmup * total))
    device = rt.device
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)  # dropout masks only; the caller's RNG state is restored on exit
        gen = torch.Generator().manual_seed(seed)
        model = Classifier(
            copy.deepcopy(bert), spec.num_labels, cfg.model.dropout, cfg.model.init_range, gen, ft.pooling
        ).to(device)
        opt = finetune_optimizer(model, ft)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total, warmup))
        labels = torch.from_numpy(train.labels)
        losses: list[float] = []
        model.train()
        step = 0
        bar = tqdm(total=total, desc=desc, unit="step", disable=quiet, leave=False)
        for epoch in range(math.ceil(ft.epochs)):
            for idx in epoch_batches(train, ft, seed, epoch):
                if step >= total:
                    break
                try:
                    loss = finetune_step(
                        model,
                        opt,
                        collate(train, idx, device),
                        labels[torch.from_numpy(idx)].to(device),
                        spec.is_regression,
                        rt.autocast,
                    )
                except FloatingPointError as exc:
                    raise FloatingPointError(f"{exc} at step {step} ({spec.name}, seed {seed})") from None
                sched.step()
                losses.append(loss.item())
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        bar.close()
        preds = _predict(model, dev, rt)
    check_finite(preds, f"{spec.name}, seed {seed}")
    tail = losses[-max(1, steps_per_epoch // 4) :]  # the last quarter epoch: the loss where training ended
    return {
        "metrics": compute_metrics(spec, preds if not spec.is_regression else preds[:, 0], dev.labels),
        "steps": step,
        "train_loss": float(np.mean(tail)),
        "wall_s": round(time.time() - t0, 3),
    }


def check_finite(preds: np.ndarray, where: str) -> None:
    """Non-finite dev predictions (weights gone NaN/inf in the last updates) would still score (argmax of NaN
    is class 0): the seed is diverged, as with a non-finite loss."""
    if not np.isfinite(preds).all():
        raise FloatingPointError(
            f"non-finite dev predictions ({int((~np.isfinite(preds)).sum())} values) "
            f"after the last step ({where})"
        )


# --------------------------------------------------------------------------- orchestration
def _validate(cfg: RunConfig) -> list[TaskSpec]:
    ft = cfg.finetune
    specs = [get_task(t) for t in ft.tasks]  # unknown names -> StudyError listing the allowed ones
    if len(set(ft.tasks)) != len(ft.tasks):
        raise StudyError(f"duplicate task in {ft.tasks}", field="finetune.tasks")
    if ft.glue_dir != HUB and not Path(ft.glue_dir).is_dir():
        raise StudyError(
            f"GLUE folder {ft.glue_dir} does not exist (resolved from {Path.cwd()})",
            field="finetune.glue_dir",
            allowed=f"a folder of GLUE tasks, or '{HUB}'",
        )
    if ft.max_length > cfg.model.max_positions:
        raise StudyError(
            f"{ft.max_length} exceeds model.max_positions ({cfg.model.max_positions})",
            field="finetune.max_length",
            allowed=f"8..{cfg.model.max_positions}",
        )
    if ft.length_groups == 1:
        raise StudyError(
            "length_groups 1 sorts rows within a batch only: the same batches as 0",
            field="finetune.length_groups",
            allowed="0 (off) or an integer >= 2",
        )
    if ft.probe and ft.probe_layers > cfg.model.layers:
        raise StudyError(
            f"the model has {cfg.model.layers} layers",
            field="finetune.probe_layers",
            allowed=f"1..{cfg.model.layers}",
        )
    return specs


def _run_all(
    cfg: RunConfig,
    layout: Layout,
    run_key: str,
    init: str,
    load: Callable[[], Encoder],
    quiet: bool,
    encoder_data: str | None = None,
) -> list[dict]:
    quiet = quiet or not cfg.impl.progress
    ft = cfg.finetune
    specs = _validate(cfg)
    fh = cfg.finetune_hash()
    modes = ["finetune"] + (["probe"] if ft.probe else [])
    rt = resolve(cfg.impl)  # where pre-training ran: the same device and precision rules
    call = _Call(cfg, layout, run_key, init, quiet, fh, modes, rt)
    with threads(cfg.impl.threads):
        return _run_tasks(call, load, specs, encoder_data)


@dataclass(frozen=True)
class _Call:
    """What every task of one `_run_all` call shares: the run, where results go and how they are made."""

    cfg: RunConfig
    layout: Layout
    run_key: str
    init: str
    quiet: bool
    fh: str  # cfg.finetune_hash()
    modes: list[str]  # "finetune", and "probe" when finetune.probe
    rt: Runtime


def _run_tasks(call: _Call, load: Callable[[], Encoder], specs: list[TaskSpec], encoder_data) -> list[dict]:
    cfg, layout, run_key, fh, modes = call.cfg, call.layout, call.run_key, call.fh, call.modes
    ft = cfg.finetune
    plan = []  # (spec, paths, what): what = "done" | skip reason | (train, dev)
    # what each task's results must have been made from
    digests = {
        spec.name: {"task_data": task_digest(spec, ft.glue_dir), "encoder_data": encoder_data}
        for spec in specs
    }
    for spec in specs:
        paths = {(m, s): result_path(layout, run_key, spec.name, fh, m, s) for m in modes for s in ft.seeds}
        done = {k: r for k, p in paths.items() if (r := existing_result(p, digests[spec.name])) is not None}
        plan.append([spec, paths, "done" if len(done) == len(paths) else unavailable(spec, ft.glue_dir)])
    enc: Encoder | None = None
    if any(what != "done" for _, _, what in plan):
        enc = load()  # validates the checkpoint (tokenizer vs vocab) before anything is written
        for item in plan:
            if item[2] is None:
                # read every task's data before computing anything: a bad file stops the call early
                item[2] = (
                    cap_rows(load_task(item[0].name, ft.glue_dir, "train"), ft.max_train_examples),
                    cap_rows(load_task(item[0].name, ft.glue_dir, "dev"), ft.max_eval_examples),
                )
                item[2] = degenerate(item[2][0], ft.max_train_examples) or item[2]
    results: list[dict] = []
    for spec, paths, what in plan:
        if what == "done":
            results.extend(existing_result(p, digests[spec.name]) for p in paths.values())
        elif isinstance(what, str):
            for p in paths.values():
                rec = {"run_key": run_key, "task": spec.name, "skipped": what}
                atomic_write_json(p, rec)
                results.append(rec)
        else:
            lock = layout.cache_dir("finetune") / "locks" / f"{run_key}-{spec.name}-{fh}.lease"
            with lease(lock):  # across hosts too (study/lease.py)
                # another process?
                done = {
                    k: r
                    for k, p in paths.items()
                    if (r := existing_result(p, digests[spec.name])) is not None
                }
                results.extend(_run_task(call, spec, enc, paths, done, digests[spec.name], *what))
    return results


def _run_task(
    call: _Call, spec: TaskSpec, enc: Encoder, paths, done, digest, train: TaskData, dev: TaskData
) -> list[dict]:
    cfg, layout, run_key, rt, quiet = call.cfg, call.layout, call.run_key, call.rt, call.quiet
    ft = cfg.finetune
    e_train = encode(enc.tokenizer, train, ft.max_length, layout, ft.glue_dir)
    e_dev = encode(enc.tokenizer, dev, ft.max_length, layout, ft.glue_dir)
    records = TaskRecords(
        run_key,
        spec,
        call.init,
        len(train),
        len(dev),
        call.fh,
        recipe(ft),
        digest,
        provenance(str(rt.device)),
        enc.source,
    )
    out: dict = dict(done)
    todo = [s for s in ft.seeds if ("finetune", s) not in out]
    stacked: dict = {}
    if todo and cfg.impl.finetune_batched_seeds:  # every missing seed in one stacked model (batched.py)
        stacked = _stacked(cfg, spec, enc, e_train, e_dev, todo, rt, run_key, quiet)
    for seed in todo:
        try:
            res = (
                stacked[seed]
                if seed in stacked
                else _finetune_one(
                    cfg,
                    spec,
                    enc.bert,
                    e_train,
                    e_dev,
                    seed,
                    rt,
                    f"{run_key[:12]} {spec.name} seed{seed}",
                    quiet,
                )
            )
            rec = records.result("finetune", seed, res)
        except FloatingPointError as exc:  # this seed only: the others (and the study) go on
            print(f"fine-tuning diverged: {run_key[:12]} {spec.name} seed {seed}: {exc}", file=sys.stderr)
            rec = records.diverged(seed, str(exc))
        out[("finetune", seed)] = rec
        atomic_write_json(paths[("finetune", seed)], rec)
    if "probe" in call.modes and any(("probe", s) not in out for s in ft.seeds):
        res = probe(cfg, spec, enc.bert, e_train, e_dev, rt, quiet)
        for seed in ft.seeds:
            if ("probe", seed) not in out:
                out[("probe", seed)] = rec = records.result("probe", seed, res)
                atomic_write_json(paths[("probe", seed)], rec)
    return [out[k] for k in paths]


def _stacked(cfg, spec, enc, e_train, e_dev, todo, rt, run_key, quiet) -> dict:
    """The seeds `todo` fine-tuned as one stacked model: {seed: result}, without the seeds the stack left
    out, or {} when a stacked step stopped them all (they then train one at a time)."""
    try:
        return batched.finetune_seeds(
            cfg,
            spec,
            enc.bert,
            e_train,
            e_dev,
            todo,
            rt,
            f"{run_key[:12]} {spec.name} seeds{','.join(map(str, todo))}",
            quiet,
        )
    except FloatingPointError as exc:
        # one stacked step stops every seed in it: each seed then trains on its own, so whether a seed
        # scores or is recorded diverged never depends on this speed setting (outside the run hash)
        print(f"batched fine-tuning stopped ({exc}); {spec.name} seeds {todo} one at a time", file=sys.stderr)
        return {}
