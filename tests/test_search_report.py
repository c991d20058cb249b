"""`study report SPEC` on a search spec renders the search (issue 46, "search in the open"): no hand-run
aggregate, the trials table (value, state, parameters, runs, the plateau guard per trial), the best
parameters, the importance and history figures, and a headline naming the best trial and whether it
learned (before: exit 2 without an aggregate, and with one "No answer yet: 0 of 1 runs finished")."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

from study.paths import Layout
from study.rundir import RunDir

sys.path.insert(0, str(Path(__file__).parent))
from test_search import tiny_search, write_corpus, write_spec  # noqa: E402 - the search tests' tiny spec


def _train(cfg, layout, quiet, on_eval):
    """A finished run in no time: value = its mask rate (minimized); [MASK] accuracy 3.7% (below the 4.1%
    floor over 2,000 positions: did not learn) at rate 0.15, 30% (learned) otherwise."""
    run = RunDir(layout, cfg.run_hash())
    run.write_metrics(
        {
            "ref_mlm_loss": cfg.masking.rate,
            "tokens_seen": 64,
            "ref_mask_acc": 0.037 if cfg.masking.rate < 0.2 else 0.30,
            "ref_mask_mode_acc": 0.041,
            "ref_mask_count": 2000,
        }
    )
    run.write_status("done")


def test_study_report_renders_the_search_with_its_guard(tmp_path: Path, capsys):
    from study.cli import main
    from study.search import run_search

    search = tiny_search(
        n_trials=4,
        sampler={"kind": "grid", "seed": 0},
        pruner={"kind": "none"},
        params={"masking.rate": [0.15, 0.3], "masking.split.mask": [0.6, 0.9]},
    )
    spec = write_spec(tmp_path / "s.yaml", write_corpus(tmp_path / "corpus"), search, name="tiny")
    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    ostudy = run_search(spec, layout=layout, quiet=True, train_fn=_train)
    trials = ostudy.get_trials()
    best = min(trials, key=lambda t: t.value)
    assert best.params["masking.rate"] == 0.15 and len(trials) == 4
    capsys.readouterr()
    # no `study aggregate` by hand
    roots = ["--results", str(layout.root), "--reports", str(layout.reports)]
    assert main([*roots, "report", str(spec), "--quiet"]) == 0
    meta = json.loads((layout.reports / "tiny" / "report.json").read_text())
    assert meta["answer"].startswith(f"Search: the best of 4 complete trials is #{best.number} (value 0.15")
    assert "it did NOT learn" in meta["answer"] and "No answer yet" not in meta["answer"]
    assert {"search_trials", "search_importance"} <= set(meta["figures"])
    page = html.unescape((layout.reports / "tiny" / "index.html").read_text())
    section = page[page.index('id="search"') : page.index('id="problems"')]
    assert f"Best: trial {best.number}," in section and "masking.rate=0.15" in section
    assert 'id="search-guard"' in section and best.user_attrs["run_hash"] in section
    rows = re.findall(r"<tr[^>]*><td>(?:<b>)?(\d+)(?:</b>)?</td>(.*?)</tr>", section)
    assert len(rows) == 4
    for number, cells in rows:  # the guard per trial: only the rate-0.15 trials stayed on the plateau
        t = trials[int(number)]
        assert t.user_attrs["run_hash"] in cells and f"{t.value:.4g}" in cells
        assert cells.endswith("<td>no</td>" if t.params["masking.rate"] == 0.15 else "<td>yes</td>")
    # the importance is optuna's fANOVA over the table: the value is the rate alone
    figure = page[page.index('id="fig-search_importance"') :]
    caption = figure[figure.index("<figcaption") : figure.index("</figcaption>")]
    share = dict(re.findall(r"(masking\.[\w.]+) (\d\.\d\d)", caption))
    assert float(share["masking.rate"]) > 0.9 > float(share["masking.split.mask"]) + 0.8, share


def test_the_headline_says_when_the_best_trial_learned():
    import pandas as pd

    from study.report.searchreport import search_answer, search_summary

    trials = pd.DataFrame(
        {
            "number": [0, 1],
            "state": ["COMPLETE", "FAIL"],
            "value": [2.5, None],
            "params_masking.rate": [0.3, 0.4],
            "learned": [True, None],
        }
    )
    none = {"text": "No answer yet: 0 of 1 runs finished", "kind": "none"}
    ans = search_answer(none, search_summary(trials))
    assert ans["kind"] == "search" and "No answer yet" not in ans["text"]
    assert "#0 (value 2.5, minimized) with masking.rate=0.3; it learned past" in ans["text"]
    # a study with its own answer keeps it, after the search's sentence
    own = {"text": "whole_word minus token: +1.0 pp.", "kind": "paired"}
    assert search_answer(own, search_summary(trials))["text"].endswith(own["text"])
