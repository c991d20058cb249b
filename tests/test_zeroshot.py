"""The zero-shot evaluations (study/zeroshot/): the PLL scorer against a peer (minicons), determinism, ties,
the result cache, BLiMP's sample and the cross-sentence rows, and that none of it moves a run hash."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pandas as pd
import pytest
import report_fixtures as rf
import torch

from study.config import RunConfig
from study.data.tokenizer import continuation_mask, load_tokenizer, special_ids, train_tokenizer
from study.data.tokens import TokenizedSplit
from study.errors import StudyError
from study.io import read_json
from study.metrics import BLIMP, CROSS_SENTENCE
from study.model.bert import build_model
from study.paths import Layout
from study.report.aggregate import aggregate_study
from study.report.render import render_report
from study.studies.spec import load_study
from study.zeroshot import blimp, crosssent
from study.zeroshot import run as zs_run
from study.zeroshot.pll import Scored, mask_sets, pll, sentence_rows

# Rare, long words so that a small WordPiece vocabulary splits them into several pieces (within_word_l2r
# then masks more than the scored piece), punctuation and a contraction as BLiMP has them.
SENTENCES = [
    "The dermatologists haven't attacked the unconvinced photographers.",
    "Who did Amanda's lawyer fire before the hospital hired Curtis?",
    "Every cashier was forgetting about those rather uncomfortable mushrooms.",
    "Some waitresses boast about themselves, and Gregory hides.",
    "Those glaciers aren't vaporizing, but this lamp is sparkling.",
    "A child with the sketches reveals herself to Diana.",
    "Kristen wasn't irritating many customers.",
    "There were probably many senators who weren't escaping from Noah.",
]
CONFIG = {
    "tokenizer": {"vocab_size": 160, "min_frequency": 1},
    "objective": {"max_seq_len": 48, "sentence": "none"},
    # init_range 0.3: far from uniform predictions, so a wrong position or mask shows in the PLL
    "model": {
        "layers": 2,
        "hidden": 32,
        "heads": 2,
        "intermediate": 64,
        "max_positions": 64,
        "init_range": 0.3,
    },
    "finetune": {"max_length": 48},
    "impl": {"device": "cpu", "progress": False},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model exported as the pre-training stage leaves it: save_pretrained + tokenizer in one folder."""
    torch.set_num_threads(1)
    cfg = RunConfig.model_validate(CONFIG)
    model_dir = tmp_path_factory.mktemp("zs") / "model"
    train_tokenizer([SENTENCES * 3], cfg.tokenizer, model_dir)
    tok = load_tokenizer(model_dir)
    model = build_model(cfg.model, len(tok), sentence_head=False, impl=cfg.impl, seed=3)
    model.save_pretrained(str(model_dir))
    return cfg, tok, model, model_dir


@pytest.mark.parametrize("metric", ["original", "within_word_l2r"])
def test_pll_equals_minicons(tiny, metric):
    scorer = pytest.importorskip("minicons.scorer")
    cfg, tok, model, model_dir = tiny
    peer = scorer.MaskedLMScorer(str(model_dir), "cpu")
    # minicons 0.3.39 calls batch_encode_plus, which transformers 5 removed; __call__ takes the same arguments
    peer.tokenizer.batch_encode_plus = peer.tokenizer.__call__
    theirs = peer.sequence_score(SENTENCES, reduction=lambda x: x.sum(0).item(), PLL_metric=metric)
    ours = pll(model, sentence_rows(tok, SENTENCES, 64), tok.mask_token_id, metric=metric)
    assert np.abs(ours - np.array(theirs)).max() < 1e-4, (ours, theirs)
    # the words really are split, so the two metrics are not the same computation
    rows = sentence_rows(tok, SENTENCES, 64)
    assert any(len(m) > 1 for r in rows for _, m in mask_sets(r, "within_word_l2r"))


def test_metrics_differ_on_multipiece_words(tiny):
    cfg, tok, model, _ = tiny
    rows = sentence_rows(tok, SENTENCES, 64)
    a = pll(model, rows, tok.mask_token_id, metric="original")
    b = pll(model, rows, tok.mask_token_id, metric="within_word_l2r")
    assert np.abs(a - b).max() > 1e-3


def test_deterministic_and_no_rng_consumed(tiny):
    cfg, tok, model, _ = tiny
    rows = sentence_rows(tok, SENTENCES, 64)
    model.train()  # the scorer must score in eval mode and give the mode back
    state = torch.get_rng_state()
    first = pll(model, rows, tok.mask_token_id)
    second = pll(model, rows, tok.mask_token_id)
    assert torch.equal(state, torch.get_rng_state())
    assert model.training
    assert np.array_equal(first, second)
    # another batch composition (one sentence alone) gives the same score up to float rounding
    alone = pll(model, rows[2:3], tok.mask_token_id)
    assert abs(alone[0] - first[2]) < 1e-4


def test_tie_is_a_failure():
    pairs = [blimp.Pair("u", "t", 0, "a", "b"), blimp.Pair("u", "t", 1, "c", "d")]
    res = blimp.pair_results(pairs, np.array([-5.0, -5.0, -4.0, -6.0]))
    assert [r["correct"] for r in res] == [False, True]
    assert blimp.summary(res)["accuracy"] == 0.5
    per = [{"true": -3.0, "random": -3.0, "tokens": 2}, {"true": -2.0, "random": -4.0, "tokens": 2}]
    s = crosssent.summary(per)
    assert s["win_rate"] == 0.5 and s["gain"] == pytest.approx(0.5)


def test_blimp_sample(shared_data):
    pairs = blimp.read_pairs(shared_data / "blimp" / "BLiMP.zip", 3)
    assert len(pairs) == 3 * blimp.PARADIGMS
    assert len({p.term for p in pairs}) == 13
    assert pairs == blimp.read_pairs(shared_data / "blimp" / "BLiMP.zip", 3)  # deterministic
    more = blimp.read_pairs(shared_data / "blimp" / "BLiMP.zip", 6)
    assert {(p.uid, p.pair_id) for p in pairs} <= {(p.uid, p.pair_id) for p in more}  # nested samples


def test_crosssent_rows_follow_the_training_layout(tiny):
    cfg, tok, model, _ = tiny
    ids = [list(range(10, 10 + n)) for n in (5, 6, 7, 5, 6, 8)]
    split = TokenizedSplit.from_lists([ids[:3], ids[3:]])
    ts = crosssent.triples(split, 10)
    assert ts and all(t.b == t.a + 1 for t in ts)
    doc = np.repeat(np.arange(split.n_docs), np.diff(split.doc_starts))
    assert all(doc[t.other] != doc[t.a] for t in ts)
    sp, cont = special_ids(tok), continuation_mask(tok)
    for segments in (True, False):
        r_true, r_other = crosssent.rows(split, ts[:1], sp, cont, segments, 48)
        b = split.sentence(ts[0].b).tolist()
        for r in (r_true, r_other):
            assert [r.ids[k] for k in r.targets] == b  # only B is scored
            assert r.ids[0] == sp.cls and r.ids[-1] == sp.sep
            assert set(r.types[r.targets[0] :]) == {1 if segments else 0}
            assert (sp.sep in r.ids[:-1]) == segments  # [SEP] between A and B only with segments


def test_cache_prevents_rescoring_and_hashes_stay(tiny, tmp_path, monkeypatch):
    cfg, tok, model, model_dir = tiny
    cfg = cfg.model_copy(deep=True)
    cfg.zeroshot.crosssent = False
    cfg.zeroshot.blimp_pairs = 1
    layout = Layout(tmp_path / "results", tmp_path / "reports")
    zip_path = tmp_path / "BLiMP.zip"
    _fake_blimp(zip_path)
    cfg.zeroshot.blimp_zip = str(zip_path)
    calls = []
    real = zs_run.random_model
    monkeypatch.setattr(
        zs_run, "random_model", lambda *a, **k: calls.append(1) or (tok, real(*a, **k)[1], "x")
    )
    monkeypatch.setattr(
        "study.downstream.models.prepare_data", lambda *a, **k: pytest.fail("the tokenizer is the model's")
    )
    (layout.run_dir(cfg.run_hash()) / "model").mkdir(parents=True)
    for f in model_dir.iterdir():
        (layout.run_dir(cfg.run_hash()) / "model" / f.name).write_bytes(f.read_bytes())
    first = zs_run.zeroshot_baseline(cfg, layout, quiet=True)
    assert len(calls) == 1 and first[0]["task"] == BLIMP and len(first[0]["pairs"]) == blimp.PARADIGMS
    again = zs_run.zeroshot_baseline(cfg, layout, quiet=True)
    assert len(calls) == 1 and again == first  # read back, not scored again (the model was not even built)
    path = layout.zeroshot_file(cfg.baseline_key(), BLIMP, cfg.zeroshot_hashes()[BLIMP])
    assert path.is_file()
    # the evaluation's settings are its own identity, never the run's
    other = cfg.model_copy(deep=True)
    other.zeroshot.blimp_pairs, other.zeroshot.pll = 7, "within_word_l2r"
    assert other.run_hash() == cfg.run_hash() and other.baseline_key() == cfg.baseline_key()
    assert other.zeroshot_hashes()[BLIMP] != cfg.zeroshot_hashes()[BLIMP]
    assert "zeroshot" not in cfg.semantic()


def test_run_hashes_unchanged():
    # the default config's and a packed format's hashes as they were before the zeroshot section existed
    assert RunConfig().run_hash() == "4862e86c4da0"
    packed = RunConfig.model_validate({"objective": {"format": "full_sentences", "sentence": "none"}})
    assert packed.run_hash() == "f04a4fd7418d" and packed.baseline_key() == "random-612e2abfaea0"
    # a baseline shared by a pair and a packed format is scored in each layout
    assert packed.zeroshot_hashes()[CROSS_SENTENCE] != RunConfig().zeroshot_hashes()[CROSS_SENTENCE]
    assert packed.zeroshot_hashes()[BLIMP] == RunConfig().zeroshot_hashes()[BLIMP]


def _fake_blimp(path) -> None:
    """A BLiMP-shaped zip: 67 paradigms of 2 pairs, plus the macOS metadata the real one carries."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__MACOSX/data/._p00.jsonl", "junk")
        z.writestr("data/.DS_Store", "junk")
        for k in range(blimp.PARADIGMS):
            lines = [
                json.dumps(
                    {
                        "sentence_good": SENTENCES[(k + i) % 8],
                        "sentence_bad": SENTENCES[(k + i + 1) % 8],
                        "linguistics_term": f"term{k % 13}",
                        "UID": f"p{k:02d}",
                        "pairID": str(i),
                    }
                )
                for i in range(2)
            ]
            z.writestr(f"data/p{k:02d}.jsonl", "\n".join(lines) + "\n")


def test_scored_type():
    r = Scored((2, 5, 6, 3), (0, 0, 0, 0), (1, 2), (None, 0, 0, None))
    assert mask_sets(r, "original") == [(1, [1]), (2, [2])]
    assert mask_sets(r, "within_word_l2r") == [(1, [1, 2]), (2, [2])]
    with pytest.raises(ValueError):
        mask_sets(r, "l2r")


def test_tables_and_report_section(tmp_path, shared_data):
    """Zero-shot result files of every run and baseline reach the tidy table (headline metrics), the
    per-phenomenon tables and the report's section, beside the BLiMP paper's models and human agreement."""
    layout, plan, study_dir = rf.build(tmp_path, "nsp", failures=False)
    hashes = {BLIMP: "bh", CROSS_SENTENCE: "ch"}
    terms = ["anaphor_agreement", "binding"]
    for r in plan["runs"]:
        r["zeroshot"] = hashes
        cfg = layout.run_dir(r["run_hash"]) / "config.json"
        conf = read_json(cfg)
        conf["zeroshot"] = {"blimp_zip": str(shared_data / "blimp" / "BLiMP.zip")}
        cfg.write_text(json.dumps(conf))
        nsp = r["factors"]["objective.sentence"] == "nsp"
        for key, init, acc in (
            (r["run_hash"], "pretrained", 0.6 + 0.05 * nsp),
            (r["baseline_key"], "random", 0.5),
        ):
            metrics = {
                "accuracy": acc,
                "pairs": 200,
                **{f"accuracy:{t}": acc + 0.01 * i for i, t in enumerate(terms)},
            }
            for ev, m in (
                (BLIMP, metrics),
                (CROSS_SENTENCE, {"gain": 0.02 * nsp, "win_rate": 0.55, "pairs": 600}),
            ):
                path = layout.zeroshot_file(key, ev, hashes[ev])
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"init": init, "metrics": m, "recipe": {"pll": "original"}}))
    out = aggregate_study(plan, layout)
    tidy = read_json(out / "study.json")  # the aggregate ran through
    assert tidy["plan"]["runs"][0]["zeroshot"] == hashes
    results = pd.read_csv(out / "results.csv")
    zs = results[results["mode"] == "zeroshot"]
    assert set(zip(zs["task"], zs["metric"], strict=True)) == {
        (BLIMP, "accuracy"),
        (CROSS_SENTENCE, "gain"),
        (CROSS_SENTENCE, "win_rate"),
    }  # per phenomenon stays out of the comparisons
    detail = pd.read_csv(out / "zeroshot_summary.csv")
    assert {f"accuracy:{t}" for t in terms} <= set(detail["metric"])
    base = pd.read_csv(out / "baseline.csv")
    assert ((base["task"] == BLIMP) & (base["metric"] == "accuracy")).any()  # pre-trained vs random init
    html = render_report(out, layout.report_dir(plan["name"])).read_text()
    assert 'id="blimp"' in html and "GPT-2 (paper)" in html and "83.0" in html and "human (paper)" in html
    assert "1,200 minimal pairs" not in html and "200 minimal pairs" in html  # pairs per model, as scored
    assert 'id="fig-blimp-phenomena"' in html and 'id="crosssent"' in html


@pytest.mark.parametrize(
    "primary, ok",
    [
        ("BLiMP/zeroshot/accuracy", True),
        ("cross-sentence/zeroshot/win_rate", True),
        ("BLiMP/zeroshot/gain", False),
    ],
)
def test_a_zeroshot_metric_may_be_a_primary(tmp_path, primary, ok):
    spec = {
        "name": "z",
        "question": "q?",
        "defaults": {"corpus": {"sources": ["embedded"]}, "finetune": {"tasks": ["SST-2"]}},
        "seeds": [0],
        "report": {"primary_metric": primary},
    }
    (tmp_path / "z.yaml").write_text(json.dumps(spec))  # JSON is YAML
    if ok:
        assert load_study(tmp_path / "z.yaml").runs
    else:
        with pytest.raises(StudyError, match="report.primary_metric"):
            load_study(tmp_path / "z.yaml")
