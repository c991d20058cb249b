"""One pre-training optimizer step, and the model and optimizer it runs on.

The trainer calls `pretrain_step` for every step and `study plan` (study/studies/cost.py) times the
very same function on a synthetic batch of the run's shape, so a plan cannot drift from training.

Loss weighting (why not just the mean per micro-batch): a micro-batch's MLM mean is multiplied by
(its masked tokens / the global batch's masked tokens), and likewise the sentence loss by its share
of sentence labels, so summing micro-batches and ranks gives exactly the mean over the global batch,
as if it had been one forward pass. DDP averages gradients over ranks; the factor `world` turns that
average into the sum over the global batch.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from study.config import RunConfig
from study.model.bert import build_model, pretraining_loss, use_bits_dropout
from study.runtime import Runtime, all_reduce_sum, param_groups


def resolve_dropout_masks(name: str, device: torch.device) -> str:
    """impl.dropout_masks: auto is "bits" on CPU (measured faster there), torch's kernel elsewhere."""
    return ("bits" if device.type == "cpu" else "torch") if name == "auto" else name


def build_training_model(cfg: RunConfig, vocab: int, device: torch.device) -> tuple[nn.Module, str]:
    """The run's freshly initialised model on `device` (init seeded by cfg.seed, global RNG untouched),
    with the dropout kernel impl.dropout_masks resolves to. Returns (model, resolved dropout_masks)."""
    model = build_model(cfg.model, vocab, cfg.objective.sentence != "none", cfg.impl, seed=cfg.seed).to(device)
    masks = resolve_dropout_masks(cfg.impl.dropout_masks, device)
    if masks == "bits":
        use_bits_dropout(model)
    return model, masks


def make_optimizer(cfg: RunConfig, model: nn.Module, device: torch.device) -> tuple[torch.optim.AdamW, bool]:
    """The run's AdamW (runtime.param_groups) and whether it is the fused kernel (impl.fused_optimizer,
    on the devices where torch has it)."""
    fused = cfg.impl.fused_optimizer and device.type in ("cpu", "cuda")
    t = cfg.train
    opt = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps,
                            **({"fused": True} if fused else {}))
    return opt, fused


class LossModule(nn.Module):
    """Wraps the HF model so DDP sees one forward(); returns the weighted contribution and the parts."""

    def __init__(self, model, sparse: bool):
        super().__init__()
        self.model, self.sparse = model, sparse

    def forward(self, input_ids, attention_mask, token_type_ids, labels, sentence_label, w_mlm, w_sent):
        out = pretraining_loss(self.model, input_ids, attention_mask, token_type_ids, labels,
                               sentence_label, sparse=self.sparse, accuracy=False)
        zero = out.mlm_loss.new_zeros(())
        mlm = out.mlm_loss * w_mlm if w_mlm else zero  # w_mlm is 0 exactly when nothing is masked (NaN mean)
        sent = out.sentence_loss * w_sent if out.sentence_loss is not None else zero
        return mlm + sent, mlm.detach(), sent.detach()


@dataclass
class StepResult:
    """Global (all micro-batches and ranks) values of one step."""

    loss: float
    mlm: float
    sentence: float
    grad_norm: float   # nan when clipping is off or the loss was not finite
    masked: int        # MLM predictions trained on
    positions: int     # positions computed (after trimming padding)


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def pretrain_step(module: nn.Module, model: nn.Module, opt: torch.optim.Optimizer, parts: list[dict], lr: float,
                  *, clip: float, rt: Runtime, fused: bool, poison: bool = False,
                  mid_step: Callable[[], None] | None = None) -> StepResult:
    """Forward/backward over the micro-batches `parts` (study.data.batches.micro_batches), clip, AdamW.

    `module` is LossModule(model) or its DDP wrapper. The optimizer step is skipped when the loss or the
    gradient norm is not finite (the caller decides what divergence means). `poison` makes the loss NaN
    (the divergence test hook); `mid_step` runs after the backward passes, before the update (the fault
    suite's kill point)."""
    dist, device = rt.dist, rt.device
    g_mlm, g_sent, positions = all_reduce_sum([float(sum(p["n_mlm"] for p in parts)),
                                               float(sum(p["n_sent"] for p in parts)),
                                               float(sum(p["positions"] for p in parts))], dist, device)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    autocast = rt.autocast
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for i, p in enumerate(parts):
        tensors = {k: v.to(device, non_blocking=True) for k, v in p["tensors"].items()}
        w_mlm = dist.world * p["n_mlm"] / g_mlm if g_mlm else 0.0
        w_sent = dist.world * p["n_sent"] / g_sent if g_sent else 0.0
        sync = (not dist.on) or i == len(parts) - 1  # DDP all-reduces gradients on the last micro-batch only
        with contextlib.nullcontext() if sync else module.no_sync():
            with autocast():
                loss, mlm, sent = module(w_mlm=w_mlm, w_sent=w_sent, **tensors)
            if poison and i == 0:
                loss = loss * float("nan")
            loss.backward()
        sums += torch.stack([loss.detach(), mlm, sent]).double() / dist.world
    if mid_step is not None:
        mid_step()
    loss_sum, mlm_sum, sent_sum = all_reduce_sum(sums.tolist(), dist, device)
    gnorm = float("nan")
    if finite(loss_sum):
        if clip > 0:
            gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=fused or None))
        if clip == 0 or finite(gnorm):
            opt.step()
    return StepResult(loss_sum, mlm_sum, sent_sum, gnorm, int(g_mlm), int(positions))
