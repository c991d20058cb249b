"""The in-memory form of a tokenized corpus split, shared by tokenizer, instances and masking.

A split is three flat arrays, so it memory-maps and hashes cheaply:
  ids          int32 [n_tokens]        every sentence's WordPiece ids, back to back (no specials)
  sent_starts  int64 [n_sents + 1]     sentence s is ids[sent_starts[s]:sent_starts[s+1]]
  doc_starts   int64 [n_docs + 1]      document d is sentences doc_starts[d]..doc_starts[d+1]-1
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from study.io import atomic_write_bytes


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int
    vocab_size: int

    @property
    def all(self) -> tuple[int, ...]:
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


@dataclass(frozen=True)
class TokenizedSplit:
    ids: np.ndarray
    sent_starts: np.ndarray
    doc_starts: np.ndarray

    @property
    def n_docs(self) -> int:
        return len(self.doc_starts) - 1

    @property
    def n_sents(self) -> int:
        return len(self.sent_starts) - 1

    @property
    def n_tokens(self) -> int:
        return int(self.sent_starts[-1])

    def sentence(self, s: int) -> np.ndarray:
        return self.ids[self.sent_starts[s] : self.sent_starts[s + 1]]

    def doc_sentences(self, d: int) -> range:
        return range(int(self.doc_starts[d]), int(self.doc_starts[d + 1]))

    @classmethod
    def from_lists(cls, docs: list[list[list[int]]]) -> TokenizedSplit:
        """Build from nested python lists: docs -> sentences -> token ids (tests, fixtures)."""
        sent_lens = [len(s) for d in docs for s in d]
        ids = np.fromiter((t for d in docs for s in d for t in s), dtype=np.int32, count=sum(sent_lens))
        sent_starts = np.zeros(len(sent_lens) + 1, dtype=np.int64)
        np.cumsum(sent_lens, out=sent_starts[1:])
        doc_starts = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in docs], out=doc_starts[1:])
        return cls(ids, sent_starts, doc_starts)

    def save(self, path: Path) -> None:
        """Write as one .npz, atomically (study.io)."""
        buf = io.BytesIO()
        np.savez(buf, ids=self.ids, sent_starts=self.sent_starts, doc_starts=self.doc_starts)
        atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: Path) -> TokenizedSplit:
        with np.load(path) as z:
            return cls(z["ids"], z["sent_starts"], z["doc_starts"])
