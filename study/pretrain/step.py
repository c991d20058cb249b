"""One pre-training optimizer step, and the model and optimizer it runs on.

The trainer calls `pretrain_step` for every step and `study plan` (study/studies/cost.py) times the
very same function on a synthetic batch of the run's shape, so a plan cannot drift from training.

Loss weighting (why not just the mean per micro-batch): a micro-batch's MLM mean is multiplied by
(its masked tokens / the global batch's masked tokens), and likewise the sentence loss by its share
of sentence labels, so summing micro-batches and ranks gives exactly the mean over the global batch,
as if it had been one forward pass. DDP averages gradients over ranks; the factor `world` turns that
average into the sum over the global batch.

No host sync: the step reads nothing back from the device. Its losses and gradient norm stay device
tensors (`StepResult.stats`) that the trainer reads once per log window with `read_steps`; clipping
keeps the norm as a tensor; under DDP the global counts are all-reduced on the device and the loss
weights computed there. The optimizer step is therefore taken whatever the loss: a non-finite loss
or gradient norm is found by the trainer at its next sync, which stops the run before anything of
it (history, checkpoint, evaluation) is written.

Static shapes (impl.pad_to="max", `pad_parts`): every micro-batch padded to max_seq_len, so one run
has one input shape and impl.compile compiles the encoder once (`LossModule(compile=True)`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from study.config import RunConfig
from study.labels import IGNORE
from study.model.bert import build_model, pretraining_loss, use_bits_dropout
from study.runtime import Dist, Runtime, param_groups


def resolve_dropout_masks(name: str, device: torch.device) -> str:
    """impl.dropout_masks: auto is "bits" on CPU (measured faster there), torch's kernel elsewhere."""
    return ("bits" if device.type == "cpu" else "torch") if name == "auto" else name


def build_training_model(cfg: RunConfig, vocab: int, device: torch.device) -> tuple[nn.Module, str]:
    """The run's freshly initialised model on `device` (init seeded by cfg.seed, global RNG untouched),
    with the dropout kernel impl.dropout_masks resolves to. Returns (model, resolved dropout_masks)."""
    model = build_model(cfg.model, vocab, cfg.objective.sentence != "none", cfg.impl, seed=cfg.seed).to(
        device
    )
    masks = resolve_dropout_masks(cfg.impl.dropout_masks, device)
    if masks == "bits":
        use_bits_dropout(model)
    return model, masks


def make_optimizer(cfg: RunConfig, model: nn.Module, device: torch.device) -> tuple[torch.optim.AdamW, bool]:
    """The run's AdamW (runtime.param_groups) and whether it is the fused kernel (impl.fused_optimizer,
    on the devices where torch has it)."""
    fused = cfg.impl.fused_optimizer and device.type in ("cpu", "cuda")
    t = cfg.train
    opt = torch.optim.AdamW(
        param_groups(model, t.weight_decay),
        lr=t.lr,
        betas=(t.beta1, t.beta2),
        eps=t.eps,
        **({"fused": True} if fused else {}),
    )
    return opt, fused


def pad_parts(parts: list[dict], length: int, pad_id: int) -> list[dict]:
    """impl.pad_to="max": micro-batches (study.data.batches.micro_batches) padded back to `length` positions,
    as the rows were before trimming: [PAD] ids, attention 0, token type 0, label IGNORE. Padding is masked
    out of attention (exp(-inf) = 0) and of the loss, so only the order of float sums changes."""
    fill = {"input_ids": pad_id, "attention_mask": 0, "token_type_ids": 0, "labels": IGNORE}
    out = []
    for p in parts:
        t = p["tensors"]
        rows, width = t["input_ids"].shape
        if width >= length:
            out.append(p)
            continue
        tensors = {k: F.pad(v, (0, length - width), value=fill[k]) if k in fill else v for k, v in t.items()}
        out.append({**p, "tensors": tensors, "positions": rows * length})
    return out


class _CompiledEncoder:
    """What pretraining_loss reads of a model, with `.bert` compiled (static shapes); the rest is the model's."""

    def __init__(self, model: nn.Module):
        self._model = model
        self.bert = torch.compile(model.bert, dynamic=False)

    def __getattr__(self, name):
        return getattr(self._model, name)


class LossModule(nn.Module):
    """Wraps the HF model so DDP sees one forward(); returns the weighted contribution and the parts.

    `compile`: the encoder runs through torch.compile (impl.compile, with impl.pad_to="max"). The compiled
    wrapper is kept outside the module tree, so parameters, state_dict and DDP see the model alone, and
    evaluation (which calls the model itself) stays eager. `chunked`: the runtime's choice of MLM loss
    (Runtime.chunked_mlm, impl.mlm_loss)."""

    def __init__(self, model, sparse: bool, compile: bool = False, chunked: bool = False):
        super().__init__()
        self.model, self.sparse, self.chunked = model, sparse, chunked
        object.__setattr__(self, "_runs", _CompiledEncoder(model) if compile else model)

    def forward(
        self,
        input_ids,
        attention_mask,
        token_type_ids,
        labels,
        sentence_label,
        w_mlm,
        w_sent,
        n_mlm: int,
        n_sent: int,
    ):
        # the part's counts are host ints: the loss then reads nothing back from the device
        out = pretraining_loss(
            self._runs,
            input_ids,
            attention_mask,
            token_type_ids,
            labels,
            sentence_label,
            sparse=self.sparse,
            accuracy=False,
            n_masked=n_mlm,
            sentence=sentence_label is not None and n_sent > 0,
            chunked=self.chunked and self.sparse,
        )
        zero = out.mlm_loss.new_zeros(())
        mlm = out.mlm_loss * w_mlm if w_mlm is not None else zero  # None: nothing masked here (NaN mean)
        sent = out.sentence_loss * w_sent if out.sentence_loss is not None else zero
        if w_mlm is None and out.sentence_loss is None:
            # Nothing to learn from in this part (a row's mask count rounds to 0, no sentence task): a zero
            # that still reaches every parameter, since backward needs a graph and DDP a gradient for each.
            return sum(q.sum() for q in self.model.parameters()) * 0.0, zero, zero
        return mlm + sent, mlm.detach(), sent.detach()


@dataclass
class StepResult:
    """One step, still on the device: read it with read_steps (one transfer for a whole log window)."""

    stats: (
        torch.Tensor
    )  # float64: loss, mlm, sentence, grad_norm (nan without clipping) [, masked, positions]
    masked: int | None  # MLM predictions trained on (all ranks); None under DDP: then in stats
    positions: int | None  # positions computed (after trimming or padding); None under DDP: then in stats


@dataclass
class StepValues:
    """Global (all micro-batches and ranks) values of one step, on the host."""

    loss: float
    mlm: float
    sentence: float
    grad_norm: float
    masked: int
    positions: int


def read_steps(results: list[StepResult]) -> list[StepValues]:
    """The host values of `results` with ONE device->host transfer (the sync of a log window)."""
    if not results:
        return []
    rows = torch.stack([r.stats for r in results]).tolist()
    return [
        StepValues(
            row[0],
            row[1],
            row[2],
            row[3],
            r.masked if r.masked is not None else int(row[4]),
            r.positions if r.positions is not None else int(row[5]),
        )
        for r, row in zip(results, rows, strict=True)
    ]


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy that does not wait for the device: pinned host memory and a non-blocking copy on CUDA."""
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _all_reduce_(t: torch.Tensor, dist: Dist) -> torch.Tensor:
    """Sum over ranks in place, without reading it on the host (nccl: CUDA tensors, gloo: CPU ones)."""
    if not dist.on:
        return t
    if t.device.type in ("cpu", "cuda"):
        torch.distributed.all_reduce(t)
    else:
        c = t.cpu()
        torch.distributed.all_reduce(c)
        t.copy_(c)
    return t


def pretrain_step(
    module: nn.Module,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    parts: list[dict],
    lr: float,
    *,
    clip: float,
    rt: Runtime,
    fused: bool,
    poison: bool = False,
    mid_step: Callable[[], None] | None = None,
) -> StepResult:
    """Forward/backward over the micro-batches `parts` (study.data.batches.micro_batches), clip, AdamW.

    `module` is LossModule(model) or its DDP wrapper. Nothing is read back from the device (see the module
    doc): the update is taken even when the loss or gradient norm is not finite, and the caller finds that
    in the returned stats. `poison` makes the loss NaN (the divergence test hook); `mid_step` runs after the
    backward passes, before the update (the fault suite's kill point)."""
    dist, device = rt.dist, rt.device
    local = [
        float(sum(p["n_mlm"] for p in parts)),
        float(sum(p["n_sent"] for p in parts)),
        float(sum(p["positions"] for p in parts)),
    ]
    counts = None
    if dist.on:  # the global counts, summed on the device; the loss weights are computed there too
        counts = _all_reduce_(_to_device(torch.tensor(local, dtype=torch.float64), device), dist)
        g_mlm, g_sent = counts[0], counts[1]
    else:
        g_mlm, g_sent = local[0], local[1]
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    autocast = rt.autocast
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for i, p in enumerate(parts):
        tensors = {k: _to_device(v, device) for k, v in p["tensors"].items()}
        # a part with nothing masked (or no sentence labels) contributes no such loss; then n == 0, g >= 0
        w_mlm = (dist.world * p["n_mlm"] / g_mlm) if p["n_mlm"] else None
        w_sent = (dist.world * p["n_sent"] / g_sent) if p["n_sent"] else 0.0
        if dist.on:
            w_mlm = w_mlm.float() if w_mlm is not None else None
            w_sent = w_sent.float() if torch.is_tensor(w_sent) else w_sent
        sync = (not dist.on) or i == len(parts) - 1  # DDP all-reduces gradients on the last micro-batch only
        with contextlib.nullcontext() if sync else module.no_sync():
            with autocast():
                loss, mlm, sent = module(
                    w_mlm=w_mlm, w_sent=w_sent, n_mlm=p["n_mlm"], n_sent=p["n_sent"], **tensors
                )
            if poison and i == 0:
                loss = loss * float("nan")
            loss.backward()
        sums += torch.stack([loss.detach(), mlm, sent]).double() / dist.world
    if mid_step is not None:
        mid_step()
    _all_reduce_(sums, dist)
    if clip > 0:
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=fused or None).detach()
        gnorm = gnorm.to(torch.float64).reshape(1)
    else:
        gnorm = sums.new_full((1,), math.nan)
    opt.step()
    stats = torch.cat([sums, gnorm] + ([counts[0:1], counts[2:3]] if counts is not None else []))
    return StepResult(stats, None if dist.on else int(local[0]), None if dist.on else int(local[2]))
