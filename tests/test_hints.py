"""The report hints answer the spec's own question: `compare: {factor, baseline, treatment}` is answered as
treatment minus baseline (a/b still read, deprecated); `validate` warns when `kind` or `references` are
about other factors; the answer says when every pre-trained level scored below random init."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from study.cli import main
from study.report.aggregate import compare
from study.report.render import StudyFiles, answer_sentence
from study.studies.spec import load_study

sys.path.insert(0, str(Path(__file__).parent))
from test_aggregate import _tidy  # noqa: E402 - the aggregate tests' tidy rows

REPO = Path(__file__).resolve().parents[1]
WWM = (
    (REPO / "ablations" / "smoke.yaml")
    .read_text()
    .replace("name: smoke", "name: wwm")
    .replace("objective.sentence: [nsp, none]", "masking.unit: [token, whole_word]")
    .replace("x: objective.sentence", "x: masking.unit")
)


def _spec(tmp_path: Path, compare_line: str, name: str = "wwm.yaml", text: str = WWM) -> Path:
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("compare:")]
    at = lines.index("report:") + 1
    path = tmp_path / name
    path.write_text("\n".join([*lines[:at], f"  {compare_line}", *lines[at:]]) + "\n")
    return path


def test_treatment_minus_baseline_and_the_old_names_read_the_same(tmp_path: Path, capsys):
    new = load_study(
        _spec(tmp_path, "compare: {factor: masking.unit, baseline: token, treatment: whole_word}")
    )
    capsys.readouterr()
    old = load_study(_spec(tmp_path, "compare: {factor: masking.unit, a: token, b: whole_word}", "old.yaml"))
    assert "deprecated" in capsys.readouterr().err
    assert (
        new.spec.report.compare
        == old.spec.report.compare
        == {
            "factor": "masking.unit",
            "baseline": "token",
            "treatment": "whole_word",
        }
    )
    assert [r.run_hash for r in new.runs] == [r.run_hash for r in old.runs]  # report hints are not semantic
    t = _tidy(
        {"accuracy": {"token": {0: 0.60, 1: 0.62, 2: 0.61}, "whole_word": {0: 0.65, 1: 0.66, 2: 0.66}}}, "u"
    )
    row = compare(t, {"factor": "u", "baseline": "token", "treatment": "whole_word"}).iloc[0]
    assert row["diff"] == pytest.approx(0.0467, abs=1e-3)  # treatment - baseline, whichever is written first
    assert row["interpretation"].startswith("whole_word higher than token")
    with pytest.raises(Exception, match="mixes a/b"):
        load_study(
            _spec(tmp_path, "compare: {factor: masking.unit, a: token, treatment: whole_word}", "x.yaml")
        )


def test_shipped_smoke_run_hashes_unchanged_by_the_rename():
    """The smoke study's run hashes before the rename (its compare was {a: nsp, b: none})."""
    hashes = [r.run_hash for r in load_study(REPO / "ablations" / "smoke.yaml").runs]
    assert hashes == ["89a6a406a43a", "5432bb4e72c8", "26585e0fdfab", "2d5639fdbebe"]


def test_validate_warns_when_kind_or_references_concern_other_factors(tmp_path: Path, capsys):
    copied = _spec(tmp_path, "compare: {factor: masking.unit, baseline: token, treatment: whole_word}")
    assert main(["validate", str(copied)]) == 0
    err = capsys.readouterr().err
    assert "report.kind 'nsp' is about objective.sentence" in err and "'bert_table5' is about" in err
    fitting = WWM.replace("kind: nsp", "kind: generic").replace("references: [bert_table5]", "references: []")
    ok = _spec(
        tmp_path,
        "compare: {factor: masking.unit, baseline: token, treatment: whole_word}",
        "ok.yaml",
        fitting,
    )
    assert main(["validate", str(ok)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["validate", str(REPO / "ablations" / "smoke.yaml")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_answer_names_the_subtraction_and_says_when_pretraining_scored_below_random_init():
    ans = {"diff": 0.02, "ci_low": -0.01, "ci_high": 0.05, "n": 3, "p_value": 0.2, "mde": 0.05, "mean_a": 0.6}
    ans |= {"a": "token", "b": "whole_word", "interpretation": "indistinguishable from noise at n=3 seeds"}
    plan = {
        "name": "t",
        "runs": [],
        "primary_metric": "SST-2/finetune/accuracy",
        "compare": {"factor": "masking.unit", "baseline": "token", "treatment": "whole_word"},
    }
    gains = pd.DataFrame(
        [
            {
                "task": "SST-2",
                "mode": "finetune",
                "metric": "accuracy",
                "masking.unit": lv,
                "diff": g,
                "ci_low": lo,
            }
            for lv, g, lo in (("token", -0.071, -0.09), ("whole_word", -0.057, -0.08))
        ]
    )
    empty = pd.DataFrame()
    sf = StudyFiles(
        Path("."),
        {"plan": plan, "answer": ans},
        empty,
        empty,
        gains,
        empty,
        empty,
        factor_keys=["masking.unit"],
    )
    text = answer_sentence(sf)["text"]
    assert text.startswith("whole_word minus token (masking.unit) on SST-2 finetune accuracy")
    assert "every pre-trained level scored below random init on it (gains -7.1 pp to -5.7 pp" in text
    # too few seeds for an answer: the headline still says pre-training scored below random init
    sf.study["answer"] = ans | {"n": 1, "ci_low": float("nan"), "ci_high": float("nan")}
    few = answer_sentence(sf)["text"]
    assert "n=1" in few and few.endswith(
        "Every pre-trained level scored below random init on SST-2 finetune accuracy (gains -7.1 pp to -5.7 pp)."
    )
