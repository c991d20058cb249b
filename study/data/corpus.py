"""Corpus readers and the deterministic document-level split.

Every reader yields documents as lists of sentence strings (list[list[str]]).

Sentence splitting uses pysbd: it is rule-based (Golden Rules for English), so it
keeps "Dr. Smith", "e.g. this" and "3.14" in one sentence and needs no model
download (we have no internet). pysbd is slow, so paragraphs are split on newlines
first, one Segmenter is cached, and a paragraph without . ! ? inside is taken as
one sentence without calling pysbd at all.

WikiText is pre-tokenized (" @-@ ", " @,@ ", " @.@ ", spaces before punctuation);
it is detokenized lightly before sentence splitting so pysbd sees normal text.
"""
from __future__ import annotations

import bz2
import functools
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from study.config import CorpusConfig, CorpusSource
from study.errors import StudyError

Doc = list[str]


# --------------------------------------------------------------------------- sentences
@functools.lru_cache(maxsize=1)
def _segmenter():
    import pysbd
    return pysbd.Segmenter(language="en", clean=False)


_TERMINAL_INSIDE = re.compile(r"[.!?]\S*\s+\S")


def split_sentences(text: str) -> list[str]:
    out: list[str] = []
    for para in text.split("\n"):
        para = para.strip()
        if not para:
            continue
        # fast path: no terminal punctuation followed by more text -> one sentence
        if not _TERMINAL_INSIDE.search(para):
            out.append(para)
            continue
        out.extend(s.strip() for s in _segmenter().segment(para) if s.strip())
    return out


# --------------------------------------------------------------------------- file helpers
def _files(path: str, patterns: tuple[str, ...], fieldname: str) -> list[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted({f for pat in patterns for f in p.rglob(pat) if f.is_file()})
        if files:
            return files
    raise StudyError(f"no {' / '.join(patterns)} files at {path!r}", field=fieldname,
                     allowed="an existing file or a folder containing such files")


def _read_text(path: Path) -> str:
    """Strict UTF-8 (BOM dropped), CRLF/CR normalized to LF."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig", errors="strict")
    except UnicodeDecodeError as e:
        raise StudyError(f"{path} is not valid UTF-8 (byte offset {e.start})",
                         field="corpus.sources.path", allowed="UTF-8 text files") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _blank_line_docs(text: str) -> Iterator[str]:
    for block in re.split(r"\n\s*\n", text):
        if block.strip():
            yield block


# --------------------------------------------------------------------------- readers
def read_text(path: str) -> Iterator[Doc]:
    """A .txt file or folder (sorted, recursive); blank lines separate documents."""
    for f in _files(path, ("*.txt",), "corpus.sources.path"):
        for block in _blank_line_docs(_read_text(f)):
            sents = split_sentences(block)
            if sents:
                yield sents


_WT_SUBS = [(re.compile(r" @([-,.])@ "), r"\1"),
            (re.compile(r" ([,.;:!?%)\]}])"), r"\1"),
            (re.compile(r"([(\[{$]) "), r"\1"),
            (re.compile(r" (n't|'s|'re|'ve|'ll|'d|'m)\b"), r"\1")]


def detokenize_wikitext(line: str) -> str:
    for pat, rep in _WT_SUBS:
        line = pat.sub(rep, line)
    return line


_TOP = re.compile(r"^ = [^=].* = $")
_SUB = re.compile(r"^ (= )+.*( =)+ $")


def read_wikitext(path: str) -> Iterator[Doc]:
    """A document starts at a ' = Title = ' line with blank lines on both sides.

    Heading and subheading lines are dropped; the blank-line rule keeps math lines
    such as ' = 1 henry and capacitance C = ' from splitting their article.
    """
    for f in _files(path, ("*.raw", "*.tokens", "*.txt"), "corpus.sources.path"):
        lines = _read_text(f).split("\n")
        doc: list[str] = []
        for i, line in enumerate(lines):
            blank_before = i == 0 or not lines[i - 1].strip()
            blank_after = i + 1 >= len(lines) or not lines[i + 1].strip()
            if _TOP.match(line) and blank_before and blank_after:
                if doc:
                    yield doc
                doc = []
                continue
            if _SUB.match(line) and blank_before and blank_after:
                continue
            if line.strip():
                doc.extend(split_sentences(detokenize_wikitext(line.strip())))
        if doc:
            yield doc


def read_hf(src: CorpusSource) -> Iterator[Doc]:
    """A Hugging Face dataset; `name` may be a local `save_to_disk` folder.

    Rule: if any row of `text_column` is blank the dataset is line-based (like
    wikitext on the hub) and blank rows separate documents; otherwise each row is
    one document.
    """
    import datasets
    p = Path(src.name)
    if p.is_dir() and ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()):
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if src.split not in ds:
                raise StudyError(f"split {src.split!r} not in {p}", field="corpus.sources.split",
                                 allowed=", ".join(ds))
            ds = ds[src.split]
    else:
        try:
            ds = datasets.load_dataset(src.name, src.config, split=src.split)
        except (OSError, ValueError) as e:  # not found / offline / unknown split or config
            raise StudyError(f"cannot load dataset {src.name!r} (config {src.config!r}, split {src.split!r}): "
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                             field="corpus.sources.name",
                             allowed="a hub id already in the local cache (HF_HUB_OFFLINE=1), a save_to_disk "
                                     "folder, or a folder of data files") from None
    if src.text_column not in ds.column_names:
        raise StudyError(f"column {src.text_column!r} not in dataset {src.name}",
                         field="corpus.sources.text_column", allowed=", ".join(ds.column_names))
    rows = ds[src.text_column]
    if any(not (r or "").strip() for r in rows):
        for block in _blank_line_docs("\n".join((r or "").rstrip("\n") for r in rows)):
            sents = split_sentences(block)
            if sents:
                yield sents
    else:
        for r in rows:
            sents = split_sentences(r)
            if sents:
                yield sents


def embedded_path() -> Path:
    import gensim
    return (Path(gensim.__file__).parent / "test" / "test_data" /
            "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")


MIN_EMBEDDED_WORDS = 50  # stubs and disambiguation pages carry no usable sentences


_WIKI_EMPHASIS = re.compile(r"'{2,}")
_WIKI_ALT = re.compile(r"\|\s*alt=.*$")         # image caption "...|alt=description": keep the caption
_WIKI_FILE = re.compile(r"(File|Image):", re.I)  # gallery lines "File:x.jpg|caption"


def read_embedded() -> Iterator[Doc]:
    """The English Wikipedia sample in the gensim wheel, markup stripped, sentences kept."""
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki
    with bz2.open(embedded_path(), "rb") as f:
        for title, text, _pageid in extract_pages(f):
            if not text or text.lstrip().lower().startswith("#redirect"):
                continue
            plain = _WIKI_EMPHASIS.sub("", filter_wiki(text))  # filter_wiki keeps the '' / ''' emphasis quotes
            # drop leftover table/list scaffolding lines, gallery entries and section markers
            lines = [_WIKI_ALT.sub("", ln).strip().strip("=").strip() for ln in plain.split("\n")]
            body = "\n".join(ln for ln in lines if len(ln.split()) >= 3 and not _WIKI_FILE.match(ln))
            if len(body.split()) < MIN_EMBEDDED_WORDS:
                continue
            sents = split_sentences(body)
            if sents:
                yield sents


# The licence header ends with a "*** START OF THE PROJECT GUTENBERG EBOOK ... ***" line and the
# footer starts at "*** END OF ..." -- which some files indent -- or, in older files, at an
# "End of (the) Project Gutenberg EBook of ..." line a few lines earlier. Matching "START OF" at
# column 0 only (the old rule) left the whole licence in books with an indented END line.
# (the START marker may wrap onto a second line before its closing ***, as in pg43.txt)
_START = re.compile(r"^[ \t]*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG(?:[^*]{0,400}\*{3}.*$|.*$)",
                    re.M | re.I)
_END = re.compile(r"^[ \t]*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)", re.M | re.I)
# Paragraphs inside the body that are transcriber/producer notes, not the book
_NOTE = re.compile(r"project\s+gutenberg|gutenberg\.org|\be-?text\b|transcriber['’]?s note"
                   r"|^\s*\[?(produced by|transcribed from|e-?text prepared by)",
                   re.I)
_PARA_SEP = re.compile(r"(\n[ \t]*\n)")
_BARE_NUMBER = re.compile(r"-?\d{1,3}-?\.?|[IVXLC]+\.?")           # fullmatch on a stripped line
_NUMBER_TITLE = re.compile(r"([IVXLC]+|\d{1,3})\.\s+\S.{0,80}")
_CHAPTER = re.compile(r"^\s*(CHAPTER|Chapter|BOOK|Book|PART|Part)\s+([IVXLCDM]+|\d+|[A-Z][a-z]+)\b.*$")


def strip_gutenberg(text: str) -> str:
    """The book text only: licence header and footer and producer/transcriber notes removed.

    Expects text already BOM-free with LF line ends (`_read_text`); a file without the
    START marker is taken whole (minus notes), one without an END marker runs to the end.
    """
    m = _START.search(text)
    if m:
        text = text[m.end():]
    m = _END.search(text)
    if m:
        text = text[:m.start()]
    parts = _PARA_SEP.split(text)  # [para, sep, para, sep, ...]: separators kept for chapter lines
    return "".join(p for i, p in enumerate(parts) if i % 2 or not _NOTE.search(p))


def _is_heading(lines: list[str], i: int) -> bool:
    line = lines[i]
    if _CHAPTER.match(line):
        return True
    blank_before = i == 0 or not lines[i - 1].strip()
    if not blank_before:
        return False
    text = line.strip()
    if _BARE_NUMBER.fullmatch(text):  # "I.", "XII", "-1-" (a title line may follow directly)
        return True
    # "1.  The Cyclone", "I. A SCANDAL IN BOHEMIA": alone between blank lines
    return (i + 1 == len(lines) or not lines[i + 1].strip()) and bool(_NUMBER_TITLE.fullmatch(text))


def read_gutenberg(path: str) -> Iterator[Doc]:
    """Project Gutenberg books; one document per chapter.

    A chapter starts at a heading line: "CHAPTER I", "Chapter 1", "BOOK II", "PART ONE", or a bare
    number/numeral ("II.", "-1-", "3. The Title") between blank lines. Chapters give many more
    documents than books, which NSP's random-document B and the doc-level split need; a book
    without such headings stays one document. Wrapped lines inside a paragraph are joined
    before sentence splitting.
    """
    for f in _files(path, ("*.txt",), "corpus.sources.path"):
        lines = strip_gutenberg(_read_text(f)).split("\n")
        chapters: list[list[str]] = [[]]
        for i, line in enumerate(lines):
            if _is_heading(lines, i):
                chapters.append([])
                continue
            chapters[-1].append(line)
        for ch in chapters:
            paras = [" ".join(b.split()) for b in _blank_line_docs("\n".join(ch))]
            sents = split_sentences("\n".join(paras))
            if sents:
                yield sents


def read_source(src: CorpusSource) -> Iterator[Doc]:
    if src.kind == "text":
        return read_text(src.path)
    if src.kind == "wikitext":
        return read_wikitext(src.path)
    if src.kind == "gutenberg":
        return read_gutenberg(src.path)
    if src.kind == "hf":
        return read_hf(src)
    return read_embedded()


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
            return {"documents": len(docs), "sentences": sum(len(d) for d in docs),
                    "words": sum(len(s.split()) for d in docs for s in d)}
        return {"splits": {n: count(self.split(n)) for n in ("train", "valid", "test")},
                "sources": self.per_source}


def _unit(seed: int, source: int, doc: int) -> float:
    """A uniform number in [0, 1) from a hash: the split of a doc never depends on the others."""
    d = hashlib.sha256(f"{seed}:{source}:{doc}".encode()).digest()
    return int.from_bytes(d[:8], "big") / 2**64


def load_corpus(cfg: CorpusConfig, progress: bool = True) -> Corpus:
    corpus = Corpus()
    keyed: list[tuple[float, int, Doc]] = []
    for si, src in enumerate(cfg.sources):
        n_docs = n_sents = n_words = 0
        it = tqdm(read_source(src), desc=f"read {src.kind}", unit="doc", disable=not progress)
        for di, doc in enumerate(it):
            if src.max_documents is not None and di >= src.max_documents:
                break
            keyed.append((_unit(cfg.split_seed, si, di), si, doc))
            n_docs += 1
            n_sents += len(doc)
            n_words += sum(len(s.split()) for s in doc)
        corpus.per_source.append({"kind": src.kind, "path": src.path, "name": src.name,
                                  "documents": n_docs, "sentences": n_sents, "words": n_words})
    if not keyed:
        raise StudyError("the corpus has no documents", field="corpus.sources",
                         allowed="sources that contain at least one non-empty document")

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
