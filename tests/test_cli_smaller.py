"""Smaller first-hour fixes (issue 46): a help line on every command and flag; `study deselect` removes the
stamps and metrics copies its stage left; `study data --run` shows that run's masking."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from study.cli import build_parser, main

sys.path.insert(0, str(Path(__file__).parent))
from test_pipeline import _two_studies  # noqa: E402 - two small specs that share a run
from test_search import write_corpus, write_spec  # noqa: E402 - a tiny corpus and spec


def test_every_command_and_flag_has_a_help_line():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    missing = [name for name in sub.choices if not helps.get(name)]
    missing += [
        f"{name} {a.option_strings or a.dest}"
        for name, sp in sub.choices.items()
        for a in sp._actions
        if a.dest != "help" and not a.help
    ]
    assert not missing, missing


def test_deselect_removes_its_stamps_and_metrics_copies(tmp_path: Path, capsys):
    abl, out = _two_studies(tmp_path)
    args = ["--ablations", str(abl), "--out", str(out)]
    assert main(["sync", *args]) == 0
    left = [tmp_path / "results" / "metrics" / f"study-{n}.json" for n in "ab"]
    left += [tmp_path / "results" / "plots" / f"study-{n}.csv" for n in "ab"]
    left += [tmp_path / "pipeline" / f"study-{n}.json" for n in "ab"]  # the stages' stamps
    for p in left:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
    assert main(["deselect", "a", *args]) == 0
    assert "removed" in capsys.readouterr().out
    assert [p.exists() for p in left] == [False, True] * 3  # a's gone, b's stay
    assert (tmp_path / "pipeline" / "code-study.json").exists()  # a stamp b still reads


def test_data_shows_the_named_runs_masking(tmp_path: Path, capsys):
    spec = write_spec(tmp_path / "s.yaml", write_corpus(tmp_path / "corpus", n_docs=40))
    spec.write_text(spec.read_text() + "factors:\n  masking.unit: [token, whole_word]\n")
    results = ["--results", str(tmp_path / "results")]
    assert (
        main([*results, "data", str(spec), "--run", "masking.unit=whole_word", "--samples", "1", "--quiet"])
        == 0
    )
    out = capsys.readouterr().out
    assert "masking.unit=whole_word" in out and "'unit': 'whole_word'" in out
    assert main([*results, "data", str(spec), "--run", "nope"]) == 2
