"""WordPiece tokenizer: train on the train split, save/load as a HF BertTokenizerFast.

- `train_tokenizer` learns the vocabulary deterministically (`learn_wordpiece`, see there why
  not the `tokenizers` trainer) and saves a standard BERT pipeline (BertNormalizer,
  BertPreTokenizer, WordPiece, [CLS]/[SEP] template) with `save_pretrained`.
- In transformers 5, `BertTokenizerFast(vocab_file=...)` silently yields a 5-token vocab, so we
  always load with `from_pretrained(dir)`, which reads tokenizer.json.
- `tokenize_docs` encodes through a per-distinct-word cache (ids identical to `encode_batch`).
"""

from __future__ import annotations

import heapq
import itertools
import json
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tqdm import tqdm
from transformers import BertTokenizerFast

from study.config import TokenizerConfig
from study.data.tokens import SpecialIds, TokenizedSplit

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] = 0


def train_tokenizer(docs: list[list[str]], cfg: TokenizerConfig, out_dir: Path, progress: bool = False):
    """Learn a WordPiece vocabulary on `docs` (the TRAIN split) and save a BertTokenizerFast to `out_dir`.

    We learn the vocabulary ourselves (`learn_wordpiece`) instead of with `tokenizers`'
    WordPieceTrainer: that trainer numbers the '##' pieces in Rust HashMap order, which is
    random per process, and breaks ties between equally frequent merges by those ids -- two
    builds of the same data gave different ids for 835 of 4096 tokens and a different vocabulary
    (measured on the embedded corpus). Same algorithm (BPE-style merges over '##' pieces,
    pair count >= min_frequency), with ties broken by the token strings, so the same corpus and
    config give a byte-identical tokenizer on every machine.
    """
    words = count_words((s for d in docs for s in d), cfg.lowercase)
    vocab = learn_wordpiece(words, cfg.vocab_size, cfg.min_frequency, progress=progress)
    tok = Tokenizer(
        models.WordPiece(
            vocab={t: i for i, t in enumerate(vocab)}, unk_token="[UNK]", max_input_chars_per_word=100
        )
    )
    tok.normalizer = normalizers.BertNormalizer(lowercase=cfg.lowercase, strip_accents=None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(SPECIALS)  # never split "[MASK]" etc. (as the HF trainer registers them)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast = BertTokenizerFast(
        tokenizer_object=tok,
        do_lower_case=cfg.lowercase,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(str(out_dir))
    return load_tokenizer(out_dir)


def count_words(sentences, lowercase: bool) -> Counter:
    """Normalized BERT pre-tokens and their counts (what BertNormalizer + BertPreTokenizer produce)."""
    sentences = list(sentences)
    keys, _ = _pretokenize(sentences, lowercase)
    chunks = Counter(keys)
    norm = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None)
    pre = pre_tokenizers.BertPreTokenizer()
    words: Counter = Counter()
    for k, c in chunks.items():
        if _PRINTABLE.match(k):  # printable-ASCII keys are already final pre-tokens
            words[k] += c
        else:
            for w, _ in pre.pre_tokenize_str(norm.normalize_str(k)):
                words[w] += c
    return words


def learn_wordpiece(
    words: Counter, vocab_size: int, min_frequency: int, prefix: str = "##", progress: bool = False
) -> list[str]:
    """The vocabulary, in id order: specials, characters, '##' characters, then merges in order.

    Every character is kept (like the HF trainer without limit_alphabet); then the most frequent
    adjacent pair (count weighted by word frequency) is merged until vocab_size or until the best
    pair is rarer than min_frequency. Ties: the smaller (left, right) token strings first.
    """
    items = sorted(words.items())
    chars = sorted({c for w, _ in items for c in w} - set(SPECIALS))
    conts = sorted({prefix + c for w, _ in items for c in w[1:]})
    toks: list[str] = list(SPECIALS) + chars + [c for c in conts if c not in set(chars)]
    tid = {t: i for i, t in enumerate(toks)}
    seqs = [[tid[w[0]]] + [tid[prefix + c] for c in w[1:]] for w, _ in items]
    counts = [c for _, c in items]
    pair_count: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = {}
    for i, seq in enumerate(seqs):
        for p in pairwise(seq):
            pair_count[p] = pair_count.get(p, 0) + counts[i]
            where.setdefault(p, set()).add(i)
    heap = [(-c, toks[a], toks[b], a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)
    bar = tqdm(total=max(vocab_size - len(toks), 0), desc="wordpiece", unit="merge", disable=not progress)
    while len(toks) < vocab_size and heap:
        neg, sa, sb, a, b = heapq.heappop(heap)
        c = pair_count.get((a, b), 0)
        if c != -neg:  # stale entry: counts only fall between pushes, so re-queue at the true count
            if c > 0:
                heapq.heappush(heap, (-c, sa, sb, a, b))
            continue
        if c < min_frequency:
            break
        merged = sa + sb[len(prefix) :]
        if merged not in tid:  # two merge paths can spell the same piece: keep one id
            tid[merged] = len(toks)
            toks.append(merged)
            bar.update(1)
        m = tid[merged]
        delta: dict[tuple[int, int], int] = {}
        for i in sorted(where.pop((a, b), ())):
            seq, n = seqs[i], counts[i]
            out, j, hit = [], 0, False
            while j < len(seq):
                if j + 1 < len(seq) and seq[j] == a and seq[j + 1] == b:
                    out.append(m)
                    j += 2
                    hit = True
                else:
                    out.append(seq[j])
                    j += 1
            if not hit:
                continue
            for p in pairwise(seq):
                delta[p] = delta.get(p, 0) - n
            for p in pairwise(out):
                delta[p] = delta.get(p, 0) + n
                where.setdefault(p, set()).add(i)
            seqs[i] = out
        for p, d in delta.items():
            if d == 0:
                continue
            new = pair_count.get(p, 0) + d
            if new > 0:
                pair_count[p] = new
            else:
                pair_count.pop(p, None)
            if d > 0:
                heapq.heappush(heap, (-new, toks[p[0]], toks[p[1]], p[0], p[1]))
    bar.close()
    return toks


def load_tokenizer(dir: Path):
    return BertTokenizerFast.from_pretrained(str(dir))


def save_beside_model(tok, out_dir: Path, max_positions: int) -> None:
    """The tokenizer of a trained model's folder. Its `model_max_length` is the model's max_positions, so
    `truncation=True` (a fill-mask pipeline, say) cuts to what the model takes: the data stage's tokenizer
    serves every model size and has no limit (1e30). The loader's `is_local` / `local_files_only` leftovers
    are dropped: a folder pushed to the hub would carry them."""
    tok.save_pretrained(str(out_dir))
    path = Path(out_dir) / "tokenizer_config.json"
    conf = json.loads(path.read_text())
    conf["model_max_length"] = max_positions
    for key in ("is_local", "local_files_only"):
        conf.pop(key, None)
    path.write_text(json.dumps(conf, indent=2, ensure_ascii=False) + "\n")


def special_ids(tok) -> SpecialIds:
    return SpecialIds(
        pad=tok.pad_token_id,
        unk=tok.unk_token_id,
        cls=tok.cls_token_id,
        sep=tok.sep_token_id,
        mask=tok.mask_token_id,
        vocab_size=len(tok),
    )


def continuation_mask(tok) -> np.ndarray:
    """True for '##' word-piece continuations (whole-word masking groups them with the previous piece)."""
    mask = np.zeros(len(tok), dtype=bool)
    for token, i in tok.get_vocab().items():
        if token.startswith("##"):
            mask[i] = True
    return mask


# ---------------------------------------------------------------------------- batch tokenization
# Why a word cache: a BERT WordPiece pipeline (BertNormalizer -> BertPreTokenizer -> WordPiece)
# maps every pre-token independently, and text repeats its words (Zipf): the embedded corpus has
# ~470k words but only ~32k distinct ones. So we split sentences into pre-tokens in Python (one C
# regex for printable-ASCII text), run the Rust tokenizer once per DISTINCT word, and gather the
# ids with numpy. Measured on the embedded corpus (bench/data.py): about 2-3x the plain
# `encode_batch` over sentences, identical ids (tests/test_data.py compares both on real text).
# Anything that is not printable ASCII (accents, CJK, control characters, non-breaking spaces)
# is left to Rust as a whole whitespace-delimited chunk, so the Python side never has to
# reimplement Unicode normalization, and only splits where BERT always splits ([ \t\n\r]).
_PRINTABLE = re.compile(r"[\x20-\x7e]*\Z")
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")  # BERT: every ASCII non-alnum is punctuation
_BERT_WS = re.compile(r"[ \t\n\r]+")
_KEYS_PER_TEXT = 1024  # distinct words joined into one text (amortizes the per-Encoding overhead)
_TEXTS_PER_CALL = 16  # texts per encode_batch (Rust may run them in parallel)


def _word_cache_lowercase(tok) -> bool | None:
    """Whether the fast path applies (the standard BERT pipeline), and if it lowercases; None if not."""
    spec = json.loads(tok.backend_tokenizer.to_str())
    norm, pre, model = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    if (
        norm.get("type") != "BertNormalizer"
        or pre.get("type") != "BertPreTokenizer"
        or model.get("type") != "WordPiece"
    ):
        return None
    return bool(norm.get("lowercase"))


def _pretokenize(
    sentences: list[str], lowercase: bool, added: tuple[str, ...] = ()
) -> tuple[list[str], np.ndarray]:
    """All sentences' cache keys back to back, and how many keys each sentence has.

    `added`: the tokenizer's added/special tokens ("[MASK]"...). Rust matches them in the raw text
    before normalizing, so a chunk holding one goes to Rust whole (they never contain whitespace).
    """
    words: list[str] = []
    counts = np.zeros(len(sentences), dtype=np.int64)
    findall = _ASCII_WORD.findall
    printable = _PRINTABLE.match

    has_added = re.compile("|".join(map(re.escape, added))).search if added else (lambda t: None)

    def simple(t: str) -> bool:
        return printable(t) is not None and has_added(t) is None

    for i, s in enumerate(sentences):
        n0 = len(words)
        if simple(s):
            words += findall(s.lower() if lowercase else s)
        else:
            for chunk in _BERT_WS.split(s):
                if not chunk:
                    continue
                if simple(chunk):
                    words += findall(chunk.lower() if lowercase else chunk)
                else:
                    words.append(chunk)  # Rust normalizes and splits it
        counts[i] = len(words) - n0
    return words, counts


def _encode_keys(backend, keys: list[str], progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of each distinct key, concatenated, and the number of ids per key.

    Keys are joined with spaces into texts of _KEYS_PER_TEXT keys; a token belongs to the key
    whose character span holds its start offset (a key may give 0, 1 or many tokens). (Passing
    the keys as pre-tokenized input and using word_ids is ~25% slower in Rust.)"""
    groups = [keys[b : b + _KEYS_PER_TEXT] for b in range(0, len(keys), _KEYS_PER_TEXT)]
    ids_parts, lens_parts = [], []
    for g0 in tqdm(
        range(0, len(groups), _TEXTS_PER_CALL), desc="tokenize", unit="batch", disable=not progress
    ):
        batch = groups[g0 : g0 + _TEXTS_PER_CALL]
        encs = backend.encode_batch([" ".join(g) for g in batch], add_special_tokens=False)
        for g, enc in zip(batch, encs, strict=True):
            key_starts = np.zeros(len(g), dtype=np.int64)
            np.cumsum([len(k) + 1 for k in g[:-1]], out=key_starts[1:])
            tok_starts = np.fromiter((o[0] for o in enc.offsets), dtype=np.int64, count=len(enc.ids))
            owner = np.searchsorted(key_starts, tok_starts, side="right") - 1  # offsets are in chars
            lens_parts.append(np.bincount(owner, minlength=len(g)))
            ids_parts.append(np.asarray(enc.ids, dtype=np.int32))
    ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=np.int32)
    lens = np.concatenate(lens_parts).astype(np.int64) if lens_parts else np.zeros(0, dtype=np.int64)
    return ids, lens


def encode_sentences(
    tok, sentences: list[str], progress: bool = False, word_cache: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [n_tokens], lens int64 [n_sentences]); no special tokens."""
    lowercase = _word_cache_lowercase(tok) if word_cache else None
    if lowercase is None:
        return _encode_plain(tok, sentences, progress)
    words, counts = _pretokenize(sentences, lowercase, tuple(tok.get_added_vocab()))
    index = dict.fromkeys(words)  # distinct words in first-seen order, at C speed
    for i, w in enumerate(index):
        index[w] = i
    word_ids = np.fromiter(map(index.__getitem__, words), dtype=np.int64, count=len(words))
    key_ids, key_lens = _encode_keys(tok.backend_tokenizer, list(index), progress)
    key_starts = np.zeros(len(key_lens), dtype=np.int64)
    if len(key_lens) > 1:
        np.cumsum(key_lens[:-1], out=key_starts[1:])
    # gather: the ids of word j are key_ids[key_starts[w_j] : key_starts[w_j] + key_lens[w_j]]
    lens = key_lens[word_ids]
    total = int(lens.sum())
    out_starts = np.cumsum(lens) - lens
    ids = key_ids[np.repeat(key_starts[word_ids] - out_starts, lens) + np.arange(total)]
    sent_of_word = np.repeat(np.arange(len(sentences)), counts)
    sent_lens = np.bincount(sent_of_word, weights=lens, minlength=len(sentences)).astype(np.int64)
    return ids.astype(np.int32, copy=False), sent_lens


def _encode_plain(
    tok, sentences: list[str], progress: bool, batch: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """The reference path: Rust batch encoding of whole sentences."""
    backend = tok.backend_tokenizer
    parts: list[list[int]] = []
    for b in tqdm(range(0, len(sentences), batch), desc="tokenize", unit="batch", disable=not progress):
        parts.extend(e.ids for e in backend.encode_batch(sentences[b : b + batch], add_special_tokens=False))
    lens = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    ids = np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int32, count=int(lens.sum()))
    return ids, lens


def tokenize_docs(
    tok, docs: list[list[str]], progress: bool = True, word_cache: bool = True
) -> TokenizedSplit:
    """Documents of sentences -> TokenizedSplit; sentences with 0 tokens are dropped (documents kept,
    so document i of the split is still document i of the corpus split, possibly empty)."""
    flat = [s for d in docs for s in d]
    ids, lens = encode_sentences(tok, flat, progress=progress, word_cache=word_cache)
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    keep = lens > 0
    kept_lens = lens[keep]
    sent_starts = np.zeros(len(kept_lens) + 1, dtype=np.int64)
    np.cumsum(kept_lens, out=sent_starts[1:])
    per_doc = np.bincount(doc_of[keep], minlength=len(docs)) if len(docs) else np.zeros(0, np.int64)
    doc_starts = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(per_doc, out=doc_starts[1:])
    return TokenizedSplit(ids, sent_starts, doc_starts)
