"""MLM pseudo-log-likelihood (Salazar et al., 2020, "Masked Language Model Scoring").

A sequence's PLL is the sum, over its scored positions, of log P(true token | the row with that position
replaced by [MASK]). `within_word_l2r` (Kauf & Ivanova, 2023) also masks the later pieces of the same word
when scoring a piece of a multi-piece word, so a word's first piece is not predicted from its own tail.

Both metrics are the ones minicons' `MaskedLMScorer.sequence_score(..., PLL_metric=...)` computes (checked
against minicons 0.3.39 within 1e-4 in tests/test_zeroshot.py); special tokens as there: every position whose
id is [CLS], [SEP] or [PAD] is context, never scored.

Every masked copy of every sequence goes into one list, sorted by length and cut into batches of at most
BATCH_TOKENS padded positions, so short sentences share forward passes; the MLM head runs only at the one
masked position of each copy. Nothing is drawn at random (the model is in eval mode, no dropout), gradients
are off, and the batches depend only on the sequences, so a score is a pure function of the model and its
inputs; the caller picks device, precision and threads (study.runtime).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from study.model.bert import PAD_ID, PreTrainingModel

METRICS = ("original", "within_word_l2r")
BATCH_TOKENS = 8192  # padded positions per forward pass: memory only, not the scores (up to float rounding)


@dataclass(frozen=True)
class Scored:
    """One row to score: its ids (specials included), token types, the positions scored and, for
    within_word_l2r, the word each position belongs to (None for specials)."""

    ids: tuple[int, ...]
    types: tuple[int, ...]
    targets: tuple[int, ...]
    words: tuple[int | None, ...]


def sentence_rows(tok, sentences: Sequence[str], max_len: int) -> list[Scored]:
    """Each sentence as `[CLS] sentence [SEP]` (segment A), scored at every position that is not [CLS], [SEP]
    or [PAD]: minicons' rule for masked LMs. Word ids from the fast tokenizer, as minicons reads them."""
    enc = tok(list(sentences), add_special_tokens=True, truncation=True, max_length=max_len)
    skip = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}
    out = []
    for i, ids in enumerate(enc["input_ids"]):
        targets = tuple(j for j, t in enumerate(ids) if t not in skip)
        out.append(Scored(tuple(ids), (0,) * len(ids), targets, tuple(enc.word_ids(i))))
    return out


def mask_sets(row: Scored, metric: str) -> list[tuple[int, list[int]]]:
    """(scored position, positions masked) per masked copy of `row`, in target order."""
    if metric not in METRICS:
        raise ValueError(f"unknown PLL metric {metric!r}; expected one of {METRICS}")
    out = []
    last = row.targets[-1] if row.targets else -1
    for t in row.targets:
        w = row.words[t]
        later = (
            [j for j in range(t + 1, last + 1) if row.words[j] == w]
            if metric == "within_word_l2r" and w is not None
            else []
        )
        out.append((t, [t, *later]))
    return out


def token_logprobs(
    model: PreTrainingModel,
    rows: Sequence[Scored],
    mask_id: int,
    metric: str = "original",
    device: torch.device | str = "cpu",
    autocast: Callable | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """log P(true token) at each scored position of each row (float64, in target order)."""
    copies = [(r, t, m) for r, row in enumerate(rows) for t, m in mask_sets(row, metric)]
    order = sorted(range(len(copies)), key=lambda c: len(rows[copies[c][0]].ids))  # stable: deterministic
    out = [np.zeros(len(row.targets), np.float64) for row in rows]
    slot = {}  # copy -> its index among its row's targets
    for r, row in enumerate(rows):
        for k, t in enumerate(row.targets):
            slot[(r, t)] = k
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), (autocast or contextlib.nullcontext)():
            for batch in _batches(order, [len(rows[c[0]].ids) for c in copies]):
                lp = _score_batch(model, [copies[c] for c in batch], rows, mask_id, device)
                for c, v in zip(batch, lp, strict=True):
                    r, t, _ = copies[c]
                    out[r][slot[(r, t)]] = v
                if progress:
                    progress(len(batch))
    finally:
        model.train(was)
    return out


def pll(model: PreTrainingModel, rows: Sequence[Scored], mask_id: int, **kw) -> np.ndarray:
    """The PLL of each row: the sum of its scored positions' log-probabilities (nats, float64)."""
    return np.array([lp.sum() for lp in token_logprobs(model, rows, mask_id, **kw)], np.float64)


def _batches(order: list[int], lengths: list[int]) -> list[list[int]]:
    """`order` (sorted by length) cut into batches of at most BATCH_TOKENS padded positions."""
    out, cur = [], []
    for c in order:
        if cur and (len(cur) + 1) * lengths[c] > BATCH_TOKENS:
            out.append(cur)
            cur = []
        cur.append(c)
    return out + ([cur] if cur else [])


def _score_batch(model, copies, rows, mask_id: int, device) -> np.ndarray:
    width = max(len(rows[r].ids) for r, _, _ in copies)
    n = len(copies)
    # filled in numpy (one small torch tensor per row cost more than the forward pass of a small model)
    ids = np.full((n, width), PAD_ID, dtype=np.int64)
    types = np.zeros((n, width), dtype=np.int64)
    attn = np.zeros((n, width), dtype=np.int64)
    at = np.empty(n, dtype=np.int64)
    true = np.empty(n, dtype=np.int64)
    for i, (r, t, masked) in enumerate(copies):
        row = rows[r]
        L = len(row.ids)
        ids[i, :L] = row.ids
        types[i, :L] = row.types
        attn[i, :L] = 1
        true[i] = row.ids[t]
        ids[i, masked] = mask_id
        at[i] = t
    ids_t, types_t, attn_t = (torch.from_numpy(x).to(device) for x in (ids, types, attn))
    hidden = model.bert(input_ids=ids_t, attention_mask=attn_t, token_type_ids=types_t)[0]
    rows_t = torch.arange(n, device=hidden.device)
    logits = model.cls.predictions(hidden[rows_t, torch.from_numpy(at).to(hidden.device)]).float()
    lp = torch.log_softmax(logits, dim=-1)
    return lp[rows_t.to(lp.device), torch.from_numpy(true).to(lp.device)].double().cpu().numpy()
