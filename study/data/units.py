"""Which positions the masks select, per `masking.unit`: tokens, whole words, spans (SpanBERT). The draws
come from the engine (study/data/masking.py), which then applies the mask/random/keep split per unit.

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
"""

from __future__ import annotations

import bisect
import functools

import numpy as np
import torch

from study.config import MaskingConfig
from study.data import counter
from study.data.counter import SCORE, WORD_COIN, WORD_KEY
from study.errors import StudyError


def select(ids: torch.Tensor, maskable: torch.Tensor, cfg: MaskingConfig, continuation, D) -> torch.Tensor:
    """Slots [B, L] of cfg.unit's units: row * L + k at the positions of the row's k-th selected unit, -1
    elsewhere. D: the engine's draws (study/data/masking.py), from counter keys or torch generators."""
    if cfg.unit == "token":
        return _select_token(maskable, cfg, D)
    if cfg.unit == "whole_word":
        return _select_whole_word(ids, maskable, cfg, continuation, D)
    if cfg.unit == "span":
        start = _word_starts(ids, maskable, continuation)
        return (_select_span_rounds if isinstance(D, counter.CounterDraws) else _select_span_loop)(
            start, maskable, cfg, D
        )
    raise StudyError(
        f"unknown masking unit {cfg.unit!r}", field="masking.unit", allowed="token, whole_word, span"
    )


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


def check_continuation(n_ids: int, max_id: int) -> None:
    if n_ids <= max_id:
        raise StudyError(
            f"continuation mask covers {n_ids} ids but the batch holds id {max_id}",
            field="tokenizer.vocab_size",
            allowed="the tokenizer the instances were built with",
        )


def _word_starts(ids: torch.Tensor, maskable: torch.Tensor, continuation) -> torch.Tensor:
    if continuation is None:
        raise StudyError(
            "whole_word / span masking needs the tokenizer's continuation mask",
            field="masking.unit",
            allowed="token (or pass `continuation`)",
        )
    cont = torch.as_tensor(continuation, dtype=torch.bool, device=ids.device)
    if ids.numel() and ids.device.type == "cpu":  # elsewhere a host read: Batches checks each epoch once
        check_continuation(cont.numel(), int(ids.max()))
    prev = torch.zeros_like(maskable)
    prev[:, 1:] = maskable[:, :-1]
    return maskable & ~(cont[ids] & prev)


def _rank(keys: torch.Tensor) -> torch.Tensor:
    """Rank of each entry within its row, ascending, ties by position (a stable sort: one answer on any device)."""
    order = torch.sort(keys, dim=1, stable=True).indices
    k = torch.arange(keys.shape[1], device=keys.device).expand_as(order).contiguous()
    return torch.empty_like(order).scatter_(1, order, k)


# --------------------------------------------------------------------------- selection per unit
# Each returns slots [B, L]: row * L + k for the row's k-th unit, -1 where nothing is selected.
def _select_token(maskable, cfg, D):
    B, L = maskable.shape
    scores = D.u(SCORE)
    if cfg.count == "bernoulli":
        selected = (scores < cfg.rate) & maskable
        if cfg.max_predictions is not None:  # the cap holds in every count mode (as in BERT)
            selected &= _rank(torch.where(selected, scores, 2.0)) < cfg.max_predictions
    else:
        n_sel = _exact_targets(maskable.sum(dim=1), cfg, D.coin())
        # lowest random scores among maskable positions win
        selected = _rank(torch.where(maskable, scores, 2.0)) < n_sel.unsqueeze(1)
    slot = torch.arange(B * L, device=maskable.device).view(B, L)
    return torch.where(selected, slot, -1)


def _words(start: torch.Tensor, maskable: torch.Tensor):
    """Per row, word slots k < L: (word of each position, words per row, valid slot [B, L], word lengths [B, L])."""
    B, L = start.shape
    k = torch.arange(L, device=start.device)
    wk = torch.cumsum(start, 1) - 1  # meaningful on maskable positions
    n_words = start.sum(1)
    w_len = torch.zeros(B, L + 1, dtype=torch.int64, device=start.device).scatter_add_(
        1, torch.where(maskable, wk, L), maskable.long()
    )[:, :L]  # column L collects the rest
    return wk, n_words, k < n_words.unsqueeze(1), w_len


def _select_whole_word(ids, maskable, cfg, continuation, D):
    B, L = ids.shape
    start = _word_starts(ids, maskable, continuation)
    wk, _, valid, w_len = _words(start, maskable)
    key = torch.where(valid, D.u(WORD_KEY), 2.0)
    order = torch.sort(key, dim=1, stable=True).indices  # each row's words in random order
    lens = w_len.gather(1, order)  # (the row's words first: valid in place)
    if cfg.count == "bernoulli":
        take = key.gather(1, order) < cfg.rate
        if cfg.max_predictions is not None:  # the cap holds in every count mode (as in BERT)
            take &= torch.cumsum(torch.where(take, lens, 0), 1) <= cfg.max_predictions
    else:
        # the target stays real-valued: the crossing-word coin below makes the count exact in expectation
        t = maskable.sum(dim=1).double() * cfg.rate
        if cfg.max_predictions is not None:
            t = torch.clamp(t, max=float(cfg.max_predictions))
        t = t.unsqueeze(1)
        after = torch.cumsum(lens, 1)  # tokens taken up to and with this word
        before = after - lens
        crossing = (before < t) & (after > t)
        if cfg.max_predictions is not None:  # the cap is a hard limit
            crossing &= after <= cfg.max_predictions
        coin = D.u(WORD_COIN).gather(1, order)
        take = ((after <= t) | (crossing & (coin * lens < (t - before)))) & valid
    chosen = torch.zeros_like(valid).scatter_(1, order, take)
    sel = maskable & chosen.gather(1, wk.clamp(min=0))
    slot = torch.arange(B, device=ids.device).unsqueeze(1) * L + wk
    return torch.where(sel, slot, -1)


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


def _select_span_loop(start, maskable, cfg, D):
    """Spans, generator "numpy": a Python loop per row and per span, drawing on from the row's generator
    (D: masking.py's generator draws, their block R and generators gens)."""
    B, L = start.shape
    slots = np.full((B, L), -1, dtype=np.int64)  # numpy: per-span torch slicing costs ~5 µs each
    pmf = clipped_geometric_pmf(cfg.span_p, cfg.span_max)
    cdf = np.cumsum(pmf).tolist()
    ks = np.arange(1, cfg.span_max + 1)
    start_np, mask_np, R_np = start.cpu().numpy(), maskable.cpu().numpy(), D.R.cpu().numpy()
    shared = _Uniforms(D.gens) if isinstance(D.gens, torch.Generator) else None
    for r in range(B):
        pos = np.nonzero(start_np[r])[0]  # word start positions
        W = len(pos)
        if W == 0:
            continue
        u = shared or _Uniforms(D.gens[r])
        wid = np.cumsum(start_np[r]) - 1
        w_end = pos + np.bincount(wid[mask_np[r]], minlength=W)  # a word's pieces are contiguous
        # words i and i+1 can share a span only when nothing unmaskable ([SEP], [PAD]) lies between
        joined = np.append(w_end[:-1] == pos[1:], False)
        free = np.ones(W, dtype=bool)
        if cfg.count == "bernoulli":
            R_words = float(np.sum(R_np[r, 2 * L : 2 * L + W] < cfg.rate))  # Binomial(W, rate) words
        else:
            R_words = cfg.rate * W
        cap = cfg.max_predictions if cfg.max_predictions is not None else L
        taken_tok, k = 0, 0
        idx = np.arange(W)
        while R_words > 0 and taken_tok < cap:
            # fit[i] = number of consecutive free, joined words starting at word i (0 if i is taken)
            chain = free & joined & np.append(free[1:], False)  # word i's span may go on to i+1
            stops = np.nonzero(~chain)[0]  # last word of each chain
            fit = np.where(free, stops[np.searchsorted(stops, idx)] - idx + 1, 0)
            longest = int(fit.max())
            if longest == 0:
                break
            # E[(placed length - R)+]; a span longer than every free run is cut to the longest one
            over = float(np.sum(np.maximum(np.minimum(ks, longest) - R_words, 0) * pmf))
            if u() >= R_words / (R_words + over):  # decided before seeing the length
                break
            length = min(bisect.bisect_right(cdf, u()) + 1, cfg.span_max, longest)
            anchors = np.nonzero(fit >= length)[0]
            a = int(anchors[min(int(u() * len(anchors)), len(anchors) - 1)])
            t0, t1 = int(pos[a]), int(w_end[a + length - 1])
            if taken_tok + (t1 - t0) > cap:  # max_predictions is a hard limit:
                ends = w_end[a : a + length]  # keep whole words up to the cap
                n_fit = int(np.searchsorted(ends - t0, cap - taken_tok, side="right"))
                if n_fit == 0:
                    break
                length, t1 = n_fit, int(ends[n_fit - 1])
            free[a : a + length] = False
            slots[r, t0:t1] = r * L + k
            k += 1
            taken_tok += t1 - t0
            R_words -= length
    return torch.from_numpy(slots).to(start.device)


@functools.lru_cache(maxsize=16)
def _span_tables(p: float, m_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cdf of the clipped length and, for X_m = min(length, m), m = 0..m_max, j = 0..m_max,
    A[m, j] = P(X_m > j) and Bt[m, j] = E[X_m; X_m > j]: E[(X_m - R)+] = Bt[m, j] - R * A[m, j], j = floor(R)."""
    pmf = clipped_geometric_pmf(p, m_max)
    A, Bt = np.zeros((m_max + 1, m_max + 1)), np.zeros((m_max + 1, m_max + 1))
    for m in range(1, m_max + 1):
        q = pmf[:m].copy()
        q[m - 1] = pmf[m - 1 :].sum()
        k = np.arange(1, m + 1)
        A[m, :m] = np.cumsum(q[::-1])[::-1]  # column j sums k >= j + 1
        Bt[m, :m] = np.cumsum((k * q)[::-1])[::-1]
    return np.cumsum(pmf), A.reshape(-1), Bt.reshape(-1)


def _select_span_rounds(start, maskable, cfg, D: counter.CounterDraws):
    """Spans, generator "counter": the rule of _select_span_loop for all rows at once, one round per span.

    In round t every row still placing spans reads three draws (go on?, length, anchor) at counters
    3t..3t+2 of its SPAN stream, so a row's spans depend on its key and ids only; rows that stop never
    restart. The expected overshoot is read from tables (a gather and a multiply: the same bits on CPU and
    CUDA, which a float sum over the lengths would not promise)."""
    B, L = start.shape
    dev = start.device
    wk, n_words, valid, w_len = _words(start, maskable)
    k = torch.arange(L, device=dev)
    pos = torch.full((B, L + 1), L, dtype=torch.int64, device=dev).scatter_(
        1, torch.where(start, wk, L), k.expand(B, L).contiguous()
    )[:, :L]  # first position of word k
    w_end = pos + w_len
    joined = torch.zeros_like(valid)  # words k, k+1 may share a span: nothing unmaskable between
    joined[:, :-1] = (w_end[:, :-1] == pos[:, 1:]) & valid[:, 1:]
    free = valid.clone()
    if cfg.count == "bernoulli":  # Binomial(W, rate) words
        budget = ((D.u(counter.SPAN_BUDGET) < cfg.rate) & valid).sum(1).double()
    else:
        budget = n_words.double() * cfg.rate
    cdf, A, Bt = (torch.as_tensor(t, device=dev) for t in _span_tables(cfg.span_p, cfg.span_max))
    cap = cfg.max_predictions if cfg.max_predictions is not None else L
    taken = torch.zeros(B, dtype=torch.int64, device=dev)
    n_spans = torch.zeros(B, dtype=torch.int64, device=dev)
    active = n_words > 0
    slots = torch.full((B, L), -1, dtype=torch.int64, device=dev)
    row_base = (torch.arange(B, device=dev) * L).unsqueeze(1)
    three = torch.arange(3, device=dev)
    check = 1 if dev.type == "cpu" else 4  # rounds between host reads of `active` (extra rounds are no-ops)
    for t in range(L):
        if t % check == 0 and not bool(active.any()):
            break
        # fit[i] = consecutive free, joined words from word i on (0 if i is taken) = next stop - i + 1
        nxt_free = torch.zeros_like(free)
        nxt_free[:, :-1] = free[:, 1:]
        stop = torch.where(free & joined & nxt_free, L, k)
        fit = torch.where(free, torch.cummin(stop.flip(1), 1).values.flip(1) - k + 1, 0)
        longest = fit.amax(1)
        # E[(placed length - R)+]; a span longer than every free run is cut to the longest one
        cell = (
            longest.clamp(max=cfg.span_max) * (cfg.span_max + 1)
            + budget.floor().clamp(0, cfg.span_max).long()
        )
        over = Bt[cell] - budget * A[cell]
        u = counter.uniform(counter.bits(D.keys, counter.SPAN, 3 * t + three))
        active &= (budget > 0) & (taken < cap) & (longest > 0) & (u[:, 0] * (budget + over) < budget)
        length = torch.minimum(torch.searchsorted(cdf, u[:, 1].contiguous(), right=True) + 1, longest)
        length = length.clamp(max=cfg.span_max).unsqueeze(1)
        ok = fit >= length
        n_ok = ok.sum(1, keepdim=True)
        pick = torch.minimum((u[:, 2:] * n_ok).floor().long(), n_ok - 1)
        a = (torch.cumsum(ok, 1) <= pick).sum(1, keepdim=True).clamp(max=L - 1)  # the pick-th anchor
        t0 = pos.gather(1, a)
        # max_predictions is a hard limit: keep whole words up to the cap (all of them when the span fits)
        placed = (k >= a) & (k < a + length) & (w_end - t0 <= cap - taken.unsqueeze(1))
        length = placed.sum(1, keepdim=True)
        active &= length.squeeze(1) > 0
        t1 = w_end.gather(1, (a + length - 1).clamp(min=0))
        on = active.unsqueeze(1)
        free &= ~(placed & on)
        slots = torch.where((k >= t0) & (k < t1) & on, row_base + n_spans.unsqueeze(1), slots)
        budget = budget - torch.where(active, length.squeeze(1), 0)
        taken += torch.where(active, (t1 - t0).squeeze(1), 0)
        n_spans += active.long()
    return slots
