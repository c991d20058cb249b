"""Fine-tuning, probe and random baseline end to end on a tiny model and tiny GLUE-format fixtures.

The fixture task is easy on purpose (the label is carried by one sentiment word), so a fine-tune that
does not actually train fails the accuracy check; STS-B exercises the regression path, QNLI (dev only,
as in ../shared/data/glue) the skipped-task record.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from study.config import RunConfig
from study.data.tokenizer import train_tokenizer
from study.downstream import encode as enc_mod
from study.downstream import finetune as ft_mod
from study.downstream import probe as probe_mod
from study.downstream.classifier import Classifier
from study.downstream.encode import Encoded, collate
from study.downstream.finetune import finetune_baseline, finetune_run, result_path
from study.errors import StudyError
from study.model.bert import build_model
from study.paths import Layout
from study.runtime import resolve

POS = ["good", "great", "lovely", "superb", "fine", "wonderful"]
NEG = ["bad", "awful", "poor", "dull", "terrible", "boring"]
FILL = [
    "the",
    "movie",
    "film",
    "was",
    "plot",
    "a",
    "story",
    "actors",
    "really",
    "quite",
    "it",
    "is",
    "and",
    "with",
    "of",
    "this",
    "that",
    "scenes",
    "music",
    "ending",
]
KEYS = {
    "run_key",
    "task",
    "mode",
    "init",
    "seed",
    "metrics",
    "primary_metric",
    "primary",
    "n_train",
    "n_eval",
    "finetune_hash",
    "task_data",
    "encoder_data",
    "provenance",
}


def sentence(rng, label: int) -> str:
    words = list(rng.choice(FILL, size=rng.integers(4, 9)))
    words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(POS if label else NEG)))
    return " ".join(words)


def make_glue(root, n_train=300, n_dev=100, seed=0):
    rng = np.random.default_rng(seed)
    (root / "SST-2").mkdir(parents=True)
    for split, n in (("train", n_train), ("dev", n_dev)):
        labels = rng.integers(0, 2, n)
        rows = "".join(f"{sentence(rng, int(y))} \t{y}\n" for y in labels)
        (root / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + rows)
    (root / "STS-B").mkdir()
    cols = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    for split, n in (("train", 120), ("dev", 60)):
        rows = []
        for i in range(n):
            a, b = set(rng.choice(FILL, 5)), set(rng.choice(FILL, 5))
            score = 5 * len(a & b) / len(a | b)
            rows.append(f"{i}\tg\tf\t2012\t{i}\tnone\tnone\t{' '.join(a)}\t{' '.join(b)}\t{score:.3f}\n")
        (root / "STS-B" / f"{split}.tsv").write_text(cols + "".join(rows))
    (root / "QNLI").mkdir()  # dev only, like the real shared copy
    (root / "QNLI" / "dev.tsv").write_text("index\tquestion\tsentence\tlabel\n0\twhat ?\tit .\tentailment\n")
    return root


def make_cfg(glue, **finetune) -> RunConfig:
    ft = dict(
        tasks=["SST-2", "STS-B", "QNLI"],
        glue_dir=str(glue),
        seeds=[0, 1],
        epochs=8,
        lr=2e-3,
        batch_size=16,
        max_length=32,
        max_train_examples=240,
        max_eval_examples=80,
        probe=True,
        probe_layers=1,
    )
    ft.update(finetune)
    return RunConfig.model_validate(
        {
            "tokenizer": {"vocab_size": 128, "min_frequency": 1},
            "objective": {"max_seq_len": 32},
            "model": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "max_positions": 64},
            "finetune": ft,
            "impl": {"device": "cpu", "progress": False},
        }
    )


def write_model(cfg: RunConfig, layout: Layout, vocab_extra: int = 0):
    """What the pre-training stage leaves behind: model/ with save_pretrained weights + tokenizer."""
    model_dir = layout.run_dir(cfg.run_hash()) / "model"
    rng = np.random.default_rng(1)
    docs = [[sentence(rng, i % 2) for i in range(20)] for _ in range(10)]
    tok = train_tokenizer(docs, cfg.tokenizer, model_dir)
    model = build_model(cfg.model, len(tok) + vocab_extra, sentence_head=True, impl=cfg.impl, seed=cfg.seed)
    model.save_pretrained(str(model_dir))
    return model_dir


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """One full finetune_run (3 tasks x 2 seeds x finetune+probe), shared by the checks below."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ft")
    glue = make_glue(root / "glue")
    cfg = make_cfg(glue)
    layout = Layout(root=root / "results")
    write_model(cfg, layout)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    results = finetune_run(cfg, layout, quiet=True)
    return {
        "cfg": cfg,
        "layout": layout,
        "results": results,
        "glue": glue,
        "root": root,
        "rng_untouched": torch.equal(before, torch.get_rng_state()),
    }


def test_result_files_follow_the_contract(done):
    cfg, layout, results = done["cfg"], done["layout"], done["results"]
    fh = cfg.finetune_hash()
    assert len(results) == 3 * 2 * 2
    for task in ("SST-2", "STS-B"):
        for mode in ("finetune", "probe"):
            for seed in (0, 1):
                path = result_path(layout, cfg.run_hash(), task, fh, mode, seed)
                assert path == layout.finetune_dir(cfg.run_hash()) / task / fh / f"{mode}-seed{seed}.json"
                res = json.loads(path.read_text())
                assert KEYS <= set(res)
                assert (res["run_key"], res["task"], res["mode"], res["init"], res["seed"]) == (
                    cfg.run_hash(),
                    task,
                    mode,
                    "pretrained",
                    seed,
                )
                assert res["primary"] == res["metrics"][res["primary_metric"]]
                assert res["finetune_hash"] == fh and res["provenance"]["packages"]["torch"]
                assert all(np.isfinite(v) for v in res["metrics"].values())
                assert res in results
    sst = json.loads(result_path(layout, cfg.run_hash(), "SST-2", fh, "finetune", 0).read_text())
    assert (sst["n_train"], sst["n_eval"], sst["primary_metric"]) == (240, 80, "accuracy")
    sts = json.loads(result_path(layout, cfg.run_hash(), "STS-B", fh, "finetune", 0).read_text())
    assert (sts["n_train"], sts["n_eval"], sts["primary_metric"]) == (120, 60, "spearman")
    assert set(sts["metrics"]) == {"pearson", "spearman"}


def test_finetune_learns_and_probe_works(done):
    cfg, layout = done["cfg"], done["layout"]
    fh = cfg.finetune_hash()
    for seed in (0, 1):
        res = json.loads(result_path(layout, cfg.run_hash(), "SST-2", fh, "finetune", seed).read_text())
        # one word decides the label: a fine-tune that trains gets it; chance is 0.5
        assert res["metrics"]["accuracy"] >= 0.85, res["metrics"]
        assert res["steps"] == 8 * 15 and res["train_loss"] < 0.3
    probes = [
        json.loads(result_path(layout, cfg.run_hash(), "SST-2", fh, "probe", s).read_text()) for s in (0, 1)
    ]
    assert probes[0]["metrics"] == probes[1]["metrics"]  # frozen encoder: deterministic, fitted once
    assert probes[0]["features"] == 32 and probes[0]["metrics"]["accuracy"] > 0.5
    seeds = [
        json.loads(result_path(layout, cfg.run_hash(), "SST-2", fh, "finetune", s).read_text())
        for s in (0, 1)
    ]
    assert seeds[0]["train_loss"] != seeds[1]["train_loss"]  # the seed matters ...
    assert done["rng_untouched"]  # ... without touching the caller's RNG


def test_task_without_train_split_is_recorded(done):
    cfg, layout = done["cfg"], done["layout"]
    for mode in ("finetune", "probe"):
        for seed in (0, 1):
            res = json.loads(
                result_path(layout, cfg.run_hash(), "QNLI", cfg.finetune_hash(), mode, seed).read_text()
            )
            assert res["run_key"] == cfg.run_hash() and res["task"] == "QNLI"
            assert "no train split" in res["skipped"] and "QNLI/train.tsv" in res["skipped"]


def test_existing_results_are_not_recomputed(done, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("recomputed an existing result")

    monkeypatch.setattr(ft_mod, "_finetune_one", boom)
    monkeypatch.setattr(ft_mod, "probe", boom)
    again = finetune_run(done["cfg"], done["layout"], quiet=True)
    assert again == done["results"]
    # a missing file is recomputed, and only that one
    cfg, layout = done["cfg"], done["layout"]
    path = result_path(layout, cfg.run_hash(), "SST-2", cfg.finetune_hash(), "finetune", 1)
    old = json.loads(path.read_text())
    path.unlink()
    monkeypatch.setattr(ft_mod, "_finetune_one", lambda *a, **k: {"metrics": {"accuracy": 0.25}, "steps": 0})
    res = finetune_run(cfg, layout, quiet=True)
    assert json.loads(path.read_text())["primary"] == 0.25 and sum(r.get("primary") == 0.25 for r in res) == 1
    path.write_text(json.dumps(old))  # restore for the other tests


def test_same_seed_same_result(done, tmp_path):
    """A fresh results folder, same checkpoint and seed -> the same numbers (tokenization cache cold)."""
    cfg = make_cfg(done["glue"], tasks=["SST-2"], seeds=[0], probe=False)
    assert cfg.finetune_hash() != done["cfg"].finetune_hash()
    layout = Layout(root=tmp_path / "results")
    src = done["layout"].run_dir(cfg.run_hash()) / "model"
    shutil.copytree(src, layout.run_dir(cfg.run_hash()) / "model")
    a = finetune_run(cfg, layout, quiet=True)[0]
    ref = json.loads(
        result_path(
            done["layout"], cfg.run_hash(), "SST-2", done["cfg"].finetune_hash(), "finetune", 0
        ).read_text()
    )
    assert a["metrics"] == ref["metrics"] and a["train_loss"] == ref["train_loss"]
    cached = list((layout.root / ".cache" / "finetune").glob("SST-2-train-*.npz"))
    assert len(cached) == 1
    # the cache round trip gives back exactly what the tokenizer gives
    from study.data.tokenizer import load_tokenizer
    from study.downstream.tasks import load_task

    tok = load_tokenizer(layout.run_dir(cfg.run_hash()) / "model")
    data = enc_mod.cap_rows(load_task("SST-2", done["glue"], "train"), 240)
    e = enc_mod.encode(tok, data, 32, layout, str(done["glue"]))
    fresh = tok(data.text_a, truncation=True, max_length=32)["input_ids"]
    assert [x.tolist() for x in e.ids] == fresh and len(cached) == 1


def test_random_baseline(done):
    cfg, layout = done["cfg"], done["layout"]
    small = cfg.model_copy(
        update={"finetune": cfg.finetune.model_copy(update={"tasks": ["SST-2"], "seeds": [0]})}
    )
    res = finetune_baseline(small, layout, quiet=True)
    key = cfg.baseline_key()
    assert key.startswith("random-") and [r["init"] for r in res] == ["random", "random"]
    assert {r["mode"] for r in res} == {"finetune", "probe"} and all(r["run_key"] == key for r in res)
    assert result_path(layout, key, "SST-2", small.finetune_hash(), "finetune", 0).is_file()
    assert res[0]["encoder"].startswith("random init (seed 0)")
    # The fixture's "pre-trained" checkpoint is an untrained build_model(seed=cfg.seed), i.e. exactly
    # what the baseline draws: same architecture, same recipe -> the very same numbers. This pins the
    # save/load path and the baseline to one model definition (a different init would not match).
    ref = json.loads(
        result_path(layout, cfg.run_hash(), "SST-2", cfg.finetune_hash(), "finetune", 0).read_text()
    )
    assert small.finetune_hash() == cfg.finetune_hash()
    assert res[0]["metrics"] == ref["metrics"] and res[0]["train_loss"] == ref["train_loss"]
    other = small.model_copy(update={"seed": 1})
    # its tokenizer from a checkpoint folder too (otherwise the data stage would build the default corpus)
    shutil.copytree(layout.run_dir(cfg.run_hash()) / "model", layout.run_dir(other.run_hash()) / "model")
    assert finetune_baseline(other, layout, quiet=True)[0]["train_loss"] != ref["train_loss"]


def test_baseline_without_checkpoint_uses_the_data_stage_tokenizer(tmp_path):
    """No pre-training run yet: the tokenizer comes from study.data.prepare.prepare_data (same data_hash)."""
    rng = np.random.default_rng(3)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n\n".join("\n".join(sentence(rng, i % 2) + " ." for i in range(8)) for _ in range(30))
    )
    glue = make_glue(tmp_path / "glue", n_train=40, n_dev=20)
    cfg = make_cfg(glue, tasks=["SST-2"], seeds=[0], epochs=1, probe=False)
    cfg = RunConfig.model_validate({**cfg.model_dump(), "corpus": {"sources": [f"text:{corpus}"]}})
    layout = Layout(root=tmp_path / "results")
    res = finetune_baseline(cfg, layout, quiet=True)
    assert res[0]["init"] == "random" and str(layout.data_dir(cfg.data_hash())) in res[0]["encoder"]
    assert not layout.run_dir(cfg.run_hash()).exists()


def test_baseline_key_depends_on_architecture_vocab_and_seed_only(done):
    cfg = done["cfg"]

    def with_(**sections):
        d = cfg.model_dump()
        for dotted, v in sections.items():
            sec, _, key = dotted.partition("__")
            if key:
                d[sec][key] = v
            else:
                d[sec] = v
        return RunConfig.model_validate(d)

    k = cfg.baseline_key()
    assert with_(objective__sentence="none", objective__format="doc_sentences").baseline_key() == k
    assert with_(train__lr=1e-4, masking__unit="whole_word", finetune__lr=1e-5).baseline_key() == k
    assert with_(model__hidden=64).baseline_key() != k
    assert with_(tokenizer__vocab_size=256).baseline_key() != k
    assert with_(seed=1).baseline_key() != k


def test_pooling_identity():
    """finetune.pooling is semantic: "mean" is another fine-tuning recipe (hash), the same pre-training run;
    the default "cls" stays out of the dump, so every existing recipe keeps its finetune_hash."""
    base = RunConfig()
    assert "pooling" not in base.finetune.model_dump()
    mean = RunConfig.model_validate({"finetune": {"pooling": "mean"}})
    assert mean.finetune_hash() != base.finetune_hash()
    assert mean.run_hash() == base.run_hash() and mean.baseline_key() == base.baseline_key()
    assert RunConfig.model_validate(json.loads(mean.model_dump_json())).finetune.pooling == "mean"


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_row_scores_the_same_whatever_its_batch_pads_to(pooling):
    """Padding never enters what the head reads: a row's logits (and probe features) are the same alone and
    padded inside a batch with a longer row. A mean over the padded width would fail this."""
    torch.manual_seed(0)
    cfg = RunConfig.model_validate(
        {"model": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64}, "impl": {"device": "cpu"}}
    )
    bert = build_model(cfg.model, 100, sentence_head=False, impl=cfg.impl, seed=0).bert.eval()
    clf = Classifier(bert, 2, 0.0, 0.02, torch.Generator().manual_seed(0), pooling).eval()
    rows = Encoded(
        [np.array([2, 17, 40, 9, 3], np.int32), np.arange(5, 45, dtype=np.int32)],
        [np.zeros(5, np.int8), np.zeros(40, np.int8)],
        np.zeros(2, np.int64),
    )
    dev = torch.device("cpu")
    with torch.no_grad():
        alone = clf(**collate(rows, np.array([0]), dev))
        padded = clf(**collate(rows, np.array([0, 1]), dev))[:1]
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-6)
    rt = resolve(cfg.impl)

    def feats(idx):
        part = Encoded([rows.ids[i] for i in idx], [rows.types[i] for i in idx], rows.labels[idx])
        return probe_mod.features(bert, part, 1, rt, "", True, pooling)

    np.testing.assert_allclose(feats([0, 1])[0], feats([0])[0], rtol=1e-5, atol=1e-6)
    if pooling == "mean":  # and it is the mean: of the last layer over the row's own tokens
        with torch.no_grad():
            h = bert(**collate(rows, np.array([0]), dev)).last_hidden_state[0]
        np.testing.assert_allclose(feats([0])[0], h.mean(0).numpy(), rtol=1e-5, atol=1e-6)


def test_tokenizer_vocab_mismatch_is_a_user_error(tmp_path):
    glue = make_glue(tmp_path / "glue", n_train=20, n_dev=10)
    cfg = make_cfg(glue)
    layout = Layout(root=tmp_path / "results")
    write_model(cfg, layout, vocab_extra=7)
    with pytest.raises(StudyError, match="tokenizer has .* tokens but the model's embedding has") as e:
        finetune_run(cfg, layout, quiet=True)
    assert e.value.field == "tokenizer.vocab_size"
    assert not layout.finetune_dir(cfg.run_hash()).exists()


def test_user_errors_before_anything_is_written(tmp_path):
    glue = make_glue(tmp_path / "glue", n_train=20, n_dev=10)
    layout = Layout(root=tmp_path / "results")
    cases = [
        (dict(tasks=["SST-2", "SST-2"]), "finetune.tasks", "duplicate task"),
        (dict(glue_dir=str(tmp_path / "nope")), "finetune.glue_dir", "does not exist"),
        (dict(probe_layers=2), "finetune.probe_layers", "has 1 layers"),
    ]
    for kw, field, msg in cases:
        with pytest.raises(StudyError, match=msg) as e:
            finetune_run(make_cfg(glue, **kw), layout, quiet=True)
        assert e.value.field == field
    # RunConfig refuses max_length > max_positions when it is built; fine-tuning checks again because an
    # assignment to one section does not re-run the cross-section rule
    too_long = make_cfg(glue)
    too_long.finetune.max_length = 128
    with pytest.raises(StudyError, match="exceeds model.max_positions") as e:
        finetune_run(too_long, layout, quiet=True)
    assert e.value.field == "finetune.max_length"
    with pytest.raises(StudyError, match="no pre-trained model"):
        finetune_run(make_cfg(glue), layout, quiet=True)
    assert not (layout.root / "finetune").exists()


def test_bad_tsv_names_file_and_row(tmp_path):
    glue = make_glue(tmp_path / "glue", n_train=20, n_dev=10)
    bad = glue / "SST-2" / "train.tsv"
    lines = bad.read_text().splitlines()
    lines[7] = lines[7].replace("\t1", "\t7").replace("\t0", "\t7")
    bad.write_text("\n".join(lines) + "\n")
    cfg = make_cfg(glue, tasks=["STS-B", "SST-2"])  # the good task first: it must not be run either
    layout = Layout(root=tmp_path / "results")
    write_model(cfg, layout)
    with pytest.raises(StudyError, match="label '7'") as e:
        finetune_run(cfg, layout, quiet=True)
    assert f"{bad}:8" in str(e.value)
    assert not list(layout.finetune_dir(cfg.run_hash()).rglob("*.json"))


@pytest.mark.parametrize("batched", [False, True])
def test_a_diverging_seed_is_recorded_and_the_rest_go_on(done, tmp_path, monkeypatch, batched):
    """A non-finite fine-tuning loss stops that seed only (before: it escaped and stopped the whole study,
    with no record): its file says `diverged`, the other seed scores, a second call reuses both, and the
    aggregate lists the seed apart instead of averaging it."""
    from study.report.collect import collect

    cfg = make_cfg(done["glue"], tasks=["SST-2"], seeds=[0, 1], probe=False, epochs=1)
    cfg = cfg.model_copy(update={"impl": cfg.impl.model_copy(update={"finetune_batched_seeds": batched})})
    layout = Layout(root=tmp_path / "results")
    shutil.copytree(
        done["layout"].run_dir(cfg.run_hash()) / "model", layout.run_dir(cfg.run_hash()) / "model"
    )
    real_step, real_seeds = ft_mod.finetune_step, ft_mod.batched.finetune_seeds

    def step(model, opt, batch, labels, *a):
        if torch.initial_seed() == 1:  # _finetune_one seeds torch with the fine-tune seed
            raise FloatingPointError("non-finite loss nan")
        return real_step(model, opt, batch, labels, *a)

    def seeds(cfg_, spec, bert, train, dev, todo, *a):
        raise FloatingPointError("non-finite loss nan")

    monkeypatch.setattr(ft_mod, "finetune_step", step)
    monkeypatch.setattr(ft_mod.batched, "finetune_seeds", seeds)
    res = finetune_run(cfg, layout, quiet=True)
    by_seed = {r["seed"]: r for r in res}
    assert "diverged" in by_seed[1] and "metrics" not in by_seed[1] and "nan" in by_seed[1]["diverged"]
    # batched: the stacked group stops as one, then each seed trains alone, so seed 0 scores either way
    # (a speed setting outside the hash must not decide which seeds have a score)
    assert by_seed[0]["metrics"]["accuracy"] > 0.5
    fh = cfg.finetune_hash()
    assert (
        json.loads(result_path(layout, cfg.run_hash(), "SST-2", fh, "finetune", 1).read_text()) == by_seed[1]
    )
    monkeypatch.setattr(ft_mod, "finetune_step", real_step)
    monkeypatch.setattr(ft_mod.batched, "finetune_seeds", real_seeds)
    assert finetune_run(cfg, layout, quiet=True) == res  # kept like a result (deterministic: same again)
    plan = {"name": "t", "finetune_hash": fh, "runs": [{"run_hash": cfg.run_hash(), "label": "a", "seed": 0}]}
    c = collect(plan, layout)
    assert [(p["task"], p["seed"]) for p in c["finetune_problems"]] == [("SST-2", 1)]
    ft_rows = c["tidy"][c["tidy"]["task"] == "SST-2"]
    assert set(ft_rows["finetune_seed"]) == {0}


def test_a_result_of_other_task_files_is_recomputed(done, tmp_path, monkeypatch):
    """A fine-tune result keeps the content hash of the task files it used (`task_data`); after a task file
    changes it is recomputed, not reused (before: the recipe hash leaves glue_dir and its files out, so
    an edited TSV kept the old scores). Unchanged files, or the same files in another folder, reuse it."""
    glue = tmp_path / "glue"
    shutil.copytree(done["glue"], glue)
    cfg = make_cfg(glue, tasks=["SST-2"], seeds=[0], probe=False, epochs=1)
    layout = Layout(root=tmp_path / "results")
    shutil.copytree(
        done["layout"].run_dir(cfg.run_hash()) / "model", layout.run_dir(cfg.run_hash()) / "model"
    )
    first = finetune_run(cfg, layout, quiet=True)[0]
    assert isinstance(first["task_data"], str)
    calls = []
    real = ft_mod._finetune_one
    monkeypatch.setattr(ft_mod, "_finetune_one", lambda *a, **k: calls.append(1) or real(*a, **k))
    moved = tmp_path / "glue2"
    shutil.copytree(glue, moved)
    assert (
        finetune_run(make_cfg(moved, tasks=["SST-2"], seeds=[0], probe=False, epochs=1), layout, quiet=True)[
            0
        ]
        == first
        and calls == []
    )
    dev = glue / "SST-2" / "dev.tsv"
    lines = dev.read_text().splitlines(keepends=True)
    dev.write_text("".join(lines[:-25]))  # a corrected dev file: 75 rows, under the cap of 80
    again = finetune_run(cfg, layout, quiet=True)[0]
    assert (
        calls == [1]
        and again["task_data"] != first["task_data"]
        and (first["n_eval"], again["n_eval"]) == (80, 75)
    )


def test_a_result_of_another_encoder_under_the_same_run_hash_is_recomputed(done, tmp_path, monkeypatch):
    """A run folder deleted and trained again keeps its hash, but on a GPU not its weights: the results of
    the old encoder were reused (keyed by run hash and recipe only). Each result now keeps the content hash
    of the weights it was fine-tuned from (`encoder_data`) and is recomputed when they differ."""
    from safetensors.torch import load_file, save_file

    cfg = make_cfg(done["glue"], tasks=["SST-2"], seeds=[0], probe=False, epochs=1)
    layout = Layout(root=tmp_path / "results")
    model = layout.run_dir(cfg.run_hash()) / "model"
    shutil.copytree(done["layout"].run_dir(cfg.run_hash()) / "model", model)
    first = finetune_run(cfg, layout, quiet=True)[0]
    calls = []
    real = ft_mod._finetune_one
    monkeypatch.setattr(ft_mod, "_finetune_one", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert finetune_run(cfg, layout, quiet=True)[0] == first and calls == []  # the same weights: reused
    weights = load_file(model / "model.safetensors")
    name = next(k for k in weights if k.endswith("word_embeddings.weight"))
    weights[name] = weights[name] * 1.01  # "trained again": other weights under the same run hash
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    again = finetune_run(cfg, layout, quiet=True)[0]
    assert (
        calls == [1]
        and again["encoder_data"] != first["encoder_data"]
        and again["task_data"] == first["task_data"]
    )


@pytest.mark.parametrize("batched", [False, True])
def test_non_finite_dev_predictions_are_recorded_diverged(done, tmp_path, monkeypatch, batched):
    """NaN weights after the last update leave the loss finite but the dev logits NaN: argmax then gave
    class 0 and a normal-looking score (before). The seed is recorded `diverged` like a non-finite loss;
    batched, the stacked group leaves it out and it trains alone, so the speed setting decides nothing."""
    cfg = make_cfg(done["glue"], tasks=["SST-2"], seeds=[0, 1], probe=False, epochs=1)
    cfg = cfg.model_copy(update={"impl": cfg.impl.model_copy(update={"finetune_batched_seeds": batched})})
    layout = Layout(root=tmp_path / "results")
    shutil.copytree(
        done["layout"].run_dir(cfg.run_hash()) / "model", layout.run_dir(cfg.run_hash()) / "model"
    )
    real_predict, real_stacked = ft_mod._predict, ft_mod.batched.SeedBatch.predict

    def predict(model, e, rt):  # _finetune_one seeds torch with the fine-tune seed
        out = real_predict(model, e, rt)
        return np.full_like(out, np.nan) if torch.initial_seed() == 1 else out

    def stacked(self, e):
        out = real_stacked(self, e)
        out[1] = np.nan  # seed 1's model of the two stacked
        return out

    monkeypatch.setattr(ft_mod, "_predict", predict)
    monkeypatch.setattr(ft_mod.batched.SeedBatch, "predict", stacked)
    by_seed = {r["seed"]: r for r in finetune_run(cfg, layout, quiet=True)}
    assert "metrics" not in by_seed[1] and "non-finite dev predictions" in by_seed[1]["diverged"], by_seed[1]
    assert by_seed[0]["metrics"]["accuracy"] > 0.5


def test_a_single_label_training_split_is_skipped_and_the_rest_go_on(done, tmp_path):
    """A (capped) training split with one label made the probe's sklearn head raise ValueError, which stopped
    the whole call, other tasks included (before): the task is recorded skipped with the reason."""
    glue = tmp_path / "glue"
    shutil.copytree(done["glue"], glue)
    train = glue / "SST-2" / "train.tsv"
    rows = train.read_text().splitlines(keepends=True)
    train.write_text(rows[0] + "".join(r for r in rows[1:] if r.rstrip("\n").endswith("\t1")))
    cfg = make_cfg(glue, tasks=["SST-2", "STS-B"], seeds=[0], epochs=1)
    layout = Layout(root=tmp_path / "results")
    shutil.copytree(
        done["layout"].run_dir(cfg.run_hash()) / "model", layout.run_dir(cfg.run_hash()) / "model"
    )
    res = finetune_run(cfg, layout, quiet=True)
    sst = [r for r in res if r["task"] == "SST-2"]
    assert len(sst) == 2 and all("single label (1)" in r["skipped"] for r in sst), sst
    assert (
        json.loads(result_path(layout, cfg.run_hash(), "SST-2", cfg.finetune_hash(), "probe", 0).read_text())
        == sst[1]
    )
    assert {r["mode"] for r in res if r["task"] == "STS-B" and "metrics" in r} == {"finetune", "probe"}


def test_result_files_record_the_resolved_recipe(done):
    """A result named only its recipe's hash (before); it now spells the recipe out, every field (the
    defaults the hash leaves out, such as pooling "cls", too), and the hash is unchanged."""
    from study.config import FinetuneConfig

    cfg, layout = done["cfg"], done["layout"]
    res = json.loads(
        result_path(layout, cfg.run_hash(), "SST-2", cfg.finetune_hash(), "finetune", 0).read_text()
    )
    assert res["recipe"]["pooling"] == "cls" and res["recipe"]["lr"] == cfg.finetune.lr
    assert "seeds" not in res["recipe"] and "tasks" not in res["recipe"]
    back = RunConfig.model_validate(
        {
            **cfg.model_dump(),
            "finetune": FinetuneConfig(
                **res["recipe"], seeds=cfg.finetune.seeds, tasks=cfg.finetune.tasks
            ).model_dump(),
        }
    )
    assert back.finetune_hash() == cfg.finetune_hash() == res["finetune_hash"]


def test_correlations_are_printed_as_plain_numbers():
    """`study finetune`'s line printed CoLA's MCC and STS-B's Spearman as percentages (before)."""
    from study.work import ft_summary as _ft_summary

    res = [
        {"task": "CoLA", "mode": "finetune", "primary_metric": "matthews_corr", "primary": 0.1234},
        {"task": "SST-2", "mode": "finetune", "primary_metric": "accuracy", "primary": 0.8},
        {"task": "STS-B", "mode": "probe", "primary_metric": "spearman", "primary": -0.05},
    ]
    assert _ft_summary(res) == (
        "CoLA finetune matthews_corr 0.123, SST-2 finetune 80.0%, STS-B probe spearman -0.050"
    )
