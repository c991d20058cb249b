"""Pre-training instances: cut a tokenized split into fixed-width rows per objective format.

Rows are ``[CLS] A [SEP] B [SEP]`` (pair formats) or ``[CLS] X [SEP]`` (packed formats),
padded with [PAD] to ``max_seq_len``. Every segment is a contiguous range of ``split.ids``
(sentences of one document are stored back to back), so an instance is described by
token offsets and the rows are filled with one vectorized gather at the end.

Formats (`objective.format` x `objective.sentence`):
- segment_pair + nsp: BERT's create_pretraining_data. Sentences fill a chunk up to a target
  length (max_seq_len - 3, or with prob short_seq_prob a random 2..max); A = the first
  a_end sentences, B = the rest (IsNext) or, 50%, sentences from a random OTHER document
  with the unused sentences put back; the longer segment is truncated from a random end.
  Deliberate differences, each so the sentence task measures what it claims:
    * the coin is flipped for every chunk. BERT forces NotNext for a one-sentence chunk, which
      makes IsNext < 50% on corpora with long sentences; we split that sentence at a random
      token instead (A = its head, B = its tail: a true continuation).
    * the "other document" is drawn uniformly among the other non-empty documents; BERT's
      10 tries can return the same document.
    * the short target is redrawn per chunk. BERT draws it once per document, which its own
      comment calls "10% of the time": on book-length documents a per-document draw would make
      whole books short.
- segment_pair + none: the same pairs, always the true continuation, label -1.
- segment_pair + sop: ALBERT: A, B consecutive segments of one document, swapped 50% (label 1).
- sentence_pair (+ nsp / sop / none): RoBERTa SENTENCE-PAIR: A is one natural sentence, B the
  next one or (NotNext) a random sentence of another document.
- full_sentences: the documents' tokens back to back with one [SEP] between documents, cut into
  blocks of max_seq_len - 2; the block grid starts at a random offset (seeded), so only the first
  and last blocks are short. A block never starts or ends on a document separator.
- doc_sentences: each document cut into blocks of max_seq_len - 2 that never cross it; the
  slack of the last block is moved to a random place (seeded), so cut points depend on the seed.

Randomness: one np.random.Generator per (seed, epoch, copy) from a SeedSequence: same seed ->
byte-identical instances, no global RNG. Instances come out in corpus order; the trainer shuffles.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from study.config import ObjectiveConfig
from study.data.tokens import SpecialIds, TokenizedSplit
from study.errors import StudyError

REFERENCE_SEED = 1234
_TAG = 0x1257  # keeps instance streams apart from other streams derived from the same run seed


@dataclass(frozen=True)
class Instances:
    input_ids: np.ndarray  # int32 [N, L], [PAD]-padded
    token_type_ids: np.ndarray  # int8  [N, L], 1 on B and its closing [SEP]
    lengths: np.ndarray  # int32 [N]   non-pad tokens
    sentence_label: np.ndarray  # int8  [N]   NSP 0=IsNext 1=NotNext; SOP 0=in order 1=swapped; -1 none
    # diagnostics (token offsets into split.ids, [start, end)); B fields are -1 without a B
    a_span: np.ndarray  # int64 [N, 2] tokens of A (or X) as they appear in the row
    b_span: np.ndarray  # int64 [N, 2]
    a_full: np.ndarray  # int64 [N, 2] A before truncation (whole sentences unless a split one)
    b_full: np.ndarray  # int64 [N, 2]
    a_doc: np.ndarray  # int32 [N] document of A's first token
    a_doc_last: np.ndarray  # int32 [N] document of A's last token (differs only in full_sentences)
    b_doc: np.ndarray  # int32 [N]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def max_seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def attention_mask(self) -> np.ndarray:
        """int8 [N, L]: 1 on the first `lengths[i]` positions of row i."""
        return (np.arange(self.max_seq_len)[None, :] < self.lengths[:, None]).astype(np.int8)

    def take(self, index) -> Instances:
        return Instances(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @classmethod
    def concat(cls, parts: list[Instances]) -> Instances:
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)})


# --------------------------------------------------------------------------- helpers
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


def _gather(
    out: np.ndarray, rows: np.ndarray, col0: np.ndarray, src: np.ndarray, starts: np.ndarray, lens: np.ndarray
) -> None:
    """out[rows[i], col0[i] + j] = src[starts[i] + j] for j < lens[i], without a Python loop."""
    lens = lens.astype(np.int64)
    total = int(lens.sum())
    if total == 0:
        return
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    out[np.repeat(rows, lens), np.repeat(col0, lens) + within] = src[np.repeat(starts, lens) + within]


def _doc_of_token(split: TokenizedSplit, tok: np.ndarray) -> np.ndarray:
    doc_tok = split.sent_starts[split.doc_starts]
    # 'right' - 1: the last document starting at or before the token, i.e. the non-empty one holding it
    return (np.searchsorted(doc_tok, tok, side="right") - 1).astype(np.int32)


def _nonempty_docs(split: TokenizedSplit) -> np.ndarray:
    doc_tok = split.sent_starts[split.doc_starts]
    return np.nonzero(np.diff(doc_tok) > 0)[0]


def _rng(seed: int, epoch: int, copy: int) -> np.random.Generator:
    # SeedSequence needs non-negative entropy; the modulo keeps distinct negative seeds distinct
    return np.random.default_rng(np.random.SeedSequence([_TAG, seed % 2**64, epoch % 2**64, copy]))


# --------------------------------------------------------------------------- validation
def _validate(split: TokenizedSplit, obj: ObjectiveConfig) -> None:
    pair = obj.format in ("segment_pair", "sentence_pair")
    need = 5 if pair else 3
    if obj.max_seq_len < need:
        shape = "[CLS] A [SEP] B [SEP]" if pair else "[CLS] X [SEP]"
        raise StudyError(
            f"max_seq_len {obj.max_seq_len} cannot hold {shape} with one token per segment",
            field="objective.max_seq_len",
            allowed=f"an integer >= {max(need, 8)}",
        )
    if split.n_tokens == 0:
        raise StudyError(
            "the tokenized split is empty",
            field="corpus.sources",
            allowed="sources with at least one non-empty document in every split",
        )
    if obj.sentence == "nsp" and len(_nonempty_docs(split)) < 2:
        raise StudyError(
            "NSP draws NotNext segments from another document, but the split has "
            f"{len(_nonempty_docs(split))} non-empty document(s)",
            field="corpus.sources",
            allowed="a corpus with at least 2 documents per split, or objective.sentence: none|sop",
        )


# --------------------------------------------------------------------------- pair formats
def _pairs(split: TokenizedSplit, obj: ObjectiveConfig, rng: np.random.Generator) -> dict:
    """Token ranges of A and B for segment_pair / sentence_pair (one Python step per sentence)."""
    draws = _Draws(rng)
    u, randint = draws.u, draws.randint
    T = split.sent_starts.tolist()  # Python ints: scalar numpy indexing is ~10x slower
    dstart = split.doc_starts.tolist()
    docs = _nonempty_docs(split).tolist()
    doc_pos = {d: k for k, d in enumerate(docs)}
    max_tokens = obj.max_seq_len - 3
    nsp, sop = obj.sentence == "nsp", obj.sentence == "sop"
    segment = obj.format == "segment_pair"
    rec: list[tuple] = []  # (a0, a1, b0, b1, label, b_doc): token ranges of the row's A and B

    def other_doc(d: int) -> int:
        r = randint(0, len(docs) - 2)
        return docs[r + 1] if r >= doc_pos[d] else docs[r]

    def target_len() -> int:
        if obj.short_seq_prob > 0 and u() < obj.short_seq_prob:
            return randint(2, max_tokens)
        return max_tokens

    def emit(d: int, a0: int, a1: int, c0: int, c1: int, random_b: tuple | None) -> None:
        # A = [a0, a1), its continuation = [c0, c1); random_b = (b0, b1, doc) when NotNext
        if random_b is not None:
            rec.append((a0, a1, random_b[0], random_b[1], 1, random_b[2]))
        elif sop and u() < 0.5:
            rec.append((c0, c1, a0, a1, 1, d))  # swapped: the later segment comes first
        else:
            rec.append((a0, a1, c0, c1, 0 if (nsp or sop) else -1, d))

    def split_sentence(s: int) -> tuple[int, int, int, int] | None:
        # one sentence must provide both A and B: cut it at a random token (a true continuation)
        n = T[s + 1] - T[s]
        if n < 2:
            return None
        k = randint(1, n - 1)
        return T[s], T[s] + k, T[s] + k, T[s + 1]

    for d in docs:
        first, last = dstart[d], dstart[d + 1]
        if segment:
            target = target_len()
            c_start, cur, i = first, 0, first
            while i < last:
                cur += T[i + 1] - T[i]
                if i == last - 1 or cur >= target:
                    n = i - c_start + 1
                    random_next = nsp and u() < 0.5
                    if n >= 2:
                        a_end = c_start + randint(1, n - 1)
                        cut = (T[c_start], T[a_end], T[a_end], T[i + 1])
                    else:
                        cut = split_sentence(c_start)  # None: a 1-token sentence, nothing to pair
                    if cut is not None:
                        a0, a1, c0, c1 = cut
                        random_b = None
                        if random_next:
                            target_b = target - (a1 - a0)
                            rd = other_doc(d)
                            rs = randint(dstart[rd], dstart[rd + 1] - 1)
                            j, blen = rs, 0
                            while j < dstart[rd + 1]:
                                blen += T[j + 1] - T[j]
                                j += 1
                                if blen >= target_b:
                                    break
                            random_b = (T[rs], T[j], rd)
                            if n >= 2:
                                i = a_end - 1  # put the unused sentences back (BERT: i -= unused)
                        emit(d, a0, a1, c0, c1, random_b)
                    target = target_len()
                    c_start, cur = i + 1, 0
                i += 1
        else:  # sentence_pair: one natural sentence per segment
            i = first
            while i < last:
                if nsp and u() < 0.5:
                    rd = other_doc(d)
                    rs = randint(dstart[rd], dstart[rd + 1] - 1)
                    emit(d, T[i], T[i + 1], -1, -1, (T[rs], T[rs + 1], rd))
                    i += 1  # B came from elsewhere: the next sentence stays
                elif i + 1 < last:
                    emit(d, T[i], T[i + 1], T[i + 1], T[i + 2], None)
                    i += 2
                else:
                    cut = split_sentence(i)
                    if cut is not None:
                        emit(d, *cut, None)
                    i += 1
    if not rec:
        raise StudyError(
            "no pair instance could be built (every document is a single 1-token sentence)",
            field="corpus.sources",
            allowed="documents with at least 2 tokens",
        )
    arr = np.asarray(rec, dtype=np.int64)
    a_full, b_full = arr[:, 0:2].copy(), arr[:, 2:4].copy()
    la, lb = a_full[:, 1] - a_full[:, 0], b_full[:, 1] - b_full[:, 0]
    # BERT's truncate_seq_pair: counts in closed form, each removed token from the front w.p. 1/2
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


def _assemble_pairs(split: TokenizedSplit, p: dict, L: int, special: SpecialIds) -> Instances:
    a, b = p["a_span"], p["b_span"]
    la, lb = a[:, 1] - a[:, 0], b[:, 1] - b[:, 0]
    n = len(a)
    rows = np.arange(n, dtype=np.int64)
    ids = np.full((n, L), special.pad, dtype=np.int32)
    ids[:, 0] = special.cls
    _gather(ids, rows, np.ones(n, np.int64), split.ids, a[:, 0], la)
    ids[rows, 1 + la] = special.sep
    _gather(ids, rows, 2 + la, split.ids, b[:, 0], lb)
    ids[rows, 2 + la + lb] = special.sep
    col = np.arange(L)[None, :]
    tt = ((col >= (2 + la)[:, None]) & (col <= (2 + la + lb)[:, None])).astype(np.int8)
    a_doc = _doc_of_token(split, a[:, 0])
    return Instances(
        input_ids=ids,
        token_type_ids=tt,
        lengths=(3 + la + lb).astype(np.int32),
        sentence_label=p["sentence_label"],
        a_span=a,
        b_span=b,
        a_full=p["a_full"],
        b_full=p["b_full"],
        a_doc=a_doc,
        a_doc_last=_doc_of_token(split, a[:, 1] - 1),
        b_doc=p["b_doc"],
    )


# --------------------------------------------------------------------------- packed formats
def _single(
    split: TokenizedSplit,
    src: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    a_span: np.ndarray,
    L: int,
    special: SpecialIds,
) -> Instances:
    n = len(starts)
    rows = np.arange(n, dtype=np.int64)
    ids = np.full((n, L), special.pad, dtype=np.int32)
    ids[:, 0] = special.cls
    _gather(ids, rows, np.ones(n, np.int64), src, starts, lens)
    ids[rows, 1 + lens] = special.sep
    none2 = np.full((n, 2), -1, dtype=np.int64)
    return Instances(
        input_ids=ids,
        token_type_ids=np.zeros((n, L), np.int8),
        lengths=(lens + 2).astype(np.int32),
        sentence_label=np.full(n, -1, np.int8),
        a_span=a_span,
        b_span=none2,
        a_full=a_span.copy(),
        b_full=none2.copy(),
        a_doc=_doc_of_token(split, a_span[:, 0]),
        a_doc_last=_doc_of_token(split, a_span[:, 1] - 1),
        b_doc=np.full(n, -1, np.int32),
    )


def _doc_blocks(split: TokenizedSplit, L: int, special: SpecialIds, rng: np.random.Generator) -> Instances:
    C = L - 2
    doc_tok = split.sent_starts[split.doc_starts].astype(np.int64)
    docs = _nonempty_docs(split)
    ds, de = doc_tok[docs], doc_tok[docs + 1]
    D = de - ds
    nblk = -(-D // C)
    slack = nblk * C - D
    # first block is C - s long, s uniform in [0, slack]: same block count and padding, seeded cut points
    s = np.where(nblk >= 2, (rng.random(len(docs)) * (slack + 1)).astype(np.int64), 0)
    s = np.minimum(s, slack)
    bd = np.repeat(np.arange(len(docs)), nblk)
    k = np.arange(int(nblk.sum()), dtype=np.int64) - np.repeat(np.cumsum(nblk) - nblk, nblk)
    start = ds[bd] + np.where(k == 0, 0, k * C - s[bd])
    end = np.minimum(ds[bd] + (k + 1) * C - s[bd], de[bd])
    return _single(split, split.ids, start, end - start, np.stack([start, end], 1), L, special)


def _full_blocks(split: TokenizedSplit, L: int, special: SpecialIds, rng: np.random.Generator) -> Instances:
    C = L - 2
    doc_tok = split.sent_starts[split.doc_starts].astype(np.int64)
    docs = _nonempty_docs(split)
    ins = doc_tok[docs[1:]]  # ids offsets where a separator goes in
    stream = np.insert(split.ids, ins, np.int32(special.sep))
    sep_pos = ins + np.arange(len(ins), dtype=np.int64)  # separator positions in stream coordinates
    is_sep = np.zeros(len(stream) + 1, dtype=bool)
    is_sep[sep_pos] = True
    Ts = len(stream)
    r = int(rng.integers(1, C + 1))  # random grid offset: only first/last blocks short
    starts = np.concatenate([[0], np.arange(r, Ts, C, dtype=np.int64)]) if r < Ts else np.zeros(1, np.int64)
    ends = np.append(starts[1:], Ts)
    starts = starts + is_sep[starts]  # never open or close a row on a separator
    ends = ends - is_sep[ends - 1]
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]

    # stream -> ids coordinates: subtract the separators before the position
    def to_ids(p):
        return p - np.searchsorted(sep_pos, p, side="left")

    a_span = np.stack([to_ids(starts), to_ids(ends)], axis=1)
    return _single(split, stream, starts, ends - starts, a_span, L, special)


# --------------------------------------------------------------------------- public API
def build_instances(
    split: TokenizedSplit, obj: ObjectiveConfig, special: SpecialIds, seed: int, epoch: int = 0
) -> Instances:
    """All instances of one pass over `split`; `dupe_factor` copies with derived seeds, concatenated."""
    _validate(split, obj)
    L = obj.max_seq_len
    parts = []
    for copy in range(obj.dupe_factor):
        rng = _rng(seed, epoch, copy)
        if obj.format in ("segment_pair", "sentence_pair"):
            parts.append(_assemble_pairs(split, _pairs(split, obj, rng), L, special))
        elif obj.format == "doc_sentences":
            parts.append(_doc_blocks(split, L, special, rng))
        elif obj.format == "full_sentences":
            parts.append(_full_blocks(split, L, special, rng))
        else:  # unreachable through ObjectiveConfig's Literal, kept for hand-built configs
            raise StudyError(
                f"unknown format {obj.format!r}",
                field="objective.format",
                allowed="segment_pair, sentence_pair, full_sentences, doc_sentences",
            )
    return parts[0] if len(parts) == 1 else Instances.concat(parts)


def reference_instances(split: TokenizedSplit, max_seq_len: int, special: SpecialIds) -> Instances:
    """The fixed-reference evaluation rows: doc_sentences, no sentence task, seed 1234.

    Depends only on (split, max_seq_len, special): identical for every run on the same data.
    """
    obj = ObjectiveConfig(format="doc_sentences", sentence="none", max_seq_len=max_seq_len, dupe_factor=1)
    return build_instances(split, obj, special, seed=REFERENCE_SEED, epoch=0)
