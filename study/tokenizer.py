"""WordPiece tokenizer: train on the train split, save/load as a HF BertTokenizerFast.

In transformers 5, `BertTokenizerFast(vocab_file=...)` silently yields a 5-token
vocab, so we always load with `from_pretrained(dir)`, which reads tokenizer.json.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from .config import TokenizerConfig
from .tokens import SpecialIds, TokenizedSplit

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] = 0


def train_tokenizer(docs: list[list[str]], cfg: TokenizerConfig, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=cfg.lowercase, strip_accents=None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                        special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator((s for d in docs for s in d), trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast = BertTokenizerFast(tokenizer_object=tok, do_lower_case=cfg.lowercase,
                             unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                             cls_token="[CLS]", mask_token="[MASK]")
    fast.save_pretrained(str(out_dir))
    return load_tokenizer(out_dir)


def load_tokenizer(dir: Path):
    from transformers import BertTokenizerFast
    return BertTokenizerFast.from_pretrained(str(dir))


def special_ids(tok) -> SpecialIds:
    return SpecialIds(pad=tok.pad_token_id, unk=tok.unk_token_id, cls=tok.cls_token_id,
                      sep=tok.sep_token_id, mask=tok.mask_token_id, vocab_size=len(tok))


def continuation_mask(tok) -> np.ndarray:
    """True for '##' word-piece continuations (whole-word masking groups them with the previous piece)."""
    mask = np.zeros(len(tok), dtype=bool)
    for token, i in tok.get_vocab().items():
        if token.startswith("##"):
            mask[i] = True
    return mask


def tokenize_docs(tok, docs: list[list[str]], progress: bool = True, batch: int = 4096) -> TokenizedSplit:
    """Fast batch encoding, no specials; empty sentences (0 tokens) are dropped."""
    backend = tok.backend_tokenizer
    flat = [s for d in docs for s in d]
    ids_parts: list[np.ndarray] = []
    lens = np.zeros(len(flat), dtype=np.int64)
    for b in tqdm(range(0, len(flat), batch), desc="tokenize", unit="batch", disable=not progress):
        encs = backend.encode_batch(flat[b:b + batch], add_special_tokens=False)
        for j, e in enumerate(encs):
            lens[b + j] = len(e.ids)
            ids_parts.append(np.asarray(e.ids, dtype=np.int32))
    ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=np.int32)
    # sentences kept per document, after dropping the empty ones
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    keep = lens > 0
    kept_lens = lens[keep]
    sent_starts = np.zeros(len(kept_lens) + 1, dtype=np.int64)
    np.cumsum(kept_lens, out=sent_starts[1:])
    per_doc = np.bincount(doc_of[keep], minlength=len(docs)) if len(docs) else np.zeros(0, np.int64)
    doc_starts = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(per_doc, out=doc_starts[1:])
    return TokenizedSplit(ids, sent_starts, doc_starts)
