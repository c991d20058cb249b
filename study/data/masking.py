"""MLM masking engine: choose units (tokens, whole words or spans), then replace each unit by
[MASK] / random ids / itself, the split drawn ONCE PER UNIT.

Never selected: pad, cls, sep, mask. [UNK] is an ordinary, selectable token. Random replacements
come uniformly from the non-special vocabulary (all ids but pad/unk/cls/sep/mask).

Units
- token: each maskable position. count="exact": rate * maskable per row, rounded stochastically
  (see _exact_targets), "bernoulli": each position with prob rate. max_predictions caps a row's
  selected tokens in every unit and count mode (a random subset of units is kept).
- whole_word: a word is a maskable piece plus the '##' continuation pieces that follow it
  (`continuation[id]`); a continuation right after [CLS]/[SEP] (a word cut by truncation) starts
  its own word. Words are selected whole. exact: words in random order are taken while they fit
  rate * maskable tokens; the word that crosses the target is taken with probability
  (target - taken) / its length, so the count is exact in expectation and off by less than one word
  in any row (BERT's greedy fill never exceeds the target, so it runs low). bernoulli: each word with
  prob rate. The mask/random/keep split is drawn per word (HF's whole-word collator forces
  100% [MASK]; this does not).
- span (SpanBERT): span lengths ~ Geometric(span_p) clipped at span_max, in words, never crossing
  [SEP]/[CLS]/[PAD] and never overlapping. A span is placed at a uniformly random position where it
  fits whole; only when no such position is left (crowded rows at high rates) is it cut to the
  longest free run. The budget is counted in words, rate * maskable words (bernoulli:
  Binomial(maskable words, rate)), which equals rate * maskable tokens in expectation. Whether to
  draw one more span is decided BEFORE its length is seen, with the probability that makes the
  expected overshoot zero: with R words left, q(R) = R / (R + E[(placed len - R)+]). By Wald's
  identity the mean span length is then not biased by the budget, as SpanBERT's "truncate the last
  span" biases it low; the count is exact in expectation, off by less than one span in a row.

Measured on 1M Gutenberg tokens (tests/test_masking.py): rates within 0.2 pp for 0.05..0.8, the
split within 1 pp per unit, mean span 4.47 words at 15% against the exact 4.463 (4.24 at 80%, where
crowded rows cut spans).
"""
from __future__ import annotations

import bisect
import functools

import numpy as np
import torch

from study.config import MaskingConfig
from study.errors import StudyError
from study.data.tokens import SpecialIds

IGNORE = -100
REFERENCE = MaskingConfig(rate=0.15, mask=0.8, random=0.1, keep=0.1, unit="token", count="exact")
REFERENCE_SEED = 1234


@functools.lru_cache(maxsize=8)
def _non_special_table(special: SpecialIds) -> torch.Tensor:
    """Ids a random replacement may take (cached: built per call it cost more than the masking)."""
    keep = torch.ones(special.vocab_size, dtype=torch.bool)
    keep[list(special.all)] = False
    return torch.nonzero(keep).squeeze(1)


def _maskable(ids: torch.Tensor, special: SpecialIds) -> torch.Tensor:
    # four comparisons: torch.isin costs ~0.25 ms per call on small rows
    return (ids != special.pad) & (ids != special.cls) & (ids != special.sep) & (ids != special.mask)


# --------------------------------------------------------------------------- random numbers
# Every row draws the same fixed-size block from ITS generator: 4L + 1 uniforms
#   [0, L) position scores | [L, 2L) the split draw of the row's k-th unit | [2L, 3L) word keys
#   | [3L, 4L) word coins | 4L the stochastic-rounding coin
# and L random-replacement indices; span placement then draws sequentially from the same generator.
# With one generator per row (mask_rows) the rows are independent, and the selection itself runs
# vectorized over the batch: a row's mask depends on its key and ids only.
def _draws(B: int, L: int, n_table: int, gens) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(gens, torch.Generator):
        return (torch.rand((B, 4 * L + 1), generator=gens, dtype=torch.float64),
                torch.randint(n_table, (B, L), generator=gens))
    if B == 0:
        return torch.zeros((0, 4 * L + 1), dtype=torch.float64), torch.zeros((0, L), dtype=torch.long)
    rs, ri = [], []
    for g in gens:
        rs.append(torch.rand(4 * L + 1, generator=g, dtype=torch.float64))
        ri.append(torch.randint(n_table, (L,), generator=g))
    return torch.stack(rs), torch.stack(ri)


def _exact_targets(m: torch.Tensor, cfg: MaskingConfig, coin: torch.Tensor) -> torch.Tensor:
    """Per row rate * maskable, rounded STOCHASTICALLY (floor + Bernoulli(fraction)), capped by max_predictions.

    Plain round() is biased by up to half a token per row, always the same way for rows of the same
    length: 0.05 * 126 maskable rounds to 6 = 4.76%. Stochastic rounding is exact in expectation and
    never more than one token from round().
    """
    x = m.double() * cfg.rate
    n = torch.floor(x).long()
    n = torch.minimum(n + (coin < (x - n)).long(), m)
    if cfg.max_predictions is not None:
        n = torch.clamp(n, max=cfg.max_predictions)
    return n


def _word_starts(ids: torch.Tensor, maskable: torch.Tensor, continuation) -> torch.Tensor:
    if continuation is None:
        raise StudyError("whole_word / span masking needs the tokenizer's continuation mask",
                         field="masking.unit", allowed="token (or pass `continuation`)")
    cont = torch.as_tensor(continuation, dtype=torch.bool)
    if ids.numel() and cont.numel() <= int(ids.max()):
        raise StudyError(f"continuation mask covers {cont.numel()} ids but the batch holds id {int(ids.max())}",
                         field="tokenizer.vocab_size", allowed="the tokenizer the instances were built with")
    prev = torch.zeros_like(maskable)
    prev[:, 1:] = maskable[:, :-1]
    return maskable & ~(cont[ids] & prev)


# --------------------------------------------------------------------------- selection per unit
# Each returns slots [B, L]: row * L + k for the row's k-th unit, -1 where nothing is selected.
def _select_token(maskable, cfg, R):
    B, L = maskable.shape
    scores = R[:, :L]
    if cfg.count == "bernoulli":
        selected = (scores < cfg.rate) & maskable
        if cfg.max_predictions is not None:   # the cap holds in every count mode (as in BERT)
            keyed = torch.where(selected, scores, torch.full_like(scores, 2.0))
            selected &= keyed.argsort(dim=1).argsort(dim=1) < cfg.max_predictions
    else:
        n_sel = _exact_targets(maskable.sum(dim=1), cfg, R[:, 4 * L])
        # lowest random scores among maskable positions win: rank via a double argsort
        keyed = torch.where(maskable, scores, torch.full_like(scores, 2.0))
        selected = keyed.argsort(dim=1).argsort(dim=1) < n_sel.unsqueeze(1)
    slot = torch.arange(B * L).view(B, L)
    return torch.where(selected, slot, torch.full_like(slot, -1))


def _select_whole_word(ids, maskable, cfg, continuation, R):
    B, L = ids.shape
    start = _word_starts(ids, maskable, continuation)
    flat_start = start.reshape(-1)
    wid = torch.cumsum(flat_start.long(), 0) - 1                   # word index of every position
    wid = torch.where(maskable.reshape(-1), wid, torch.full_like(wid, -1))
    n_words = int(flat_start.sum())
    if n_words == 0:
        return torch.full((B, L), -1, dtype=torch.long)
    w_row = torch.div(torch.nonzero(flat_start).squeeze(1), L, rounding_mode="floor")
    per_row = torch.bincount(w_row, minlength=B)
    first = torch.cumsum(per_row, 0) - per_row                      # first word index of each row
    w_k = torch.arange(n_words) - first[w_row]                      # word index inside its row (< L)
    w_len = torch.bincount(wid[wid >= 0], minlength=n_words)
    key = R[w_row, 2 * L + w_k]
    order = torch.argsort(w_row.double() + key)                     # by row, random order inside a row
    lens, row_sorted = w_len[order], w_row[order]

    def taken_in_row(x):  # running sum of x within each row, in `order`
        cs = torch.cumsum(x, 0)
        return cs - torch.cat([torch.zeros(1, dtype=cs.dtype), cs])[first[row_sorted]]

    if cfg.count == "bernoulli":
        take = key[order] < cfg.rate
        if cfg.max_predictions is not None:   # the cap holds in every count mode (as in BERT)
            take &= taken_in_row(torch.where(take, lens, 0)) <= cfg.max_predictions
    else:
        # the target stays real-valued: the crossing-word coin below makes the count exact in expectation
        target = maskable.sum(dim=1).double() * cfg.rate
        if cfg.max_predictions is not None:
            target = torch.clamp(target, max=float(cfg.max_predictions))
        t = target[row_sorted]
        after = taken_in_row(lens)                                 # tokens taken up to and with this word
        before = after - lens
        crossing = (before < t) & (after > t)
        if cfg.max_predictions is not None:                        # the cap is a hard limit
            crossing &= after <= cfg.max_predictions
        coin = R[w_row, 3 * L + w_k][order]
        take = (after <= t) | (crossing & (coin * lens < (t - before)))
    chosen = torch.zeros(n_words, dtype=torch.bool)
    chosen[order] = take
    slot = w_row * L + w_k
    sel = wid >= 0
    out = torch.full((B * L,), -1, dtype=torch.long)
    pick = sel.clone()
    pick[sel] = chosen[wid[sel]]
    out[pick] = slot[wid[pick]]
    return out.view(B, L)


def clipped_geometric_pmf(p: float, m: int) -> np.ndarray:
    """P(len = k), k = 1..m, for len = min(Geometric(p), m)."""
    k = np.arange(1, m + 1)
    pmf = p * (1 - p) ** (k - 1)
    pmf[-1] = (1 - p) ** (m - 1)
    return pmf


def clipped_geometric_mean(p: float, m: int) -> float:
    """E[min(G, m)] = sum_{k<m} P(G > k) = (1 - (1-p)^m) / p."""
    return (1 - (1 - p) ** m) / p


class _Uniforms:
    """Uniforms from a torch generator, drawn in blocks (one torch call per 64 draws)."""

    def __init__(self, g: torch.Generator):
        self.g, self.buf, self.i = g, [], 0

    def __call__(self) -> float:
        if self.i >= len(self.buf):
            self.buf = torch.rand(64, generator=self.g, dtype=torch.float64).tolist()
            self.i = 0
        self.i += 1
        return self.buf[self.i - 1]


def _select_span(ids, maskable, cfg, continuation, R, gens):
    B, L = ids.shape
    start = _word_starts(ids, maskable, continuation)
    slots = np.full((B, L), -1, dtype=np.int64)   # numpy: per-span torch slicing costs ~5 µs each
    pmf = clipped_geometric_pmf(cfg.span_p, cfg.span_max)
    cdf = np.cumsum(pmf).tolist()
    ks = np.arange(1, cfg.span_max + 1)
    start_np, mask_np, R_np = start.numpy(), maskable.numpy(), R.numpy()
    shared = _Uniforms(gens) if isinstance(gens, torch.Generator) else None
    for r in range(B):
        pos = np.nonzero(start_np[r])[0]                          # word start positions
        W = len(pos)
        if W == 0:
            continue
        u = shared or _Uniforms(gens[r])
        wid = np.cumsum(start_np[r]) - 1
        w_end = pos + np.bincount(wid[mask_np[r]], minlength=W)   # a word's pieces are contiguous
        # words i and i+1 can share a span only when nothing unmaskable ([SEP], [PAD]) lies between
        joined = np.append(w_end[:-1] == pos[1:], False)
        free = np.ones(W, dtype=bool)
        if cfg.count == "bernoulli":
            R_words = float(np.sum(R_np[r, 2 * L:2 * L + W] < cfg.rate))  # Binomial(W, rate) words
        else:
            R_words = cfg.rate * W
        cap = cfg.max_predictions if cfg.max_predictions is not None else L
        taken_tok, k = 0, 0
        idx = np.arange(W)
        while R_words > 0 and taken_tok < cap:
            # fit[i] = number of consecutive free, joined words starting at word i (0 if i is taken)
            chain = free & joined & np.append(free[1:], False)     # word i's span may go on to i+1
            stops = np.nonzero(~chain)[0]                           # last word of each chain
            fit = np.where(free, stops[np.searchsorted(stops, idx)] - idx + 1, 0)
            longest = int(fit.max())
            if longest == 0:
                break
            # E[(placed length - R)+]; a span longer than every free run is cut to the longest one
            over = float(np.sum(np.maximum(np.minimum(ks, longest) - R_words, 0) * pmf))
            if u() >= R_words / (R_words + over):                   # decided before seeing the length
                break
            length = min(bisect.bisect_right(cdf, u()) + 1, cfg.span_max, longest)
            anchors = np.nonzero(fit >= length)[0]
            a = int(anchors[min(int(u() * len(anchors)), len(anchors) - 1)])
            t0, t1 = int(pos[a]), int(w_end[a + length - 1])
            if taken_tok + (t1 - t0) > cap:                        # max_predictions is a hard limit:
                ends = w_end[a:a + length]                         # keep whole words up to the cap
                n_fit = int(np.searchsorted(ends - t0, cap - taken_tok, side="right"))
                if n_fit == 0:
                    break
                length, t1 = n_fit, int(ends[n_fit - 1])
            free[a:a + length] = False
            slots[r, t0:t1] = r * L + k
            k += 1
            taken_tok += t1 - t0
            R_words -= length
    return torch.from_numpy(slots)


# --------------------------------------------------------------------------- the engine
def _mask(input_ids: torch.Tensor, cfg: MaskingConfig, special: SpecialIds, continuation, gens):
    ids = input_ids.long()
    B, L = ids.shape
    table = _non_special_table(special)
    R, rand_idx = _draws(B, L, len(table), gens)
    maskable = _maskable(ids, special)
    if cfg.unit == "token":
        slot = _select_token(maskable, cfg, R)
    elif cfg.unit == "whole_word":
        slot = _select_whole_word(ids, maskable, cfg, continuation, R)
    elif cfg.unit == "span":
        slot = _select_span(ids, maskable, cfg, continuation, R, gens)
    else:
        raise StudyError(f"unknown masking unit {cfg.unit!r}", field="masking.unit",
                         allowed="token, whole_word, span")
    selected = slot >= 0
    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE))
    u = R[:, L:2 * L].reshape(-1)[slot.clamp(min=0)]               # one split draw per unit
    to_mask = selected & (u < cfg.mask)
    to_random = selected & (u >= cfg.mask) & (u < cfg.mask + cfg.random)
    inputs = ids.clone()
    inputs[to_mask] = special.mask
    inputs[to_random] = table[rand_idx[to_random]]
    return inputs, labels, slot


def mask_units(input_ids: torch.Tensor, cfg: MaskingConfig, special: SpecialIds,
               continuation, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, labels, units): mask_tokens plus, at every selected position, its unit's id
    (row * L + k for the row's k-th token / word / span; unique, not contiguous), -1 elsewhere."""
    return _mask(input_ids, cfg, special, continuation, generator)


def select_units(input_ids: torch.Tensor, cfg: MaskingConfig, special: SpecialIds,
                 continuation, generator: torch.Generator) -> torch.Tensor:
    """The units of mask_units alone (tests and diagnostics)."""
    return _mask(input_ids, cfg, special, continuation, generator)[2]


def mask_tokens(input_ids: torch.Tensor, cfg: MaskingConfig, special: SpecialIds,
                continuation: torch.Tensor | None, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (inputs, labels); labels hold the original id at selected positions, -100 elsewhere."""
    inputs, labels, _ = _mask(input_ids, cfg, special, continuation, generator)
    return inputs, labels


def row_generator(key) -> torch.Generator:
    """A generator that depends only on `key` (a tuple of ints): no global RNG, no batch coupling."""
    state = np.random.SeedSequence([int(k) for k in key]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def mask_rows(input_ids: torch.Tensor, cfg: MaskingConfig, special: SpecialIds,
              continuation: torch.Tensor | None, row_keys) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask each row with its own generator seeded by its key, e.g. (run seed, instance index, epoch).

    A row's mask then depends only on (key, ids): batch size, order and sharding (DDP) cannot change
    it, static masking is "same key every epoch" and dynamic masking is "epoch in the key". Row i
    equals mask_tokens(row i, row_generator(key i)); only the random draws are made per row.
    """
    gens = [row_generator(k) for k in row_keys]
    if len(gens) != len(input_ids):
        raise ValueError(f"{len(input_ids)} rows but {len(gens)} keys")
    inputs, labels, _ = _mask(input_ids, cfg, special, continuation, gens)
    return inputs, labels


def reference_masking(input_ids: torch.Tensor, special: SpecialIds, instance_index: torch.Tensor,
                      generator_seed: int = REFERENCE_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """Evaluation masks that depend only on (seed, instance index, ids): batch order/size cannot change them."""
    return mask_rows(input_ids, REFERENCE, special, None,
                     [(generator_seed, int(i)) for i in instance_index.tolist()])
