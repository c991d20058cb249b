"""Corpus readers on real files (shared_data) and tiny fixtures: documents, sentences, splits, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from study.config import CorpusConfig, CorpusSource
from study.data.corpus import load_corpus
from study.data.readers import (
    read_embedded,
    read_gutenberg,
    read_hf,
    read_text,
    read_utf8,
    read_wikitext,
    split_sentences,
    strip_gutenberg,
)
from study.errors import StudyError

LICENCE = re.compile(
    r"gutenberg|\*\*\*\s*(start|end) of|electronic works?|literary archive|"
    r"www\.|https?://|\bebook\b",
    re.I,
)


def _cfg(*sources, **kw) -> CorpusConfig:
    return CorpusConfig(sources=list(sources), **kw)


# --------------------------------------------------------------------------- sentences
def test_split_sentences_keeps_abbreviations_and_decimals():
    s = split_sentences(
        "Dr. Smith paid $3.50 for it, e.g. a pen. He left at 5 p.m. on Monday. Why? Nobody knows!"
    )
    assert s[0] == "Dr. Smith paid $3.50 for it, e.g. a pen."
    assert s[-2:] == ["Why?", "Nobody knows!"]
    assert split_sentences("a line without a stop\n\n  \nsecond line") == [
        "a line without a stop",
        "second line",
    ]
    assert split_sentences("") == []


# --------------------------------------------------------------------------- text
def test_read_text_file_and_folder(tmp_path):
    (tmp_path / "b.txt").write_text("Doc B one. Doc B two.\n\n\n \t \nDoc C.\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("Doc A line one\ncontinues here.\n", encoding="utf-8")
    (tmp_path / "ignored.md").write_text("Not a text file.", encoding="utf-8")
    docs = list(read_text(str(tmp_path)))
    # sorted paths: b.txt before sub/a.txt; a whitespace-only line is a blank line
    assert docs == [["Doc B one.", "Doc B two."], ["Doc C."], ["Doc A line one", "continues here."]]
    assert list(read_text(str(tmp_path / "b.txt"))) == docs[:2]


def test_bom_and_crlf_are_normalized(tmp_path):
    clean = "First doc. Two sentences.\n\nSecond doc.\nLine two.\n"
    (tmp_path / "clean.txt").write_text(clean, encoding="utf-8")
    (tmp_path / "crlf.txt").write_bytes(b"\xef\xbb\xbf" + clean.replace("\n", "\r\n").encode())
    (tmp_path / "cr.txt").write_bytes(clean.replace("\n", "\r").encode())
    ref = list(read_text(str(tmp_path / "clean.txt")))
    for name in ("crlf.txt", "cr.txt"):
        docs = list(read_text(str(tmp_path / name)))
        assert docs == ref, name
        assert not any("\ufeff" in s or "\r" in s for d in docs for s in d)


def test_bad_text_inputs_raise_naming_the_field(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("d\xe9j\xe0 vu.".encode("latin-1"))
    with pytest.raises(StudyError) as ei:
        list(read_text(str(bad)))
    assert (
        ei.value.field == "corpus.sources.path" and "latin1.txt" in str(ei.value) and "UTF-8" in str(ei.value)
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(StudyError) as ei:
        load_corpus(_cfg(f"text:{empty}"), progress=False)
    assert ei.value.field == "corpus.sources"
    with pytest.raises(StudyError) as ei:
        list(read_text(str(tmp_path / "missing")))
    assert ei.value.field == "corpus.sources.path"
    (tmp_path / "nothing").mkdir()
    with pytest.raises(StudyError):
        list(read_wikitext(str(tmp_path / "nothing")))


def test_read_text_on_a_real_bom_crlf_file(shared_data):
    f = shared_data / "gutenberg" / "pg11.txt"
    assert (
        f.read_bytes()[:3] == b"\xef\xbb\xbf" and b"\r\n" in f.read_bytes()[:500]
    )  # the fixture is what we think
    docs = list(read_text(str(f)))  # as plain text: every paragraph is a document, licence included
    raw = f.read_bytes().decode("utf-8-sig").replace("\r\n", "\n")
    assert len(docs) == len([b for b in re.split(r"\n\s*\n", raw) if b.strip()])
    assert docs[0][0].startswith("The Project Gutenberg’s Alice’s Adventures")
    assert not any("\ufeff" in s or "\r" in s for d in docs for s in d)


# --------------------------------------------------------------------------- wikitext
WIKI = """ 
 = Alpha = 
 
 Alpha is a letter @-@ like thing . It costs $ 1 @,@ 000 ( roughly ) . 
 
 = = History = = 
 
 It was n't known . 
 = not a heading because text touches it = 
 more text . 
 
 = Beta = 
 
 Beta 's text . 
"""


def test_wikitext_fixture_headings_and_detokenization(tmp_path):
    f = tmp_path / "wiki.raw"
    f.write_text(WIKI, encoding="utf-8")
    docs = list(read_wikitext(str(f)))
    assert len(docs) == 2
    alpha, beta = docs
    assert alpha[0] == "Alpha is a letter-like thing."
    assert "It costs $1,000 (roughly)." in alpha
    assert "It wasn't known." in alpha
    assert "= not a heading because text touches it =" in alpha  # kept as text, no split
    assert not any("History" in s for s in alpha)  # subheadings are dropped
    assert beta == ["Beta's text."]


@pytest.mark.parametrize("split", ["valid", "test"])
def test_wikitext2_real(shared_data, split):
    docs = list(read_wikitext(str(shared_data / "wikitext-2-raw" / f"wiki.{split}.raw")))
    assert len(docs) == 60  # WikiText-2 has 60 articles in each of valid and test
    assert not any(re.fullmatch(r"=( =)* .* (= )*=", s) and s.startswith("= =") for d in docs for s in d)
    if split == "test":
        ck = [d for d in docs if d[0].startswith("Constant k filters")]
        assert len(ck) == 1, "the Constant k filter article must be exactly one document"
        ck = ck[0]
        # the two math lines that look like headings stay inside the article...
        assert any(s.startswith("= 1 rad / s and a nominal impedance k =") for s in ck)
        assert "= 1 henry and capacitance C =" in ck
        # ...and the article runs on past them, up to the next real heading (The Snowmen)
        math_at = ck.index("= 1 henry and capacitance C =")
        assert len(ck) - math_at > 5
        assert not any("Snowmen" in s for s in ck)
        nxt = docs[docs.index(ck) + 1]
        assert "Snowmen" in " ".join(nxt[:3])


# --------------------------------------------------------------------------- gutenberg
def test_strip_gutenberg_all_books(shared_data):
    books = sorted((shared_data / "gutenberg").glob("*.txt"))
    assert len(books) == 44
    for f in books:
        raw = read_utf8(f)
        body = strip_gutenberg(raw)
        assert 0.8 * len(raw) < len(body) < len(raw), f.name  # something cut, most of the book kept
        m = LICENCE.search(body)
        assert m is None, f"{f.name}: licence text left: {body[max(0, m.start() - 80) : m.end() + 80]!r}"


def test_pg11_known_bug(shared_data):
    body = strip_gutenberg(read_utf8(shared_data / "gutenberg" / "pg11.txt"))
    assert "Project Gutenberg" not in body and "\ufeff" not in body and "\r" not in body
    assert body.strip().endswith("THE END")
    assert "Down the Rabbit-Hole" in body[:2000]


def test_read_gutenberg_real_books(shared_data):
    docs = list(read_gutenberg(str(shared_data / "gutenberg" / "pg11.txt")))
    assert len(docs) >= 12  # Alice: 12 chapters (+ title/contents)
    assert sum(d[0].startswith("Alice was beginning to get very tired") for d in docs) == 1
    docs += list(read_gutenberg(str(shared_data / "gutenberg" / "pg35.txt")))
    text = "\n".join(s for d in docs for s in d)
    assert LICENCE.search(text) is None
    assert "THE END" in text
    # wrapped lines are joined: no sentence holds a newline
    assert not any("\n" in s for d in docs for s in d)


def test_gutenberg_fixture_bom_crlf_and_headings(tmp_path):
    book = (
        "\ufeffThe Project Gutenberg eBook of Test\r\n\r\nLicence words here.\r\n\r\n"
        "*** START OF THE PROJECT GUTENBERG EBOOK TEST ***\r\n\r\nProduced by Somebody\r\n\r\n"
        "CHAPTER I.\r\n\r\nIt was a dark night.  The rain fell\r\nhard.\r\n\r\n"
        "II.\r\n\r\nMorning came.\r\n\r\n-3-\r\n\r\nThe end came.\r\n\r\n"
        "        *** END OF THE PROJECT GUTENBERG EBOOK TEST ***\r\n\r\nTHE FULL PROJECT GUTENBERG LICENSE\r\n"
    )
    f = tmp_path / "book.txt"
    f.write_bytes(book.encode("utf-8"))
    docs = list(read_gutenberg(str(f)))
    assert docs == [["It was a dark night.", "The rain fell hard."], ["Morning came."], ["The end came."]]


# --------------------------------------------------------------------------- hf
@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    return datasets


ROWS = ["First doc. It has two sentences.", "Second doc here! Yes.", "Third."]
EXPECTED = [["First doc.", "It has two sentences."], ["Second doc here!", "Yes."], ["Third."]]


def test_hf_save_to_disk(tmp_path, hf_cache):
    ds = hf_cache.Dataset.from_dict({"text": ROWS, "id": [1, 2, 3]})
    ds.save_to_disk(str(tmp_path / "one"))
    hf_cache.DatasetDict({"train": ds, "validation": ds.select([2])}).save_to_disk(str(tmp_path / "dict"))
    assert list(read_hf(CorpusSource(kind="hf", name=str(tmp_path / "one")))) == EXPECTED
    assert list(read_hf(CorpusSource(kind="hf", name=str(tmp_path / "dict")))) == EXPECTED
    assert list(read_hf(CorpusSource(kind="hf", name=str(tmp_path / "dict"), split="validation"))) == [
        ["Third."]
    ]
    with pytest.raises(StudyError) as ei:
        list(read_hf(CorpusSource(kind="hf", name=str(tmp_path / "dict"), split="test")))
    assert ei.value.field == "corpus.sources.split"
    with pytest.raises(StudyError) as ei:
        list(read_hf(CorpusSource(kind="hf", name=str(tmp_path / "one"), text_column="body")))
    assert ei.value.field == "corpus.sources.text_column" and "text" in ei.value.allowed


def test_hf_load_dataset_on_local_data_files(tmp_path, hf_cache):
    js = tmp_path / "jsonl"
    js.mkdir()
    (js / "train.jsonl").write_text("\n".join(json.dumps({"text": r}) for r in ROWS) + "\n", encoding="utf-8")
    assert list(read_hf(CorpusSource(kind="hf", name=str(js)))) == EXPECTED
    # line-based data (datasets' "text" builder: one row per line): with rows=lines blank rows separate documents
    tx = tmp_path / "txt"
    tx.mkdir()
    (tx / "train.txt").write_text("Line one. More.\nline two\n\nDoc two.\n", encoding="utf-8")
    lines = CorpusSource(kind="hf", name=str(tx), rows="lines")
    assert list(read_hf(lines)) == [["Line one.", "More.", "line two"], ["Doc two."]]
    # the shorthand goes through load_corpus too
    corpus = load_corpus(_cfg(f"hf:{js}:train"), progress=False)
    assert sorted(map(tuple, corpus.train + corpus.valid + corpus.test)) == sorted(map(tuple, EXPECTED))
    with pytest.raises(StudyError) as ei:
        list(read_hf(CorpusSource(kind="hf", name=str(js), split="validation")))
    assert ei.value.field == "corpus.sources.name"


def _wikitext_rows(text: str) -> list[str]:
    """WikiText as the hub stores it: a row per line, ending in "\\n", and an empty row per blank line."""
    return [f"{ln}\n" if ln.strip() else "" for ln in text.split("\n")]


def test_hf_wikitext_rows_are_read_as_articles(tmp_path, hf_cache):
    """WikiText from the hub (a blank row around every heading and paragraph) is one document per article,
    detokenized, exactly as the wikitext kind reads its files: not a document per paragraph and heading."""
    (tmp_path / "wiki.raw").write_text(WIKI, encoding="utf-8")
    want = list(read_wikitext(str(tmp_path / "wiki.raw")))
    hf_cache.Dataset.from_dict({"text": _wikitext_rows(WIKI)}).save_to_disk(
        str(tmp_path / "wikitext-103-raw")
    )
    by_name = CorpusSource.model_validate(f"hf:{tmp_path / 'wikitext-103-raw'}:train")
    assert by_name.rows == "wikitext" and "rows" in by_name.model_dump()  # resolved: in the run hash
    docs = list(read_hf(by_name))
    assert docs == want and len(docs) == 2 and docs[0][0] == "Alpha is a letter-like thing."
    # any other name reads it so when asked
    hf_cache.Dataset.from_dict({"text": _wikitext_rows(WIKI)}).save_to_disk(str(tmp_path / "wt"))
    assert list(read_hf(CorpusSource(kind="hf", name=str(tmp_path / "wt"), rows="wikitext"))) == want


def test_hf_wikitext_rows_real(tmp_path, shared_data, hf_cache):
    raw = shared_data / "wikitext-2-raw" / "wiki.valid.raw"
    rows = _wikitext_rows(read_utf8(raw))
    hf_cache.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "wikitext-2"))
    docs = list(read_hf(CorpusSource.model_validate(f"hf:{tmp_path / 'wikitext-2'}")))
    assert len(docs) == 60 and docs == list(read_wikitext(str(raw)))  # 60 articles
    assert not any(" @-@ " in s or s.startswith("= =") for d in docs for s in d)


def test_hf_document_rule_does_not_depend_on_the_rows(tmp_path, hf_cache):
    """One empty row (a book with no text) must not turn a dataset of books into blank-line blocks."""
    hf_cache.Dataset.from_dict({"text": [ROWS[0], "", *ROWS[1:], None]}).save_to_disk(str(tmp_path / "books"))
    src = CorpusSource(kind="hf", name=str(tmp_path / "books"))
    assert src.rows == "document" and list(read_hf(src)) == EXPECTED
    with pytest.raises(ValueError, match="rows"):  # only an hf source has rows
        CorpusSource(kind="text", path="x.txt", rows="lines")


def test_hf_unreachable_hub_is_a_study_error(hf_cache):
    with pytest.raises(StudyError) as ei:
        list(read_hf(CorpusSource(kind="hf", name="no-such-user/no-such-dataset-xyz")))
    assert ei.value.field == "corpus.sources.name"


# --------------------------------------------------------------------------- split
def _many_docs(tmp_path, n=400, name="c.txt", tag="d") -> Path:
    f = tmp_path / name
    f.write_text("\n\n".join(f"Document {tag}{i} says hello." for i in range(n)), encoding="utf-8")
    return f


def test_split_is_deterministic_disjoint_and_doc_level(tmp_path):
    f = _many_docs(tmp_path)
    cfg = _cfg(f"text:{f}", valid_fraction=0.1, test_fraction=0.05)
    a, b = load_corpus(cfg, progress=False), load_corpus(cfg, progress=False)
    assert (a.train, a.valid, a.test) == (b.train, b.valid, b.test)
    sets = {n: {tuple(d) for d in a.split(n)} for n in ("train", "valid", "test")}
    assert not (sets["train"] & sets["valid"] or sets["train"] & sets["test"] or sets["valid"] & sets["test"])
    assert sum(map(len, sets.values())) == 400
    assert 20 <= len(a.valid) <= 60 and 5 <= len(a.test) <= 40  # ~40 and ~20 expected
    assert a.content_hash() == b.content_hash()
    # another seed: another split of the same documents
    c = load_corpus(_cfg(f"text:{f}", valid_fraction=0.1, test_fraction=0.05, split_seed=1), progress=False)
    assert c.valid != a.valid and c.content_hash() != a.content_hash()
    st = a.stats()
    assert st["splits"]["valid"]["documents"] == len(a.valid) and st["sources"][0]["documents"] == 400


def test_adding_a_source_does_not_move_existing_documents(tmp_path):
    f = _many_docs(tmp_path)
    g = _many_docs(tmp_path, n=50, name="g.txt", tag="g")
    one = load_corpus(_cfg(f"text:{f}"), progress=False)
    two = load_corpus(_cfg(f"text:{f}", f"text:{g}"), progress=False)
    for name in ("train", "valid", "test"):
        mine = [d for d, o in zip(two.split(name), two.origin[name], strict=True) if o == 0]
        assert mine == one.split(name)
        assert len(two.origin[name]) == len(two.split(name))
    assert [s["documents"] for s in two.per_source] == [400, 50]


def test_split_is_keyed_by_position_not_contents(tmp_path):
    """What docs/DATA.md "Split" says: the key is (seed, source index, position in the source), so a
    document inserted early re-draws every later one, and equal documents are drawn independently."""
    f = _many_docs(tmp_path)
    one = load_corpus(_cfg(f"text:{f}"), progress=False)
    f.write_text("An inserted first document.\n\n" + f.read_text(encoding="utf-8"), encoding="utf-8")
    two = load_corpus(_cfg(f"text:{f}"), progress=False)
    assert [d for d in two.valid if d != ["An inserted first document."]] != one.valid
    same = tmp_path / "same.txt"
    same.write_text("\n\n".join(["The same document."] * 400), encoding="utf-8")
    dup = load_corpus(_cfg(f"text:{same}"), progress=False)
    assert dup.train and dup.valid and dup.train[0] == dup.valid[0]  # one text, two splits


def test_tiny_corpus_still_gets_train_and_valid(tmp_path):
    f = tmp_path / "two.txt"
    f.write_text("One doc.\n\nTwo doc.\n", encoding="utf-8")
    c = load_corpus(_cfg(f"text:{f}"), progress=False)
    assert len(c.train) == 1 and len(c.valid) == 1 and c.test == []
    src = CorpusSource(kind="text", path=str(_many_docs(tmp_path)), max_documents=7)
    assert (
        sum(
            len(load_corpus(CorpusConfig(sources=[src]), progress=False).split(n))
            for n in ("train", "valid", "test")
        )
        == 7
    )


# --------------------------------------------------------------------------- embedded
@pytest.mark.slow
def test_embedded_wikipedia_sample():
    docs = list(read_embedded())  # ~36 s on an idle core: pysbd over ~470k words
    words = sum(len(s.split()) for d in docs for s in d)
    assert 90 <= len(docs) <= 120, len(docs)
    assert 420_000 <= words <= 520_000, words
    text = "\n".join(s for d in docs for s in d)
    assert "'''" not in text and "''" not in text and "|alt=" not in text and "[[" not in text
    assert any(d[0].startswith("Anarchism is a political philosophy") for d in docs)


# --------------------------------------------------------------------------- fingerprint
def test_fingerprint_follows_contents_not_location(tmp_path, monkeypatch):
    import shutil

    import study.data.corpus as corpus_mod
    from study.data.corpus import fingerprint

    a = tmp_path / "a"
    a.mkdir()
    (a / "one.txt").write_text("First doc. Two sentences.\n\nSecond doc.\n", encoding="utf-8")
    (a / "notes.md").write_text("not read by a text source\n", encoding="utf-8")
    shutil.copytree(a, tmp_path / "b")
    fa = fingerprint(_cfg(f"text:{a}"))
    assert fingerprint(_cfg(f"text:{tmp_path / 'b'}")) == fa  # a moved corpus is the same corpus
    (a / "notes.md").write_text("edited, but no text source reads it\n", encoding="utf-8")
    assert fingerprint(_cfg(f"text:{a}")) == fa
    (a / "two.txt").write_text("A new document.\n", encoding="utf-8")
    assert fingerprint(_cfg(f"text:{a}")) != fa  # a file added is new contents
    # digests are cached per file state: an unchanged corpus is stat()ed, not re-read
    calls = []
    monkeypatch.setattr(corpus_mod, "sha256_file", lambda p: calls.append(p) or "x")
    fingerprint(_cfg(f"text:{a}"))
    assert calls == []
    (a / "one.txt").write_text("First dot. Two sentences.\n\nSecond doc.\n", encoding="utf-8")  # same size
    fingerprint(_cfg(f"text:{a}"))
    assert [Path(p).name for p in calls] == ["one.txt"]


def test_fingerprint_of_hf_sources(tmp_path, hf_cache):
    from study.data.corpus import fingerprint

    hub = _cfg(
        "hf:someone/some-dataset@cfg:train"
    )  # not downloaded: identified by name/config/split/revision
    assert fingerprint(hub) != fingerprint(_cfg("hf:someone/some-dataset@cfg:validation"))
    pinned = CorpusConfig(
        sources=[CorpusSource(kind="hf", name="someone/some-dataset", config="cfg", revision="abc")]
    )
    assert fingerprint(pinned) != fingerprint(hub)
    ds = hf_cache.Dataset.from_dict({"text": ROWS})
    ds.save_to_disk(str(tmp_path / "local"))
    local = _cfg(f"hf:{tmp_path / 'local'}:train")
    before = fingerprint(local)
    hf_cache.Dataset.from_dict({"text": ROWS[::-1]}).save_to_disk(str(tmp_path / "local2"))
    for f in (tmp_path / "local2").iterdir():  # the same folder, rewritten with other rows
        (tmp_path / "local" / f.name).write_bytes(f.read_bytes())
    assert fingerprint(local) != before


def test_unpinned_hub_fingerprint_does_not_follow_the_cache(tmp_path, monkeypatch):
    """A download writes refs/main into the hub cache: the identity of an unpinned source must not move
    with it (study plan before and after a download would show other run hashes). A pin is identity."""
    from huggingface_hub import constants

    from study.data.corpus import fingerprint

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    hub = _cfg("hf:someone/some-dataset@cfg:train")
    before = fingerprint(hub)
    ref = tmp_path / "hub" / "datasets--someone--some-dataset" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text("0123abcd" * 5, encoding="utf-8")
    assert fingerprint(hub) == before
    pins = [
        CorpusConfig(sources=[CorpusSource(kind="hf", name="someone/some-dataset", config="cfg", revision=r)])
        for r in ("abc", "def")
    ]
    assert len({before, *map(fingerprint, pins)}) == 3


def test_prepare_downloading_an_unpinned_hub_source(tmp_path, hf_cache, monkeypatch):
    """The first online prepare downloads the dataset, which writes refs/main between prepare_data's two
    fingerprints: that is no edit. The commit read is recorded in stats.json; a second prepare reuses it."""
    from huggingface_hub import constants

    from study.config import RunConfig
    from study.data.prepare import prepare_data
    from study.paths import Layout

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    commit = "0123abcd" * 5
    rows = [
        f"Document {i} tells of the {c} cat. It sat on the {c} mat."
        for i in range(40)
        for c in [("red", "green", "blue")[i % 3]]
    ]

    def download(name, config=None, split=None, revision=None):
        ref = Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}" / "refs" / "main"
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit, encoding="utf-8")
        return hf_cache.Dataset.from_dict({"text": rows})

    monkeypatch.setattr(hf_cache, "load_dataset", download)
    cfg = RunConfig.model_validate(
        {
            "corpus": {"sources": ["hf:someone/books:train"], "valid_fraction": 0.1},
            "tokenizer": {"vocab_size": 128},
        }
    )
    layout = Layout(root=tmp_path / "results")
    first = prepare_data(cfg, layout, progress=False)
    assert first.stats["sources"][0]["revision"] == commit and first.stats["sources"][0]["documents"] == 40
    assert prepare_data(cfg, layout, progress=False).dir == first.dir


def test_with_fingerprint_fills_then_checks(tmp_path):
    from study.config import RunConfig
    from study.data.corpus import with_fingerprint

    f = tmp_path / "c.txt"
    f.write_text("One doc here.\n\nAnother doc.\n", encoding="utf-8")
    bare = RunConfig.model_validate({"corpus": {"sources": [f"text:{f}"]}})
    resolved = with_fingerprint(bare)
    assert bare.corpus.fingerprint is None and resolved.corpus.fingerprint  # a copy; the input is untouched
    assert resolved.run_hash() != bare.run_hash() and with_fingerprint(resolved) == resolved
    again = RunConfig.model_validate(resolved.model_dump(mode="json"))  # a run folder's config.json
    assert with_fingerprint(again).run_hash() == resolved.run_hash()
    f.write_text("One dog here.\n\nAnother doc.\n", encoding="utf-8")
    with pytest.raises(StudyError) as ei:
        with_fingerprint(again, source="config.json")
    assert ei.value.field == "corpus.fingerprint" and ei.value.source == "config.json"
    with pytest.raises(StudyError) as ei:
        with_fingerprint(
            RunConfig.model_validate({"corpus": {"sources": [f"gutenberg:{tmp_path}/none"]}}), source="s.yaml"
        )
    assert ei.value.field == "corpus.sources[0].path" and ei.value.source == "s.yaml"
