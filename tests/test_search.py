"""Optuna search (issue 6): spec validation, trial = ordinary run, reuse, pruning, storages, dead workers.

Everything trains a tiny BERT on a synthetic corpus written into tmp_path (no shared data needed).
Multi-process tests (3 workers on SQLite / journal / PostgreSQL, SIGKILL of a worker) are `slow`.
PostgreSQL tests need a server: `eval "$(.ci/postgres.sh)"` sets STUDY_TEST_PG_URL; they skip without it.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from study.errors import StudyError
from study.paths import Layout
from study.studies.spec import load_study

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("STUDY_TEST_PG_URL")
needs_pg = pytest.mark.skipif(
    not PG_URL, reason='no PostgreSQL server: run `eval "$(.ci/postgres.sh)"` to set STUDY_TEST_PG_URL'
)


# --------------------------------------------------------------------------- fixtures
def write_corpus(folder: Path, n_docs: int = 300, seed: int = 0) -> Path:
    """Subject-verb-object sentences where the subject fixes the adverb: learnable, tiny, deterministic."""
    rng = np.random.default_rng(seed)
    subj = "the cat|the dog|a bird|my friend|the teacher|a child|the farmer|our neighbor".split("|")
    verb = "sees|likes|finds|takes|wants|brings|makes|holds".split("|")
    obj = (
        "a red ball|the old book|some fresh bread|a small box|the green apple|a long letter|the warm coat|"
        "a new chair"
    ).split("|")
    adv = "today|again|quickly|at home|in the park|after lunch|every day|with care".split("|")
    docs = []
    for _ in range(n_docs):
        sents = []
        for _ in range(int(rng.integers(3, 8))):
            i = int(rng.integers(len(subj)))
            sents.append(
                f"{subj[i].capitalize()} {verb[(i + int(rng.integers(2))) % len(verb)]} "
                f"{obj[int(rng.integers(len(obj)))]} {adv[i]}."
            )
        docs.append(" ".join(sents))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.txt").write_text("\n\n".join(docs) + "\n")
    return folder


def tiny_defaults(corpus: Path, steps: int = 20, eval_every: int = 5) -> dict:
    return {
        "corpus": {"sources": [f"text:{corpus}"], "valid_fraction": 0.1, "test_fraction": 0.05},
        "tokenizer": {"vocab_size": 128, "min_frequency": 1},
        "objective": {"format": "doc_sentences", "sentence": "none", "max_seq_len": 32},
        "model": {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32, "max_positions": 32},
        "train": {"budget": "steps", "amount": steps, "batch_size": 8, "lr": 0.005, "eval_sequences": 32},
        "finetune": {
            "tasks": ["SST-2"],
            "seeds": [0],
            "epochs": 1,
            "max_length": 32,
            "probe": False,
            "baseline": False,
            "batch_size": 8,
        },
        "impl": {
            "eval_every": eval_every,
            "checkpoint_every": eval_every or 10,
            "threads": 1,
            "progress": False,
        },
    }


def tiny_search(**over) -> dict:
    s = {
        "objective": "ref_mlm_loss",
        "n_trials": 4,
        "sampler": {"kind": "tpe", "seed": 0, "n_startup_trials": 2},
        "pruner": {"kind": "median", "n_startup_trials": 1},
        "heartbeat_interval": 1,
        "grace_period": 4,
        "params": {
            "masking.rate": {"low": 0.1, "high": 0.5, "step": 0.1},
            "masking.split.mask": {"low": 0.5, "high": 1.0, "step": 0.1},
        },
    }
    s.update(over)
    return s


def write_spec(
    path: Path, corpus: Path, search: dict | None = None, name: str | None = None, **defaults_kw
) -> Path:
    doc = {
        "name": name or f"s{uuid.uuid4().hex[:8]}",
        "question": "which mask rate?",
        "defaults": tiny_defaults(corpus, **defaults_kw),
    }
    if search is not None:
        doc["search"] = search
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """One results root per module: data is prepared once and runs are shared, as in a real study."""
    return tmp_path_factory.mktemp("results")


def _storage_obj(url: str):
    import optuna

    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal://") :]))
    return url


def load_trials(url: str, name: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.load_study(study_name=name, storage=_storage_obj(url)).get_trials(deepcopy=False)


# --------------------------------------------------------------------------- validation (no training)
def _err(tmp_path, corpus, search, **kw) -> StudyError:
    from study.search import load_search

    spec = write_spec(tmp_path / "bad.yaml", corpus, search, **kw)
    with pytest.raises(StudyError) as ei:
        load_search(spec)
    return ei.value


def test_unknown_key_names_field_and_suggests(tmp_path, corpus):
    e = _err(tmp_path, corpus, tiny_search(params={"masking.rat": {"low": 0.1, "high": 0.2}}))
    assert e.field == "search.params.masking.rat" and "did you mean 'masking.rate'" in str(e)


def test_empty_and_invalid_ranges(tmp_path, corpus):
    e = _err(tmp_path, corpus, tiny_search(params={"masking.rate": {"low": 0.3, "high": 0.1}}))
    assert "empty range" in str(e) and "search.params.masking.rate" in str(e)
    e = _err(tmp_path, corpus, tiny_search(params={"objective.sentence": []}))
    assert "empty list of choices" in str(e)
    # in-range for the search block but not a valid run: caught before training, naming the value
    e = _err(tmp_path, corpus, tiny_search(params={"masking.rate": {"low": 0.1, "high": 1.0}}))
    assert e.field == "search.params.masking.rate" and "masking.rate=1.0" in str(e)
    e = _err(
        tmp_path,
        corpus,
        tiny_search(
            params={
                "masking.split.mask": {"low": 0.5, "high": 1.0},
                "masking.keep": {"low": 0.0, "high": 0.2},
            }
        ),
    )
    assert "not both" in str(e)
    e = _err(
        tmp_path,
        corpus,
        tiny_search(sampler={"kind": "grid"}, params={"train.lr": {"low": 1e-4, "high": 1e-2, "log": True}}),
    )
    assert "grid sampler needs a `step`" in str(e)


def test_objective_no_run_produces(tmp_path, corpus):
    e = _err(tmp_path, corpus, tiny_search(objective="ref_mlm_los"))
    assert e.field == "search.objective" and "ref_mlm_loss" in e.allowed
    e = _err(tmp_path, corpus, tiny_search(objective="sentence_acc"))  # tiny defaults: sentence none
    assert "sentence_acc is null" in str(e)
    e = _err(tmp_path, corpus, tiny_search(objective="SST-2/finetune/f1"))
    assert "SST-2 does not report 'f1'" in str(e) and e.allowed == "accuracy"
    e = _err(tmp_path, corpus, tiny_search(objective="SST-2/probe/accuracy"))
    assert "finetune.probe" in str(e)
    e = _err(tmp_path, corpus, tiny_search(objective="XYZ/finetune/accuracy"))
    assert "unknown task 'XYZ'" in str(e)
    e = _err(tmp_path, corpus, tiny_search(objective={"ref_mlm_loss": 1.0, "ref_mlm_acc": -1.0}))
    assert "explicit direction" in str(e)


def test_step_pruner_needs_evaluations(tmp_path, corpus):
    e = _err(tmp_path, corpus, tiny_search(), eval_every=0)
    assert e.field == "search.pruner.kind" and "eval_every" in str(e)


def test_cli_bad_input_exits_2_before_writing(tmp_path, corpus, capsys, monkeypatch):
    import optuna

    from study.search.cli import main

    res = tmp_path / "results"
    spec = write_spec(
        tmp_path / "bad.yaml", corpus, tiny_search(params={"masking.rat": {"low": 0.1, "high": 0.2}})
    )
    assert main(["--results", str(res), "search", str(spec), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "search.params.masking.rat" in err and "Traceback" not in err
    assert not res.exists()
    # a storage that can't be reached: one clear line, exit 2, quickly (a connect timeout is passed to the
    # engine, not the driver's default), nothing written
    good = write_spec(tmp_path / "good.yaml", corpus, tiny_search())
    engines, rdb = [], optuna.storages.RDBStorage

    def recording(url, engine_kwargs=None, **kw):
        engines.append(engine_kwargs)
        return rdb(url, engine_kwargs=engine_kwargs, **kw)

    monkeypatch.setattr(optuna.storages, "RDBStorage", recording)
    assert (
        main(
            [
                "--results",
                str(res),
                "search",
                str(good),
                "--quiet",
                "--storage",
                "postgresql+psycopg2://nobody@127.0.0.1:1/none",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert engines and all(e["connect_args"]["connect_timeout"] == 10 for e in engines), engines
    assert "can't open storage" in err and "Connection refused" in err.replace(
        "connection refused", "Connection refused"
    )
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (
        main(["--results", str(res), "search", str(good), "--storage", f"journal://{tmp_path}/no/such/j.log"])
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
    assert main(["--results", str(res), "search", str(good), "--storage", "not-a-url"]) == 2
    assert not res.exists()
    # a timeout of 0 or less ended the search at once with exit 0, after creating its storage
    for t in ("0", "-1"):
        assert main(["--results", str(res), "search", str(good), "--quiet", "--timeout", t]) == 2
        assert "--timeout:" in capsys.readouterr().err
    # search-best before any search: it created an empty storage to find nothing in it
    assert main(["--results", str(res), "search-best", str(good)]) == 2
    assert "no search storage" in capsys.readouterr().err
    assert not res.exists()


# --------------------------------------------------------------------------- configs
def test_split_parameterization_sums_to_one_and_hashes_like_the_defaults(tmp_path, corpus):
    from study.search import load_search
    from study.search.configs import resolve_settings, trial_config

    study, _ = load_search(write_spec(tmp_path / "s.yaml", corpus, tiny_search()))
    s = resolve_settings({"masking.split.mask": 0.8, "masking.split.random_share": 0.5}, study.defaults)
    assert (s["masking.mask"], s["masking.random"], s["masking.keep"]) == (0.8, 0.1, 0.1)
    default_run = load_study(study.path).runs[0].config  # 80/10/10 from config.py
    assert trial_config(study, s, 0).run_hash() == default_run.run_hash()
    for mask in np.linspace(0, 1, 7):
        for share in np.linspace(0, 1, 5):
            cfg = trial_config(
                study,
                resolve_settings(
                    {"masking.split.mask": mask, "masking.split.random_share": share}, study.defaults
                ),
                0,
            )
            m = cfg.masking
            assert abs(m.mask + m.random + m.keep - 1) < 1e-6 and min(m.mask, m.random, m.keep) >= 0
    # only one coordinate searched: the other keeps the defaults' random:keep ratio (1:1)
    s = resolve_settings({"masking.split.mask": 0.6}, study.defaults)
    assert (s["masking.random"], s["masking.keep"]) == (0.2, 0.2)


def test_trial_is_the_grid_run(tmp_path, corpus):
    """A sampled value with float noise (0.1 + 0.2) gives the very run a grid spec plans."""
    from study.search import load_search
    from study.search.configs import tidy, trial_config

    doc = yaml.safe_load(write_spec(tmp_path / "g.yaml", corpus, tiny_search()).read_text())
    doc["factors"] = {"masking.rate": [0.15, 0.3]}
    doc["seeds"] = [0, 1]
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(doc))
    study, _ = load_search(tmp_path / "g.yaml")
    grid = {(r.factors["masking.rate"], r.seed): r.run_hash for r in study.runs}
    assert trial_config(study, {"masking.rate": tidy(0.1 + 0.2)}, 1).run_hash() == grid[(0.3, 1)]
    assert trial_config(study, {"masking.rate": 0.15}, 0).run_hash() == grid[(0.15, 0)]


def test_sampler_is_seeded_per_trial_number():
    """Workers started together must not propose the same points; the same trial number replays."""
    import optuna

    from study.search.samplers import make_sampler
    from study.studies.searchspec import SearchSpec

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = SearchSpec(params={"x": {"low": 0.0, "high": 1.0}}, sampler={"kind": "random", "seed": 7})

    def first_two(shared_storage):
        # two "workers": separate Study objects and samplers with the same seed, one storage
        a = optuna.create_study(
            storage=shared_storage, study_name="s", sampler=make_sampler(spec), load_if_exists=True
        )
        b = optuna.create_study(
            storage=shared_storage, study_name="s", sampler=make_sampler(spec), load_if_exists=True
        )
        return a.ask().suggest_float("x", 0, 1), b.ask().suggest_float("x", 0, 1)

    x0, x1 = first_two(optuna.storages.InMemoryStorage())
    assert x0 != x1  # plain RandomSampler(seed=7) twice would give x0 == x1
    assert first_two(optuna.storages.InMemoryStorage()) == (x0, x1)  # reproducible
    other = SearchSpec(params={"x": {"low": 0.0, "high": 1.0}}, sampler={"kind": "random", "seed": 8})
    c = optuna.create_study(sampler=make_sampler(other))
    assert c.ask().suggest_float("x", 0, 1) != x0  # the seed matters


# --------------------------------------------------------------------------- one worker, real training
@pytest.fixture(scope="module")
def searched(tmp_path_factory, corpus, results):
    """A 4-trial search (TPE + median pruner, default SQLite storage) on the tiny spec."""
    from study.search import run_search

    spec = write_spec(tmp_path_factory.mktemp("spec") / "tiny.yaml", corpus, tiny_search(), name="tiny")
    ostudy = run_search(spec, layout=Layout(root=results), quiet=True)
    return spec, ostudy


def test_search_trials_are_ordinary_runs(searched, results):
    from optuna.trial import TrialState

    from study.io import read_json
    from study.search import load_search
    from study.search.configs import trial_config

    spec, ostudy = searched
    study, search = load_search(spec)
    trials = ostudy.get_trials()
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 4 and [t.number for t in trials] == list(range(len(trials)))
    assert (results / "search" / "tiny" / "study.db").exists()  # default storage: SQLite under results/search
    full = 20 * 8 * 32  # steps x batch x seq: an upper bound on tokens of a full run
    states = set()
    for t in finished:
        states.add(t.state)
        cfg = trial_config(study, t.user_attrs["settings"], 0)
        assert t.user_attrs["run_hash"] == cfg.run_hash()
        run_dir = results / "runs" / cfg.run_hash()
        assert read_json(run_dir / "config.json")["run_hash"] == cfg.run_hash()
        assert t.user_attrs["tokens"] > 0 and t.intermediate_values  # the trainer's evals were reported
        assert set(t.intermediate_values) <= {5, 10, 15, 20}
        if t.state == TrialState.COMPLETE:
            metrics = read_json(run_dir / "metrics.json")
            assert read_json(run_dir / "status.json")["status"] == "done"
            assert t.value == pytest.approx(metrics["ref_mlm_loss"])
            assert t.user_attrs["tokens"] == metrics["tokens_seen"] <= full
        else:  # pruned: resumable folder, no status, fewer tokens than a full run
            assert not (run_dir / "status.json").exists()
            assert (
                t.user_attrs["tokens"]
                < read_json(results / "runs" / finished[0].user_attrs["run_hash"] / "metrics.json")[
                    "tokens_seen"
                ]
            )
            assert max(t.intermediate_values) < 20
    assert TrialState.COMPLETE in states
    rows = list(csv.DictReader((results / "search" / "tiny" / "trials.csv").open()))
    assert [int(r["number"]) for r in rows] == [t.number for t in trials]
    for r, t in zip(rows, trials, strict=True):
        assert r["state"] == t.state.name and r["run_hash"] == t.user_attrs["run_hash"]
        assert int(r["tokens"]) == t.user_attrs["tokens"]
        assert json.loads(r["params"]).keys() == t.params.keys()


def test_trial_equal_to_a_done_run_reuses_it(searched, results, tmp_path, corpus):
    from optuna.trial import TrialState

    from study.io import read_json
    from study.search import run_search

    _, ostudy = searched
    done = next(t for t in ostudy.get_trials() if t.state == TrialState.COMPLETE)
    s = done.user_attrs["settings"]
    # the same config, reached through the direct keys instead of the split coordinates
    params = {
        "masking.rate": [s["masking.rate"]],
        "masking.mask": [s["masking.mask"]],
        "masking.random": [s["masking.random"]],
        "masking.keep": [s["masking.keep"]],
    }
    spec = write_spec(tmp_path / "reuse.yaml", corpus, tiny_search(n_trials=1, params=params))
    run_dir = results / "runs" / done.user_attrs["run_hash"]
    before = (run_dir / "history.jsonl").read_bytes()
    t = run_search(spec, layout=Layout(root=results), quiet=True).get_trials()[0]
    assert t.state == TrialState.COMPLETE and t.user_attrs["run_hash"] == done.user_attrs["run_hash"]
    assert t.user_attrs["reused"] is True and t.user_attrs["tokens"] == 0
    assert t.value == done.value == read_json(run_dir / "metrics.json")["ref_mlm_loss"]
    assert t.intermediate_values == done.intermediate_values  # curve replayed from history.jsonl
    assert (run_dir / "history.jsonl").read_bytes() == before  # not trained again


def test_search_then_report_names_the_best_trials_parameters(tmp_path, corpus, results, capsys):
    """`study search`, `study aggregate`, `study report` through the CLI: the report's search section names
    the best trial and its parameter values, read from the trials.csv the search wrote. (The search wrote
    `param.<key>` columns while the report read `params_<key>`: a real search's report named no parameter.)"""
    import html as html_lib

    import pandas as pd

    from study.cli import main as study_main
    from study.metrics import param_column
    from study.search.configs import tidy

    name = f"e2e{uuid.uuid4().hex[:6]}"
    spec = write_spec(tmp_path / "e2e.yaml", corpus, tiny_search(n_trials=3), name=name)
    root = ["--results", str(results), "--reports", str(tmp_path / "reports")]
    assert study_main([*root, "search", str(spec), "--quiet"]) == 0
    assert study_main([*root, "aggregate", str(spec), "--quiet"]) == 0
    assert study_main([*root, "report", str(spec), "--quiet"]) == 0
    capsys.readouterr()
    done = [
        t
        for t in load_trials(f"sqlite:///{results}/search/{name}/study.db", name)
        if t.state.name == "COMPLETE"
    ]
    assert done, "no complete trial: nothing to name"
    best = min(done, key=lambda t: t.value)  # ref_mlm_loss: minimized
    page = html_lib.unescape((tmp_path / "reports" / name / "index.html").read_text())
    section = page[page.index('id="search"') :]
    assert f"Best: trial {best.number}," in section
    for key, value in best.params.items():
        assert f"{key}={tidy(value)}" in section, (key, value, section[:600])
    trials = pd.read_csv(results / "search" / name / "trials.csv")
    assert {param_column(k) for k in best.params} <= set(trials.columns)  # the columns the report reads


def test_search_best_writes_a_spec_that_retrains_the_best(searched, results, tmp_path):
    from study.search import write_best

    spec, ostudy = searched
    out = write_best(spec, tmp_path / "tiny-best.yaml", layout=Layout(root=results))
    best = load_study(out)
    assert best.name == "tiny-best" and [r.seed for r in best.runs] == [0, 1, 2]
    assert best.runs[0].run_hash == ostudy.best_trial.user_attrs["run_hash"]
    assert best.runs[0].status(Layout(root=results)) == "done"  # seed 0 is the trial's own run
    assert len({r.run_hash for r in best.runs}) == 3
    info = json.loads((results / "search" / "tiny" / "best.json").read_text())
    assert info["number"] == ostudy.best_trial.number


def fake_train(cfg, layout, quiet, on_eval):
    """A finished run in no time: the value is the run's own mask rate (what the search minimizes)."""
    from study.rundir import RunDir

    run = RunDir(layout, cfg.run_hash())
    run.write_metrics({"ref_mlm_loss": cfg.masking.rate + cfg.seed / 100, "tokens_seen": 64})
    run.write_status("done")


def _respec(spec: Path, **edits) -> None:
    """Edit a written spec: each keyword is a dotted path into the YAML document (`search__params`)."""
    doc = yaml.safe_load(spec.read_text())
    for path, value in edits.items():
        *parents, leaf = path.split("__")
        node = doc
        for part in parents:
            node = node[part]
        node[leaf] = value
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_storage_of_another_space_or_other_settings_is_refused(tmp_path, corpus):
    """The storage keeps what its trials were run for. A narrowed range, other seeds, other defaults or an
    edited profile make another search: continuing it would mix their trials, and search-best would write
    a best outside the new range with settings no trial ran. Both refuse, naming the field, writing nothing."""
    from study.search import run_search, write_best

    search = tiny_search(
        n_trials=2,
        sampler={"kind": "grid", "seed": 0},
        pruner={"kind": "none"},
        params={"masking.rate": [0.15, 0.3, 0.45]},
    )
    spec = write_spec(tmp_path / "fp.yaml", corpus, search)
    _respec(spec, profiles={"cpu": {"train.amount": 30}})
    layout = Layout(root=tmp_path / "results")
    run_search(spec, layout=layout, quiet=True, profile="cpu", train_fn=fake_train)
    original = spec.read_text()
    out = tmp_path / "best.yaml"
    for field, edit in (
        ("search.params", {"search__params": {"masking.rate": [0.3, 0.45]}}),
        ("search.seeds", {"search__seeds": [0, 1]}),
        ("defaults", {"defaults__train__lr": 0.004}),
        ("defaults", {"profiles__cpu__train.amount": 31}),
    ):
        spec.write_text(original)
        _respec(spec, **edit)
        for attempt in (
            lambda: run_search(spec, layout=layout, quiet=True, profile="cpu", train_fn=fake_train),
            lambda: write_best(spec, out, layout=layout, profile="cpu"),
        ):
            with pytest.raises(StudyError) as ei:
                attempt()
            assert (
                ei.value.field == field
                and ei.value.allowed == "the same space and settings, or another --storage"
            )
        assert (
            not out.exists() and not (layout.search_dir(load_study(spec, "cpu").name) / "best.json").exists()
        )
    # what does not change a trial's value keeps the storage: more trials, speed-only settings
    spec.write_text(original)
    _respec(spec, search__n_trials=3, defaults__impl__threads=2)
    ostudy = run_search(spec, layout=layout, quiet=True, profile="cpu", train_fn=fake_train)
    assert len(ostudy.get_trials()) == 3
    assert write_best(spec, out, layout=layout, profile="cpu") == out


def test_best_json_and_trials_csv_say_what_produced_them(tmp_path, corpus):
    """best.json: the best trial, every seed's run, the searched spec, its profile and seeds, and the
    provenance (commit, packages, hardware); trials.csv: each trial's runs and the commit that ran it."""
    from study.provenance import git_info
    from study.search import run_search, write_best

    search = tiny_search(
        n_trials=2,
        seeds=[0, 1],
        sampler={"kind": "grid", "seed": 0},
        pruner={"kind": "none"},
        params={"masking.rate": [0.15, 0.3]},
    )
    spec = write_spec(tmp_path / "prov.yaml", corpus, search)
    layout = Layout(root=tmp_path / "results")
    ostudy = run_search(spec, layout=layout, quiet=True, train_fn=fake_train)
    out = write_best(spec, tmp_path / "best.yaml", layout=layout)
    best = ostudy.best_trial
    folder = layout.search_dir(load_study(spec).name)
    info = json.loads((folder / "best.json").read_text())
    assert len(best.user_attrs["run_hashes"]) == 2 and info["run_hashes"] == best.user_attrs["run_hashes"]
    assert info["run_hash"] == info["run_hashes"][0] and info["seeds"] == [0, 1]
    assert info["search_spec"] == str(spec) and info["spec"] == str(out) and info["profile"] is None
    assert info["provenance"]["git"]["commit"] == git_info()["commit"] and "packages" in info["provenance"]
    rows = list(csv.DictReader((folder / "trials.csv").open()))
    assert [json.loads(r["run_hashes"]) for r in rows] == [
        t.user_attrs["run_hashes"] for t in ostudy.get_trials()
    ]
    assert {r["commit"] for r in rows} == {git_info()["commit"] or ""}
    header = next(csv.reader((folder / "trials.csv").open()))
    assert header.index("commit") < header.index("params_masking.rate")  # provenance before the parameters


def test_search_best_writes_nothing_on_a_bad_storage_or_spec(tmp_path, corpus, capsys, monkeypatch):
    """search-best only reads: a SQLite or journal storage that does not exist is exit 2 without creating
    it (or the init lock); a best spec that does not validate is refused before any file is written."""
    from study.search import run_search, trials
    from study.search.cli import main

    res = tmp_path / "results"
    search = tiny_search(
        n_trials=1,
        sampler={"kind": "grid", "seed": 0},
        pruner={"kind": "none"},
        params={"masking.rate": [0.15]},
    )
    spec = write_spec(tmp_path / "sb.yaml", corpus, search)
    for url, path in (
        (f"sqlite:///{tmp_path}/new.db", tmp_path / "new.db"),
        (f"journal://{tmp_path}/new.log", tmp_path / "new.log"),
    ):
        assert main(["--results", str(res), "search-best", str(spec), "--storage", url]) == 2
        assert "no search storage" in capsys.readouterr().err
        assert not path.exists() and not res.exists()
    # --n-trials 0: exit 2 with the values allowed
    assert main(["--results", str(res), "search", str(spec), "--quiet", "--n-trials", "0"]) == 2
    assert "allowed: an integer >= 1" in capsys.readouterr().err and not res.exists()
    layout = Layout(root=res)
    run_search(spec, layout=layout, quiet=True, train_fn=fake_train)
    table = layout.search_dir(load_study(spec).name) / "trials.csv"  # the search's own export
    before = table.read_bytes()
    good = trials.best_spec
    monkeypatch.setattr(trials, "best_spec", lambda *a: {**good(*a), "seeds": [-1]})  # not a valid spec
    out = tmp_path / "sb-best.yaml"
    with pytest.raises(StudyError, match="seeds"):
        trials.write_best(spec, out, layout=layout)
    assert not out.exists() and not (table.parent / "best.json").exists() and table.read_bytes() == before


def test_trial_failed_as_stale_by_another_worker_does_not_end_this_worker(tmp_path, corpus, results, capsys):
    """Another worker failed our trial as stale (our heartbeat was late: a stalled machine or a journal lock
    left by a killed worker). Our next write raises, optuna's tell then says "Cannot tell a FAIL trial":
    the worker warns and goes on to its next trial instead of dying with exit 1 (a CI failure seen under load)."""
    import optuna
    from optuna.trial import TrialState

    from study.pretrain.trainer import train_run
    from study.search import run_search
    from study.search.storage import open_storage
    from study.studies.searchspec import SearchSpec

    search = tiny_search(n_trials=1, sampler={"kind": "grid", "seed": 0}, params={"masking.rate": [0.15]})
    spec = write_spec(tmp_path / "stale.yaml", corpus, search)
    url = f"journal://{tmp_path}/stale.log"
    calls = []

    def train_fn(cfg, layout, quiet, on_eval):
        calls.append(cfg.run_hash())
        if len(calls) == 1:  # what fail_stale_trials in another worker does to our running trial
            other = open_storage(url, SearchSpec.model_validate(search), tmp_path)
            (ost,) = [
                optuna.load_study(study_name=s.study_name, storage=other) for s in other.get_all_studies()
            ]
            (t,) = ost.get_trials(states=(TrialState.RUNNING,))
            other.set_trial_state_values(t._trial_id, TrialState.FAIL)
            other.get_heartbeat_stale_trial_callback()(ost, other.get_trial(t._trial_id))  # re-queue it
            on_eval(1, 1, {"ref_mlm_loss": 5.0})  # our next write: UpdateFinishedTrialError
        return train_run(cfg, layout, quiet=quiet, on_eval=on_eval)

    ostudy = run_search(spec, storage=url, layout=Layout(root=results), quiet=True, train_fn=train_fn)
    dead, retry = ostudy.get_trials()
    assert dead.state == TrialState.FAIL and retry.state == TrialState.COMPLETE and len(calls) == 2
    assert retry.system_attrs["failed_trial"] == dead.number and retry.params == dead.params
    assert f"failed as stale by another worker; trial {dead.number} re-queued" in capsys.readouterr().err


def test_two_retries_of_one_dead_trial_run_its_grid_point_once(tmp_path, corpus):
    """On SQLite two workers can both fail the same stale trial (the state is read before the write lock),
    so it is re-queued twice: the CI failure of stop 13 (a grid point finished twice). The second retry
    finds the point held by the first and stands aside, marked, without counting as a failure."""
    import optuna
    from optuna.trial import TrialState

    from study.pretrain.trainer import train_run
    from study.search import run_search
    from study.search.storage import open_storage
    from study.search.trials import trials_rows
    from study.studies.searchspec import SearchSpec

    search = tiny_search(
        n_trials=2, sampler={"kind": "grid", "seed": 0}, params={"masking.rate": [0.15, 0.3]}
    )
    spec = write_spec(tmp_path / "twice.yaml", corpus, search)
    url = f"sqlite:///{tmp_path}/twice.db"
    calls = []

    def train_fn(cfg, layout, quiet, on_eval):
        calls.append(cfg.run_hash())
        if len(calls) == 1:  # two other workers fail our running trial and each re-queues it
            other = open_storage(url, SearchSpec.model_validate(search), tmp_path)
            (ost,) = [
                optuna.load_study(study_name=s.study_name, storage=other) for s in other.get_all_studies()
            ]
            (t,) = ost.get_trials(states=(TrialState.RUNNING,))
            other.set_trial_state_values(t._trial_id, TrialState.FAIL)
            for _ in range(2):
                other.get_heartbeat_stale_trial_callback()(ost, other.get_trial(t._trial_id))
            on_eval(1, 1, {"ref_mlm_loss": 5.0})  # our next write: UpdateFinishedTrialError
        return train_run(cfg, layout, quiet=quiet, on_eval=on_eval)

    # its own results folder: a run another test already finished would be reused without training,
    # and the simulated stale failure (inside train_fn) would never happen
    ostudy = run_search(
        spec, storage=url, layout=Layout(root=tmp_path / "results"), quiet=True, train_fn=train_fn
    )
    trials = ostudy.get_trials()
    assert calls, "train_fn never ran: nothing was tested"
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert sorted(t.params["masking.rate"] for t in done) == [0.15, 0.3], trials_rows(ostudy)
    dupes = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert len(dupes) == 1 and dupes[0].state == TrialState.FAIL
    assert dupes[0].system_attrs["failed_trial"] == 0  # it was the second retry
    holder = trials[dupes[0].user_attrs["duplicate_of"]]
    assert holder in done and holder.params == dupes[0].params
    assert calls.count(holder.user_attrs["run_hash"]) == 2  # the dead trial and its retry; not the duplicate
    assert [r["duplicate_of"] for r in trials_rows(ostudy)].count(holder.number) == 1


def test_of_two_running_trials_on_one_grid_point_the_first_started_holds_it():
    """The order every worker sees the same way: a finished trial holds its point; among running ones,
    the one that started first. A failed one holds nothing (its retry takes over)."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from study.search.grid import grid_point_holder

    ost = optuna.create_study(sampler=optuna.samplers.GridSampler({"x": [1, 2]}, seed=0))
    first, second = ost.ask(), ost.ask()  # grid points 0 and 1 by trial number
    for x in (first, second):
        x.suggest_categorical("x", [1, 2])
    grid0 = ost._storage.get_trial(first._trial_id).system_attrs["grid_id"]
    dist = {"x": optuna.distributions.CategoricalDistribution([1, 2])}
    ost.add_trial(
        create_trial(
            state=TrialState.WAITING,
            params={"x": 1},
            distributions=dist,
            system_attrs={"grid_id": grid0, "search_space": {"x": [1, 2]}},
        )
    )
    late = ost.ask()  # pops the queued one: same point, later start
    assert grid_point_holder(late) == first.number
    assert grid_point_holder(first) is None and grid_point_holder(second) is None
    ost._storage.set_trial_state_values(first._trial_id, TrialState.FAIL)  # (tell() would stop the study)
    assert grid_point_holder(late) is None  # the first died: the later one runs the point
    ost._storage.set_trial_state_values(second._trial_id, TrialState.COMPLETE, [1.0])
    twin = ost.ask()  # grid exhausted: optuna re-deals a point
    held = grid_point_holder(twin)
    assert held in (late.number, second.number)


def test_a_journal_retry_is_not_failed_by_the_heartbeat_it_inherited(tmp_path, monkeypatch):
    """The retry of a dead trial is created with the dead trial's system attrs, and on journal storage the
    heartbeat is one of them. Read as the retry's own, it made the retry look dead from the moment a worker
    popped it until its first beat: another worker failed it, then its retry, until max_retry ran out and
    the grid point was lost (CI of stop 27: 5 of 6 grid trials finished)."""
    from types import SimpleNamespace

    import optuna
    from optuna.storages import fail_stale_trials
    from optuna.trial import TrialState

    from study.search import storage
    from study.search.storage import HEARTBEAT_ATTR, open_storage
    from study.studies.searchspec import SearchSpec

    # the heartbeats' clock, injected: no sleeping against the grace, whatever the machine's load. Trial
    # start times are optuna's own (the real clock); the beats and "now" are shifted by `skew` seconds.
    skew = [0.0]
    monkeypatch.setattr(
        storage, "time", SimpleNamespace(time=lambda: time.time() + skew[0], sleep=time.sleep)
    )
    search = SearchSpec.model_validate(tiny_search(heartbeat_interval=1, grace_period=30))
    store = open_storage(f"journal://{tmp_path}/retry.log", search, tmp_path)
    ost = optuna.create_study(storage=store, study_name="retry")
    dead = ost.ask()
    skew[0] = -100
    store.record_heartbeat(dead._trial_id)  # its last beat, long ago
    skew[0] = 100  # its worker died: no beat for > grace
    fail_stale_trials(ost)
    (waiting,) = ost.get_trials(states=(TrialState.WAITING,))
    assert waiting.system_attrs[HEARTBEAT_ATTR] < storage.time.time() - 30  # the inherited (stale) beat
    skew[0] = 0
    retry = ost.ask()  # a live worker pops it: RUNNING, no beat yet
    assert retry.number == waiting.number
    fail_stale_trials(ost)  # another worker looks right away
    assert store.get_trial(retry._trial_id).state == TrialState.RUNNING
    assert not ost.get_trials(states=(TrialState.WAITING,))
    skew[0] = 100  # and a retry that never beats does die
    assert store._get_stale_trial_ids(ost._study_id) == [retry._trial_id]


def test_journal_lock_of_a_killed_worker_is_broken_inside_the_heartbeat_grace(tmp_path):
    """While a dead worker's lock file stands, nobody can write a heartbeat; if breaking it took longer
    than the heartbeat grace (optuna's default lock grace is 30 s, ours 3 heartbeats = 30 s too), every
    live trial would look dead the moment it frees."""
    from study.search.storage import open_storage
    from study.studies.searchspec import SearchSpec

    for hb, grace in ((1, None), (10, None), (60, None), (2, 6), (1, 4)):
        search = SearchSpec.model_validate(tiny_search(heartbeat_interval=hb, grace_period=grace))
        lock = open_storage(f"journal://{tmp_path}/j{hb}.log", search, tmp_path)._backend._lock
        assert lock.grace_period + hb < search.grace, (hb, lock.grace_period, search.grace)


# --------------------------------------------------------------------------- slower single-worker paths
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_worker_does_not_leave_a_dead_trial_running_once_enough_trials_finished(tmp_path, corpus, kind):
    """n_trials have finished, but a trial whose worker died still shows RUNNING. A worker that left then
    (as one did before) left it RUNNING for ever once the last worker was gone (CI of stop 31, journal
    storage). It must stay until the heartbeat fails the trial, then run its retry, and only then leave."""
    import optuna
    from optuna.trial import TrialState

    from study.search import run_search
    from study.search.storage import open_storage
    from study.studies.searchspec import SearchSpec

    search = tiny_search(
        n_trials=1,
        sampler={"kind": "random", "seed": 0},
        pruner={"kind": "none"},
        heartbeat_interval=1,
        grace_period=2,
        params={"masking.rate": [0.15, 0.3]},
    )
    spec = write_spec(tmp_path / "dead.yaml", corpus, search)
    url = _storages(tmp_path, kind)
    layout = Layout(root=tmp_path / "results")
    first = run_search(spec, storage=url, layout=layout, quiet=True).get_trials()
    assert [t.state for t in first] == [TrialState.COMPLETE]  # n_trials=1: enough have finished
    rate = 0.3 if first[0].params["masking.rate"] == 0.15 else 0.15
    store = open_storage(url, SearchSpec.model_validate(search), tmp_path)
    ost = optuna.load_study(study_name=load_study(spec).name, storage=store)
    ost.enqueue_trial({"masking.rate": rate})
    dead = ost.ask()  # a worker took it ...
    store.record_heartbeat(dead._trial_id)  # ... beat once, and died
    trials = run_search(spec, storage=url, layout=layout, quiet=True).get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], _trial_table(
        trials
    )
    assert trials[dead.number].state == TrialState.FAIL, _trial_table(trials)  # failed by heartbeat
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == dead.number]
    assert retry.state == TrialState.COMPLETE and retry.params == {"masking.rate": rate}


@pytest.mark.slow
def test_wilcoxon_prunes_across_seeds(tmp_path, corpus, results):
    """One value per pre-training seed; a trial worse than the best on every seed so far is cut before
    its last seed (2 seeds worse: one-sided exact p = 0.25 < 0.5)."""
    from optuna.trial import TrialState

    from study.search import run_search

    search = tiny_search(
        n_trials=3,
        seeds=[0, 1, 2],
        sampler={"kind": "grid", "seed": 3},
        pruner={"kind": "wilcoxon", "n_startup_steps": 2, "p_threshold": 0.5},
        params={"masking.rate": [0.05, 0.3, 0.6]},
    )
    spec = write_spec(tmp_path / "w.yaml", corpus, search, eval_every=0)
    ostudy = run_search(spec, layout=Layout(root=results), quiet=True)
    for t in ostudy.get_trials():
        assert len(t.user_attrs["run_hashes"]) == len(t.intermediate_values)
        if t.state == TrialState.COMPLETE:
            assert sorted(t.intermediate_values) == [0, 1, 2]
            assert t.value == pytest.approx(np.mean(list(t.intermediate_values.values())))
        else:
            assert t.state == TrialState.PRUNED and sorted(t.intermediate_values) == [0, 1]
            best = ostudy.best_trial.intermediate_values
            assert all(t.intermediate_values[k] > best[k] for k in (0, 1))


@pytest.mark.slow
def test_downstream_objective_reads_finetune_results(tmp_path, corpus, results):
    """objective SST-2/finetune/accuracy: fine-tuned per trial, value = mean over fine-tune seeds' files."""
    from study.io import read_json
    from study.search import load_search, run_search
    from study.search.configs import trial_config

    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("dev", 32)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            y = int(rng.integers(2))
            rows.append(f"{'the cat likes a red ball' if y else 'a bird takes the old book'} today .\t{y}")
        (glue / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    spec = write_spec(
        tmp_path / "d.yaml",
        corpus,
        tiny_search(
            n_trials=1,
            objective="SST-2/finetune/accuracy",
            pruner={"kind": "none"},
            params={"masking.rate": [0.2]},
        ),
    )
    doc = yaml.safe_load(spec.read_text())
    doc["defaults"]["finetune"].update({"glue_dir": str(tmp_path / "glue"), "seeds": [0, 1]})
    spec.write_text(yaml.safe_dump(doc))
    t = run_search(spec, layout=Layout(root=results), quiet=True).get_trials()[0]
    study, _ = load_search(spec)
    cfg = trial_config(study, {"masking.rate": 0.2}, 0)
    d = results / "finetune" / cfg.run_hash() / "SST-2" / cfg.finetune_hash()
    accs = [read_json(d / f"finetune-seed{s}.json")["metrics"]["accuracy"] for s in (0, 1)]
    assert t.value == pytest.approx(np.mean(accs)) and t.state.name == "COMPLETE"


# --------------------------------------------------------------------------- many workers (processes)
def _worker(spec: Path, results: Path, storage: str, n_trials: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "study.search",
            "--results",
            str(results),
            "search",
            str(spec),
            "--storage",
            storage,
            "--n-trials",
            str(n_trials),
            "--quiet",
        ],
        cwd=REPO,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def _storages(tmp_path: Path, kind: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/search.db"
    if kind == "journal":
        return f"journal://{tmp_path}/search.log"
    return PG_URL


def _prepare(spec: Path, results: Path) -> None:
    """Data once, before the workers, so they race on trials and not on the tokenizer."""
    from study.data.prepare import prepare_data

    prepare_data(load_study(spec).runs[0].config, Layout(root=results), progress=False)


def _check_complete(trials, n_trials: int, workers: int, why: str = "") -> None:
    from optuna.trial import TrialState

    numbers = [t.number for t in trials]
    assert sorted(numbers) == list(range(len(trials))), why  # each number exactly once
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], why  # none lost
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    # racing workers may each start "the last" trial: at most workers - 1 extra
    assert n_trials <= len(finished) <= n_trials + workers - 1, why


def _trial_table(trials) -> str:
    """One line per trial, for a failing test's report: what ran where, and which trial it retried."""

    def when(d):
        return d.strftime("%H:%M:%S.%f")[:-3] if d else "-"

    return "\n".join(
        f"trial {t.number} {t.state.name} grid {t.system_attrs.get('grid_id')} "
        f"worker {t.user_attrs.get('worker')} start {when(t.datetime_start)} "
        f"end {when(t.datetime_complete)} retry_of {t.system_attrs.get('failed_trial')} "
        f"duplicate_of {t.user_attrs.get('duplicate_of')}"
        for t in trials
    )


STORAGES = ["sqlite", "journal", pytest.param("postgres", marks=needs_pg)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", STORAGES)
def test_three_workers_share_a_study_and_survive_a_killed_worker(tmp_path, corpus, kind):
    """3 worker processes on one storage; one is SIGKILLed mid-trial and restarted. The dead trial is
    failed by heartbeat and re-run once (resuming its checkpoint); every number appears once, none lost.

    Grid sampler: trial k gets grid point k, so no two trials share a run and the retry can't be
    satisfied by someone else's run (TPE's parallel behaviour is covered by the seeding test)."""
    from optuna.trial import TrialState

    results = tmp_path / "results"
    name = f"c{uuid.uuid4().hex[:8]}"
    rates = [0.1, 0.15, 0.2, 0.3, 0.4, 0.5]
    search = tiny_search(
        n_trials=6,
        sampler={"kind": "grid", "seed": 0},
        pruner={"kind": "median", "n_startup_trials": 2},
        heartbeat_interval=2,
        grace_period=6,
        params={"masking.rate": rates},
    )
    spec = write_spec(tmp_path / "c.yaml", corpus, search, name=name, steps=60, eval_every=10)
    _prepare(spec, results)
    url = _storages(tmp_path, kind)
    procs = [_worker(spec, results, url, 6, tmp_path / f"w{i}.log") for i in range(3)]
    victim, deadline = None, time.monotonic() + 300
    while victim is None and time.monotonic() < deadline:
        # a running trial past its first checkpoint and not past half its steps, so the kill lands mid-run
        # (a trial killed after its last checkpoint has nothing left to train: seen in CI on a fast machine)
        for t in load_trials(url, name) if _study_exists(url, name) else []:
            h = t.user_attrs.get("run_hash")
            ckpts = sorted((results / "runs" / h / "checkpoints").glob("step-*.pt")) if h else []
            if t.state == TrialState.RUNNING and ckpts and int(ckpts[-1].stem.split("-")[1]) <= 30:
                victim = t
                break
        time.sleep(0.05)
    assert victim is not None, "no trial reached its first checkpoint"
    pid = int(victim.user_attrs["worker"].rsplit(":", 1)[1])
    os.kill(pid, signal.SIGKILL)
    killed = next(p for p in procs if p.pid == pid)
    killed.wait(timeout=30)
    procs.remove(killed)
    procs.append(_worker(spec, results, url, 6, tmp_path / "restart.log"))  # the worker comes back
    for p in procs:
        assert p.wait(timeout=600) == 0, _logs(tmp_path)
    trials = load_trials(url, name)
    why = f"killed trial {victim.number} (worker {pid})\n{_trial_table(trials)}\n{_logs(tmp_path)}"
    _check_complete(trials, 6, 3, why)
    workers = {t.user_attrs["worker"].rsplit(":", 1)[1] for t in trials if "worker" in t.user_attrs}
    assert len(workers) >= 3, workers  # trials really came from several processes
    assert (
        sorted(
            t.params["masking.rate"] for t in trials if t.state.is_finished() and t.state != TrialState.FAIL
        )
        == rates
    ), why  # each grid point finished exactly once
    dead = trials[victim.number]
    assert dead.state == TrialState.FAIL, why  # failed by heartbeat
    retries = [
        t
        for t in trials
        if t.system_attrs.get("failed_trial") == victim.number and "duplicate_of" not in t.user_attrs
    ]  # (SQLite may re-queue it twice; one stands aside)
    assert len(retries) == 1 and retries[0].state in (TrialState.COMPLETE, TrialState.PRUNED), why
    assert (
        retries[0].params == dead.params
        and retries[0].user_attrs["run_hash"] == victim.user_attrs["run_hash"]
    )
    # it resumed the dead trial's checkpoint instead of starting over, and counts only what it trained
    starts = _starts(results / "runs" / victim.user_attrs["run_hash"])
    assert len(starts) == 2 and starts[1]["resumed"] and starts[1]["tokens"] > 0
    # (>= 0: the run may still reach its end between the check above and the kill)
    assert retries[0].user_attrs["tokens"] == retries[0].user_attrs["tokens_total"] - starts[1]["tokens"] >= 0
    # a duplicate (racing workers on one grid point) stood aside before it named a run; every other trial did
    assert all(("run_hash" in t.user_attrs) != ("duplicate_of" in t.user_attrs) for t in trials)
    # no run was trained by two trials: one session per trial that trained it
    for h in {t.user_attrs["run_hash"] for t in trials if "run_hash" in t.user_attrs}:
        assert len(_starts(results / "runs" / h)) == sum(t.user_attrs.get("run_hash") == h for t in trials)


def _logs(folder: Path) -> str:
    """Every worker's log, so a failing worker says why in the test report."""
    return "\n".join(
        f"--- {f.name}\n{f.read_text()[-4000:]}"
        for f in sorted(folder.glob("*.log"))
        if f.name != "search.log"
    )  # that one is the journal storage


def _starts(run_dir: Path) -> list[dict]:
    """train_run's per-session `start` events (events.jsonl)."""
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == "start"]


def _study_exists(url: str, name: str) -> bool:
    try:
        load_trials(url, name)
        return True
    except Exception:  # noqa: BLE001 - not created yet (or tables not yet there)
        return False
