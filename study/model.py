"""The BERT model: a plain transformers `BertForPreTraining`, plus a loss function with a sparse MLM head.

The module itself stays a stock HF class so that `save_pretrained` writes a checkpoint every
HF tool loads without custom code (`AutoModelForMaskedLM`, `AutoModel`, `pipeline("fill-mask")`).
The speed trick lives in `pretraining_loss`: with `sparse=True` the MLM head (transform + vocab
projection) runs only on the positions that carry a label, as in original BERT / cramming /
academic-budget-bert; the vocab projection over every position is the single largest matmul
of a small BERT, and 85% of its output would be thrown away.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForPreTraining

from .config import ImplConfig, ModelConfig
from .errors import StudyError

IGNORE = -100


def bert_config(cfg: ModelConfig, vocab_size: int, impl: ImplConfig) -> BertConfig:
    conf = BertConfig(
        vocab_size=vocab_size, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, intermediate_size=cfg.intermediate, hidden_act=cfg.activation,
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
        max_position_embeddings=cfg.max_positions, type_vocab_size=2, initializer_range=cfg.init_range,
        architectures=["BertForPreTraining"],
    )
    conf._attn_implementation = impl.attention
    return conf


def build_model(cfg: ModelConfig, vocab_size: int, sentence_head: bool, impl: ImplConfig,
                seed: int = 0) -> BertForPreTraining:
    """A freshly initialised BertForPreTraining. Init draws from a forked RNG seeded by `seed`,
    so ambient torch RNG state neither affects nor is affected by model creation.

    `sentence_head` is kept for the contract: the NSP/SOP head always exists in
    BertForPreTraining (so checkpoints stay standard); the loss simply skips it when False.
    """
    if vocab_size < 8:
        raise StudyError(f"vocabulary of {vocab_size} is too small", field="tokenizer.vocab_size", allowed=">= 128")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertForPreTraining(bert_config(cfg, vocab_size, impl))
    model.sentence_head = sentence_head  # plain attribute, not saved; read by pretraining_loss callers
    return model


@dataclass
class LossOut:
    loss: torch.Tensor
    mlm_loss: torch.Tensor
    sentence_loss: torch.Tensor | None
    mlm_correct: torch.Tensor      # number of correctly predicted masked tokens
    mlm_count: torch.Tensor        # number of masked tokens
    sentence_correct: torch.Tensor | None
    sentence_count: int


def pretraining_loss(model: BertForPreTraining, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     token_type_ids: torch.Tensor, labels: torch.Tensor,
                     sentence_label: torch.Tensor | None = None, *, sparse: bool = True) -> LossOut:
    """MLM (+ NSP/SOP when `sentence_label` has entries >= 0) loss of one batch.

    The MLM loss is the mean over masked tokens of the batch in both modes, so sparse and
    full heads give the same loss and the same gradients (tested).
    """
    out = model.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    seq, pooled = out[0], out[1]
    heads = model.cls
    if sparse:
        sel = labels != IGNORE
        logits = heads.predictions(seq[sel])            # [n_masked, vocab]
        target = labels[sel]
    else:
        logits = heads.predictions(seq).flatten(0, 1)   # [B*L, vocab]
        target = labels.flatten()
    mlm_loss = F.cross_entropy(logits.float(), target, ignore_index=IGNORE)
    valid = target != IGNORE
    mlm_correct = ((logits.argmax(-1) == target) & valid).sum()
    mlm_count = valid.sum()
    loss, s_loss, s_correct, s_count = mlm_loss, None, None, 0
    if sentence_label is not None and bool((sentence_label >= 0).any()):
        s_logits = heads.seq_relationship(pooled).float()
        sl = sentence_label.long()
        s_loss = F.cross_entropy(s_logits, sl, ignore_index=-1)
        s_correct = ((s_logits.argmax(-1) == sl) & (sl >= 0)).sum()
        s_count = int((sl >= 0).sum())
        loss = mlm_loss + s_loss
    return LossOut(loss, mlm_loss, s_loss, mlm_correct, mlm_count, s_correct, s_count)


def model_flops_per_token(cfg: ModelConfig, seq_len: int, vocab: int, n_predictions_per_seq: float,
                          sparse: bool = True) -> float:
    """Training FLOPs (forward + backward) per input token.

    - Dense encoder weights: per layer 4*H^2 (QKV + output proj) + 2*H*I (FFN) parameters;
      a multiply-add is 2 FLOPs and backward costs twice the forward -> 6 * N_layer.
    - Attention scores and weighted sum: 2 matmuls of [L, H] x [H, L] per layer -> 2*2*L*H
      FLOPs per token forward, times 3 for fwd+bwd -> 12 * L * H * layers (the "12*L*H*seq" term).
    - MLM head (transform H^2 + projection H*V) runs on every position (full) or only on the
      predicted ones (sparse): 6 * (H^2 + H*V) * fraction of positions predicted.
    Embedding lookups are not matmuls and are left out (PaLM-style accounting).
    """
    h, i, n_layers = cfg.hidden, cfg.intermediate, cfg.layers
    dense = n_layers * (4 * h * h + 2 * h * i)
    attention = 12 * n_layers * seq_len * h
    frac = (n_predictions_per_seq / seq_len) if sparse else 1.0
    head = 6 * (h * h + h * vocab) * frac
    return 6 * dense + attention + head
