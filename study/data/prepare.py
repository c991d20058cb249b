"""The data stage: corpus -> WordPiece tokenizer -> tokenized splits, cached by `data_hash`.

results/data/<data_hash>/
  tokenizer/        save_pretrained output (trained on the TRAIN split only, so valid/test
                    words the tokenizer never saw are measured honestly as pieces/[UNK])
  train.npz valid.npz test.npz   TokenizedSplit.save
  stats.json        documents/sentences/words/tokens per split and per source + corpus hash, and the
                    commit each unpinned hub source was read at (provenance: not in the hash)
  manifest.json     bytes + sha256 of every other file, and the corpus fingerprint it was built
                    from; written LAST

The folder is built under a temp name (`atomic_dir`) while holding a `file_lock`, so two
processes preparing the same data do not both build it: the second waits, then finds the
finished folder and reuses it. A folder is only used when its manifest verifies (sizes and
sha256): a truncated, corrupted or deleted file means a rebuild with a warning, never
silently training on damaged data.

The data hash covers the corpus contents once a config is resolved (corpus.fingerprint, filled by
the spec loader, the search and the trainer's driver): an edited book is a new folder. The files are
fingerprinted again here on every call, so that
  - a resolved config whose sources changed since it was resolved is a StudyError (its hash names
    data that no longer exists), and
  - a config built in code without a fingerprint still never reuses a folder built from other
    contents (the manifest records the fingerprint; a mismatch rebuilds).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from study.config import RunConfig
from study.data.corpus import fingerprint, with_fingerprint
from study.data.instances import build_instances
from study.data.tokenizer import (
    continuation_mask,
    load_tokenizer,
    special_ids,
    tokenize_docs,
    train_tokenizer,
)
from study.data.tokens import SpecialIds, TokenizedSplit
from study.errors import StudyError
from study.io import atomic_dir, atomic_write_json, file_lock, read_json, sha256_file
from study.paths import Layout

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
MANIFEST = "manifest.json"
FORMAT = 2  # 2: the manifest records the corpus fingerprint. Bump when the folder layout changes: old folders then fail verification and rebuild
# The reference evaluation needs validation text and the tokenizer needs training text; below
# this many documents one of the two splits would be empty.
MIN_DOCUMENTS = 2


@dataclass
class PreparedData:
    dir: Path
    cfg: RunConfig  # the run config it was prepared for (describe() cuts instances with its objective)
    tokenizer: object  # transformers.BertTokenizerFast
    special: SpecialIds
    continuation: np.ndarray
    stats: dict
    _splits: dict = field(default_factory=dict, repr=False)

    def split(self, name: str) -> TokenizedSplit:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
        if name not in self._splits:
            self._splits[name] = TokenizedSplit.load(self.dir / f"{name}.npz")
        return self._splits[name]


# --------------------------------------------------------------------------- manifest
def _write_manifest(folder: Path, data_hash: str, fingerprint: str) -> None:
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(folder).as_posix()
            files[rel] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    atomic_write_json(
        folder / MANIFEST,
        {"format": FORMAT, "data_hash": data_hash, "fingerprint": fingerprint, "files": files},
    )


_REQUIRED = ("stats.json", "tokenizer/tokenizer.json", *(f"{s}.npz" for s in SPLITS))


def verify(folder: Path, data_hash: str, fingerprint: str | None = None) -> str | None:
    """None when the folder is complete and intact (and, given `fingerprint`, was built from corpus
    files with that fingerprint), else the reason it is not."""
    folder = Path(folder)
    if not folder.exists():
        return "missing"
    try:
        man = read_json(folder / MANIFEST)
    except (OSError, ValueError) as e:
        return f"manifest unreadable ({type(e).__name__})"
    if man.get("format") != FORMAT or man.get("data_hash") != data_hash:
        return "manifest is for another format or data hash"
    if fingerprint is not None and man.get("fingerprint") != fingerprint:
        return f"built from other corpus contents (fingerprint {man.get('fingerprint')}, the sources now {fingerprint})"
    files = man.get("files", {})
    for req in _REQUIRED:
        if req not in files:
            return f"manifest lacks {req}"
    # sizes first (cheap, catches truncation and deletion), then content hashes
    for rel, info in files.items():
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != info["bytes"]:
            return f"{rel} has {p.stat().st_size} bytes, manifest says {info['bytes']}"
    for rel, info in files.items():
        if sha256_file(folder / rel) != info["sha256"]:
            return f"{rel} sha256 differs from the manifest"
    return None


# --------------------------------------------------------------------------- build
def _per_doc_tokens(split: TokenizedSplit) -> np.ndarray:
    ss, ds = split.sent_starts, split.doc_starts
    return ss[ds[1:]] - ss[ds[:-1]]


def _build(cfg: RunConfig, fp: str, out: Path, progress: bool) -> None:
    """Build the folder for `cfg`'s data hash from sources whose fingerprint is `fp`."""
    # looked up per call: tests patch study.data.corpus.load_corpus to prove a cache hit reads nothing
    from study.data.corpus import load_corpus

    corpus = load_corpus(cfg.corpus, progress=progress)
    # edited while being read: the text is neither the old nor the new one (a hub download is no edit: an
    # unpinned hub source's fingerprint does not follow the cache it writes)
    if fingerprint(cfg.corpus) != fp:
        raise StudyError(
            "the corpus files changed while they were being read; run again",
            field="corpus.sources",
            allowed="sources that stay unchanged while the data is prepared",
        )
    n_docs = len(corpus.train) + len(corpus.valid) + len(corpus.test)
    if n_docs < MIN_DOCUMENTS or not corpus.train or not corpus.valid:
        raise StudyError(
            f"the corpus is too small: {n_docs} document(s) (train {len(corpus.train)}, valid "
            f"{len(corpus.valid)}); pre-training needs a train and a validation document",
            field="corpus.sources",
            allowed=f"sources with at least {MIN_DOCUMENTS} documents",
        )
    tok = train_tokenizer(corpus.train, cfg.tokenizer, out / "tokenizer", progress=progress)
    splits = {name: tokenize_docs(tok, corpus.split(name), progress=progress) for name in SPLITS}
    for name in ("train", "valid"):
        if splits[name].n_tokens == 0:
            raise StudyError(
                f"the {name} split has no tokens after tokenization",
                field="corpus.sources",
                allowed="sources with text in them",
            )
    for name, sp in splits.items():
        sp.save(out / f"{name}.npz")

    base = corpus.stats()
    source_tokens = np.zeros(len(cfg.corpus.sources), dtype=np.int64)
    for name, sp in splits.items():
        base["splits"][name]["tokens"] = sp.n_tokens
        np.add.at(source_tokens, np.asarray(corpus.origin[name], dtype=np.int64), _per_doc_tokens(sp))
    for src, n in zip(base["sources"], source_tokens, strict=True):
        src["tokens"] = int(n)
    stats = {
        "data_hash": cfg.data_hash(),
        "fingerprint": fp,
        "corpus_hash": corpus.content_hash(),
        "vocab_size": len(tok),
        **base,
    }
    atomic_write_json(out / "stats.json", stats)
    _write_manifest(out, cfg.data_hash(), fp)  # last: its presence + validity means "complete"


def _load(cfg: RunConfig, folder: Path) -> PreparedData:
    tok = load_tokenizer(folder / "tokenizer")
    return PreparedData(
        dir=folder,
        cfg=cfg,
        tokenizer=tok,
        special=special_ids(tok),
        continuation=continuation_mask(tok),
        stats=read_json(folder / "stats.json"),
    )


def _created_dirs(path: Path) -> list[Path]:
    """The ancestors of `path` (itself included) that do not exist yet, deepest first."""
    out = []
    for p in [path, *path.parents]:
        if p.exists():
            break
        out.append(p)
    return out


def prepare_data(cfg: RunConfig, layout: Layout, progress: bool = True) -> PreparedData:
    # Before anything is written: a missing source or sources changed under a resolved config are StudyErrors.
    fp = with_fingerprint(cfg).corpus.fingerprint
    h = cfg.data_hash()  # the caller's identity (unresolved configs keep theirs; the manifest guards them)
    final = layout.data_dir(h)
    if verify(final, h, fp) is None:  # fast path: no lock, no corpus read
        return _load(cfg, final)
    lock = final.with_name(f".{final.name}.lock")
    new_dirs = _created_dirs(lock.parent)
    try:
        with file_lock(lock):
            try:
                # another process may have finished while we waited for the lock
                reason = verify(final, h, fp)
                if reason is None:
                    return _load(cfg, final)
                if reason != "missing":
                    log.warning("data cache %s is damaged or stale (%s); rebuilding it", final, reason)
                # temp folders of builds that were killed (no atomic_dir cleanup on SIGKILL): while we
                # hold the lock nobody else is building this hash, so they are all stale
                for stale in final.parent.glob(f".{final.name}.*.tmp"):
                    shutil.rmtree(stale, ignore_errors=True)
                with atomic_dir(final) as tmp:
                    _build(cfg, fp, tmp, progress)
            finally:
                # removed while still held: a waiter on this inode then finds the finished folder,
                # a newcomer takes the fast path; nothing is left next to the data folders
                with contextlib.suppress(OSError):
                    lock.unlink()
    except StudyError:
        # a user mistake leaves nothing behind: not the folders made for the lock either
        for d in new_dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    return _load(cfg, final)


# --------------------------------------------------------------------------- describe
def _format_stats(stats: dict) -> list[str]:
    lines = [
        f"data {stats['data_hash']}  corpus sha256 {stats['corpus_hash'][:16]}  vocab {stats['vocab_size']}"
    ]
    lines.append(f"{'':10}{'documents':>11}{'sentences':>11}{'words':>12}{'tokens':>12}")
    for name in SPLITS:
        s = stats["splits"][name]
        lines.append(
            f"{name:10}{s['documents']:>11,}{s['sentences']:>11,}{s['words']:>12,}{s['tokens']:>12,}"
        )
    for src in stats["sources"]:
        label = f"{src['kind']}:{src.get('path') or src.get('name') or ''}".rstrip(":")
        lines.append(
            f"  source {label}: {src['documents']:,} docs, {src['sentences']:,} sentences, "
            f"{src['words']:,} words, {src['tokens']:,} tokens"
        )
    return lines


def describe(prepared: PreparedData, n: int = 3) -> str:
    """Corpus stats and `n` training instances (epoch 0) decoded to text, with the run's masking.

    A masked position shows as [MASK:word], a random replacement as [RAND:word->other], a kept
    (selected but unchanged) one as [KEEP:word]; '##' pieces are glued back to their word.
    """
    # torch (1.7 s to import; masking.py imports it too) only here: `study prepare` builds and loads
    # data without it
    import torch

    from study.data.masking import mask_rows

    cfg, tok, special = prepared.cfg, prepared.tokenizer, prepared.special
    lines = _format_stats(prepared.stats)
    inst = build_instances(prepared.split("train"), cfg.objective, special, cfg.seed, epoch=0)
    k = min(n, len(inst))
    lines.append(
        f"{len(inst):,} training instances (epoch 0, format {cfg.objective.format}, "
        f"sentence task {cfg.objective.sentence}, max_seq_len {cfg.objective.max_seq_len}); first {k}:"
    )
    if k == 0:
        return "\n".join(lines)
    ids = torch.as_tensor(np.asarray(inst.input_ids[:k]), dtype=torch.long)
    cont = torch.as_tensor(prepared.continuation)
    inputs, labels = mask_rows(ids, cfg.masking, special, cont, [(cfg.seed, i, 0) for i in range(k)])
    for i in range(k):
        pieces = []
        n_tok = int(inst.lengths[i])
        for tid, inp, lab in zip(
            ids[i, :n_tok].tolist(), inputs[i, :n_tok].tolist(), labels[i, :n_tok].tolist(), strict=True
        ):
            orig = tok.convert_ids_to_tokens(tid)
            if lab < 0:
                pieces.append(orig)
            elif inp == special.mask:
                pieces.append(f"[MASK:{orig}]")
            elif inp == tid:
                pieces.append(f"[KEEP:{orig}]")
            else:
                pieces.append(f"[RAND:{orig}->{tok.convert_ids_to_tokens(inp)}]")
        head = f"[{i}] {n_tok} tokens, {int((labels[i] >= 0).sum())} selected"
        if cfg.objective.sentence != "none":
            head += f", {cfg.objective.sentence} label {int(inst.sentence_label[i])}"
        lines.append(head + ":")
        lines.append("    " + " ".join(pieces).replace(" ##", ""))
    return "\n".join(lines)
