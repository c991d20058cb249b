"""Specs: expansion, hashing, and bad input answered with exit 2 naming the field."""

import subprocess
import sys
from pathlib import Path

import pytest

from study.cli import main
from study.config import RunConfig
from study.errors import StudyError
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


def test_run_selection_by_hash_or_label(tmp_path, capsys):
    study = load_study(write(tmp_path, GOOD))
    first, label = study.runs[0], study.runs[0].label
    assert study.select(None) == study.runs
    assert study.select([first.run_hash]) == [first]
    both = study.select([label])  # a label names every seed of it, in the spec's order
    assert [r.seed for r in both] == [0, 1] and {r.label for r in both} == {label}
    assert study.select([study.runs[-1].run_hash, label]) == [*both, study.runs[-1]]
    with pytest.raises(StudyError) as exc:
        study.select([label, "nope"])
    assert exc.value.field == "--run" and first.run_hash in exc.value.allowed and label in exc.value.allowed
    # the CLI: exit 2, the choices named, nothing trained or written
    results = tmp_path / "results"
    assert main(["--results", str(results), "pretrain", str(tmp_path / "s.yaml"), "--run", "nope"]) == 2
    assert "--run" in capsys.readouterr().err and not results.exists()


# Bad flags that used to be found only after the data was prepared (or not at all): each exits 2 naming
# the flag, and nothing is written.
BAD_FLAGS = {
    "run_unknown_run": (["run", "{spec}", "--run", "nope"], "--run"),
    "curve_empty_run": (["curve", "{spec}", "--run", ""], "--run"),
    "data_negative_samples": (["data", "{spec}", "--samples", "-1"], "--samples"),
    "prepare_unknown_data": (["prepare", "{spec}", "--data", "{data}", "--data", "0123456789ab"], "--data"),
    "plan_sd_without_detect": (["plan", "{spec}", "--no-time", "--sd", "0.01"], "--sd"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_bad_flags_exit_2_before_anything_is_written(tmp_path, capsys, case):
    argv, flag = BAD_FLAGS[case]
    spec = write(tmp_path, GOOD)
    results = tmp_path / "results"
    data = load_study(spec).runs[0].config.data_hash()  # the spec's own data, beside a bad one
    assert main(["--results", str(results), *(a.format(spec=spec, data=data) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert f"{flag}:" in err and "Traceback" not in err, err
    assert not results.exists()


def test_hash_ignores_impl_and_changes_with_semantics():
    a = RunConfig()
    b = RunConfig(impl={"threads": 7, "progress": False, "log_every": 3, "precision": "bf16", "workers": 2})
    assert a.run_hash() == b.run_hash()
    for change in (
        {"masking": {"rate": 0.2}},
        {"seed": 1},
        {"model": {"layers": 3}},
        {"objective": {"sentence": "none"}},
        {"train": {"lr": 5e-4}},
    ):
        assert RunConfig.model_validate(change).run_hash() != a.run_hash(), change


def test_identical_runs_in_two_studies_share_a_hash(tmp_path):
    a = load_study(write(tmp_path, GOOD, "a.yaml"))
    b = load_study(
        write(
            tmp_path, GOOD.replace("name: t", "name: other").replace("[0.15, 0.3]", "[0.3, 0.45]"), "b.yaml"
        )
    )
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
    "nsp_with_full": (
        "name: t\ndefaults:\n  objective: {format: full_sentences, sentence: nsp}\n",
        "objective",
    ),
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
    "runs_empty": ("name: t\nruns: []\n", "runs: an empty list"),  # it planned one base run, silently
    "dupe_labels": ("name: t\nruns:\n  - {label: x}\n  - {label: x}\n", "runs"),
    "run_bad_key": ("name: t\nruns:\n  - {label: x, set: {model.depth: 3}}\n", "model.depth"),
    "finetune_seeds": ("name: t\ndefaults:\n  finetune: {seeds: []}\n", "finetune.seeds"),
    "unknown_task": ("name: t\ndefaults:\n  finetune: {tasks: [SST2]}\n", "finetune.tasks"),
    "pooling": ("name: t\ndefaults:\n  finetune: {pooling: max}\n", "finetune.pooling"),
    "unknown_reference": ("name: t\nreport: {references: [bert_table9]}\n", "report.references"),
    "duplicate_factor": (
        "name: t\nfactors:\n  masking.rate: [0.1]\n  masking.rate: [0.2]\n",
        "duplicate key",
    ),
    "search_unknown_key": (
        "name: t\nsearch: {params: {masking.rat: {low: 0.1, high: 0.2}}}\n",
        "masking.rat",
    ),
    "search_empty_range": (
        "name: t\nsearch: {params: {masking.rate: {low: 0.3, high: 0.1}}}\n",
        "masking.rate",
    ),
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


def _standin_repo(tmp_path: Path, monkeypatch) -> Path:
    """A copy of the shipped specs beside stand-in text where they read theirs (../shared/data for the cpu
    profiles, .gpudata/ for the GPU check), with the copy as the working directory: the specs resolve
    here and on CI, where the real data is absent. The text enters every run hash alike."""
    repo = tmp_path / "repo"
    for spec in [*REPO.glob("ablations/**/*.yaml"), *REPO.glob("bench/gpu_*.yaml")]:
        rel = spec.relative_to(REPO)
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(spec.read_text())
    for root in (tmp_path / "shared" / "data", repo / ".gpudata"):
        for folder in ("gutenberg", "wikitext-2-raw"):
            (root / folder).mkdir(parents=True)
            (root / folder / "a.txt").write_text("Stand-in text. Two sentences.\n")
    monkeypatch.chdir(repo)
    return repo


def test_shipped_profiles_resolve(tmp_path, monkeypatch):
    """Every profile of every shipped spec resolves and validates here, so that a bad key in the `gpu`
    profile fails on a laptop, not after someone has rented a GPU. A profile changes every run's hash.
    On stand-in text, so the cpu profiles (which read ../shared/data) are checked where it is absent."""
    repo = _standin_repo(tmp_path, monkeypatch)
    seen = set()
    for spec in sorted((repo / "ablations").glob("*.yaml")):
        plain = {r.run_hash for r in load_study(spec).runs}
        for profile in load_study(spec).spec.profiles:
            study = load_study(spec, profile)
            assert study.runs and study.name == f"{study.spec.name}-{profile}", (spec, profile)
            assert not plain & {r.run_hash for r in study.runs}, (spec, profile)
            seen.add((spec.stem, profile))
            if profile == "gpu":  # BERT-small-scale on hub corpora, all of GLUE's dev sets
                for run in study.runs:
                    cfg = run.config
                    assert {s.kind for s in cfg.corpus.sources} == {"hf"}, (spec, cfg.corpus.sources)
                    assert cfg.finetune.glue_dir == "hub" and cfg.finetune.max_eval_examples is None
                    assert cfg.model.hidden == 512 and cfg.tokenizer.vocab_size == 30522
    # the four cpu studies and their gpu profiles are among what was checked
    assert {(n, p) for n in ("nsp", "mask_rate", "replacement", "depth") for p in ("cpu", "gpu")} <= seen


def test_gpu_check_specs_validate_and_match_the_gpu_profile(tmp_path, monkeypatch):
    """bench/gpu_learn.yaml and bench/gpu_smoke.yaml (the GPU check's studies) validate, and train the gpu
    profile's model, vocabulary and batch: a GPU session must not find a typo or a drifted shape. Their
    text lives in .gpudata/ once staged (bench/gpu_check.sh --stage); checked here on stand-in text."""
    repo = _standin_repo(tmp_path, monkeypatch)
    gpu = load_study(repo / "ablations" / "nsp.yaml", "gpu").runs[0].config
    specs = sorted((repo / "bench").glob("gpu_*.yaml"))
    assert {s.stem for s in specs} >= {"gpu_learn", "gpu_smoke"}, specs
    for spec in specs:
        study = load_study(spec)
        assert study.runs, spec
        for run in study.runs:
            cfg = run.config
            for key in ("layers", "hidden", "heads", "intermediate"):
                assert getattr(cfg.model, key) == getattr(gpu.model, key), (spec, key)
            assert (cfg.tokenizer.vocab_size, cfg.train.batch_size, cfg.objective.max_seq_len) == (
                gpu.tokenizer.vocab_size,
                gpu.train.batch_size,
                gpu.objective.max_seq_len,
            ), spec


def test_gpu_pooling_check_fine_tunes_the_runs_the_learn_check_trains(tmp_path, monkeypatch):
    """bench/gpu_check.sh pooling fine-tunes gpu_learn's checkpoints again: bench/gpu_learn_mean.yaml must
    name the same runs (run hashes, random-init baselines) with another fine-tuning recipe (mean pooling).
    Checked on stand-in text in a copy, so it runs unstaged (the corpus enters every run hash alike)."""
    for rel in ("bench/gpu_learn.yaml", "bench/gpu_learn_mean.yaml", "ablations/base/bert.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text())
    for folder in ("gutenberg", "wikitext-2-raw"):
        (tmp_path / ".gpudata" / folder).mkdir(parents=True)
        (tmp_path / ".gpudata" / folder / "a.txt").write_text("Stand-in text. Two sentences.\n")
    monkeypatch.chdir(tmp_path)
    learn, mean = (load_study(tmp_path / "bench" / f"{n}.yaml").runs for n in ("gpu_learn", "gpu_learn_mean"))
    assert [r.config.run_hash() for r in mean] == [r.config.run_hash() for r in learn]
    assert [r.config.baseline_key() for r in mean] == [r.config.baseline_key() for r in learn]
    assert {r.config.finetune.pooling for r in mean} == {"mean"}
    assert {r.config.finetune.pooling for r in learn} == {"cls"}
    assert mean[0].config.finetune_hash() != learn[0].config.finetune_hash()


def test_generated_run_list_is_in_sync():
    """study_runs.yaml and dvc.yaml are generated from the specs: they must match them (run `study sync`)."""
    assert not is_stale(REPO / "ablations", REPO / "study_runs.yaml"), (
        "study_runs.yaml is stale: run `study sync`"
    )


def test_cli_exit_code_in_a_subprocess(tmp_path):
    path = write(tmp_path, "name: t\ndefaults:\n  masking: {rate: 2}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "study", "validate", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "masking.rate" in proc.stderr


CROSS = {  # rules between fields: `study validate` names the dotted field and what it allows
    # case: (defaults that break the rule, one run's setting that breaks it, field, allowed)
    "seq_vs_positions": (
        "objective: {max_seq_len: 64}\n  model: {max_positions: 32}",
        "objective.max_seq_len: 1024",
        "objective.max_seq_len",
        "<= model.max_positions (32)",
    ),
    "finetune_length": (
        "finetune: {max_length: 256}\n  model: {max_positions: 128}",
        "finetune.max_length: 1024",
        "finetune.max_length",
        "8..128",
    ),
    "grad_accum": (
        "train: {batch_size: 30, grad_accum: 4}",
        "train.grad_accum: 7",
        "train.batch_size",
        "a positive multiple of train.grad_accum (4)",
    ),
    "heads": (
        "model: {hidden: 100, heads: 3}",
        "model.heads: 7",
        "model.heads",
        "a divisor of model.hidden (100)",
    ),
    "short_len_vs_seq": (
        "objective: {max_seq_len: 64}\n  train: {short_len: 64, short_fraction: 0.2}",
        "train.short_len: 1000, train.short_fraction: 0.3",
        "train.short_len",
        "8..63",
    ),
    "short_len_missing": (
        "train: {short_fraction: 0.2}",
        "train.short_fraction: 0.5",
        "train.short_len",
        "an integer >= 8, below objective.max_seq_len",
    ),
    # 2.5 steps were rounded up by the schedule, down by the search, kept as 2.5 by `study plan`
    "whole_steps": ("train: {amount: 2.5}", "train.amount: 100.5", "train.amount", "a whole number of steps"),
}


@pytest.mark.parametrize("case", sorted(CROSS))
def test_cross_field_rules_are_caught_by_validate(tmp_path, capsys, case):
    defaults, setting, field, allowed = CROSS[case]
    path = write(tmp_path, f"name: t\ndefaults:\n  {defaults}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {field}:" in err and f"(allowed: {allowed})" in err, err
    # the same rule broken by one run of a study names the run too
    path = write(tmp_path, f"name: t\nruns:\n  - {{label: odd, set: {{{setting}}}}}\n", "r.yaml")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{field}:" in err and "(in run 'odd')" in err, err


WRONG_TYPE = {  # a value of the wrong type: pydantic names the type it wanted; validate adds the field's range
    "int": ("defaults:\n  model: {layers: two}", "model.layers", "an integer >= 1 and <= 48"),
    "float": ("defaults:\n  train: {lr: fast}", "train.lr", "a number > 0 and <= 1"),
    "bool": ("defaults:\n  masking: {dynamic: maybe}", "masking.dynamic", "true or false"),
    "optional": (
        "defaults:\n  finetune: {max_train_examples: lots}",
        "finetune.max_train_examples",
        "an integer >= 1, or null",
    ),
    "factor_level": ("factors:\n  model.layers: [2, four]", "model.layers", "an integer >= 1 and <= 48"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPE))
def test_a_wrong_type_names_what_the_field_allows(tmp_path, capsys, case):
    text, field, allowed = WRONG_TYPE[case]
    path = write(tmp_path, f"name: t\n{text}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{field}:" in err and f"(allowed: {allowed})" in err, err


def test_build_run_config_is_what_load_study_builds(tmp_path):
    """The one construction of a run from a spec (search trials use it too): same config, same hash."""
    from study.studies.spec import build_run_config

    study = load_study(write(tmp_path, GOOD))
    for run in study.runs:
        cfg = build_run_config(study.defaults, run.factors, run.seed, str(study.path))
        assert cfg == run.config and cfg.run_hash() == run.run_hash


# --------------------------------------------------------------------------- the hardened front door
# Every case: exit 2, the message names the file and the dotted field, no traceback, nothing written.
def _rejects(tmp_path, capsys, text, field, *, name="s.yaml", extra=()):
    path = write(tmp_path, text, name)
    results, reports = tmp_path / "results", tmp_path / "reports"
    assert main(["--results", str(results), "--reports", str(reports), "validate", str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err, err
    assert not results.exists() and not reports.exists()
    return err


def _laughs(levels: int = 9, inside: str = "factors:\n  masking.rate") -> str:
    """A 'billion laughs': each anchor is a list of ten aliases of the one before (10**levels strings)."""
    first = "[" + ", ".join(["lol"] * 10) + "]"
    items = [f"&l0 {first}"] + [
        f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels + 1)
    ]
    return f"name: t\n{inside}: [{', '.join(items)}]\n"


YAML_BOMBS = {
    "laughs_in_factor": (_laughs(), "factors.masking.rate"),
    "laughs_in_report_x": (_laughs(inside="report:\n  x"), "report.x"),
    "laughs_in_defaults": (_laughs(inside="defaults:\n  corpus:\n    sources"), "defaults.corpus.sources"),
    "recursive_alias": ("name: t\nfactors:\n  masking.rate: &r [0.1, *r]\n", "factors.masking.rate"),
    "deep_nesting": ("name: t\nquestion: " + "[" * 5000 + "]" * 5000 + "\n", "question: nested deeper"),
    "deep_alias_chain": (
        "name: t\nq:\n"
        + "\n".join(f"  - &c{i} [*c{i - 1}]" if i else "  - &c0 [0.1]" for i in range(400))
        + "\n",
        "q",
    ),
    "unhashable_key": ("name: t\nfactors:\n  ? [a, b]\n  : [1]\n", "key must be a scalar"),
    "huge_file": ("name: t\nquestion: '" + "x" * (300 * 1024) + "'\n", "256 KiB"),
}


@pytest.mark.parametrize("case", sorted(YAML_BOMBS))
def test_yaml_bombs_are_refused_small(tmp_path, capsys, case):
    import tracemalloc

    text, field = YAML_BOMBS[case]
    tracemalloc.start()
    try:
        _rejects(tmp_path, capsys, text, field)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # before: 1.9 GB (and 20 s) then killed (the error path formatted the expanded value). Memory, not time, is
    # checked: it does not depend on the machine's speed or load, and an expansion shows in both.
    assert peak < 64 * 2**20, peak


def test_yaml_merge_keys_and_plain_anchors_still_work(tmp_path):
    study = load_study(
        write(
            tmp_path,
            "name: t\nprofiles:\n  cpu: &p {model.layers: 1, model.hidden: 32}\n"
            "  gpu: {<<: *p, model.hidden: 64}\nfactors:\n  masking.rate: &r [0.1, 0.2]\n"
            "runs:\n  - {label: x, set: {masking.rate: 0.3}}\n",
        ),
        "gpu",
    )
    assert study.spec.profiles["gpu"] == {"model.layers": 1, "model.hidden": 64}
    assert {r.config.model.hidden for r in study.runs} == {64}


def test_error_messages_never_format_an_unbounded_value(tmp_path, capsys):
    err = _rejects(
        tmp_path, capsys, "name: t\ndefaults:\n  masking: {rate: '" + "9" * 5000 + "'}\n", "masking.rate"
    )
    assert len(err) < 600, len(err)


def test_base_naming_a_folder_or_a_non_spec_file(tmp_path, capsys):
    (tmp_path / "dir.yaml").mkdir()
    err = _rejects(tmp_path, capsys, "name: t\nbase: dir.yaml\n", "base")
    assert "s.yaml" in err and "not a file" in err
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "notes.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    err = _rejects(tmp_path, capsys, "name: t\nbase: elsewhere/notes.txt\n", "base")
    assert "s.yaml" in err and ".yaml" in err
    (outside / "passwd.yaml").write_text("root:x:0:0:root:/root:/bin/bash\n")
    err = _rejects(tmp_path, capsys, "name: t\nbase: elsewhere/passwd.yaml\n", "base")
    assert "s.yaml" in err and "passwd.yaml" in err and "mapping" in err
    (outside / "other.yaml").write_text("owner: me\n")  # a mapping, but not a spec
    err = _rejects(tmp_path, capsys, "name: t\nbase: elsewhere/other.yaml\n", "name: Field required")
    assert "other.yaml" in err and "base of" in err and "s.yaml" in err
    _rejects(tmp_path, capsys, "name: t\nbase: ''\n", "base")


def test_error_inside_a_base_names_the_base_file_and_its_field(tmp_path, capsys):
    write(tmp_path, "name: b\ndefaults:\n  masking: {rat: 0.2}\n", "b.yaml")
    err = _rejects(tmp_path, capsys, "name: t\nbase: b.yaml\n", "masking.rat")
    assert "b.yaml" in err and "base of" in err


REPORT_BAD = {
    "compare_factor_typo": (
        "compare: {factor: masking.rte, baseline: 0.15, treatment: 0.3}",
        "report.compare.factor",
    ),
    "compare_a_not_a_level": (
        "compare: {factor: masking.rate, baseline: 0.2, treatment: 0.3}",
        "report.compare.baseline",
    ),
    "compare_b_missing": ("compare: {factor: masking.rate, baseline: 0.15}", "report.compare.treatment"),
    "compare_unknown_key": (
        "compare: {factor: masking.rate, baseline: 0.15, treatment: 0.3, c: 1}",
        "report.compare.c",
    ),
    "compare_same_level": (
        "compare: {factor: masking.rate, baseline: 0.15, treatment: 0.15}",
        "report.compare.treatment",
    ),
    "compare_label_level": (
        "compare: {factor: label, baseline: nope, treatment: base}",
        "report.compare.baseline",
    ),
    "x_typo": ("x: masking.rat", "report.x"),
    "hue_typo": ("hue: objective.sentense", "report.hue"),
    "metric_typo": ("primary_metric: ref_pll", "report.primary_metric"),
    "metric_task_not_finetuned": ("primary_metric: MRPC/finetune/accuracy", "report.primary_metric"),
    "metric_not_reported": ("primary_metric: SST-2/finetune/f1", "report.primary_metric"),
    "metric_bad_mode": ("primary_metric: SST-2/frozen/accuracy", "report.primary_metric"),
    "probe_metric_without_probe": ("primary_metric: SST-2/probe/accuracy", "report.primary_metric"),
}


@pytest.mark.parametrize("case", sorted(REPORT_BAD))
def test_report_hints_are_checked_at_validation(tmp_path, capsys, case):
    hint, field = REPORT_BAD[case]
    text = GOOD.replace("defaults:\n", "defaults:\n  finetune: {probe: false}\n") if "probe" in case else GOOD
    _rejects(tmp_path, capsys, text + f"report:\n  {hint}\n", field)


def test_report_hints_that_the_aggregate_can_use_pass(tmp_path):
    for hint in (
        "compare: {factor: masking.rate, a: 0.15, b: 0.3}",
        "x: label",
        "hue: objective.sentence",
        "compare: {factor: objective.sentence, a: nsp, b: none}",
        "primary_metric: SST-2/probe/accuracy",
        "primary_metric: tokens_per_s",
        "compare: {factor: label, a: 'masking.rate=0.15,objective.sentence=nsp',"
        " b: 'masking.rate=0.3,objective.sentence=nsp'}",
    ):
        assert load_study(write(tmp_path, GOOD + f"report:\n  {hint}\n")).runs, hint


def test_sentence_metric_needs_a_sentence_task(tmp_path, capsys):
    _rejects(
        tmp_path,
        capsys,
        "name: t\ndefaults:\n  objective: {sentence: none, format: doc_sentences}\n"
        "report: {primary_metric: sentence_acc}\n",
        "report.primary_metric",
    )


SEED_BAD = {
    "seeds_repeated": ("seeds: [0, 0]", "seeds"),
    "seeds_negative": ("seeds: [-1]", "seeds"),
    "seeds_too_large": ("seeds: [4294967296]", "seeds"),
    "seeds_bool": ("seeds: [true]", "seeds"),
    "seeds_float": ("seeds: [1.5]", "seeds"),
    "finetune_seeds_repeated": ("defaults:\n  finetune: {seeds: [1, 2, 1]}", "finetune.seeds"),
    "finetune_seeds_negative": ("defaults:\n  finetune: {seeds: [-3]}", "finetune.seeds"),
    "split_seed_negative": ("defaults:\n  corpus: {split_seed: -1}", "corpus.split_seed"),
    "search_seeds_negative": (
        "search: {params: {masking.rate: {low: 0.1, high: 0.2}}, seeds: [-1]}",
        "search.seeds",
    ),
    "search_sampler_seed": (
        "search: {params: {masking.rate: {low: 0.1, high: 0.2}}, sampler: {seed: 4294967296}}",
        "search.sampler.seed",
    ),
    "search_best_seeds_repeated": (
        "search: {params: {masking.rate: {low: 0.1, high: 0.2}}, best_seeds: [3, 3]}",
        "search.best_seeds",
    ),
}


@pytest.mark.parametrize("case", sorted(SEED_BAD))
def test_one_seed_rule_everywhere(tmp_path, capsys, case):
    text, field = SEED_BAD[case]
    err = _rejects(tmp_path, capsys, f"name: t\n{text}\n", field)
    assert "4294967295" in err, err  # the allowed range is named


def test_run_config_seed_rule():
    from pydantic import ValidationError

    for bad in (-1, 2**32, True):
        with pytest.raises(ValidationError):
            RunConfig(seed=bad)
    assert RunConfig(seed=2**32 - 1).seed == 2**32 - 1


def test_a_hand_written_fingerprint_is_refused(tmp_path, capsys):
    for text, field in (
        ("defaults:\n  corpus: {fingerprint: 0123456789abcdef}", "defaults.corpus.fingerprint"),
        ("profiles:\n  cpu: {corpus.fingerprint: 0123456789abcdef}", "profiles.cpu.corpus.fingerprint"),
        ("factors:\n  corpus.fingerprint: [0123456789abcdef]", "factors.corpus.fingerprint"),
        (
            "runs:\n  - {label: x, set: {corpus.fingerprint: 0123456789abcdef}}",
            "runs[0].set.corpus.fingerprint",
        ),
    ):
        _rejects(tmp_path, capsys, f"name: t\n{text}\n", field)


def test_a_missing_corpus_source_is_refused_at_validation(tmp_path, capsys):
    err = _rejects(
        tmp_path,
        capsys,
        f"name: t\ndefaults:\n  corpus:\n    sources: [embedded, 'text:{tmp_path}/nope']\n",
        "corpus.sources[1].path",
    )
    assert "does not exist" in err and "s.yaml" in err


def test_a_factor_that_cannot_change_the_run_is_refused(tmp_path, capsys):
    """Span settings without span masking, or short_seq_prob in a format that never draws short rows, give
    runs that differ only in their hash: the same model trained twice, compared with itself. Refused
    (exit 2, naming the key and the setting that would make it count); the same factor where it acts is fine."""
    err = _rejects(tmp_path, capsys, "name: t\nfactors:\n  masking.span_p: [0.1, 0.3]\n", "masking.span_p")
    assert "masking.unit is token" in err and "masking.unit: span" in err
    err = _rejects(
        tmp_path,
        capsys,
        "name: t\ndefaults:\n  objective: {format: doc_sentences, sentence: none}\n"
        "factors:\n  objective.short_seq_prob: [0.0, 0.1]\n",
        "objective.short_seq_prob",
    )
    assert "objective.format is doc_sentences" in err
    err = _rejects(
        tmp_path,
        capsys,
        "name: t\ndefaults:\n  objective: {format: sentence_pair}\n"
        "factors:\n  objective.short_seq_prob: [0.0, 0.1]\n",
        "objective.short_seq_prob",
    )
    assert "objective.format is sentence_pair" in err and "objective.format: segment_pair" in err
    ok = write(
        tmp_path,
        "name: t\ndefaults:\n  masking: {unit: span}\nfactors:\n  masking.span_p: [0.1, 0.3]\n",
        "ok.yaml",
    )
    assert len(load_study(ok).runs) == 2


@pytest.mark.parametrize(
    "varies, field",
    [
        # with another pre-training setting: two runs, the second's fine-tune rows were silently dropped
        (
            "runs:\n  - {label: a}\n  - {label: b, set: {masking.rate: 0.3, finetune.pooling: mean}}\n",
            "pooling",
        ),
        # one at a time: the lr levels were merged into the base point, the factor silently gone
        ("design: one_at_a_time\nfactors:\n  finetune.lr: [1.0e-4, 2.0e-4]\n  masking.rate: [0.3]\n", "lr"),
        ("factors:\n  finetune.probe: [true, false]\n", "probe"),
    ],
)  # was "resolve to the same config"
def test_runs_fine_tuned_with_other_recipes_are_refused(tmp_path, capsys, varies, field):
    """The plan holds one finetune_hash and the aggregate reads results under it only: a spec whose runs
    differ in a fine-tuning setting lost the other runs' fine-tune rows without a word (before)."""
    assert main(["validate", str(write(tmp_path, "name: t\n" + varies))]) == 2
    err = capsys.readouterr().err
    field = f"finetune.{field}"
    assert f"{field}:" in err and "one recipe" in err and "vary it across specs" in err, err
    # seeds and tasks are not in the hash (each is its own result file): a run may differ there
    ok = "name: t\nruns:\n  - {label: a}\n  - {label: b, set: {masking.rate: 0.3, finetune.seeds: [0, 1]}}\n"
    assert main(["validate", str(write(tmp_path, ok))]) == 0


# --------------------------------------------------------------------------- names, numbers and seeds (front-door audit)
def _tree(root: Path) -> dict:
    """Every file under root with its bytes and mtime: what "nothing written" compares."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


SMALL = "defaults:\n  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64}\n"


def test_a_profile_name_that_leaves_the_results_folder_is_refused(tmp_path, capsys):
    """`profiles: {/../../../esc: ...}` validated and `aggregate --profile` wrote outside --results; an
    unquoted `--profile "my prof"` went into dvc.yaml's commands. Both exit 2 naming the field now."""
    from study.paths import Layout

    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    spec = write(work, f"name: t\nprofiles:\n  /../../../esc: {{train.amount: 5}}\n{SMALL}")
    ok = write(work, f"name: t\n{SMALL}", "ok.yaml")
    results, reports = work / "results", work / "reports"
    before = _tree(tmp_path)
    assert main(["validate", str(spec)]) == 2
    assert "profiles./../../../esc:" in capsys.readouterr().err
    assert (
        main(
            [
                "--results",
                str(results),
                "--reports",
                str(reports),
                "aggregate",
                str(spec),
                "--profile",
                "/../../../esc",
            ]
        )
        == 2
    )
    assert "--profile:" in capsys.readouterr().err
    assert main(["--results", str(results), "validate", str(ok), "--profile", "my prof"]) == 2
    assert "--profile:" in capsys.readouterr().err
    assert _tree(tmp_path) == before
    with pytest.raises(StudyError):  # the folder guard below every writer
        Layout(root=results).study_dir("../esc")


@pytest.mark.parametrize("name", ["..", "."])
def test_a_name_of_only_dots_is_refused(tmp_path, capsys, name):
    """`name: ".."` passed the pattern; aggregate then wrote into the results root itself."""
    spec = write(tmp_path, f"name: '{name}'\n{SMALL}")
    results = tmp_path / "results"
    assert main(["--results", str(results), "aggregate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "name:" in err and "not only dots" in err, err
    assert not results.exists()


NON_FINITE = {
    "amount_inf": ("  train: {amount: .inf}", "train.amount", "a finite number > 0"),
    "weight_decay_inf": ("  train: {weight_decay: .inf}", "train.weight_decay", "a finite number >= 0"),
    "lr_nan": ("  train: {lr: .nan}", "train.lr", "a finite number > 0 and <= 1"),
    "factor_level_inf": ("factors:\n  masking.rate: [0.1, -.inf]", "masking.rate", "a finite number"),
    "search_high_inf": (
        "search: {params: {masking.rate: {low: 0.1, high: .inf}}}",
        "search.params.masking.rate.high",
        "a finite number",
    ),
    # the search block's numbers are refused by its schema (study/schema.py's Strict), as a run's are
    "search_choice_nan": (
        "search: {params: {masking.rate: [0.1, .nan]}}",
        "search.params.masking.rate.choices.1",
        "a finite number",
    ),
    "search_weight_nan": (
        "search: {params: {masking.rate: [0.1, 0.2]}, objective: {ref_mlm_loss: .nan}, direction: minimize}",
        "search.objective.ref_mlm_loss",
        "a finite number",
    ),
    "search_timeout_inf": (
        "search: {params: {masking.rate: [0.1, 0.2]}, timeout: .inf}",
        "search.timeout",
        "a finite number",
    ),
    "search_p_threshold_nan": (
        "search: {params: {masking.rate: [0.1, 0.2]}, seeds: [0, 1], pruner: {kind: wilcoxon, p_threshold: .nan}}",
        "search.pruner.p_threshold",
        "a finite number",
    ),
}


@pytest.mark.parametrize("case", sorted(NON_FINITE))
def test_a_non_finite_number_is_refused_naming_the_field(tmp_path, capsys, case):
    """.inf and .nan validated (then `plan` died with an OverflowError; `lr: .nan` said "should be <= 1")."""
    text, field, allowed = NON_FINITE[case]
    path = write(tmp_path, f"name: t\n{SMALL}{text}\n")
    results = tmp_path / "results"
    assert main(["--results", str(results), "plan", str(path), "--no-time"]) == 2
    err = capsys.readouterr().err
    assert f"{field}:" in err and f"(allowed: {allowed}" in err and "Traceback" not in err, err
    assert not results.exists()


@pytest.mark.parametrize(
    "text, field",
    [
        ("  seed: 3\n", "defaults.seed"),
        ("profiles:\n  cpu: {seed: 3}\n", "profiles.cpu.seed"),
        ("runs:\n  - {label: a, set: {seed: 3}}\n", "runs[0].set.seed"),
    ],
)
def test_a_seed_outside_seeds_is_refused(tmp_path, capsys, text, field):
    """A `seed` anywhere but `seeds:` was overwritten by it without a word (factors.seed already failed)."""
    err = _rejects(tmp_path, capsys, f"name: t\n{SMALL}{text}", field)
    assert "the spec's `seeds:` list" in err, err


@pytest.mark.parametrize(
    "profile, field",
    [("{model.layerz: 3}", "profiles.cpu.model.layerz"), ("{model.layers: 0}", "profiles.cpu.model.layers")],
)
def test_validate_without_a_profile_checks_every_profile(tmp_path, capsys, profile, field):
    """`validate` without --profile reported ok for a spec whose cpu profile could never build a run."""
    err = _rejects(
        tmp_path, capsys, f"name: t\n{SMALL}profiles:\n  gpu: {{}}\n  cpu: {profile}\n", f"{field}:"
    )
    assert "did you mean 'model.layers'" in err or "an integer >= 1 and <= 48" in err, err


def test_validate_checks_the_shipped_profiles_without_their_corpus_files(tmp_path, monkeypatch, capsys):
    """The profile sweep reads no corpus file (the cpu profiles' ../shared/data is absent on CI)."""
    monkeypatch.chdir(tmp_path)
    assert main(["validate", *map(str, sorted((REPO / "ablations").glob("*.yaml")))]) == 0, (
        capsys.readouterr().err
    )


MESSAGES = {  # (spec text, what the message must say)
    "report_key": (
        "report: {primary_metrc: ref_ppl}",
        [
            "report.primary_metrc:",
            "did you mean 'report.primary_metric'",
            "allowed: kind, primary_metric, primary_why, x, hue, compare, references",
        ],
    ),
    "search_key": (
        "search: {params: {masking.rate: {loww: 0.1, high: 0.2}}}",
        ["did you mean 'search.params.masking.rate.low'", "allowed: type, low, high, step, log, choices"],
    ),
    "corpus_key": (
        "defaults:\n  corpus: {sources: [{kind: text, pathh: x}]}",
        ["did you mean 'corpus.sources.0.path'", "allowed: kind, path, name"],
    ),
    "top_key": (
        "factr: {}",
        [
            "did you mean 'factors'",
            "allowed: name, question, base, defaults, factors, design, "
            "runs, seeds, profiles, report, search)",
        ],
    ),
    "both_bounds": ("defaults:\n  masking: {rate: 0}", ["masking.rate:", "allowed: a number > 0 and < 1"]),
    "equal_levels": (
        "factors:\n  model.layers: [1, 1.0]",
        ["factors.model.layers:", "equal once resolved", "allowed: distinct values"],
    ),
}


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_messages_name_the_sections_keys_both_bounds_and_why(tmp_path, capsys, case):
    text, needles = MESSAGES[case]
    err = _rejects(tmp_path, capsys, f"name: t\n{text}\n", needles[0])
    assert all(n in err for n in needles), err
