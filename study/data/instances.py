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
from study.data.pairs import pair_spans
from study.data.tokens import SpecialIds, TokenizedSplit
from study.errors import StudyError

# The evaluation seed: the fixed reference rows (reference_instances), their masks (masking.reference_masking)
# and which of them are scored (pretrain/evaluate.py). Changing it changes every run's reference metrics.
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
    if not split.n_tokens:
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
            spans = pair_spans(split, obj, rng, _nonempty_docs(split).tolist())
            parts.append(_assemble_pairs(split, spans, L, special))
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
