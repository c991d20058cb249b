"""Pre-training instances on real text: pair semantics, packing, determinism, errors (speed: bench/instances.py).

The real-text fixture is ~1M WordPiece tokens of 14 Gutenberg books (tokenizer trained here).
Sentences are cut by a regex, not pysbd (~600 sentences/s would take over a minute): instance
building only needs sentence and document boundaries, not good ones. "Documents" are runs of 40
paragraphs, so NSP has hundreds of documents to draw from.
"""

from __future__ import annotations

import numpy as np
import pytest

from study.config import ObjectiveConfig
from study.data.instances import Instances, build_instances, reference_instances
from study.data.pairs import truncation_counts
from study.data.tokens import SpecialIds, TokenizedSplit
from study.errors import StudyError

SP = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=1000)


def _toy(n_docs=50, seed=0, max_sents=30, max_len=40) -> TokenizedSplit:
    rng = np.random.default_rng(seed)
    return TokenizedSplit.from_lists(
        [
            [list(rng.integers(5, 1000, rng.integers(1, max_len))) for _ in range(rng.integers(1, max_sents))]
            for _ in range(n_docs)
        ]
    )


def _doc_of(split: TokenizedSplit, tok):
    return np.searchsorted(split.sent_starts[split.doc_starts], tok, side="right") - 1


def _check_pair_rows(inst: Instances, split: TokenizedSplit, sp: SpecialIds, L: int):
    """Row layout: [CLS] A [SEP] B [SEP] [PAD]..., A/B exactly the recorded token ranges."""
    a, b = inst.a_span, inst.b_span
    la, lb = a[:, 1] - a[:, 0], b[:, 1] - b[:, 0]
    assert (la >= 1).all() and (lb >= 1).all()
    assert (inst.lengths == 3 + la + lb).all() and (inst.lengths <= L).all()
    # truncation only removes tokens: the row spans lie inside the untruncated segments
    assert (inst.a_full[:, 0] <= a[:, 0]).all() and (a[:, 1] <= inst.a_full[:, 1]).all()
    assert (inst.b_full[:, 0] <= b[:, 0]).all() and (b[:, 1] <= inst.b_full[:, 1]).all()
    ids, tt = inst.input_ids, inst.token_type_ids
    assert ids.dtype == np.int32 and tt.dtype == np.int8 and inst.sentence_label.dtype == np.int8
    rng = np.random.default_rng(0)
    for i in rng.choice(len(inst), size=min(2000, len(inst)), replace=False):
        x, y = int(la[i]), int(lb[i])
        exp = np.concatenate(
            [
                [sp.cls],
                split.ids[a[i, 0] : a[i, 1]],
                [sp.sep],
                split.ids[b[i, 0] : b[i, 1]],
                [sp.sep],
                np.full(L - 3 - x - y, sp.pad),
            ]
        )
        assert np.array_equal(ids[i], exp)
        assert np.array_equal(tt[i], np.r_[np.zeros(x + 2), np.ones(y + 1), np.zeros(L - 3 - x - y)])
    assert np.array_equal(inst.attention_mask().sum(1), inst.lengths)


def _whole_sentence_start(split, tok):
    return np.isin(tok, split.sent_starts)


# --------------------------------------------------------------------------- truncation
def test_truncation_counts_equal_berts_loop():
    for la in range(1, 40):
        for lb in range(1, 40):
            for m in (2, 5, 17, 30, 125):
                a, b = la, lb
                while a + b > m:  # google-research/bert truncate_seq_pair, counting only
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                assert truncation_counts(la, lb, m) == (la - a, lb - b), (la, lb, m)


# --------------------------------------------------------------------------- pair formats on real text
def test_nsp_segment_pairs(real):
    split, sp, _ = real
    L = 128
    inst = build_instances(
        split,
        ObjectiveConfig(format="segment_pair", sentence="nsp", max_seq_len=L, dupe_factor=3),
        sp,
        seed=0,
    )
    assert len(inst) > 25_000
    _check_pair_rows(inst, split, sp, L)
    lab = inst.sentence_label
    assert set(np.unique(lab)) == {0, 1}
    assert abs((lab == 0).mean() - 0.5) < 0.01
    nxt, rnd = lab == 0, lab == 1
    # IsNext: B is exactly what follows A in the same document
    assert (inst.b_full[nxt, 0] == inst.a_full[nxt, 1]).all()
    assert (inst.b_doc[nxt] == inst.a_doc[nxt]).all()
    assert (_doc_of(split, inst.b_full[nxt, 1] - 1) == inst.a_doc[nxt]).all()
    # NotNext: B from ANOTHER document, whole sentences of it
    assert (inst.b_doc[rnd] != inst.a_doc[rnd]).all()
    assert (_doc_of(split, inst.b_full[rnd, 0]) == inst.b_doc[rnd]).all()
    assert (_doc_of(split, inst.b_full[rnd, 1] - 1) == inst.b_doc[rnd]).all()
    assert _whole_sentence_start(split, inst.b_full[rnd, 0]).all()
    assert _whole_sentence_start(split, inst.b_full[rnd, 1]).all()
    # A starts on a sentence and never crosses its document
    assert _whole_sentence_start(split, inst.a_full[:, 0]).all()
    assert (inst.a_doc == inst.a_doc_last).all()
    # the sequences are mostly full (short_seq_prob = 0.1): BERT-like lengths
    assert np.median(inst.lengths) >= L - 8


def test_short_seq_prob(real):
    """short_seq_prob 0: rows are full except at document ends; 1: targets uniform in 2..max."""
    split, sp, _ = real
    short = []
    for p in (0.0, 0.1, 1.0):
        inst = build_instances(
            split, ObjectiveConfig(format="segment_pair", sentence="none", short_seq_prob=p), sp, seed=0
        )
        short.append(float((inst.lengths < 64).mean()))
    assert short[0] < 0.05 and short[0] < short[1] < short[2] and short[2] > 0.25, short


def test_nsp_unused_sentences_are_put_back(real):
    """After a NotNext instance BERT rewinds to A's end: the next instance's A starts there."""
    split, sp, _ = real
    inst = build_instances(split, ObjectiveConfig(format="segment_pair", sentence="nsp"), sp, seed=3)
    same = inst.a_doc[1:] == inst.a_doc[:-1]
    rnd = (inst.sentence_label[:-1] == 1) & same
    assert rnd.sum() > 1000
    end = inst.a_full[:-1][rnd, 1]
    # (a one-sentence chunk gave A only the head of its sentence: its tail is not reusable)
    s = np.searchsorted(split.sent_starts, end, side="left")
    assert (inst.a_full[1:][rnd, 0] == split.sent_starts[s]).all()
    assert (split.sent_starts[s] == end).mean() > 0.8
    # and every sentence of a document starts some A at most once: no sentence used twice as A's start
    assert len(np.unique(inst.a_full[:, 0])) == len(inst)


def test_segment_pairs_without_sentence_task(real):
    split, sp, _ = real
    inst = build_instances(split, ObjectiveConfig(format="segment_pair", sentence="none"), sp, seed=0)
    _check_pair_rows(inst, split, sp, 128)
    assert (inst.sentence_label == -1).all()
    assert (inst.b_full[:, 0] == inst.a_full[:, 1]).all() and (inst.b_doc == inst.a_doc).all()
    # chunks tile the documents: consecutive instances of a document continue each other
    same = inst.a_doc[1:] == inst.a_doc[:-1]
    assert (inst.a_full[1:][same, 0] == inst.b_full[:-1][same, 1]).all()


def test_sop_segment_pairs(real):
    split, sp, _ = real
    inst = build_instances(
        split, ObjectiveConfig(format="segment_pair", sentence="sop", dupe_factor=4), sp, seed=0
    )
    assert len(inst) > 25_000
    _check_pair_rows(inst, split, sp, 128)
    lab = inst.sentence_label
    assert abs((lab == 1).mean() - 0.5) < 0.01
    assert (inst.b_doc == inst.a_doc).all()
    ordered, swapped = lab == 0, lab == 1
    assert (inst.b_full[ordered, 0] == inst.a_full[ordered, 1]).all()
    assert (inst.a_full[swapped, 0] == inst.b_full[swapped, 1]).all()


def test_sentence_pairs_nsp(real):
    split, sp, _ = real
    inst = build_instances(split, ObjectiveConfig(format="sentence_pair", sentence="nsp"), sp, seed=0)
    assert len(inst) > 30_000
    _check_pair_rows(inst, split, sp, 128)
    lab = inst.sentence_label
    assert abs((lab == 0).mean() - 0.5) < 0.01
    # A is one sentence (or the head of one, when a last sentence had to give A and B)
    s_of = np.searchsorted(split.sent_starts, inst.a_full[:, 0], side="right") - 1
    assert (inst.a_full[:, 1] <= split.sent_starts[s_of + 1]).all()
    nxt, rnd = lab == 0, lab == 1
    assert (inst.b_full[nxt, 0] == inst.a_full[nxt, 1]).all() and (inst.b_doc[nxt] == inst.a_doc[nxt]).all()
    assert (inst.b_doc[rnd] != inst.a_doc[rnd]).all()
    b_s = np.searchsorted(split.sent_starts, inst.b_full[rnd, 0], side="right") - 1
    assert (inst.b_full[rnd, 0] == split.sent_starts[b_s]).all()
    assert (inst.b_full[rnd, 1] == split.sent_starts[b_s + 1]).all()  # exactly one sentence


# --------------------------------------------------------------------------- packed formats
def test_doc_sentences_never_cross_and_tile_each_document(real):
    split, sp, _ = real
    L = 128
    inst = build_instances(
        split, ObjectiveConfig(format="doc_sentences", sentence="none", max_seq_len=L), sp, seed=0
    )
    a = inst.a_span
    assert (inst.a_doc == inst.a_doc_last).all()  # never crosses a document
    assert (inst.sentence_label == -1).all() and (inst.token_type_ids == 0).all()
    # blocks tile the corpus: every token exactly once, in order
    assert a[0, 0] == 0 and a[-1, 1] == split.n_tokens and (a[1:, 0] == a[:-1, 1]).all()
    doc_tok = split.sent_starts[split.doc_starts]
    n_blocks = np.bincount(inst.a_doc, minlength=split.n_docs)
    assert (n_blocks == -(-np.diff(doc_tok) // (L - 2))).all()  # the fewest blocks possible per doc
    ids = inst.input_ids
    assert (ids[:, 0] == sp.cls).all() and (ids[np.arange(len(inst)), inst.lengths - 1] == sp.sep).all()
    for i in range(0, len(inst), 7):
        n = inst.lengths[i] - 2
        assert np.array_equal(ids[i, 1 : 1 + n], split.ids[a[i, 0] : a[i, 1]])
        assert (ids[i, n + 2 :] == sp.pad).all()


def test_full_sentences_pack_across_documents(real):
    split, sp, _ = real
    L = 128
    inst = build_instances(
        split, ObjectiveConfig(format="full_sentences", sentence="none", max_seq_len=L), sp, seed=0
    )
    padding = 1 - inst.lengths.sum() / inst.input_ids.size
    assert padding <= 0.02
    a = inst.a_span
    assert a[0, 0] == 0 and a[-1, 1] == split.n_tokens and (a[1:, 0] == a[:-1, 1]).all()
    crosses = inst.a_doc != inst.a_doc_last
    assert crosses.sum() > 100
    doc_tok = split.sent_starts[split.doc_starts]
    for i in range(len(inst)):
        # the row is A's tokens with one [SEP] before every document start strictly inside A
        cuts = doc_tok[(doc_tok > a[i, 0]) & (doc_tok < a[i, 1])]
        exp = np.insert(split.ids[a[i, 0] : a[i, 1]], cuts - a[i, 0], sp.sep)
        n = inst.lengths[i] - 2
        assert len(exp) == n and np.array_equal(inst.input_ids[i, 1 : 1 + n], exp)
        assert inst.input_ids[i, 1] != sp.sep and inst.input_ids[i, n] != sp.sep


def test_reference_instances_are_fixed(real):
    split, sp, _ = real
    r1 = reference_instances(split, 64, sp)
    r2 = reference_instances(split, 64, sp)
    d = build_instances(
        split, ObjectiveConfig(format="doc_sentences", sentence="none", max_seq_len=64), sp, seed=1234
    )
    for f in ("input_ids", "a_span"):
        assert np.array_equal(getattr(r1, f), getattr(r2, f)) and np.array_equal(
            getattr(r1, f), getattr(d, f)
        )
    assert r1.input_ids.shape[1] == 64


# --------------------------------------------------------------------------- determinism, dupes
@pytest.mark.parametrize(
    "fmt,sent",
    [
        ("segment_pair", "nsp"),
        ("segment_pair", "sop"),
        ("segment_pair", "none"),
        ("sentence_pair", "nsp"),
        ("full_sentences", "none"),
        ("doc_sentences", "none"),
    ],
)
def test_seeded(fmt, sent):
    split = _toy()
    obj = ObjectiveConfig(format=fmt, sentence=sent, max_seq_len=64)
    a, b = build_instances(split, obj, SP, seed=0), build_instances(split, obj, SP, seed=0)
    for f in ("input_ids", "token_type_ids", "lengths", "sentence_label", "a_span", "b_span"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.tobytes() == y.tobytes() and x.dtype == y.dtype
    other = build_instances(split, obj, SP, seed=1)
    later = build_instances(split, obj, SP, seed=0, epoch=1)
    for c in (other, later):
        assert a.input_ids.shape != c.input_ids.shape or not np.array_equal(a.input_ids, c.input_ids)
    dup = build_instances(split, obj.model_copy(update={"dupe_factor": 3}), SP, seed=0)
    # copy 0 is the single build; copies differ from each other (static masking needs distinct copies)
    assert np.array_equal(dup.input_ids[: len(a)], a.input_ids)
    n = len(a)
    assert not (len(dup) == 3 * n and np.array_equal(dup.input_ids[n : 2 * n], dup.input_ids[:n]))


def test_pair_rows_small_max_seq_len():
    """max_seq_len 8: A and B get at least one token each, sequences never exceed 8."""
    split = _toy(seed=2)
    for fmt in ("segment_pair", "sentence_pair"):
        inst = build_instances(split, ObjectiveConfig(format=fmt, sentence="nsp", max_seq_len=8), SP, seed=0)
        _check_pair_rows(inst, split, SP, 8)


# --------------------------------------------------------------------------- errors
def test_nsp_needs_two_documents():
    one = _toy(n_docs=1)
    with pytest.raises(StudyError, match="corpus.sources") as e:
        build_instances(one, ObjectiveConfig(format="segment_pair", sentence="nsp"), SP, seed=0)
    assert "2 documents" in e.value.allowed
    # SOP and no sentence task only need one document
    assert len(build_instances(one, ObjectiveConfig(format="segment_pair", sentence="sop"), SP, seed=0)) > 0


def test_too_short_max_seq_len_names_field():
    obj = ObjectiveConfig.model_construct(
        format="segment_pair", sentence="nsp", max_seq_len=4, short_seq_prob=0.1, dupe_factor=1
    )
    with pytest.raises(StudyError, match="objective.max_seq_len") as e:
        build_instances(_toy(), obj, SP, seed=0)
    assert "[CLS] A [SEP] B [SEP]" in str(e.value) and e.value.allowed


def test_empty_split_names_field():
    empty = TokenizedSplit(np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(2, np.int64))
    with pytest.raises(StudyError, match="corpus.sources"):
        build_instances(empty, ObjectiveConfig(format="doc_sentences", sentence="none"), SP, seed=0)
