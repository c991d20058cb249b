"""Attention whose probability dropout draws its masks our way, registered with transformers.

Two callers need it: pre-training's `bits-<kernel>` (model/bert.py: bits_dropout, cheap CPU masks) and
batched fine-tuning's `seed-<kernel>` (downstream/batched.py: each vmapped seed's own masks). The model
picks one by name through `config._attn_implementation`; transformers looks the name up in its attention
registry (`AttentionInterface`) and the mask builder in `AttentionMaskInterface`.

What this leans on in transformers (5.x), all checked by `check_registry` at import and by
tests/test_model.py: the registries are mappings with "sdpa" (attention) and "eager"/"sdpa" (masks)
entries and a `register` class method, and an attention function is called as
`f(module, query, key, value, attention_mask, scaling=, dropout=, **kwargs) -> (output, probs)`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import transformers
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.models.bert.modeling_bert import eager_attention_forward

KERNELS = ("eager", "sdpa")  # the stock kernels a dropout variant wraps (ImplConfig.attention)
Drop = Callable[[torch.Tensor, float], torch.Tensor]  # (probabilities, p) -> dropped probabilities


def check_registry() -> None:
    """Raise a RuntimeError saying what changed when transformers' attention registries no longer hold what
    `register_dropout_attention` needs (a transformers upgrade)."""
    attention, masks = AttentionInterface(), AttentionMaskInterface()
    missing = [f"AttentionInterface[{k!r}]" for k in KERNELS if k != "eager" and k not in attention]
    missing += [f"AttentionMaskInterface[{k!r}]" for k in KERNELS if k not in masks]
    if missing or not callable(getattr(AttentionInterface, "register", None)):
        raise RuntimeError(
            f"transformers {transformers.__version__} changed its attention registry: "
            f"{', '.join(missing) or 'AttentionInterface.register'} is gone. study/model/attention.py "
            "registers the bits-/seed- dropout kernels through it and needs updating to the new API."
        )


def dropout_attention(kernel: str, drop: Drop):
    """The stock `kernel` whenever there is no attention dropout (evaluation, or attention_dropout 0),
    else eager attention (HF's eager_attention_forward's math, what SDPA itself falls back to on CPU when
    dropout_p > 0) with `drop` applied to the probabilities [batch, heads, width, width]."""
    stock = eager_attention_forward if kernel == "eager" else AttentionInterface()[kernel]

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if dropout == 0.0:
            return stock(module, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs)
        if attention_mask is not None and attention_mask.dtype == torch.bool:  # sdpa's mask: True = attend
            attention_mask = torch.zeros(
                attention_mask.shape, dtype=query.dtype, device=query.device
            ).masked_fill_(~attention_mask, torch.finfo(query.dtype).min)
        scaling = query.size(-1) ** -0.5 if scaling is None else scaling
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = drop(F.softmax(scores, dim=-1), dropout)
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs

    return attend


def register_dropout_attention(prefix: str, drop: Drop) -> list[str]:
    """Register `<prefix>-eager` and `<prefix>-sdpa` (attention and mask builder alike), once per process at
    import of the caller (DDP workers and spawned jobs import it too); returns the registered names."""
    check_registry()
    names = []
    for kernel in KERNELS:
        name = f"{prefix}-{kernel}"
        AttentionInterface.register(name, dropout_attention(kernel, drop))
        AttentionMaskInterface.register(name, AttentionMaskInterface()[kernel])
        names.append(name)
    return names
