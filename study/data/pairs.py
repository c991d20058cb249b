"""The pair formats' cuts (objective.format segment_pair, sentence_pair): which token ranges of a split
become A and B, with which sentence label, and BERT's truncate_seq_pair. The rules, and where they differ
from BERT's create_pretraining_data, are in study/data/instances.py's docstring; instances.py fills the rows.
"""

from __future__ import annotations

import numpy as np

from study.config import ObjectiveConfig
from study.data.tokens import TokenizedSplit
from study.errors import StudyError


class _Draws:
    """Uniform draws pulled from a buffer: scalar Generator calls cost ~1 µs each, a buffer ~10 ns."""

    def __init__(self, rng: np.random.Generator, block: int = 8192):
        self.rng, self.block = rng, block
        self.buf: list[float] = []
        self.i = 0

    def u(self) -> float:
        if self.i >= len(self.buf):
            self.buf = self.rng.random(self.block).tolist()
            self.i = 0
        self.i += 1
        return self.buf[self.i - 1]

    def randint(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi], both inclusive (Python's random.randint)."""
        return lo + min(int(self.u() * (hi - lo + 1)), hi - lo)


def truncation_counts(la: int, lb: int, max_tokens: int) -> tuple[int, int]:
    """How many tokens BERT's truncate_seq_pair removes from A and from B.

    Its loop removes one token from the longer segment (B on ties) until the pair fits; the
    counts follow in closed form, so we never loop per token. (The test checks it against the loop.)
    """
    excess = la + lb - max_tokens
    if excess <= 0:
        return 0, 0
    if la > lb:
        d = la - lb
        if d >= excess:
            return excess, 0
        e = excess - d
        return d + e // 2, (e + 1) // 2
    d = lb - la
    if d >= excess:
        return 0, excess
    e = excess - d
    return e // 2, d + (e + 1) // 2


# --------------------------------------------------------------------------- pair formats
class _PairCutter:
    """Token ranges of A and B for segment_pair / sentence_pair, one Python step per sentence: `rec` holds
    (a0, a1, b0, b1, label, b_doc) per row, the token ranges of the row's A and B before truncation. Every
    draw comes from one _Draws in a fixed order, so the rows are a function of the seed."""

    def __init__(
        self, split: TokenizedSplit, obj: ObjectiveConfig, rng: np.random.Generator, docs: list[int]
    ):
        draws = _Draws(rng)
        self.u, self.randint = draws.u, draws.randint
        self.T = split.sent_starts.tolist()  # Python ints: scalar numpy indexing is ~10x slower
        self.dstart = split.doc_starts.tolist()
        self.docs = docs
        self.doc_pos = {d: k for k, d in enumerate(self.docs)}
        self.max_tokens = obj.max_seq_len - 3
        self.short_seq_prob = obj.short_seq_prob
        self.nsp, self.sop = obj.sentence == "nsp", obj.sentence == "sop"
        self.rec: list[tuple] = []

    def other_doc(self, d: int) -> int:
        r = self.randint(0, len(self.docs) - 2)
        return self.docs[r + 1] if r >= self.doc_pos[d] else self.docs[r]

    def target_len(self) -> int:
        if self.short_seq_prob > 0 and self.u() < self.short_seq_prob:
            return self.randint(2, self.max_tokens)
        return self.max_tokens

    def emit(self, d: int, a0: int, a1: int, c0: int, c1: int, random_b: tuple | None) -> None:
        # A = [a0, a1), its continuation = [c0, c1); random_b = (b0, b1, doc) when NotNext
        if random_b is not None:
            self.rec.append((a0, a1, random_b[0], random_b[1], 1, random_b[2]))
        elif self.sop and self.u() < 0.5:
            self.rec.append((c0, c1, a0, a1, 1, d))  # swapped: the later segment comes first
        else:
            self.rec.append((a0, a1, c0, c1, 0 if (self.nsp or self.sop) else -1, d))

    def split_sentence(self, s: int) -> tuple[int, int, int, int] | None:
        # one sentence must provide both A and B: cut it at a random token (a true continuation)
        T = self.T
        n = T[s + 1] - T[s]
        if n < 2:
            return None
        k = self.randint(1, n - 1)
        return T[s], T[s] + k, T[s] + k, T[s + 1]

    def random_segment(self, d: int, target_b: int) -> tuple[int, int, int]:
        """NotNext B (segment_pair): sentences of another document from a random one on, until they reach
        target_b tokens or the document ends; (b0, b1, doc)."""
        T, dstart = self.T, self.dstart
        rd = self.other_doc(d)
        rs = self.randint(dstart[rd], dstart[rd + 1] - 1)
        j, blen = rs, 0
        while j < dstart[rd + 1]:
            blen += T[j + 1] - T[j]
            j += 1
            if blen >= target_b:
                break
        return T[rs], T[j], rd

    def segment_doc(self, d: int) -> None:
        """segment_pair: sentences fill a chunk up to a target length; A its first a_end sentences."""
        T, u, randint = self.T, self.u, self.randint
        first, last = self.dstart[d], self.dstart[d + 1]
        target = self.target_len()
        c_start, cur, i = first, 0, first
        while i < last:
            cur += T[i + 1] - T[i]
            if i == last - 1 or cur >= target:
                n = i - c_start + 1
                random_next = self.nsp and u() < 0.5
                if n >= 2:
                    a_end = c_start + randint(1, n - 1)
                    cut = (T[c_start], T[a_end], T[a_end], T[i + 1])
                else:
                    cut = self.split_sentence(c_start)  # None: a 1-token sentence, nothing to pair
                if cut is not None:
                    a0, a1, c0, c1 = cut
                    random_b = None
                    if random_next:
                        random_b = self.random_segment(d, target - (a1 - a0))
                        if n >= 2:
                            i = a_end - 1  # put the unused sentences back (BERT: i -= unused)
                    self.emit(d, a0, a1, c0, c1, random_b)
                target = self.target_len()
                c_start, cur = i + 1, 0
            i += 1

    def sentence_doc(self, d: int) -> None:
        """sentence_pair: one natural sentence per segment."""
        T, dstart = self.T, self.dstart
        i, last = dstart[d], dstart[d + 1]
        while i < last:
            if self.nsp and self.u() < 0.5:
                rd = self.other_doc(d)
                rs = self.randint(dstart[rd], dstart[rd + 1] - 1)
                self.emit(d, T[i], T[i + 1], -1, -1, (T[rs], T[rs + 1], rd))
                i += 1  # B came from elsewhere: the next sentence stays
            elif i + 1 < last:
                self.emit(d, T[i], T[i + 1], T[i + 1], T[i + 2], None)
                i += 2
            else:
                cut = self.split_sentence(i)
                if cut is not None:
                    self.emit(d, *cut, None)
                i += 1


def pair_spans(
    split: TokenizedSplit, obj: ObjectiveConfig, rng: np.random.Generator, docs: list[int]
) -> dict:
    """Token ranges of A and B for segment_pair / sentence_pair over the non-empty documents `docs`, each
    pair then truncated as BERT does: a_span, b_span (in the row), a_full, b_full, sentence_label, b_doc."""
    cutter = _PairCutter(split, obj, rng, docs)
    cut_doc = cutter.segment_doc if obj.format == "segment_pair" else cutter.sentence_doc
    for d in cutter.docs:
        cut_doc(d)
    if not cutter.rec:
        raise StudyError(
            "no pair instance could be built (every document is a single 1-token sentence)",
            field="corpus.sources",
            allowed="documents with at least 2 tokens",
        )
    return _truncate(np.asarray(cutter.rec, dtype=np.int64), cutter.max_tokens, rng)


def _truncate(arr: np.ndarray, max_tokens: int, rng: np.random.Generator) -> dict:
    """BERT's truncate_seq_pair on rows of (a0, a1, b0, b1, label, b_doc): counts in closed form, each
    removed token from the front w.p. 1/2 (drawn after every cut above, from the same generator)."""
    a_full, b_full = arr[:, 0:2].copy(), arr[:, 2:4].copy()
    la, lb = a_full[:, 1] - a_full[:, 0], b_full[:, 1] - b_full[:, 0]
    cuts = np.array(
        [truncation_counts(x, y, max_tokens) for x, y in zip(la.tolist(), lb.tolist(), strict=True)],
        dtype=np.int64,
    ).reshape(-1, 2)
    front_a = rng.binomial(cuts[:, 0], 0.5)
    front_b = rng.binomial(cuts[:, 1], 0.5)
    a_span = np.stack([a_full[:, 0] + front_a, a_full[:, 1] - (cuts[:, 0] - front_a)], axis=1)
    b_span = np.stack([b_full[:, 0] + front_b, b_full[:, 1] - (cuts[:, 1] - front_b)], axis=1)
    return dict(
        a_span=a_span,
        b_span=b_span,
        a_full=a_full,
        b_full=b_full,
        sentence_label=arr[:, 4].astype(np.int8),
        b_doc=arr[:, 5].astype(np.int32),
    )
