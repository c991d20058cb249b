"""The data stage on a tiny text corpus: cache reuse, train-only tokenizer, manifest checks, lock, errors."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import study.data.corpus as corpus_mod
from study.cli import main
from study.config import RunConfig
from study.data.prepare import prepare_data, verify
from study.data.tokens import TokenizedSplit
from study.errors import StudyError
from study.paths import Layout

WORDS = (
    "the cat sat on a mat while dogs ran across green fields and birds sang loudly in tall trees "
    "near old stone walls under grey clouds"
).split()


def _corpus_text(n_docs: int = 40, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        sents = [
            " ".join(rng.choice(WORDS, size=int(rng.integers(5, 15)))).capitalize() + "." for _ in range(6)
        ]
        docs.append("\n".join(sents))
    return "\n\n".join(docs) + "\n"


@pytest.fixture
def tiny(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text(_corpus_text(), encoding="utf-8")
    cfg = RunConfig.model_validate(
        {"corpus": {"sources": [f"text:{f}"], "valid_fraction": 0.1}, "tokenizer": {"vocab_size": 200}}
    )
    return cfg, Layout(root=tmp_path / "results")


def test_prepare_writes_verified_folder_and_reuses_it(tiny, monkeypatch):
    cfg, layout = tiny
    p = prepare_data(cfg, layout, progress=False)
    assert p.dir == layout.data_dir(cfg.data_hash())
    assert verify(p.dir, cfg.data_hash()) is None
    man = json.loads((p.dir / "manifest.json").read_text())
    assert set(man["files"]) >= {
        "train.npz",
        "valid.npz",
        "test.npz",
        "stats.json",
        "tokenizer/tokenizer.json",
    }
    # stats: per split counts add up to the per-source totals, tokens equal the arrays
    st = p.stats
    for key in ("documents", "sentences", "words", "tokens"):
        assert sum(st["splits"][s][key] for s in ("train", "valid", "test")) == st["sources"][0][key]
    for s in ("train", "valid", "test"):
        sp = p.split(s)
        assert isinstance(sp, TokenizedSplit)
        assert sp.n_tokens == st["splits"][s]["tokens"] == len(sp.ids)
        assert sp.n_docs == st["splits"][s]["documents"]
        assert sp.ids.max() < p.special.vocab_size and sp.ids.min() >= 0
    assert st["splits"]["valid"]["documents"] >= 1 and len(st["corpus_hash"]) == 64
    assert p.continuation.dtype == np.bool_ and p.continuation.shape == (len(p.tokenizer),)
    assert not p.continuation[list(p.special.all)].any()

    # second call: no corpus read at all, same content
    def boom(*a, **k):
        raise AssertionError("load_corpus called on a cache hit")

    monkeypatch.setattr(corpus_mod, "load_corpus", boom)
    q = prepare_data(cfg, layout, progress=False)
    assert q.dir == p.dir and q.stats == p.stats
    np.testing.assert_array_equal(q.split("train").ids, p.split("train").ids)
    # no temp folder or lock left behind
    assert sorted(x.name for x in p.dir.parent.iterdir()) == [p.dir.name]


def test_tokenizer_is_trained_on_train_split_only(tmp_path):
    # each document has its own made-up word repeated: a word is in the vocabulary iff its
    # document landed in the train split
    docs = [" ".join([f"zq{chr(97 + i // 26)}{chr(97 + i % 26)}x"] * 8) + "." for i in range(60)]
    f = tmp_path / "c.txt"
    f.write_text("\n\n".join(docs), encoding="utf-8")
    cfg = RunConfig.model_validate(
        {
            "corpus": {"sources": [f"text:{f}"], "valid_fraction": 0.2, "test_fraction": 0.1},
            "tokenizer": {"vocab_size": 1000, "min_frequency": 2},
        }
    )
    p = prepare_data(cfg, Layout(root=tmp_path / "r"), progress=False)
    vocab = p.tokenizer.get_vocab()
    corpus = corpus_mod.load_corpus(cfg.corpus, progress=False)  # the same deterministic split
    words = {s: {d[0].split()[0] for d in corpus.split(s)} for s in ("train", "valid", "test")}
    assert words["valid"] and words["test"] and words["train"]
    assert all(w in vocab for w in words["train"])
    assert not any(w in vocab for w in words["valid"] | words["test"])
    # and the cached valid ids spell those unseen words with pieces / [UNK], never a whole-word id
    sp = p.split("valid")
    assert sp.n_docs == len(words["valid"])
    assert not set(sp.ids.tolist()) & {vocab[w] for w in words["train"]}


def test_vocab_round_trip(tiny):
    cfg, layout = tiny
    p = prepare_data(cfg, layout, progress=False)
    from transformers import BertTokenizerFast

    again = BertTokenizerFast.from_pretrained(str(p.dir / "tokenizer"))
    assert len(again) == len(p.tokenizer) == p.stats["vocab_size"] > 5
    assert again.get_vocab() == p.tokenizer.get_vocab()
    text = "the cat sat on a mat."
    assert again.decode(again(text, add_special_tokens=False)["input_ids"]) == text
    # ids in the cache decode back to the corpus words
    words = set(again.decode(p.split("train").ids[:200].tolist()).split())
    assert words <= set(WORDS) | {w + "." for w in WORDS} | {"."}


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_tokenizer", "delete_manifest"])
def test_damaged_cache_is_detected_and_rebuilt(tiny, caplog, damage):
    cfg, layout = tiny
    p = prepare_data(cfg, layout, progress=False)
    good = p.split("valid").ids.copy()
    npz = p.dir / "valid.npz"
    if damage == "truncate":
        npz.write_bytes(npz.read_bytes()[:-10])
    elif damage == "flip":  # same size, one byte changed: only the sha256 can catch it
        b = bytearray(npz.read_bytes())
        b[len(b) // 2] ^= 0xFF
        npz.write_bytes(bytes(b))
    elif damage == "delete_tokenizer":
        (p.dir / "tokenizer" / "tokenizer.json").unlink()
    else:
        (p.dir / "manifest.json").unlink()
    assert verify(p.dir, cfg.data_hash()) is not None
    with caplog.at_level(logging.WARNING, logger="study.data.prepare"):
        q = prepare_data(cfg, layout, progress=False)
    assert "rebuilding" in caplog.text
    assert verify(q.dir, cfg.data_hash()) is None
    np.testing.assert_array_equal(q.split("valid").ids, good)
    assert len(q.tokenizer) == len(p.tokenizer)


def test_stale_temp_folder_of_a_killed_build_is_removed(tiny):
    cfg, layout = tiny
    final = layout.data_dir(cfg.data_hash())
    stale = final.parent / f".{final.name}.abc123.tmp"  # what atomic_dir leaves when SIGKILLed
    (stale / "tokenizer").mkdir(parents=True)
    (stale / "train.npz").write_bytes(b"half")
    p = prepare_data(cfg, layout, progress=False)
    assert not stale.exists() and verify(p.dir, cfg.data_hash()) is None
    assert sorted(x.name for x in final.parent.iterdir()) == [final.name]


def test_concurrent_prepare_builds_once(tiny, monkeypatch):
    cfg, layout = tiny
    real = corpus_mod.load_corpus
    calls, entered = [], threading.Event()

    def slow_load(*a, **k):
        calls.append(threading.get_ident())
        entered.set()
        time.sleep(0.5)  # the second caller must arrive while this build is in progress
        return real(*a, **k)

    monkeypatch.setattr(corpus_mod, "load_corpus", slow_load)
    out = {}

    def worker(name):
        out[name] = prepare_data(cfg, layout, progress=False)

    a = threading.Thread(target=worker, args=("a",))
    a.start()
    assert entered.wait(30)
    b = threading.Thread(target=worker, args=("b",))
    b.start()
    a.join(60)
    b.join(60)
    assert len(calls) == 1, "two builders ran"
    assert out["a"].dir == out["b"].dir and out["a"].stats == out["b"].stats


def _assert_nothing_written(root: Path):
    assert not root.exists() or not any(root.rglob("*")), sorted(root.rglob("*"))


@pytest.mark.parametrize("case", ["empty", "non_utf8", "one_doc", "blank_only"])
def test_bad_corpus_raises_naming_field_and_writes_nothing(tmp_path, case):
    f = tmp_path / "c.txt"
    if case == "empty":
        f.write_text("", encoding="utf-8")
    elif case == "non_utf8":
        f.write_bytes("caf\xe9 au lait.\n\nsecond doc.".encode("latin-1"))
    elif case == "one_doc":
        f.write_text("Just one document here. It has two sentences.\n", encoding="utf-8")
    else:
        f.write_text("\n \n\t\n\n", encoding="utf-8")
    cfg = RunConfig.model_validate({"corpus": {"sources": [f"text:{f}"]}})
    root = tmp_path / "results"
    with pytest.raises(StudyError) as ei:
        prepare_data(cfg, Layout(root=root), progress=False)
    assert ei.value.field and ei.value.field.startswith("corpus.sources")
    _assert_nothing_written(root)


def test_cli_exit_2_on_bad_corpus(tmp_path, capsys):
    f = tmp_path / "c.txt"
    f.write_bytes(b"\xff\xfe not utf8\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: bad\nquestion: q\ndefaults:\n  corpus:\n    sources: ['text:{f}']\n", encoding="utf-8"
    )
    root = tmp_path / "results"
    rc = main(["--results", str(root), "--reports", str(tmp_path / "rep"), "prepare", str(spec), "--quiet"])
    assert rc == 2
    assert "corpus.sources" in capsys.readouterr().err
    _assert_nothing_written(root)


# --------------------------------------------------------------------------- tokenizer fast path
NASTY = [
    "café naïve 😀 x\u00a0y Straße ﬁne",
    "中文字符 mixed 日本",
    "tab\there\nnew\rline",
    "ctrl\x01char\x7f del",
    "\x85next\u2028line\u2029",
    "",
    "   ",
    "a" * 150,
    "é" * 120 + " ok",
    "İstanbul ǅ Σίσυφος",
    "\ufffd replacement \x00 nul",
    "don't-stop 3.14 $5 @user #tag ~x `q` ^ | {a}[b](c)",
    "ALL CAPS Mixed",
    "word—dash “quoted” ‘single’ … ellipsis",
    "x" * 99 + " " + "y" * 101,
    "the [MASK] sat on [CLS]x[SEP] and [mask] [UNK]",
    "[PAD][PAD] é[MASK]é",
]


@pytest.mark.parametrize("lowercase", [True, False])
def test_word_cache_encoding_equals_plain_encode_batch(tmp_path, shared_data, lowercase):
    from study.config import TokenizerConfig
    from study.data.readers import read_utf8, strip_gutenberg
    from study.data.tokenizer import encode_sentences, train_tokenizer

    lines = [
        ln
        for ln in strip_gutenberg(read_utf8(shared_data / "gutenberg" / "pg11.txt")).split("\n")
        if ln.strip()
    ]
    lines += (
        (shared_data / "wikitext-2-raw" / "wiki.valid.raw").read_text(encoding="utf-8").split("\n")[:3000]
    )
    tok = train_tokenizer(
        [lines[:2000]], TokenizerConfig(vocab_size=800, lowercase=lowercase), tmp_path / "tok"
    )
    sents = lines + NASTY
    fast_ids, fast_lens = encode_sentences(tok, sents, word_cache=True)
    ref_ids, ref_lens = encode_sentences(tok, sents, word_cache=False)
    assert fast_ids.dtype == np.int32 and fast_lens.sum() == len(fast_ids) > 10_000
    np.testing.assert_array_equal(fast_lens, ref_lens)
    np.testing.assert_array_equal(fast_ids, ref_ids)
    # and the plain path is the HF tokenizer itself
    for s in NASTY + lines[:50]:
        assert (
            tok(s, add_special_tokens=False)["input_ids"]
            == ref_ids[ref_lens[: sents.index(s)].sum() :][: ref_lens[sents.index(s)]].tolist()
        )


def test_tokenize_docs_keeps_document_alignment(tiny):
    cfg, layout = tiny
    p = prepare_data(cfg, layout, progress=False)
    from study.data.tokenizer import tokenize_docs

    docs = [["Hello cat."], ["", "\x01"], ["The mat.", "", "Dogs ran."]]  # doc 1 has no tokens at all
    sp = tokenize_docs(p.tokenizer, docs, progress=False)
    assert sp.n_docs == 3 and sp.n_sents == 3
    assert list(sp.doc_starts) == [0, 1, 1, 3]
    assert p.tokenizer.decode(sp.sentence(2).tolist()) == "dogs ran."


# --------------------------------------------------------------------------- describe / CLI
def test_describe_shows_stats_and_masked_instances(tiny):
    from study.data.prepare import describe

    cfg, layout = tiny
    p = prepare_data(cfg, layout, progress=False)
    out = describe(p, n=3)
    assert f"data {cfg.data_hash()}" in out
    assert re.search(r"^train\s+\d+\s+\d+", out, re.M) and re.search(r"^valid\s+\d+", out, re.M)
    assert "training instances" in out
    rows = re.findall(r"^\[(\d)\] (\d+) tokens, (\d+) selected, nsp label ([01]):$", out, re.M)
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert "[MASK:" in out and "[CLS]" in out and "[SEP]" in out
    masked = re.findall(r"\[MASK:([^\]]+)\]", out)
    assert masked and all(m.strip("#") in " ".join(WORDS) or m in ".[UNK]" for m in masked)
    assert describe(p, n=3) == out  # seeded: the same text every time


def test_cli_data_prints_description(tmp_path, capsys):
    f = tmp_path / "corpus.txt"
    f.write_text(_corpus_text(), encoding="utf-8")
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: t\nquestion: q\ndefaults:\n  corpus:\n    sources: ['text:{f}']\n"
        f"  tokenizer:\n    vocab_size: 200\n  objective:\n    max_seq_len: 32\n",
        encoding="utf-8",
    )
    rc = main(
        [
            "--results",
            str(tmp_path / "results"),
            "--reports",
            str(tmp_path / "rep"),
            "data",
            str(spec),
            "--quiet",
            "--samples",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[0] " in out and "[1] " in out and "[2] " not in out and "[MASK:" in out


# --------------------------------------------------------------------------- tokenizer training
def test_learn_wordpiece_known_example():
    from collections import Counter

    from study.data.tokenizer import SPECIALS, learn_wordpiece

    words = Counter({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5})
    vocab = learn_wordpiece(words, vocab_size=100, min_frequency=5)
    # pair counts: ##u ##g 20, ##u ##n 16, h ##ug 15, p ##un 12, then a tie at 5 (hug ##s, p ##ug):
    # broken by the strings; b ##un (4) is below min_frequency
    assert vocab == [
        *SPECIALS,
        "b",
        "g",
        "h",
        "n",
        "p",
        "s",
        "u",
        "##g",
        "##n",
        "##s",
        "##u",
        "##ug",
        "##un",
        "hug",
        "pun",
        "hugs",
        "pug",
    ]
    assert learn_wordpiece(words, vocab_size=18, min_frequency=1)[-2:] == ["##ug", "##un"]


def test_tokenizer_training_is_byte_identical_across_builds(tmp_path):
    from study.config import TokenizerConfig
    from study.data.tokenizer import train_tokenizer

    docs = [[s] for s in _corpus_text(60, seed=3).split("\n") if s.strip()]
    docs.append(["Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u201cquoted\u201d text, hyph-en-ated words."])
    cfg = TokenizerConfig(vocab_size=300, min_frequency=1)
    a = train_tokenizer(docs, cfg, tmp_path / "a")
    b = train_tokenizer(docs, cfg, tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (
        tmp_path / "b" / "tokenizer.json"
    ).read_bytes()
    assert a.get_vocab() == b.get_vocab() and len(a) > 100
    assert a.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # specials are atomic in text, and every training word encodes without [UNK]
    assert a("the [MASK] sat", add_special_tokens=False)["input_ids"][1] == a.mask_token_id
    ids = a(" ".join(s for d in docs for s in d), add_special_tokens=False)["input_ids"]
    assert a.unk_token_id not in ids


def test_mixed_sources_stats_per_source(tmp_path):
    text = tmp_path / "c.txt"
    text.write_text(_corpus_text(30), encoding="utf-8")
    wiki = tmp_path / "w.raw"
    wiki.write_text(
        "".join(f" \n = Article {i} = \n \n The cat sat on mat number {i} . \n" for i in range(12)),
        encoding="utf-8",
    )
    cfg = RunConfig.model_validate(
        {"corpus": {"sources": [f"text:{text}", f"wikitext:{wiki}"]}, "tokenizer": {"vocab_size": 200}}
    )
    p = prepare_data(cfg, Layout(root=tmp_path / "r"), progress=False)
    src = p.stats["sources"]
    assert [s["kind"] for s in src] == ["text", "wikitext"] and [s["documents"] for s in src] == [30, 12]
    assert src[1]["sentences"] == 12 and src[1]["words"] == 12 * 7
    for key in ("documents", "sentences", "words", "tokens"):
        assert sum(s[key] for s in src) == sum(p.stats["splits"][n][key] for n in ("train", "valid", "test"))


# --------------------------------------------------------------------------- corpus contents in the data identity
def _edit_in_place_same_size(f: Path) -> None:
    """Change one word to another of the same length: same size, new contents."""
    text = f.read_text(encoding="utf-8")
    assert " cat " in text
    f.write_text(text.replace(" cat ", " dog ", 1), encoding="utf-8")


def _spec_on(tmp_path: Path, corpus: Path) -> Path:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: fp\ndefaults:\n  corpus: {{sources: ['text:{corpus}'], valid_fraction: 0.1}}\n"
        "  tokenizer: {vocab_size: 200}\n",
        encoding="utf-8",
    )
    return spec


def test_an_edited_corpus_is_a_new_identity_and_is_rebuilt(tmp_path, monkeypatch):
    from study.studies.spec import load_study

    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(3):
        (src / f"book{i}.txt").write_text(_corpus_text(15, seed=i), encoding="utf-8")
    spec, layout = _spec_on(tmp_path, src), Layout(root=tmp_path / "results")
    old = load_study(spec).runs[0].config
    assert (
        old.corpus.fingerprint and load_study(spec).runs[0].run_hash == old.run_hash()
    )  # stable when unchanged
    first = prepare_data(old, layout, progress=False)
    size = (src / "book1.txt").stat().st_size
    _edit_in_place_same_size(src / "book1.txt")
    assert (src / "book1.txt").stat().st_size == size
    new = load_study(spec).runs[0].config
    assert new.corpus.fingerprint != old.corpus.fingerprint
    assert new.data_hash() != old.data_hash() and new.run_hash() != old.run_hash()
    reads = []
    real = corpus_mod.load_corpus
    monkeypatch.setattr(corpus_mod, "load_corpus", lambda *a, **k: reads.append(1) or real(*a, **k))
    second = prepare_data(new, layout, progress=False)
    assert reads == [1] and second.dir != first.dir  # rebuilt from the new text, into a new folder
    assert second.stats["fingerprint"] == new.corpus.fingerprint
    assert second.stats["corpus_hash"] != first.stats["corpus_hash"]
    # the old resolved config now names data that no longer exists: refused, nothing reused
    with pytest.raises(StudyError) as ei:
        prepare_data(old, layout, progress=False)
    assert ei.value.field == "corpus.fingerprint"


def test_unresolved_config_never_reuses_a_folder_built_from_other_contents(tiny, caplog):
    cfg, layout = tiny  # built in code: no fingerprint, so its data hash cannot see the contents
    assert cfg.corpus.fingerprint is None
    f = Path(cfg.corpus.sources[0].path)
    first = prepare_data(cfg, layout, progress=False)
    _edit_in_place_same_size(f)
    with caplog.at_level(logging.WARNING):
        second = prepare_data(cfg, layout, progress=False)
    assert "built from other corpus contents" in caplog.text
    assert second.stats["fingerprint"] != first.stats["fingerprint"]
    assert second.stats["corpus_hash"] != first.stats["corpus_hash"]


def test_missing_source_at_prepare_is_a_study_error_and_writes_nothing(tmp_path):
    cfg = RunConfig.model_validate({"corpus": {"sources": ["embedded", f"text:{tmp_path / 'gone.txt'}"]}})
    root = tmp_path / "results"
    with pytest.raises(StudyError) as ei:
        prepare_data(cfg, Layout(root=root), progress=False)
    assert ei.value.field == "corpus.sources[1].path" and "does not exist" in str(ei.value)
    _assert_nothing_written(root)


def test_reference_set_is_the_same_whatever_the_run_trains(tiny):
    """The fixed reference (docs/ARCHITECTURE.md): the same rows, the same asked positions and the same
    shown tokens for runs that differ in masking rate, unit, replacement split, objective and format;
    only the row length (objective.max_seq_len) and train.eval_sequences choose what it is."""
    from study.pretrain.evaluate import reference_set

    cfg, layout = tiny
    prepared = prepare_data(cfg, layout, progress=False)
    base = cfg.model_dump()
    variants = [cfg] + [
        RunConfig.model_validate({**base, **change})
        for change in (
            {"masking": {**base["masking"], "rate": 0.4, "unit": "whole_word"}},
            {"masking": {**base["masking"], "mask": 0.0, "random": 0.0, "keep": 1.0}},
            {"objective": {**base["objective"], "format": "doc_sentences", "sentence": "none"}},
        )
    ]
    for v in variants[1:]:
        assert v.data_hash() == cfg.data_hash() and v.run_hash() != cfg.run_hash()
    sets = [reference_set(v, prepared) for v in variants]
    assert sets[0].labels.ne(-100).any() and sets[0].input_ids.eq(prepared.special.mask).any()
    for s in sets[1:]:
        for f in ("input_ids", "labels", "attention_mask", "token_type_ids"):
            assert torch.equal(getattr(s, f), getattr(sets[0], f)), f
    # and it does move with what should move it: another row length is another reference
    longer = RunConfig.model_validate(
        {**base, "objective": {**base["objective"], "max_seq_len": cfg.objective.max_seq_len // 2}}
    )
    assert reference_set(longer, prepared).input_ids.shape[1] != sets[0].input_ids.shape[1]
