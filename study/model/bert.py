"""The BERT model: a plain transformers `BertForPreTraining`, plus a loss function with a sparse MLM head.

The module itself stays a stock HF class so that `save_pretrained` writes a checkpoint every
HF tool loads without custom code (`AutoModelForMaskedLM`, `AutoModel`, `pipeline("fill-mask")`).
`model.arch: pre_ln` builds the pre-LayerNorm encoder instead (study/model/preln.py: HF's
RobertaPreLayerNorm layout, the same `.bert` / `.cls` surface, a checkpoint those tools load too).
The speed trick lives in `pretraining_loss`: with `sparse=True` the MLM head (transform + vocab
projection) runs only on the positions that carry a label, as in original BERT / cramming /
academic-budget-bert; the vocab projection over every position is the single largest matmul
of a small BERT, and 85% of its output would be thrown away.

On a CPU the training step also computes that projection and its cross-entropy a few rows at a time
(`chunked=True`, `impl.mlm_loss`; study/model/xent.py): same loss within float rounding.

A third speed trick, for training on CPU: `use_bits_dropout` swaps the keep-mask draw of every
dropout (hidden and attention probabilities) for one that reads 32 random bits per element from whole
64-bit words. Same Bernoulli(1 - p) masks and the same arithmetic as torch's dropout; only the random
stream that picks them differs (tests/test_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForPreTraining

from study.config import ImplConfig, ModelConfig
from study.errors import StudyError
from study.labels import IGNORE
from study.model.attention import register_dropout_attention
from study.model.preln import PreLNForPreTraining, encoder_fields, lm_head_features, preln_config
from study.model.xent import linear_cross_entropy

PAD_ID = 0  # the [PAD] id of every tokenizer study/data/tokenizer.py trains
PreTrainingModel = BertForPreTraining | PreLNForPreTraining  # model.arch post_ln | pre_ln


def bert_config(cfg: ModelConfig, vocab_size: int, impl: ImplConfig) -> BertConfig:
    conf = BertConfig(
        **encoder_fields(cfg, vocab_size),
        max_position_embeddings=cfg.max_positions,
        architectures=["BertForPreTraining"],
    )
    conf._attn_implementation = impl.attention
    return conf


def build_model(
    cfg: ModelConfig,
    vocab_size: int,
    sentence_head: bool,
    impl: ImplConfig,
    seed: int = 0,
    pad_id: int = PAD_ID,
) -> PreTrainingModel:
    """A freshly initialised model of `cfg.arch`: BertForPreTraining (post_ln) or PreLNForPreTraining
    (pre_ln, study/model/preln.py; same `.bert` / `.cls` surface). Init draws from a forked RNG seeded by
    `seed`, so ambient torch RNG state neither affects nor is affected by model creation.

    `sentence_head` is kept for the contract: the NSP/SOP head always exists (so checkpoints stay
    standard); the loss simply skips it when False. `pad_id` is the tokenizer's [PAD] id, which the
    pre-LN encoder's position ids count from (study/data/tokenizer.py puts [PAD] at 0).
    """
    if vocab_size < 8:
        raise StudyError(
            f"vocabulary of {vocab_size} is too small", field="tokenizer.vocab_size", allowed=">= 128"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if cfg.arch == "pre_ln":
            model = PreLNForPreTraining(preln_config(cfg, vocab_size, impl, pad_id))
        else:
            model = BertForPreTraining(bert_config(cfg, vocab_size, impl))
    model.sentence_head = sentence_head  # plain attribute, not saved; read by pretraining_loss callers
    return model


@dataclass
class LossOut:
    loss: torch.Tensor
    mlm_loss: torch.Tensor
    sentence_loss: torch.Tensor | None
    mlm_correct: torch.Tensor  # number of correctly predicted masked tokens
    mlm_count: torch.Tensor  # number of masked tokens
    sentence_correct: torch.Tensor | None
    sentence_count: int
    mlm_hits: torch.Tensor | None = None  # with accuracy: correct or not, per asked position, row-major order
    mlm_hidden: torch.Tensor | None = (
        None  # with hidden: the encoder's output at each asked position, same order
    )


def pretraining_loss(
    model: PreTrainingModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor,
    labels: torch.Tensor,
    sentence_label: torch.Tensor | None = None,
    *,
    sparse: bool = True,
    accuracy: bool = True,
    n_masked: int | None = None,
    sentence: bool | None = None,
    hidden: bool = False,
    chunked: bool = False,
) -> LossOut:
    """MLM (+ NSP/SOP when `sentence_label` has entries >= 0) loss of one batch.

    The MLM loss is the mean over masked tokens of the batch in both modes, so sparse and
    full heads give the same loss and the same gradients (tested). `accuracy=False` skips the
    argmax over the vocabulary (the training step never reads it; ~2% of a step of config b):
    the correct counts are then 0.

    The training step passes what it knows on the host, so that nothing here reads the device (each such
    read is a host sync on a GPU): `n_masked`, the number of labels != IGNORE, picks the masked rows with a
    stable sort instead of a boolean index (the same rows in the same order, so the same loss and gradients);
    `sentence` says whether any sentence label is >= 0. Left None, both are read from the tensors.
    `hidden=True` (evaluation) also returns the encoder's output rows the MLM head read at the asked positions.
    `chunked=True` (the training step on a CPU, `impl.mlm_loss`) with `n_masked` and `accuracy=False`: the
    vocabulary projection and its loss a few rows at a time (study/model/xent.py); the logits never exist.
    """
    out = model.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    seq, pooled = out[0], out[1]
    heads = model.cls
    if sparse and n_masked is not None:
        flat = labels.flatten()
        rows = torch.argsort((flat == IGNORE).to(torch.int8), stable=True)[:n_masked]  # masked, in order
        asked = seq.flatten(0, 1).index_select(0, rows)
        target = flat.index_select(0, rows)
        # chunked: the projection and its loss in row chunks (no logits, so no accuracy)
        logits = None if chunked and not accuracy else heads.predictions(asked)
    elif sparse:
        sel = labels != IGNORE
        asked = seq[sel]
        logits = heads.predictions(asked)  # [n_masked, vocab]
        target = labels[sel]
    else:
        logits = heads.predictions(seq).flatten(0, 1)  # [B*L, vocab]
        target = labels.flatten()
        asked = seq[labels != IGNORE] if hidden else None
    if logits is None:
        dec = heads.predictions.decoder
        mlm_loss = linear_cross_entropy(decoder_input(heads.predictions, asked), dec.weight, dec.bias, target)
    else:
        mlm_loss = F.cross_entropy(logits.float(), target, ignore_index=IGNORE)
    valid = target != IGNORE
    hits = (logits.argmax(-1) == target) & valid if accuracy else None
    mlm_correct = hits.sum() if accuracy else valid.new_zeros(())
    mlm_count = valid.sum()
    loss, s_loss, s_correct, s_count = mlm_loss, None, None, 0
    if sentence is None:
        sentence = sentence_label is not None and bool((sentence_label >= 0).any())
    if sentence:
        s_logits = heads.seq_relationship(pooled).float()
        sl = sentence_label.long()
        s_loss = F.cross_entropy(s_logits, sl, ignore_index=-1)
        s_correct = ((s_logits.argmax(-1) == sl) & (sl >= 0)).sum() if accuracy else sl.new_zeros(())
        s_count = int((sl >= 0).sum()) if accuracy else 0
        loss = mlm_loss + s_loss
    if hits is not None and not sparse:
        hits = hits[valid]  # the full head scored every position: keep the asked ones, as the sparse head
    return LossOut(
        loss, mlm_loss, s_loss, mlm_correct, mlm_count, s_correct, s_count, hits, asked if hidden else None
    )


def decoder_input(predictions: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The MLM head up to its vocabulary projection (`predictions.decoder`): BERT's transform (dense, act,
    LayerNorm) or the pre-LN head's dense, gelu, LayerNorm. `predictions.decoder(decoder_input(p, x))` is
    `p(x)` bitwise (tests/test_model.py)."""
    if hasattr(predictions, "transform"):
        return predictions.transform(x)
    return lm_head_features(predictions, x)


def model_flops_per_token(
    cfg: ModelConfig, seq_len: int, vocab: int, n_predictions_per_seq: float, sparse: bool = True
) -> float:
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


# --------------------------------------------------------------------------- fast dropout masks (CPU)
# Why: torch's CPU dropout draws its mask with bernoulli_, one generator call per element in a
# serial loop; in a bf16 step of config b (L4/H256) that was 22% of the time. `random_` over the whole
# int64 range fills 64 bits per generator call, so a 32-bit threshold test costs half a call per element.
_INT32_MIN = -(1 << 31)


def bits_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout of `x` with drop probability `p` (training mode), masks from 32-bit uniform draws.

    An element is kept when its 32-bit draw falls below round((1-p) * 2^32), so P(keep) is within
    2^-33 of 1-p. After the mask the arithmetic is ATen's dropout exactly (noise = mask in x's dtype,
    divided by 1-p in that dtype; output x * noise), so given the same mask the output is bitwise
    torch's (tested). The words come from torch's default generator for x's device: seeding and
    checkpointed RNG state cover them as they cover torch's dropout.
    """
    if p <= 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    n = x.numel()
    words = torch.empty((n + 1) // 2, dtype=torch.int64, device=x.device).random_(
        -(1 << 63), None
    )  # all 64 bits
    draws = words.view(torch.int32)[:n].view(x.shape)
    # below 2^-33, 1-p rounds to 2^32: a threshold of 2^31 would wrap to int32's minimum and drop everything
    keep = draws < min(_INT32_MIN + round((1.0 - p) * 2.0**32), (1 << 31) - 1)
    noise = keep.to(x.dtype).div_(1.0 - p)
    return x * noise


class BitsDropout(torch.nn.Dropout):
    """nn.Dropout with bits_dropout's masks; the module tree and state_dict are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bits_dropout(x, self.p) if self.training else x


# `bits-eager` / `bits-sdpa`: attention with bits_dropout on the probabilities (use_bits_dropout picks it)
register_dropout_attention("bits", bits_dropout)


def use_bits_dropout(model: PreTrainingModel) -> PreTrainingModel:
    """Switch `model` (in place) to bits_dropout: every nn.Dropout module and the attention
    probabilities. Nothing saved changes: `_attn_implementation` is not written by save_pretrained,
    so the checkpoint still names no custom code."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is torch.nn.Dropout:
                setattr(module, name, BitsDropout(child.p))
    kernel = model.config._attn_implementation
    if not kernel.startswith("bits-"):  # every layer reads this one config object (as bert_config sets it)
        model.config._attn_implementation = f"bits-{kernel}"
    return model
