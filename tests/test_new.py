"""`study new NAME --factor KEY=L1,L2 --question ...` writes a valid spec whose report block is about its
factors (study/studies/new.py); at smoke scale it runs and its report answers "L2 minus L1"."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from study.cli import main
from study.report import references
from study.studies.spec import load_study

REPO = Path(__file__).resolve().parents[1]
NEW = [
    "new",
    "wwm",
    "--factor",
    "masking.unit=token,whole_word",
    "--question",
    "Does whole-word masking help?",
]
NSP_PAPERS = set(references.KIND_DEFAULTS["nsp"])


def _project(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "proj"
    (root / "ablations" / "base").mkdir(parents=True)
    shutil.copy(REPO / "ablations" / "base" / "bert.yaml", root / "ablations" / "base" / "bert.yaml")
    (root / "params.yaml").write_text("studies: []\n")
    monkeypatch.chdir(root)
    return root


def test_new_writes_a_spec_that_validates_plans_and_quotes_only_its_own_factor(tmp_path, monkeypatch, capsys):
    root = _project(tmp_path, monkeypatch)
    assert main(NEW) == 0
    spec = root / "ablations" / "wwm.yaml"
    study = load_study(spec, fingerprint=False)
    r = study.spec.report
    assert r.compare == {"factor": "masking.unit", "baseline": "token", "treatment": "whole_word"}
    assert r.kind == "generic" and not NSP_PAPERS & set(r.references)
    assert len(study.runs) == 6  # 2 levels x 3 seeds
    capsys.readouterr()
    assert main(["validate", "ablations/wwm.yaml"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["plan", "ablations/wwm.yaml", "--no-time"]) == 0
    assert main(NEW) == 2  # never overwrites without --force
    # an NSP factor gets the NSP kind and papers; a masking-rate factor its own paper
    assert main(["new", "n", "--factor", "objective.sentence=nsp,none", "--question", "q"]) == 0
    n = load_study(root / "ablations" / "n.yaml", fingerprint=False).spec.report
    assert n.kind == "nsp" and set(n.references) == NSP_PAPERS
    # a typo exits 2 and writes nothing (no spec, no draft)
    before = sorted(p.name for p in (root / "ablations").iterdir())
    assert main(["new", "bad", "--factor", "masking.unt=a,b", "--question", "q"]) == 2
    assert main(["new", "bad", "--factor", "masking.unit", "--question", "q"]) == 2
    assert sorted(p.name for p in (root / "ablations").iterdir()) == before


@pytest.mark.slow
def test_a_new_spec_runs_at_smoke_scale_and_its_report_answers_its_question(
    tmp_path, monkeypatch, capsys, shared_data
):
    root = _project(tmp_path, monkeypatch)
    (tmp_path / "shared").symlink_to(shared_data.parent)  # ../shared/data from the project, as in the repo
    assert main([*NEW, "--seeds", "1"]) == 0
    spec = root / "ablations" / "wwm.yaml"
    spec.write_text(  # smoke scale and smaller: minutes on 2 shared cores
        spec.read_text() + "defaults:\n"
        "  objective: {max_seq_len: 32}\n"
        "  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64, max_positions: 64}\n"
        "  train: {amount: 30, batch_size: 8}\n"
        "  finetune: {seeds: [0], epochs: 1, max_train_examples: 64, max_eval_examples: 64, max_length: 32}\n"
    )
    assert main(["run", "ablations/wwm.yaml", "--quiet"]) == 0
    html = (root / "reports" / "wwm" / "index.html").read_text()
    assert "whole_word minus token (masking.unit)" in html
    for ref in NSP_PAPERS:
        paper = references.load_reference(ref).paper
        assert paper not in html, paper
    b = pd.read_csv(root / "results" / "studies" / "wwm" / "baseline.csv")
    gains = b[(b["task"] == "SST-2") & (b["mode"] == "finetune") & (b["metric"] == "accuracy")][
        "diff"
    ].dropna()
    assert len(gains) == 2
    assert ("every pre-trained level scored below random init" in html.lower()) == bool((gains < 0).all())
