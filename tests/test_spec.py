"""Specs: expansion, hashing, and bad input answered with exit 2 naming the field."""
import subprocess
import sys
from pathlib import Path

import pytest

from study.cli import main
from study.config import RunConfig
from study.studies.spec import load_study
from study.studies.sync import is_stale

REPO = Path(__file__).resolve().parents[1]

GOOD = """
name: t
defaults:
  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64}
factors:
  masking.rate: [0.15, 0.3]
  objective.sentence: [nsp, none]
seeds: [0, 1]
"""


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_grid_expands_factors_times_seeds(tmp_path):
    study = load_study(write(tmp_path, GOOD))
    assert len(study.runs) == 8
    assert len({r.run_hash for r in study.runs}) == 8
    assert {r.config.masking.rate for r in study.runs} == {0.15, 0.3}


def test_one_at_a_time(tmp_path):
    study = load_study(write(tmp_path, GOOD.replace("seeds: [0, 1]", "design: one_at_a_time\nseeds: [0]")))
    # base, then each level alone; levels equal to the base (rate 0.15, nsp) are the base point
    assert [r.label for r in study.runs] == ["base", "masking.rate=0.3", "objective.sentence=none"]


def test_hash_ignores_impl_and_changes_with_semantics():
    a = RunConfig()
    b = RunConfig(impl={"threads": 7, "progress": False, "log_every": 3, "precision": "bf16", "workers": 2})
    assert a.run_hash() == b.run_hash()
    for change in ({"masking": {"rate": 0.2}}, {"seed": 1}, {"model": {"layers": 3}},
                   {"objective": {"sentence": "none"}}, {"train": {"lr": 5e-4}}):
        assert RunConfig.model_validate(change).run_hash() != a.run_hash(), change


def test_identical_runs_in_two_studies_share_a_hash(tmp_path):
    a = load_study(write(tmp_path, GOOD, "a.yaml"))
    b = load_study(write(tmp_path, GOOD.replace("name: t", "name: other").replace("[0.15, 0.3]", "[0.3, 0.45]"),
                         "b.yaml"))
    shared = {r.run_hash for r in a.runs} & {r.run_hash for r in b.runs}
    assert len(shared) == 4  # rate 0.3 x 2 sentence x 2 seeds


def test_base_chain(tmp_path):
    write(tmp_path, "name: base\ndefaults:\n  masking: {rate: 0.4}\n  model: {layers: 3}\n", "base.yaml")
    study = load_study(write(tmp_path, "name: child\nbase: base.yaml\ndefaults:\n  model: {layers: 1}\n"))
    cfg = study.runs[0].config
    assert cfg.masking.rate == 0.4 and cfg.model.layers == 1


BAD = {
    "typo_top": ("name: t\nfactor: {}\n", "factor"),
    "typo_section_key": ("name: t\ndefaults:\n  masking: {rat: 0.2}\n", "masking.rat"),
    "typo_factor_key": ("name: t\nfactors:\n  masking.rte: [0.1]\n", "masking.rte"),
    "unknown_section": ("name: t\ndefaults:\n  maskin: {rate: 0.2}\n", "defaults.maskin"),
    "rate_high": ("name: t\ndefaults:\n  masking: {rate: 1.5}\n", "masking.rate"),
    "rate_zero": ("name: t\ndefaults:\n  masking: {rate: 0}\n", "masking.rate"),
    "rate_type": ("name: t\ndefaults:\n  masking: {rate: lots}\n", "masking.rate"),
    "proportions": ("name: t\ndefaults:\n  masking: {mask: 0.5, random: 0.1, keep: 0.1}\n", "masking"),
    "unit": ("name: t\ndefaults:\n  masking: {unit: sentence}\n", "masking.unit"),
    "depth0": ("name: t\ndefaults:\n  model: {layers: 0}\n", "model.layers"),
    "heads": ("name: t\ndefaults:\n  model: {hidden: 100, heads: 3}\n", "model"),
    "seq_vs_positions": ("name: t\ndefaults:\n  objective: {max_seq_len: 600}\n", "max_positions"),
    "nsp_with_full": ("name: t\ndefaults:\n  objective: {format: full_sentences, sentence: nsp}\n", "objective"),
    "format": ("name: t\ndefaults:\n  objective: {format: pairs}\n", "objective.format"),
    "corpus_kind": ("name: t\ndefaults:\n  corpus: {sources: [wikipedia]}\n", "corpus.sources"),
    "corpus_nopath": ("name: t\ndefaults:\n  corpus: {sources: [{kind: text}]}\n", "corpus.sources"),
    "batch0": ("name: t\ndefaults:\n  train: {batch_size: 0}\n", "train.batch_size"),
    "budget": ("name: t\ndefaults:\n  train: {budget: epochs}\n", "train.budget"),
    "empty_levels": ("name: t\nfactors:\n  masking.rate: []\n", "factors.masking.rate"),
    "dupe_levels": ("name: t\nfactors:\n  masking.rate: [0.1, 0.1]\n", "factors.masking.rate"),
    "factor_bad_value": ("name: t\nfactors:\n  masking.rate: [0.1, 2]\n", "masking.rate"),
    "seed_factor": ("name: t\nfactors:\n  seed: [1, 2]\n", "factors.seed"),
    "yaml_syntax": ("name: t\ndefaults: {model: [\n", "line"),
    "not_mapping": ("- a\n- b\n", "mapping"),
    "no_name": ("defaults: {}\n", "name"),
    "bad_name": ("name: 'a b/c'\n", "name"),
    "missing_base": ("name: t\nbase: nowhere.yaml\n", "base"),
    "seeds_empty": ("name: t\nseeds: []\n", "seeds"),
    "design": ("name: t\ndesign: random\n", "design"),
    "dupe_labels": ("name: t\nruns:\n  - {label: x}\n  - {label: x}\n", "runs"),
    "run_bad_key": ("name: t\nruns:\n  - {label: x, set: {model.depth: 3}}\n", "model.depth"),
    "finetune_seeds": ("name: t\ndefaults:\n  finetune: {seeds: []}\n", "finetune.seeds"),
    "unknown_task": ("name: t\ndefaults:\n  finetune: {tasks: [SST2]}\n", "finetune.tasks"),
    "unknown_reference": ("name: t\nreport: {references: [bert_table9]}\n", "report.references"),
    "duplicate_factor": ("name: t\nfactors:\n  masking.rate: [0.1]\n  masking.rate: [0.2]\n", "duplicate key"),
    "search_unknown_key": ("name: t\nsearch: {params: {masking.rat: {low: 0.1, high: 0.2}}}\n", "masking.rat"),
    "search_empty_range": ("name: t\nsearch: {params: {masking.rate: {low: 0.3, high: 0.1}}}\n", "masking.rate"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_spec_exits_2_naming_field(tmp_path, capsys, case):
    text, field = BAD[case]
    path = write(tmp_path, text)
    results = tmp_path / "results"
    results.mkdir()
    (results / "keep.txt").write_text("precious")
    before = sorted(p.name for p in results.rglob("*"))
    assert main(["--results", str(results), "plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert field in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in results.rglob("*")) == before


def test_cycle_of_bases(tmp_path, capsys):
    write(tmp_path, "name: a\nbase: b.yaml\n", "a.yaml")
    write(tmp_path, "name: b\nbase: a.yaml\n", "b.yaml")
    assert main(["validate", str(tmp_path / "a.yaml")]) == 2
    assert "cycle" in capsys.readouterr().err


def test_typo_suggests_the_key(tmp_path, capsys):
    assert main(["validate", str(write(tmp_path, "name: t\nfactors:\n  masking.rte: [0.1]\n"))]) == 2
    assert "did you mean 'masking.rate'" in capsys.readouterr().err


def test_shipped_specs_validate():
    for spec in sorted((REPO / "ablations").glob("*.yaml")):
        assert load_study(spec).runs, spec


def test_shipped_profiles_resolve():
    """Every profile of every shipped spec resolves and validates here, so that a bad key in the `gpu`
    profile fails on a laptop, not after someone has rented a GPU. A profile changes every run's hash."""
    seen = set()
    for spec in sorted((REPO / "ablations").glob("*.yaml")):
        plain = {r.run_hash for r in load_study(spec).runs}
        for profile in load_study(spec).spec.profiles:
            study = load_study(spec, profile)
            assert study.runs and study.name == f"{study.spec.name}-{profile}", (spec, profile)
            assert not plain & {r.run_hash for r in study.runs}, (spec, profile)
            seen.add(profile)
            if profile == "gpu":  # BERT-small-scale on hub corpora, all of GLUE's dev sets
                for run in study.runs:
                    cfg = run.config
                    assert {s.kind for s in cfg.corpus.sources} == {"hf"}, (spec, cfg.corpus.sources)
                    assert cfg.finetune.glue_dir == "hub" and cfg.finetune.max_eval_examples is None
                    assert cfg.model.hidden == 512 and cfg.tokenizer.vocab_size == 30522
    assert {"cpu", "gpu"} <= seen


def test_generated_run_list_is_in_sync():
    """dvc.yaml iterates study_runs.yaml: it must match the specs (run `study sync`)."""
    assert not is_stale(REPO / "ablations", REPO / "study_runs.yaml"), "study_runs.yaml is stale: run `study sync`"


def test_cli_exit_code_in_a_subprocess(tmp_path):
    path = write(tmp_path, "name: t\ndefaults:\n  masking: {rate: 2}\n")
    proc = subprocess.run([sys.executable, "-m", "study", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "masking.rate" in proc.stderr
