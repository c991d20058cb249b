"""Corpus readers: every source kind (embedded, text, WikiText, Gutenberg, hf) as documents of sentences,
and the files each source is read from (`source_files`, which the corpus fingerprint covers).

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
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pysbd

from study.config import CorpusSource
from study.errors import StudyError

Doc = list[str]


# --------------------------------------------------------------------------- sentences
@functools.lru_cache(maxsize=1)
def _segmenter():
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
    what = (
        "does not exist"
        if not p.exists()
        else "is neither a file nor a folder"
        if not p.is_dir()
        else f"is a folder without {' / '.join(patterns)} files"
    )
    raise StudyError(
        f"{path!r} {what} (relative paths are read from {Path.cwd()})",
        field=fieldname,
        allowed=f"an existing file, or a folder containing {' / '.join(patterns)} files",
    )


def read_utf8(path: Path, fieldname: str = "corpus.sources.path") -> str:
    """Strict UTF-8 (BOM dropped), CRLF/CR normalized to LF."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig", errors="strict")
    except UnicodeDecodeError as e:
        raise StudyError(
            f"{path} is not valid UTF-8 (byte offset {e.start})", field=fieldname, allowed="UTF-8 text files"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _blank_line_docs(text: str) -> Iterator[str]:
    for block in re.split(r"\n\s*\n", text):
        if block.strip():
            yield block


# --------------------------------------------------------------------------- readers
# The files each path-based kind reads from a folder (a file path is read whatever its name).
PATTERNS = {"text": ("*.txt",), "wikitext": ("*.raw", "*.tokens", "*.txt"), "gutenberg": ("*.txt",)}


def read_text(path: str, where: str = "corpus.sources") -> Iterator[Doc]:
    """A .txt file or folder (sorted, recursive); blank lines separate documents.

    `where` names the source in errors (load_corpus passes `corpus.sources[i]`)."""
    for f in _files(path, PATTERNS["text"], f"{where}.path"):
        for block in _blank_line_docs(read_utf8(f, f"{where}.path")):
            sents = split_sentences(block)
            if sents:
                yield sents


_WT_SUBS = [
    (re.compile(r" @([-,.])@ "), r"\1"),
    (re.compile(r" ([,.;:!?%)\]}])"), r"\1"),
    (re.compile(r"([(\[{$]) "), r"\1"),
    (re.compile(r" (n't|'s|'re|'ve|'ll|'d|'m)\b"), r"\1"),
]


def detokenize_wikitext(line: str) -> str:
    for pat, rep in _WT_SUBS:
        line = pat.sub(rep, line)
    return line


_TOP = re.compile(r"^ = [^=].* = $")
_SUB = re.compile(r"^ (= )+.*( =)+ $")


def _wikitext_docs(lines: list[str]) -> Iterator[Doc]:
    """A document starts at a ' = Title = ' line with blank lines on both sides.

    Heading and subheading lines are dropped; the blank-line rule keeps math lines
    such as ' = 1 henry and capacitance C = ' from splitting their article.
    """
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


def read_wikitext(path: str, where: str = "corpus.sources") -> Iterator[Doc]:
    """WikiText raw files, one document per article (`_wikitext_docs`), each file on its own."""
    for f in _files(path, PATTERNS["wikitext"], f"{where}.path"):
        yield from _wikitext_docs(read_utf8(f, f"{where}.path").split("\n"))


def _is_local_dataset(name: str) -> bool:
    """A `save_to_disk` folder (read with load_from_disk) rather than a hub id or a folder of data files."""
    p = Path(name)
    return p.is_dir() and ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists())


def read_hf(src: CorpusSource, where: str = "corpus.sources") -> Iterator[Doc]:
    """A Hugging Face dataset; `name` may be a local `save_to_disk` folder.

    What a document is comes from `src.rows` (the config), not from the data: `document` is one
    row; `lines` is a block of rows between blank rows; `wikitext` reads the rows as the lines of a
    WikiText file (an article per document, detokenized), which is what WikiText on the hub is.
    """
    import datasets  # 1 s to import: only for a hub source, local corpora are read without it

    p = Path(src.name)
    if _is_local_dataset(src.name):
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if src.split not in ds:
                raise StudyError(
                    f"split {src.split!r} not in {p}", field=f"{where}.split", allowed=", ".join(ds)
                )
            ds = ds[src.split]
    else:
        try:
            ds = datasets.load_dataset(src.name, src.config, split=src.split, revision=src.revision)
        except (OSError, ValueError) as e:  # not found / offline / unknown split or config
            raise StudyError(
                f"cannot load dataset {src.name!r} (config {src.config!r}, split {src.split!r}): "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                field=f"{where}.name",
                allowed="a hub id already in the local cache (HF_HUB_OFFLINE=1), a save_to_disk "
                "folder, or a folder of data files",
            ) from None
    if src.text_column not in ds.column_names:
        raise StudyError(
            f"column {src.text_column!r} not in dataset {src.name}",
            field=f"{where}.text_column",
            allowed=", ".join(ds.column_names),
        )
    rows = ds[src.text_column]
    if src.rows == "document":
        for r in rows:
            sents = split_sentences(r or "")
            if sents:
                yield sents
        return
    lines = [(r or "").rstrip("\n") for r in rows]  # hub WikiText rows end in "\n"; its files' lines do not
    if src.rows == "wikitext":
        yield from _wikitext_docs("\n".join(lines).split("\n"))  # a row holding several lines reads as them
        return
    for block in _blank_line_docs("\n".join(lines)):
        sents = split_sentences(block)
        if sents:
            yield sents


def embedded_path() -> Path:
    # found without importing gensim (~2 s here): spec validation fingerprints this file
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise StudyError(
            "the embedded corpus needs the gensim package, which is not installed",
            field="corpus.sources",
            allowed="text, wikitext, gutenberg or hf sources",
        )
    return (
        Path(spec.submodule_search_locations[0])
        / "test"
        / "test_data"
        / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    )


MIN_EMBEDDED_WORDS = 50  # stubs and disambiguation pages carry no usable sentences


_WIKI_EMPHASIS = re.compile(r"'{2,}")
_WIKI_ALT = re.compile(r"\|\s*alt=.*$")  # image caption "...|alt=description": keep the caption
_WIKI_FILE = re.compile(r"(File|Image):", re.I)  # gallery lines "File:x.jpg|caption"


def read_embedded() -> Iterator[Doc]:
    """The English Wikipedia sample in the gensim wheel, markup stripped, sentences kept."""
    from gensim.corpora.wikicorpus import (  # 1.1 s to import: the embedded sample only
        extract_pages,
        filter_wiki,
    )

    with bz2.open(embedded_path(), "rb") as f:
        for _title, text, _pageid in extract_pages(f):
            if not text or text.lstrip().lower().startswith("#redirect"):
                continue
            plain = _WIKI_EMPHASIS.sub(
                "", filter_wiki(text)
            )  # filter_wiki keeps the '' / ''' emphasis quotes
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
_START = re.compile(
    r"^[ \t]*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG(?:[^*]{0,400}\*{3}.*$|.*$)", re.M | re.I
)
_END = re.compile(
    r"^[ \t]*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)", re.M | re.I
)
# Paragraphs inside the body that are transcriber/producer notes, not the book
_NOTE = re.compile(
    r"project\s+gutenberg|gutenberg\.org|\be-?text\b|transcriber['’]?s note"
    r"|^\s*\[?(produced by|transcribed from|e-?text prepared by)",
    re.I,
)
_PARA_SEP = re.compile(r"(\n[ \t]*\n)")
_BARE_NUMBER = re.compile(r"-?\d{1,3}-?\.?|[IVXLC]+\.?")  # fullmatch on a stripped line
_NUMBER_TITLE = re.compile(r"([IVXLC]+|\d{1,3})\.\s+\S.{0,80}")
_CHAPTER = re.compile(r"^\s*(CHAPTER|Chapter|BOOK|Book|PART|Part)\s+([IVXLCDM]+|\d+|[A-Z][a-z]+)\b.*$")


def strip_gutenberg(text: str) -> str:
    """The book text only: licence header and footer and producer/transcriber notes removed.

    Expects text already BOM-free with LF line ends (`read_utf8`); a file without the
    START marker is taken whole (minus notes), one without an END marker runs to the end.
    """
    m = _START.search(text)
    if m:
        text = text[m.end() :]
    m = _END.search(text)
    if m:
        text = text[: m.start()]
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


def read_gutenberg(path: str, where: str = "corpus.sources") -> Iterator[Doc]:
    """Project Gutenberg books; one document per chapter.

    A chapter starts at a heading line: "CHAPTER I", "Chapter 1", "BOOK II", "PART ONE", or a bare
    number/numeral ("II.", "-1-", "3. The Title") between blank lines. Chapters give many more
    documents than books, which NSP's random-document B and the doc-level split need; a book
    without such headings stays one document. Wrapped lines inside a paragraph are joined
    before sentence splitting.
    """
    for f in _files(path, PATTERNS["gutenberg"], f"{where}.path"):
        lines = strip_gutenberg(read_utf8(f, f"{where}.path")).split("\n")
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


def read_source(src: CorpusSource, where: str = "corpus.sources") -> Iterator[Doc]:
    if src.kind == "text":
        return read_text(src.path, where)
    if src.kind == "wikitext":
        return read_wikitext(src.path, where)
    if src.kind == "gutenberg":
        return read_gutenberg(src.path, where)
    if src.kind == "hf":
        return read_hf(src, where)
    return read_embedded()


# --------------------------------------------------------------------------- source files
def source_files(src: CorpusSource, where: str = "corpus.sources") -> list[tuple[str, Path]]:
    """(name, file) for every file `src` is read from; the name is relative to the source's folder, so
    that the fingerprint is the same for a copy elsewhere. The run hash still changes when the corpus
    moves: `CorpusSource.path` (as written: `a/` is not `a`) is in the semantic config beside the
    fingerprint. Empty for a hub dataset (not local files).

    A path that does not exist, or a folder without such files, is a StudyError naming `where`.path."""
    if src.kind in PATTERNS:
        root = Path(src.path)
        return [
            (f.relative_to(root).as_posix() if f != root else f.name, f)
            for f in _files(src.path, PATTERNS[src.kind], f"{where}.path")
        ]
    if src.kind == "embedded":
        return [(embedded_path().name, embedded_path())]
    root = Path(src.name)
    if not root.is_dir():
        return []
    # a save_to_disk folder or a folder of data files: every file in it may be read
    return [(f.relative_to(root).as_posix(), f) for f in sorted(root.rglob("*")) if f.is_file()]
