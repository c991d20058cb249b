"""The corpus of a run: its sources read (study/data/readers.py) and split into train / valid / test by
document, deterministically, and the source fingerprint that enters the data identity.

The fingerprint (`fingerprint`, `with_fingerprint`) covers exactly the files the readers read (both use
readers.source_files): an edited book is a new data hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from study.config import CorpusConfig, CorpusSource, RunConfig
from study.data.readers import Doc, read_source, source_files
from study.errors import StudyError
from study.io import hash_obj, sha256_file

# --------------------------------------------------------------------------- fingerprint
# sha256 per file, keyed by what changes when the file does: an edit (even one keeping the size) moves
# mtime and ctime (which no tool can set back), a replacement the inode. In-process only: loading every
# profile of every shipped spec hashes the ~32 MB of ../shared/data once and then only stats files.
_DIGESTS: dict[tuple, str] = {}


def file_digest(path: Path) -> str:
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def _hub_revision(src: CorpusSource) -> str | None:
    """The commit the local hub cache holds for an unpinned hub dataset (what an offline load reads), if
    any: provenance for the data folder's stats, never identity (a download writes it, see
    source_fingerprint)."""
    # huggingface_hub only when an hf source is used: spec validation stays light without it
    from huggingface_hub import constants

    ref = Path(constants.HF_HUB_CACHE) / f"datasets--{src.name.replace('/', '--')}" / "refs" / "main"
    try:
        return ref.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def source_fingerprint(src: CorpusSource, where: str = "corpus.sources") -> dict:
    """What `src` contains: [name, bytes, sha256] per file; for a hub dataset its name, config, split
    and pinned revision, or "unpinned".

    Not the commit the local cache holds: the first download writes it, so the run hashes `study plan`
    shows would change on download, and prepare_data (which fingerprints before and after reading) would
    call its own download an edit. Pin `revision` where the hub copy may change under a hash."""
    files = source_files(src, where)
    if src.kind == "hf" and not files:
        if Path(src.name).exists():  # a folder with nothing in it, or a file: neither is a dataset
            raise StudyError(
                f"{src.name!r} is not a dataset folder or hub id",
                field=f"{where}.name",
                allowed="a hub id, a save_to_disk folder, or a folder of data files",
            )
        return {
            "hub": src.name,
            "config": src.config,
            "split": src.split,
            "revision": src.revision or "unpinned",
        }
    return {"files": [[name, f.stat().st_size, file_digest(f)] for name, f in files]}


def fingerprint(cfg: CorpusConfig) -> str:
    """The corpus contents as one hash (CorpusConfig.fingerprint); errors name `corpus.sources[i]`."""
    return hash_obj(
        [source_fingerprint(src, f"corpus.sources[{i}]") for i, src in enumerate(cfg.sources)], length=16
    )


def with_fingerprint(cfg: RunConfig, source: str | None = None) -> RunConfig:
    """`cfg` with corpus.fingerprint resolved from the files as they are now.

    A config that already carries one (a run folder's config.json, a config resolved earlier in this
    process) is checked instead: if the files changed since, its run hash describes data that no longer
    exists, and going on would train or reuse under the wrong identity."""
    try:
        now = fingerprint(cfg.corpus)
    except StudyError as exc:
        if source is None or exc.source:
            raise
        raise exc.replace(source=source) from None
    if cfg.corpus.fingerprint == now:
        return cfg
    if cfg.corpus.fingerprint is not None:
        raise StudyError(
            f"the corpus sources changed since this config was resolved (fingerprint "
            f"{cfg.corpus.fingerprint}, the files now give {now}); load the spec again to get "
            f"the new run hashes",
            field="corpus.fingerprint",
            source=source,
            allowed="a config resolved from the current sources",
        )
    out = cfg.model_copy(deep=True)
    out.corpus.fingerprint = now
    return out


# --------------------------------------------------------------------------- corpus + split
@dataclass
class Corpus:
    train: list[Doc] = field(default_factory=list)
    valid: list[Doc] = field(default_factory=list)
    test: list[Doc] = field(default_factory=list)
    per_source: list[dict] = field(default_factory=list)
    # origin[split][i] = index (in cfg.sources) of the source document split[i] came from
    origin: dict[str, list[int]] = field(default_factory=lambda: {"train": [], "valid": [], "test": []})

    def split(self, name: str) -> list[Doc]:
        return {"train": self.train, "valid": self.valid, "test": self.test}[name]

    def content_hash(self) -> str:
        h = hashlib.sha256()
        for name in ("train", "valid", "test"):
            h.update(f"<{name}>".encode())
            for d in self.split(name):
                h.update("\x1e".join(d).encode() + b"\x1d")
        return h.hexdigest()

    def stats(self) -> dict:
        def count(docs: list[Doc]) -> dict:
            return {
                "documents": len(docs),
                "sentences": sum(len(d) for d in docs),
                "words": sum(len(s.split()) for d in docs for s in d),
            }

        return {
            "splits": {n: count(self.split(n)) for n in ("train", "valid", "test")},
            "sources": self.per_source,
        }


def _unit(seed: int, source: int, doc: int) -> float:
    """A uniform number in [0, 1) from a hash of the doc's position, not its text: inserting a doc re-draws
    the later ones of its source, and equal docs are drawn apart (docs/DATA.md "Split"). Fixed: it is not
    hashed, so a change would move data under every existing run hash."""
    d = hashlib.sha256(f"{seed}:{source}:{doc}".encode()).digest()
    return int.from_bytes(d[:8], "big") / 2**64


def load_corpus(cfg: CorpusConfig, progress: bool = True) -> Corpus:
    corpus = Corpus()
    keyed: list[tuple[float, int, Doc]] = []
    for si, src in enumerate(cfg.sources):
        n_docs = n_sents = n_words = 0
        it = tqdm(
            read_source(src, f"corpus.sources[{si}]"),
            desc=f"read {src.kind}",
            unit="doc",
            disable=not progress,
        )
        for di, doc in enumerate(it):
            if src.max_documents is not None and di >= src.max_documents:
                break
            keyed.append((_unit(cfg.split_seed, si, di), si, doc))
            n_docs += 1
            n_sents += len(doc)
            n_words += sum(len(s.split()) for s in doc)
        entry = {
            "kind": src.kind,
            "path": src.path,
            "name": src.name,
            "documents": n_docs,
            "sentences": n_sents,
            "words": n_words,
        }
        if src.kind == "hf" and not Path(src.name).exists():  # a hub dataset: which commit was read
            entry["revision"] = src.revision or _hub_revision(src)
        corpus.per_source.append(entry)
    if not keyed:
        raise StudyError(
            "the corpus has no documents",
            field="corpus.sources",
            allowed="sources that contain at least one non-empty document",
        )

    def put(name: str, si: int, doc: Doc) -> None:
        corpus.split(name).append(doc)
        corpus.origin[name].append(si)

    def move(src: str, dst: str) -> None:
        put(dst, corpus.origin[src].pop(), corpus.split(src).pop())

    for u, si, doc in keyed:
        if u < cfg.valid_fraction:
            put("valid", si, doc)
        elif u < cfg.valid_fraction + cfg.test_fraction:
            put("test", si, doc)
        else:
            put("train", si, doc)
    # guarantee one validation document (and keep train non-empty) when there are >= 2
    if len(keyed) >= 2 and not corpus.valid:
        move("test" if corpus.test else "train", "valid")
    if not corpus.train:
        move("test" if corpus.test else "valid", "train")
    return corpus
