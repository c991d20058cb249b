"""`study export RUN --to DIR [--push REPO]` (study/export.py): a hub folder that loads with
from_pretrained, with a model card naming the corpus, the tokens, the scores, provenance and licences;
the push goes through huggingface_hub's API, tested offline with that call replaced."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM, BertTokenizerFast

from study.cli import main
from study.io import atomic_write_json
from study.paths import Layout
from study.rundir import RunDir
from study.studies.spec import load_study

REPO = Path(__file__).resolve().parents[1]
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog"]


@pytest.fixture
def finished(tmp_path: Path):
    """A finished run folder as the trainer leaves it (a tiny model), fine-tuned, with its random init."""
    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    cfg = load_study(REPO / "ablations" / "smoke.yaml", fingerprint=False).runs[0].config
    h = cfg.run_hash()
    rd = RunDir(layout, h)
    rd.write_config({**cfg.model_dump(mode="json"), "run_hash": h})
    rd.write_metrics(
        {
            "tokens_seen": 5_120_000,
            "steps": 2500,
            "params": 372_000,
            "ref_mlm_acc": 0.184,
            "ref_mode_acc": 0.041,
        }
        | {"ref_mask_acc": 0.114, "ref_mask_mode_acc": 0.041, "ref_ppl": 222.8, "ref_mlm_loss": 5.4}
    )
    rd.write_meta(
        {"provenance": {"git": {"commit": "abc1234", "dirty": False}, "packages": {"torch": "2.x"}}}
    )
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    torch.manual_seed(0)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=12, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
        )
    )
    model.save_pretrained(rd.model_dir)
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(rd.model_dir)
    rd.write_status("done")
    for key, scores in ((h, (0.63, 0.64)), (cfg.baseline_key(), (0.70, 0.70))):
        for seed, v in enumerate(scores):
            atomic_write_json(
                layout.finetune_dir(key) / "SST-2" / "ft123" / f"finetune-seed{seed}.json",
                {"task": "SST-2", "mode": "finetune", "primary_metric": "accuracy", "primary": v}
                | {"finetune_hash": "ft123", "seed": seed},
            )
    return layout, h, model


def test_export_loads_with_from_pretrained_and_its_card_says_what_it_is(finished, tmp_path: Path):
    layout, h, model = finished
    out = tmp_path / "hub"
    assert main(["--results", str(layout.root), "export", h[:7], "--to", str(out)]) == 0
    loaded, tok = AutoModelForMaskedLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    ids = tok("the cat sat on the mat", return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(loaded.eval()(**ids).logits, model.eval()(**ids).logits)
    card = (out / "README.md").read_text()
    for said in (
        f"run {h}",
        "5,120,000 tokens",
        "`embedded`",  # the corpus
        "CC BY-SA 3.0",  # its licence
        "| `model.layers` | 2 |",  # the recipe
        "MLM accuracy 18.4%",  # reference scores with the floor
        "at [MASK] 11.4% (floor 4.1%)",
        "| SST-2 | finetune | accuracy | 63.5 ± 0.7 (n=2) | 70.0 ± 0.0 (n=2) |",  # downstream beside random
        "commit abc1234",
    ):
        assert said in card, said
    assert (out / "study_run.json").is_file()
    assert (
        main(["--results", str(layout.root), "export", h, "--to", str(out)]) == 0
    )  # an earlier export: redone


def test_export_refuses_what_it_cannot_export_and_writes_nothing(finished, tmp_path: Path):
    layout, h, _ = finished
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["--results", str(layout.root), "export", h, "--to", str(other)]) == 2
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    assert main(["--results", str(layout.root), "export", "ffffff", "--to", str(tmp_path / "x")]) == 2
    RunDir(layout, h).write_status("failed", error="boom")
    assert main(["--results", str(layout.root), "export", h, "--to", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_push_uploads_the_folder_through_the_hub_api(finished, tmp_path: Path, monkeypatch):
    from huggingface_hub import HfApi

    layout, h, _ = finished
    calls = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo, **kw: calls.append(("create", repo, kw)))

    def upload(self, **kw):
        calls.append(("upload", kw["repo_id"], kw))
        assert (Path(kw["folder_path"]) / "README.md").is_file()  # the whole export is there when it uploads

    monkeypatch.setattr(HfApi, "upload_folder", upload)
    out = tmp_path / "hub"
    assert main(["--results", str(layout.root), "export", h, "--to", str(out), "--push", "me/tiny-bert"]) == 0
    assert [(c[0], c[1]) for c in calls] == [("create", "me/tiny-bert"), ("upload", "me/tiny-bert")]
    assert calls[1][2]["folder_path"] == str(out) and calls[1][2]["repo_type"] == "model"
