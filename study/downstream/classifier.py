"""The fine-tuning model and its step: an encoder with BERT's classification head, AdamW, the schedule.

The parts of the recipe that never vary are constants here (BERT's fine-tuning defaults); everything that
varies lives in cfg.finetune. The sequential loop (finetune.py), `study plan` (study/studies/cost.py) and
bench/gpu.py train through `finetune_step`; the batched seeds (batched.py) stack the same `Classifier` and
use the same loss, constants and schedule in their own vmapped step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from study.config import FinetuneConfig
from study.runtime import param_groups

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
GRAD_CLIP = 1.0


class Classifier(torch.nn.Module):
    """BertForSequenceClassification's head: dropout + linear on the pooler output (tanh(W [CLS])), or, with
    pooling "mean", on the mean of the last layer over the row's real tokens (the pooler is then unused)."""

    def __init__(
        self,
        bert: torch.nn.Module,
        num_labels: int,
        dropout: float,
        init_range: float,
        generator: torch.Generator,
        pooling: str = "cls",
    ):
        super().__init__()
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling {pooling!r}: 'cls' or 'mean'")
        self.bert = bert
        self.pooling = pooling
        self.dropout = torch.nn.Dropout(dropout)
        self.head = torch.nn.Linear(bert.config.hidden_size, num_labels)
        with torch.no_grad():
            self.head.weight.normal_(0.0, init_range, generator=generator)
            self.head.bias.zero_()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        pool_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`pool_mask` [batch, width] 0/1: the rows' real tokens, when `attention_mask` is already the
        prepared 4-d mask (batched seeds); otherwise the 2-d attention_mask is used."""
        out = self.bert(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        if self.pooling == "cls":
            pooled = out.pooler_output
        else:
            pooled = mean_pool(out.last_hidden_state, attention_mask if pool_mask is None else pool_mask)
        return self.head(self.dropout(pooled)).float()


def mean_pool(h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of h [batch, width, hidden] over the positions where mask [batch, width] is 1 (all without a
    mask), in fp32: padding never enters, so a row's vector does not depend on how wide its batch is."""
    if mask is None:
        return h.float().mean(1)
    m = mask.to(torch.float32).unsqueeze(-1)
    return (h.float() * m).sum(1) / m.sum(1).clamp(min=1.0)


def task_loss(regression: bool, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if regression:
        return F.mse_loss(logits.squeeze(-1), y.float())
    return F.cross_entropy(logits, y.long())


def finetune_optimizer(model: torch.nn.Module, ft: FinetuneConfig) -> torch.optim.AdamW:
    """The recipe's AdamW: no weight decay on biases and LayerNorm (study.runtime.param_groups)."""
    return torch.optim.AdamW(param_groups(model, ft.weight_decay), lr=ft.lr, betas=ADAM_BETAS, eps=ADAM_EPS)


def finetune_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    y: torch.Tensor,
    regression: bool,
    autocast,
) -> torch.Tensor:
    """One fine-tuning step: forward under `autocast`, loss, backward, clip to GRAD_CLIP, AdamW update.
    Returns the loss (a device tensor). `study plan` times this very function (study/studies/cost.py).
    A non-finite loss raises FloatingPointError before any update."""
    with autocast():
        logits = model(**batch)
    loss = task_loss(regression, logits, y)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite fine-tuning loss {float(loss)}")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    opt.step()
    return loss


def lr_lambda(total: int, warmup: int) -> Callable[[int], float]:
    """The recipe's schedule: linear warmup over `warmup` steps, then linear decay to 0 at `total`."""
    return lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
