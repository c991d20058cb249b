"""Cross-sentence context use, zero-shot: how much a model's MLM predictions of a sentence B use the sentence A
that precedes it in the same document.

For each pair the PLL of B's tokens (study/zeroshot/pll.py: only B's positions are masked and scored) is
computed twice: after its true neighbour A, and after a sentence A' from another document. The gain per
token is (PLL(B | A) - PLL(B | A')) / len(B) in nats; the report gives its mean over pairs with its SE, and
the win rate, the fraction of pairs where the true neighbour scores strictly higher (a tie is a loss).

Rows are laid out as the run trained: `[CLS] A [SEP] B [SEP]` with token types 0 / 1 for the pair formats
(segment_pair, sentence_pair), one packed row `[CLS] A B [SEP]` of token type 0 for the formats without
segments (full_sentences, doc_sentences), as study/data/instances.py builds them. A is cut from the left
(the end next to B kept) where a row would exceed objective.max_seq_len.

Which sentences: the run's own held-out TEST documents (the data folder's `test` split, tokenized with the
run's tokenizer), not WikiText-2 test for every run alike. The cpu profile trains on
`wikitext:../shared/data/wikitext-2-raw`, which IS WikiText-2 valid + test, so on it the "held-out" pairs
would be training text for some runs; the test split is never trained on nor used by the reference
evaluation (that reads `valid`). Runs of one study share corpus and split seed, hence the same pairs, so
comparisons within a study are like for like; across corpora the pairs differ.

Pairs: consecutive sentences of one document, each of 4..60 tokens; `n` of them drawn with a fixed seed from
all such pairs (sorted back into corpus order). A' for pair i is the A of the first pair from i + n/2 on
(cyclically) that lies in another document: deterministic, and A' is real held-out text of the same kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from study.data.tokens import SpecialIds, TokenizedSplit
from study.zeroshot.pll import Scored

SAMPLE_SEED = 20201
MIN_TOKENS, MAX_TOKENS = 4, 60


@dataclass(frozen=True)
class Triple:
    a: int  # sentence index of the true neighbour
    b: int  # the scored sentence (a + 1, same document)
    other: int  # the replacement, from another document


def triples(split: TokenizedSplit, n: int) -> list[Triple]:
    """Up to `n` (A, B, A') sentence triples of `split` (fewer where the split has fewer eligible pairs)."""
    lens = np.diff(split.sent_starts)
    ok = (lens >= MIN_TOKENS) & (lens <= MAX_TOKENS)
    doc_of = np.repeat(np.arange(split.n_docs), np.diff(split.doc_starts))
    cand = [s for s in range(split.n_sents - 1) if ok[s] and ok[s + 1] and doc_of[s] == doc_of[s + 1]]
    if len(set(doc_of[cand])) < 2:
        return []  # no sentence from another document to stand in for A
    if len(cand) > n:
        pick = np.random.default_rng(SAMPLE_SEED).choice(len(cand), size=n, replace=False)
        cand = [cand[i] for i in sorted(pick)]
    out = []
    for i, s in enumerate(cand):
        j = (i + max(1, len(cand) // 2)) % len(cand)
        while doc_of[cand[j]] == doc_of[s]:
            j = (j + 1) % len(cand)
        out.append(Triple(s, s + 1, cand[j]))
    return out


def rows(
    split: TokenizedSplit,
    ts: list[Triple],
    special: SpecialIds,
    cont: np.ndarray,
    segments: bool,
    max_len: int,
) -> list[Scored]:
    """Two rows per triple, (true A, B) then (A', B), scored on B's tokens only."""
    out = []
    for t in ts:
        b = split.sentence(t.b).tolist()
        for a_sent in (t.a, t.other):
            room = max_len - len(b) - (3 if segments else 2)
            a = split.sentence(a_sent).tolist()[-room:] if room > 0 else []
            ids = [special.cls, *a] + ([special.sep] if segments else []) + b + [special.sep]
            start = 1 + len(a) + (1 if segments else 0)
            types = [0] * start + [int(segments)] * (len(ids) - start)
            # word ids over B: a new word at every piece that is not a '##' continuation (BERT's word_ids)
            words: list[int | None] = [None] * len(ids)
            w = -1
            for k in range(start, start + len(b)):
                w += 0 if cont[ids[k]] else 1
                words[k] = w
            out.append(Scored(tuple(ids), tuple(types), tuple(range(start, start + len(b))), tuple(words)))
    return out


def pair_results(ts: list[Triple], split: TokenizedSplit, scores: np.ndarray) -> list[dict]:
    true, other = scores[0::2], scores[1::2]
    return [
        {
            "a": t.a,
            "b": t.b,
            "other": t.other,
            "tokens": int(len(split.sentence(t.b))),
            "true": float(x),
            "random": float(y),
        }
        for t, x, y in zip(ts, true, other, strict=True)
    ]


def summary(per_pair: list[dict]) -> dict[str, float]:
    """gain (nats per token of B, mean over pairs), gain_se (its standard error), win_rate (ties lose), n."""
    gain = np.array([(r["true"] - r["random"]) / r["tokens"] for r in per_pair])
    wins = np.array([r["true"] > r["random"] for r in per_pair])
    n = len(gain)
    return {
        "gain": float(gain.mean()) if n else float("nan"),
        "gain_se": float(gain.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
        "win_rate": float(wins.mean()) if n else float("nan"),
        "pairs": n,
    }
