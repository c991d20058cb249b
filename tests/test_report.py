"""The HTML report: rendered from fixture aggregates, checked as text and in headless Chromium.

What each test proves is in its docstring. Fixtures (tests/report_fixtures.py) plant known effects
in fake run folders and go through the real `aggregate_study`, so the report is tested on exactly
the files it will meet in a real study.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report_fixtures as rf

from study.config import RunConfig
from study.errors import StudyError
from study.paths import Layout
from study.report import references as R
from study.report.levelnames import REPLACEMENT_KEYS
from study.report.prose import answer_sentence, recipe_sentence
from study.report.provenance import provenance_section
from study.report.render import render_index, render_report, search_summary
from study.report.studyfiles import StudyFiles, load_study_dir
from study.studies.spec import load_study

REPO = Path(__file__).resolve().parents[1]
KINDS = ("nsp", "mask_rate", "depth", "replacement")


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


_CACHE: dict = {}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Build + aggregate + render each fixture study once per module (tests only read the results)."""

    def get(kind: str, **kw) -> tuple[Path, str, Path]:
        key = (kind, tuple(sorted(kw.items())))
        if key not in _CACHE:
            root = tmp_path_factory.mktemp(f"{kind}-study")
            layout, plan, study_dir = rf.build(root, kind, **kw)
            out = render_report(study_dir, layout.report_dir(plan["name"]))
            _CACHE[key] = (out, out.read_text(encoding="utf-8"), study_dir)
        return _CACHE[key]

    return get


# --------------------------------------------------------------------------- paper references
def test_every_reference_file_has_schema_and_provenance():
    """Each paper table loads through the strict schema and names paper, arXiv id, table, scale, verification."""
    ids = R.available()
    assert {
        "bert_table5",
        "bert_table6",
        "bert_table8",
        "roberta_table1",
        "roberta_table2",
        "albert_table5",
        "wettig_masking",
    } <= set(ids)
    for i in ids:
        raw = yaml.safe_load((R.REFERENCE_DIR / f"{i}.yaml").read_text())
        for key in ("paper", "arxiv", "table", "caption", "columns_mean", "scale", "verification", "rows"):
            assert raw.get(key) not in (None, ""), (i, key)
        ref = R.load_reference(i)
        assert ref.scale.provenance and ref.verification.how
        assert all(isinstance(r.verified, bool) for r in ref.rows)
        assert all(v is None or 0 < v < 1000 for r in ref.rows for v in r.values.values())


def test_reference_numbers_that_were_checked():
    """Spot values checked against the papers, including the one the issue recalled wrongly (ALBERT NSP RACE)."""
    t5 = {r.label: r.values for r in R.load_reference("bert_table5").rows}
    assert t5["No NSP"]["QNLI"] == 84.9 and t5["BERT-base"]["SQuAD v1.1 F1"] == 88.5
    t6 = {r.label: r.values for r in R.load_reference("bert_table6").rows}
    assert t6["L=3 H=768 A=12"]["LM (ppl)"] == 5.84
    t8 = {r.label: r.values for r in R.load_reference("bert_table8").rows}
    assert t8["0/0/100"] == {"MNLI fine-tune": 83.6, "NER fine-tune": 94.9, "NER feature-based": 94.6}
    albert = {r.label: r.values for r in R.load_reference("albert_table5").rows}
    assert albert["NSP"]["RACE"] == 62.3 and albert["None"]["RACE"] == 61.7
    wet = R.load_reference("wettig_masking")
    assert wet.verification.verified == "partial" and wet.scale.verified is False


def test_bad_reference_file_and_unknown_id_raise_study_error(tmp_path):
    """A malformed table names the offending field; an unknown id in a spec lists the allowed ids."""
    bad = yaml.safe_load((R.REFERENCE_DIR / "bert_table5.yaml").read_text())
    bad["rows"][0]["values"]["NotAColumn"] = 1.0
    (tmp_path / "bert_table5.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(StudyError, match="unknown columns"):
        R.load_reference("bert_table5", directory=tmp_path)
    del bad["arxiv"]
    (tmp_path / "bert_table5.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(StudyError) as e:
        R.load_reference("bert_table5", directory=tmp_path)
    assert e.value.field == "arxiv"
    with pytest.raises(StudyError) as e:
        R.for_study("nsp", ["bert_table55"])
    assert e.value.field == "report.references" and "bert_table5" in e.value.allowed


def test_level_matching_and_direction_verdicts():
    """Rows are matched on our factor keys (one signature when possible, confounders named otherwise),
    and the verdict separates agree / disagree / within noise / not measured."""
    t6 = R.load_reference("bert_table6")
    levels = [{"model.layers": 3}, {"model.layers": 6}, {"model.layers": 12}]
    matched, conf = R.match_levels(t6, levels)
    assert [matched[i].label for i in range(3)] == [
        "L=3 H=768 A=12",
        "L=6 H=768 A=12",
        "L=12 H=768 A=12 (BERT-base)",
    ]
    assert conf == []
    _, conf = R.match_levels(
        R.load_reference("roberta_table2"), [{"objective.sentence": "nsp"}, {"objective.sentence": "none"}]
    )
    assert conf == ["objective.format"]
    t5 = R.load_reference("bert_table5")
    lv = [{"objective.sentence": "nsp"}, {"objective.sentence": "none"}]
    key = ("diff", 0, 1, "SST-2", "finetune", "accuracy")
    mk = lambda d, noise: {key: {"diff": d, "ci_low": d - 0.01, "ci_high": d + 0.01, "noise": noise}}
    verdict = lambda ours: {
        r["column"]: r["verdict"] for r in R.paper_vs_ours(t5, lv, ours, pairs=[(0, 1)])["rows"]
    }
    assert verdict(mk(-0.02, False))["SST-2"] == "agrees"  # paper: No NSP 92.6 < 92.7
    assert verdict(mk(+0.02, False))["SST-2"] == "disagrees"
    assert verdict(mk(-0.02, True))["SST-2"].startswith("ours is within seed noise (point estimate agrees")
    assert verdict(mk(-0.02, False))["QNLI"] == "not measured here"
    # Unpaired levels: separated CIs give a direction; overlapping ones are no verdict (not a test), not "noise"
    ours = {
        (0, "pretrain", "pretrain", "ref_ppl"): {"mean": 6.0, "ci_low": 5.9, "ci_high": 6.1},
        (2, "pretrain", "pretrain", "ref_ppl"): {"mean": 4.0, "ci_low": 3.9, "ci_high": 4.1},
    }
    rows = R.paper_vs_ours(t6, levels, ours)["rows"]
    assert {r["verdict"] for r in rows if r["column"] == "LM (ppl)" and r["b"] == "model.layers=12"} == {
        "agrees"
    }
    ours[(2, "pretrain", "pretrain", "ref_ppl")] = {"mean": 5.8, "ci_low": 5.0, "ci_high": 6.6}
    rows = R.paper_vs_ours(t6, levels, ours)["rows"]
    assert {r["verdict"] for r in rows if r["column"] == "LM (ppl)" and r["b"] == "model.layers=12"} == {
        "not resolved: the per-level CIs overlap, no paired test (point estimate agrees)"
    }


def test_trend_when_levels_are_not_in_the_table():
    """Layers 1/2/4 are not BERT Table 6 rows: the lowest-to-highest trend is compared instead, within one
    signature (H=768, A=12), and labelled as a trend."""
    t6 = R.load_reference("bert_table6")
    levels = [{"model.layers": 1}, {"model.layers": 4}, {"model.layers": 2}]
    ours = {
        (0, "pretrain", "pretrain", "ref_ppl"): {"mean": 9.0, "ci_low": 8.8, "ci_high": 9.2},
        (1, "pretrain", "pretrain", "ref_ppl"): {"mean": 9.5, "ci_low": 9.3, "ci_high": 9.7},
    }
    out = R.paper_vs_ours(t6, levels, ours)
    assert out["trend"] and "1 → 4" in out["trend"] and "L=12 H=768 A=12" in out["trend"]
    row = next(r for r in out["rows"] if r["column"] == "LM (ppl)")
    assert row["paper_diff"] == pytest.approx(3.99 - 5.84) and row["verdict"] == "disagrees"
    assert R.trend_pair(t6, [{"model.layers": 2}, {"model.layers": 2}]) is None


def test_trend_comparison_names_no_confounder_its_rows_share():
    """Layer 6 matches two Table 6 rows (A=3, A=12), so the level match is mixed and falls back to the
    trend L=3 -> L=12 (both H=768 A=12): those rows differ only in layers, so nothing is confounded."""
    t6 = R.load_reference("bert_table6")
    out = R.paper_vs_ours(t6, [{"model.layers": 2}, {"model.layers": 6}, {"model.layers": 8}], {})
    assert out["trend"] and out["confounders"] == []
    _, conf = R.match_levels(t6, [{"model.layers": 3}, {"model.layers": 24}])  # H and A both change
    assert conf == ["model.heads", "model.hidden"]


def test_unknown_reference_in_plan_fails_before_writing(tmp_path):
    layout, plan, study_dir = rf.build(tmp_path, "nsp", seeds=(0,), failures=False)
    st = json.loads((study_dir / "study.json").read_text())
    st["plan"]["references"] = ["bert_tabel5"]
    (study_dir / "study.json").write_text(json.dumps(st))
    with pytest.raises(StudyError) as e:
        render_report(study_dir, tmp_path / "out")
    assert e.value.field == "report.references" and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- rendering
@pytest.mark.parametrize("kind", KINDS)
def test_report_renders_each_kind_self_contained(rendered, kind):
    """One HTML file per kind with the question, a one-sentence answer, tables, the kind's figure and the
    training curves embedded as data: URIs (PNG+SVG also on disk), no external resource, a CSP."""
    out, html, study_dir = rendered(kind, evil=(kind == "nsp"))
    assert out.name == "index.html"
    figs = out.parent / "figures"
    kind_fig = {
        "nsp": "paired_differences",
        "mask_rate": "mask_rate",
        "depth": "depth",
        "replacement": "replacement",
    }[kind]
    for name in (kind_fig, "training_curves"):
        assert (figs / f"{name}.png").stat().st_size > 1000 and (figs / f"{name}.svg").exists()
    srcs = re.findall(r'<img[^>]* src="([^"]+)"', html)
    assert len(srcs) >= 2 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r'(src|href)="(https?:)?//', html) and "<link" not in html
    assert "Content-Security-Policy" in html and "default-src &#39;none&#39;" in html
    assert f"Fixture question for {kind}?" in html
    for section in ("summary", "comparisons", "figures", "papers", "baseline", "problems", "provenance"):
        assert f'id="{section}"' in html
    assert "abc123def" in html and "data123" in html and "torch=2.13.0" in html  # provenance
    assert "RuntimeError: out of memory" in html and "diverged" in html  # failed runs shown
    report = json.loads((out.parent / "report.json").read_text())
    # the depth fixture has a run on the plateau: its answer is the floor guard's, without an interval
    assert report["answer"] and (
        "95% CI" in report["answer"]
        if kind != "depth"
        else report["answer"].startswith("not trained past the plateau")
    )


def test_answer_sentence_states_the_paired_difference_with_ci(rendered):
    """The headline equals comparisons.csv for the primary metric, in points, with CI, n and the verdict."""
    _, html, study_dir = rendered("nsp", evil=True)
    c = pd.read_csv(study_dir / "comparisons.csv")
    row = c[(c["task"] == "SST-2") & (c["mode"] == "finetune") & (c["metric"] == "accuracy")].iloc[0]
    answer = re.search(r'id="answer">([^<]+)<', html).group(1)
    assert answer.startswith("none minus nsp (objective.sentence) on SST-2 finetune accuracy: ")
    assert f"{100 * row['diff']:+.1f} pp" in answer
    assert f"[{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}]" in answer and "n=3 seeds" in answer
    assert answer.rstrip(".").endswith("none higher than nsp beyond seed noise")
    # The planted effect (none > nsp on SST-2) contradicts BERT Table 5, and the report says so.
    assert re.search(r"SST-2 finetune accuracy</td>.*?disagrees", html, re.S)


def test_label_compared_study_matches_papers_row_by_row(rendered):
    """A spec with explicit runs compared by label (as ablations/nsp.yaml): the answer names the labels,
    BERT Table 5 gets the paired difference, RoBERTa Table 2 its exact format rows, and ALBERT's
    None/SOP rows are matched to the runs that differ from segment_pair+nsp in the sentence task only."""
    out, html, _ = rendered("nsp_labels", failures=False)
    answer = re.search(r'id="answer">([^<]+)<', html).group(1)
    assert re.match(
        r"segment_pair minus segment_pair\+nsp \(label\) on SST-2 finetune accuracy: \+\d\.\d pp, 95% CI",
        answer,
    )
    sections = html.split("<h3>")
    bert = next(x for x in sections if "arXiv:1810.04805, Table 5" in x)
    assert "ours <code>segment_pair+nsp</code> ↔ paper “BERT-base”" in bert
    assert "paired by seed" not in bert and re.search(r"SST-2 finetune accuracy</td>.*?\[\+", bert, re.S)
    roberta = next(x for x in sections if "arXiv:1907.11692, Table 2" in x)
    assert "SEGMENT-PAIR (+NSP) 92.9 → DOC-SENTENCES 92.7" in roberta and "SENTENCE-PAIR (+NSP)" in roberta
    albert = next(x for x in sections if "arXiv:1909.11942" in x)
    pairs = set(re.findall(r"<td>(NSP [\d.]+ → \w+) ", albert))
    assert {p.split(" → ")[1] for p in pairs} == {"None", "SOP"}
    assert "doc_sentences" not in albert.split("Matched levels")[1].split("</table>")[0].split("<table>")[1]


def test_collapsed_runs_are_flagged_at_the_top_and_listed(rendered):
    """A finished run no better than always predicting the most frequent token (the depth cpu study's deep
    models at lr 2e-3) is flagged in runs.csv, warned about under the answer and listed with its floor;
    healthy studies carry no warning."""
    out, html, study_dir = rendered("depth")
    runs = pd.read_csv(study_dir / "runs.csv")
    done = runs[runs["status"] == "done"]
    assert done.set_index("run_hash")["learned"].to_dict() == {h: h != "L4s2" for h in done["run_hash"]}
    assert runs[runs["status"] != "done"]["learned"].isna().all()
    warning = re.search(r'id="collapse-warning">([^<]+)<', html).group(1)
    assert warning.startswith(f"Warning: 1 of {len(runs)} runs (model.layers=4) score no better")
    problems = html.split('id="problems"')[1].split("<h2")[0]
    assert re.search(
        r"L4s2</td><td class=\"num\">5\.1%</td><td class=\"num\">5\.0%</td><td class=\"num bad\">-</td>",
        problems,
    )  # a fixture run from before ref_mask_acc: the old test, and no [MASK] score
    assert json.loads((out.parent / "report.json").read_text())["warning"] == warning.replace("&#39;", "'")
    metrics = json.loads(
        (study_dir.parents[1] / "metrics" / "study-fixture-depth.json").read_text()
    )  # dvc metrics
    assert metrics["runs"]["not_beyond_mode"] == 1
    for kind in ("nsp", "replacement"):
        assert 'id="collapse-warning"' not in rendered(kind, **({"evil": True} if kind == "nsp" else {}))[1]


def test_a_run_beats_the_mode_floor_only_beyond_three_standard_errors():
    from study.report.collect import learned_beyond_mode

    se = (0.05 * 0.95 / 10_000) ** 0.5
    assert learned_beyond_mode(0.05 + 3.1 * se, 0.05, 10_000) is True
    assert learned_beyond_mode(0.05 + 2.9 * se, 0.05, 10_000) is False
    assert learned_beyond_mode(0.04, 0.05, 10_000) is False
    assert learned_beyond_mode(0.3, None, 10_000) is None  # a run from before the floor was recorded
    assert learned_beyond_mode(float("nan"), 0.05, 10_000) is None


def test_answer_without_compare_names_best_level_and_overlap(rendered):
    """Multi-level studies without a `compare` answer with the best level, its CI, and which other levels'
    CIs overlap it, and say that overlap is no test: no "noise" verdict comes from separate intervals (two
    levels whose intervals overlap can still differ beyond seed noise when paired by seed)."""
    _, html, _ = rendered("replacement")
    answer = re.search(r'id="answer">([^<]+)<', html).group(1)
    assert "80/10/10" in answer and "95% CI" in answer and "overlaps" in answer
    assert "not a test" in answer and "noise" not in answer


def _answer_of(interpretation: str, gains: list[tuple[float, float]], task: str = "SST-2", **answer) -> str:
    """The answer sentence of a two-level study compared on `task` accuracy, from tables written by hand:
    a paired difference of +0.2 pp read as `interpretation`, MDE 5.9 pp, and one random-init row per
    level with (gain, lower CI bound)."""
    mode = "finetune" if task != "pretrain" else "pretrain"
    metric = "accuracy" if task != "pretrain" else "ref_mlm_acc"
    ans = {
        "a": "x",
        "b": "y",
        "diff": 0.002,
        "ci_low": -0.043,
        "ci_high": 0.047,
        "n": 3,
        "mde": 0.059,
        "interpretation": interpretation,
        "mean_a": 0.61,
        **answer,
    }
    plan = {
        "name": "t",
        "runs": [],
        "primary_metric": f"{task}/{mode}/{metric}" if task != "pretrain" else metric,
        "compare": {"factor": "f", "a": "x", "b": "y"},
    }
    baseline = pd.DataFrame(
        [
            {"task": task, "mode": mode, "metric": metric, "f": lv, "diff": g, "ci_low": lo}
            for lv, (g, lo) in zip("xy", gains, strict=False)  # gains may cover only "x"
        ]
    )
    sf = StudyFiles(
        Path("."),
        {"plan": plan, "answer": ans},
        pd.DataFrame(),
        pd.DataFrame(),
        baseline,
        pd.DataFrame(),
        pd.DataFrame(),
        factor_keys=["f"],
    )
    return answer_sentence(sf)["text"]


def test_a_null_answer_says_how_large_a_difference_could_hide_and_whether_pretraining_shows():
    """ "No difference seen" is given with the smallest difference the study could detect; and where no
    pre-trained level beats random init on the answer's task, the answer says the task may not see
    pre-training at all. Neither clause appears where it does not apply."""
    noise = _answer_of("indistinguishable from noise at n=3 seeds", [(-0.031, -0.06), (0.005, -0.02)])
    assert noise.startswith(
        "y minus x (f) on SST-2 finetune accuracy: +0.2 pp, 95% CI [-4.3, +4.7], n=3 seeds: "
        "indistinguishable from noise; it could detect only differences of ≥ 5.9 pp"
    )
    assert (
        "no pre-trained level beats random init on it beyond seed noise (gains -3.1 pp to +0.5 pp, see What pre-training bought)"
        in noise
    )
    beyond = _answer_of("y higher than x beyond seed noise at n=3 seeds", [(0.08, 0.03), (0.09, 0.04)])
    assert "could detect" not in beyond and "random init" not in beyond
    # one level beating random init is enough for the downstream task to see pre-training
    assert "random init" not in _answer_of("indistinguishable from noise", [(-0.01, -0.03), (0.04, 0.01)])
    # the same difference in every seed: no test, so neither an interval nor a direction
    same = _answer_of(
        "the same difference in every seed (n=3): no test of seed noise",
        [(0.08, 0.03)],
        ci_low=float("nan"),
        ci_high=float("nan"),
    )
    assert (
        same.endswith(
            "+0.2 pp, n=3 seeds: the same difference in every seed (n=3): no test of seed noise; "
            "no direction is claimed."
        )
        and "CI" not in same
    )
    # a pre-training metric has no random-init comparison to make
    assert "random init" not in _answer_of("indistinguishable from noise", [(-0.01, -0.03)], task="pretrain")


def test_the_answer_gives_the_other_downstream_mode_too(rendered):
    """A probe answer is followed by the same comparison fine-tuned (and the reverse), from the
    comparisons table: a question about both modes is not answered by one of them."""
    _, html, study_dir = rendered("nsp")
    answer = re.search(r'id="answer">([^<]+)<', html).group(1)
    c = pd.read_csv(study_dir / "comparisons.csv")
    probe = c[(c["task"] == "SST-2") & (c["mode"] == "probe") & (c["metric"] == "accuracy")].iloc[0]
    assert answer.startswith("none minus nsp (objective.sentence) on SST-2 finetune accuracy: ")
    assert f". On SST-2 probe accuracy: {100 * probe['diff']:+.1f} pp, CI [" in answer, answer
    assert answer.count("On SST-2") == 1  # MRPC's rows stay in the table


def _table_cells(html: str, section: str) -> list[list[str]]:
    """The <td> texts of each body row of a report section's table."""
    part = html.split(f'id="{section}"')[1].split("<h2")[0]
    rows = [
        re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in re.findall(r"<tr[^>]*>(.*?)</tr>", part, re.S)
    ]
    return [r for r in rows if r]


def test_an_interval_not_at_95_percent_says_its_level(rendered):
    """docs/STATISTICS.md: a Holm row's interval is drawn at its Holm level (ci_level), and the report prints
    the level next to any interval that is not 95%: in the comparisons table, the random-init baseline table
    and the answer's secondary sentence. A 95% interval (the primary row, cost rows) has no level beside it."""
    _, html, study_dir = rendered("nsp")
    c = pd.read_csv(study_dir / "comparisons.csv")
    holm = c[c["correction"].str.startswith("Holm")]
    assert len(holm) >= 2 and (holm["ci_level"] > 0.95).all() and holm["ci_level"].round(6).nunique() >= 2
    cells = {tuple(td[:3]): td[8] for td in _table_cells(html, "comparisons")}  # task, mode, metric -> CI
    assert len(cells) == len(c)
    for r in c.itertuples():
        ci = cells[(r.task, r.mode, r.metric)]
        if r.correction.startswith("Holm"):
            assert ci.endswith(f"] at {100 * r.ci_level:.4g}%"), (r.metric, r.ci_level, ci)
        else:
            assert r.ci_level == 0.95 and " at " not in ci, (r.metric, ci)
    assert any(ci.endswith(" at 99.17%") for ci in cells.values()), (
        cells
    )  # 0.991667: a level Holm's rank gives
    # the random-init baseline table (Holm across that table): one level per interval not at 95%
    b = pd.read_csv(study_dir / "baseline.csv")
    shown = [re.search(r" at ([\d.]+)%$", td[7]) for td in _table_cells(html, "baseline")]
    assert len(shown) == len(b) and (b["ci_level"] != 0.95).sum() >= 2
    assert sorted(m.group(1) for m in shown if m) == sorted(
        f"{100 * v:.4g}" for v in b["ci_level"] if v != 0.95
    )
    # the answer: the primary at 95% ("95% CI", no level after it), the secondary probe row at its Holm level
    answer = re.search(r'id="answer">([^<]+)<', html).group(1)
    probe = holm[(holm["task"] == "SST-2") & (holm["mode"] == "probe") & (holm["metric"] == "accuracy")].iloc[
        0
    ]
    assert (
        f"CI [{100 * probe.ci_low:+.1f}, {100 * probe.ci_high:+.1f}] at {100 * probe.ci_level:.4g}%:"
        in answer
    )
    assert re.search(r"95% CI \[[^\]]+\], n=3", answer), answer


def test_git_archive_commit_reads_dirty_state_unknown_and_fine_tune_commits_are_listed():
    """A `git archive` copy records dirty: null; printed bare, the commit would read as clean. The
    fine-tune results' commits join the list (fine-tuning may have run on other code)."""
    git = {"commit": "abc", "dirty": None, "source": "git archive"}
    sf = StudyFiles(
        Path("."),
        {
            "plan": {"name": "t"},
            "provenance": {"a": {"provenance": {"git": git}}},
            "finetune_provenance": {
                "a/SST-2/finetune/0": {"commit": "def", "dirty": True},
                "a/SST-2/finetune/1": git,
            },
        },
        *(pd.DataFrame(),) * 5,
    )
    assert provenance_section(sf)["commits"] == {
        "abc (dirty state unknown: git archive)": "1 pre-training run(s), 1 fine-tune result(s)",
        "def (dirty)": "1 fine-tune result(s)",
    }


def test_runs_table_shows_each_runs_precision_and_finish_date(tmp_path):
    """meta.json's precision and finish date reach the Provenance section's Runs table."""
    from study.report.aggregate import aggregate_study

    layout, plan, study_dir = rf.build(tmp_path, "nsp", seeds=(0,), failures=False)
    h = plan["runs"][0]["run_hash"]
    meta = layout.run_dir(h) / "meta.json"
    meta.write_text(
        json.dumps(
            {**json.loads(meta.read_text()), "precision": "bf16", "finished": "2026-01-02T03:04:05+00:00"}
        )
    )
    aggregate_study(plan, layout)
    html = render_report(study_dir, tmp_path / "out").read_text()
    assert '<th scope="col">precision</th><th scope="col">finished</th>' in html
    assert re.search(rf"{h}</td>.*?<td>bf16</td><td>2026-01-02T03:04:05\+00:00</td>", html, re.S)


def test_runs_without_a_commit_are_a_provenance_warning(rendered):
    """A run that recorded no commit cannot be traced to code: the report says so in red, not as a
    quiet "unknown" line; runs that all recorded one get no warning."""
    prov = {h: {"provenance": {"git": {"commit": c, "dirty": False}}} for h, c in (("a", "abc"), ("b", None))}
    sf = StudyFiles(Path("."), {"plan": {"name": "t"}, "provenance": prov}, *(pd.DataFrame(),) * 5)
    assert provenance_section(sf)["uncommitted"].startswith("1 of 2 runs record no code commit")
    sf.study["provenance"]["b"]["provenance"]["git"]["commit"] = "abd"
    assert provenance_section(sf)["uncommitted"] is None
    _, html, _ = rendered("nsp")  # the fixtures' runs record a commit
    assert 'id="provenance-warning"' not in html and 'id="glossary"' in html


def test_labels_and_errors_are_escaped(rendered):
    """A study question, run label and error containing <script> and quotes come out as text, not markup."""
    out, html, _ = rendered("nsp", evil=True)
    assert "<script" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    index = render_index(out.parent.parent)
    assert "<script" not in index.read_text()


def test_degrades_gracefully_without_finished_runs(tmp_path):
    """All runs failed: the report still renders, says there is no answer yet, and skips figures with a note."""
    layout, plan, _ = rf.build(tmp_path, "mask_rate")
    for r in plan["runs"]:
        (layout.run_dir(r["run_hash"]) / "status.json").write_text(
            json.dumps({"status": "failed", "error": "ValueError: boom", "step": 3})
        )
        (layout.run_dir(r["run_hash"]) / "history.jsonl").write_text("")
    from study.report.aggregate import aggregate_study

    study_dir = aggregate_study(plan, layout)
    html = render_report(study_dir, tmp_path / "out").read_text()
    assert "No answer yet: 0 of" in html
    assert "skipped: no training curves yet" in html and "skipped:" in html
    assert html.count("ValueError: boom") == len(plan["runs"])


def test_single_seed_has_no_ci_and_says_so(rendered):
    """With one seed per level there is no CI; the report prints that instead of a fake interval."""
    _, html, _ = rendered("nsp", seeds=(0,), failures=False)
    assert "too few seeds for an interval" in html and "no interval (n&lt;3)" in html


def test_two_seeds_give_no_interval_and_no_direction(rendered):
    """n=2 (the smoke study): no interval, no test, no direction in the headline, whatever the point
    estimate; the MDE sentence says there is none at this n."""
    _, html, study_dir = rendered("nsp", seeds=(0, 1), failures=False)
    answer = re.search(r'id="answer">([^<]+)<', html).group(1)
    assert answer == (
        "none minus nsp (objective.sentence) on SST-2 finetune accuracy: n=2: too few seeds for an "
        "interval (3 needed), so no direction is claimed."
    )
    assert "higher" not in answer and "lower" not in answer and "CI" not in answer
    c = pd.read_csv(study_dir / "comparisons.csv")
    assert c["p_value"].isna().all() and c["ci_low"].isna().all()
    assert (c["interpretation"] == "n=2: too few seeds for an interval").all()
    methods = re.search(r'id="methods">([^<]+)<', html).group(1)
    assert "With n=2 seeds the primary comparison has no minimum detectable effect" in methods


def test_methods_sentence_states_rule_correction_threshold_and_mde(rendered):
    """One methods sentence: the one rule, Holm over the secondary comparisons, the bootstrap threshold,
    and the MDE from the primary comparison's measured SD; the primary row is marked in the table."""
    _, html, study_dir = rendered("nsp", evil=True)
    methods = re.search(r'id="methods">([^<]+)<', html).group(1).replace("&lt;", "<").replace("&#39;", "'")
    st = json.loads((study_dir / "study.json").read_text())["statistics"]
    pr = st["primary"]
    assert "interval excludes 0, which is exactly when its two-sided t-test gives p < 0.05" in methods
    assert (
        f"the other {st['family']} paired comparisons (cost metrics excluded) are Holm-corrected" in methods
    )
    assert f"only from n={st['bootstrap_min_n']}" in methods and st["bootstrap_min_n"] == 50
    assert (
        f"With n=3 seeds and SD {100 * pr['sd_diff']:.1f} pp of the paired differences, this study could "
        f"detect differences of ≥ {100 * pr['mde']:.1f} pp at 80% power"
    ) in methods
    comp = html.split('id="comparisons"')[1].split("<h2")[0]
    primary_rows = re.findall(r'<tr class="primary"><td>([^<]+)</td><td>([^<]+)</td><td>([^<]+)</td>', comp)
    assert primary_rows == [("SST-2", "finetune", "accuracy")] and "none (primary)" in comp
    assert f"Holm over {st['family']}" in comp


def test_methods_say_other_comparisons_could_not_be_tested_at_n2():
    """With n=2 there is no Holm family, but the table lists further rows: the sentence must not say
    there are none."""
    from study.report.prose import methods_sentence

    st = {"alpha": 0.05, "min_n": 3, "bootstrap_min_n": 50, "power": 0.8, "family": 0, "primary": None}
    comps = pd.DataFrame(
        {"metric": ["accuracy", "ref_ppl", "tokens_per_s"], "primary": [True, False, False], "n": [2, 2, 2]}
    )
    sf = StudyFiles(
        Path("."), {"plan": {"name": "t"}, "statistics": st}, pd.DataFrame(), comps, *(pd.DataFrame(),) * 3
    )
    text = methods_sentence(sf)
    assert "no other comparison could be tested (n<3; 1 other row in the table)" in text
    assert "there are no other paired comparisons" not in text
    sf.comparisons = comps.iloc[:1]
    assert "there are no other paired comparisons to correct for." in methods_sentence(sf)


def test_methods_state_the_pretraining_recipe(rendered, tmp_path):
    """What was pre-trained is stated under the methods: shared settings once, a factor's levels all listed,
    the short-row phase and the masking split, then the fine-tuning head and budget; an aggregate from before
    plans carried it renders without it."""
    _, html, _ = rendered("depth")
    recipe = re.search(r'id="recipe">([^<]+)<', html).group(1)
    d = RunConfig()
    assert f"encoder of 1 / 2 / 4 layers, hidden {d.model.hidden}," in recipe
    assert "post-LN (BERT&#39;s)" in recipe and "Where runs differ, every value is listed." in recipe
    assert "dropout 0.1, weights initialised with SD 0.02 (BERT&#39;s); WordPiece" in recipe
    assert (
        f"peak lr {d.train.lr:g}" in recipe and "on 16-token rows" not in recipe
    )  # no short phase by default
    assert 'id="recipe"' not in rendered("nsp")[1]
    spec = tmp_path / "r.yaml"
    spec.write_text("""
name: r
defaults:
  model: {arch: pre_ln, init_range: 0.05}
  objective: {max_seq_len: 64}
  train: {amount: 300, short_len: 16, short_fraction: 0.25}
  finetune: {pooling: mean, epochs: 3, max_train_examples: 2000}
runs:
  - {label: a, set: {masking.mask: 0.8, masking.random: 0.1, masking.keep: 0.1}}
  - {label: b, set: {masking.mask: 0.8, masking.random: 0.2, masking.keep: 0.0}}
""")
    plan = load_study(spec).plan_dict(Layout(root=tmp_path / "results"))
    text = recipe_sentence(plan)
    assert "a pre-LN encoder of" in text and "rows of 64 tokens" in text
    assert "weights initialised with SD 0.05 (BERT: 0.02);" in text  # a departure from BERT says so
    del plan["recipe"]["model.init_range"]  # a plan from before the init scale was recorded
    assert "initialised" not in recipe_sentence(plan) and "?" not in recipe_sentence(plan)
    assert "[MASK]/unchanged/random 80/10/10, 80/0/20;" in text  # BERT Table 8's MASK/SAME/RND order
    assert "300 steps of 32 rows, the first 25% of them on 16-token rows" in text
    assert "Fine-tuning reads the mean of the last layer over the row's tokens" in text
    assert (
        "for 3 epochs of 2,000 training rows per task, 3 fine-tune seeds per encoder, scored on the whole dev set."
        in text
    )
    # the probe is its own model, described apart (it is not the fine-tuning recipe)
    assert (
        "The probe: a logistic regression (ridge for regression tasks) on standardised features of the frozen "
        "encoder's last 1 layer(s)" in text
    )
    plan["recipe"]["finetune.probe"] = [False]
    assert "The probe" not in recipe_sentence(plan)
    for key in ("finetune.seeds", "finetune.probe", "finetune.max_eval_examples", "finetune.probe_layers"):
        del plan["recipe"][key]  # a plan from before these were recorded: nothing invented
    assert "?" not in recipe_sentence(plan) and "seeds" not in recipe_sentence(plan)
    assert not (tmp_path / "results").exists()


def test_replacement_figure_shows_the_reference_accuracies_beside_the_downstream_panels(rendered):
    """BERT Table 8's split changes what the model sees at the asked positions, so the replacement figure
    puts the fixed-reference accuracy (overall, and at [MASK] where the runs have it) beside fine-tune and probe."""
    from study.report import figures as F

    _, _, study_dir = rendered("replacement")
    summary = pd.read_csv(study_dir / "summary.csv")
    plan = json.loads((study_dir / "study.json").read_text())["plan"]
    extra = summary[summary["metric"] == "ref_mlm_acc"].assign(metric="ref_mask_acc")
    d = F.replacement(
        pd.concat([summary, extra.assign(mean=extra["mean"] - 0.07)]), plan, list(REPLACEMENT_KEYS)
    )
    ref, ft, probe = d.fig.axes
    assert [a.get_title() for a in (ref, ft, probe)] == [
        "reference MLM accuracy",
        "fine-tune",
        "feature-based (probe)",
    ]
    assert sorted(t.get_text() for t in ref.get_legend().get_texts()) == ["at [MASK]", "overall"]
    assert len(ref.containers) == 2 and all(len(c.lines[0].get_xdata()) == 3 for c in ref.containers)
    # without the reference rows the panel says so and the downstream panels still draw
    d = F.replacement(summary[summary["task"] != "pretrain"], plan, list(REPLACEMENT_KEYS))
    assert d.fig.axes[0].texts and d.fig.axes[1].containers


def test_every_figure_degrades_on_empty_or_odd_data(tmp_path):
    """Empty tables give a skip note, odd ones (missing columns, a categorical x, NaN CIs) never crash:
    make_figures turns any drawing error into a note for that figure alone."""
    from study.report import figures as F

    empty = pd.DataFrame()
    plan = {
        "kind": "mask_rate",
        "x": "masking.rate",
        "primary_metric": "ref_ppl",
        "compare": {"factor": "f", "a": 1, "b": 2},
    }
    for fn in (
        lambda: F.mask_rate(empty, plan, ["masking.rate"]),
        lambda: F.depth(empty, plan, ["model.layers"]),
        lambda: F.replacement(empty, plan, list(REPLACEMENT_KEYS)),
        lambda: F.generic(empty, plan, []),
        lambda: F.paired_differences(empty, plan),
        lambda: F.training_curves(empty),
        lambda: F.search_trials(None),
    ):
        d = fn()
        assert d.fig is None and d.skipped
    odd = pd.DataFrame(
        {
            "task": ["pretrain"] * 2,
            "mode": ["pretrain"] * 2,
            "init": ["pretrained"] * 2,
            "metric": ["ref_ppl"] * 2,
            "masking.rate": ["low", "high"],
            "mean": [5.0, 4.0],
            "ci_low": [float("nan")] * 2,
            "ci_high": [float("nan")] * 2,
            "n": [1, 1],
        }
    )
    files = F.make_figures(
        plan,
        ["masking.rate"],
        odd,
        pd.DataFrame({"oops": [1]}),
        pd.DataFrame({"step": [1, 2], "loss": [float("nan"), float("inf")]}),
        tmp_path,
    )
    by = {f.name: f for f in files}
    assert by["mask_rate"].png and by["mask_rate"].png.exists()  # categorical x, no CI: still drawn
    assert by["paired_differences"].skipped.startswith("could not draw")  # missing columns -> note
    assert by["training_curves"].skipped == "every logged loss is non-finite"


def test_missing_aggregate_is_a_study_error(tmp_path):
    with pytest.raises(StudyError, match="study aggregate"):
        render_report(tmp_path / "nothing", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_search_section_and_figure(tmp_path):
    """A trials table (as the search stage will export it) adds a search section and figure."""
    layout, plan, study_dir = rf.build(tmp_path, "nsp", failures=False)
    trials = pd.DataFrame(
        {
            "number": range(6),
            "state": ["COMPLETE"] * 4 + ["PRUNED", "FAIL"],
            "value": [5.0, 4.0, 4.5, 3.5, None, None],
            "params_masking.rate": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
            "tokens": [1e5, 2e5, 3e5, 4e5, 5e5, 6e5],
        }
    )
    s = search_summary(trials)
    assert (
        s["best"]["number"] == 3
        and s["best"]["params"] == {"masking.rate": 0.4}
        and s["counts"]["PRUNED"] == 1
    )
    html = render_report(study_dir, tmp_path / "out", search_trials=trials).read_text()
    assert 'id="search"' in html and 'id="fig-search_trials"' in html and "masking.rate=0.4" in html
    # The same file dropped where the search stage writes it is picked up without the argument.
    tdir = layout.search_dir(plan["name"])
    tdir.mkdir(parents=True)
    trials.to_csv(tdir / "trials.csv", index=False)
    assert load_study_dir(study_dir).trials is not None


def test_render_index_links_every_report(tmp_path):
    """reports/index.html lists each study report (from its report.json) with a relative link."""
    for kind in ("nsp", "depth"):
        layout, plan, study_dir = rf.build(tmp_path / kind, kind, seeds=(0,), failures=False)
        render_report(study_dir, tmp_path / "reports" / plan["name"])
    html = render_index(tmp_path / "reports").read_text()
    assert 'href="fixture-nsp/index.html"' in html and 'href="fixture-depth/index.html"' in html


@pytest.mark.slow
def test_report_does_not_import_training_stack(tmp_path):
    """Rendering imports neither torch nor transformers nor any training module (checked in a fresh process)."""
    layout, plan, study_dir = rf.build(tmp_path, "depth", failures=False)
    code = f"""
import sys
from study.report.render import render_report, render_index
render_report({str(study_dir)!r}, {str(tmp_path / "out")!r})
render_index({str(tmp_path)!r})
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'tokenizers', 'datasets')
             or m in ('study.pretrain.trainer', 'study.model.bert', 'study.downstream.finetune', 'study.data.prepare', 'study.data.masking'))
print('LOADED', bad)
assert not bad, bad
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "LOADED []" in r.stdout


# --------------------------------------------------------------------------- headless browser
CHECKER = """<script>
window.__errs = []; window.__csp = [];
window.addEventListener('error', function (e) { __errs.push(String(e.message || (e.target && e.target.outerHTML))); }, true);
document.addEventListener('securitypolicyviolation', function (e) { __csp.push(e.blockedURI + ' ' + e.violatedDirective); });
var _ce = console.error; console.error = function () { __errs.push(Array.from(arguments).join(' ')); _ce.apply(console, arguments); };
window.addEventListener('load', function () {
  // Synchronous on purpose: the load event fires after every <img> has loaded or failed, and an async
  // decode() could still be pending when --dump-dom serialises the page.
  var imgs = Array.from(document.images);
  var p = document.createElement('pre'); p.id = '__check';
  p.textContent = JSON.stringify({n: imgs.length, widths: imgs.map(function (i) { return i.complete ? i.naturalWidth : -1; }),
                                  errs: __errs, csp: __csp});
  document.body.appendChild(p);
});
</script>"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "/usr/bin/chromium"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _open_in_chromium(page: Path, tmp_path: Path) -> tuple[dict, str]:
    """Load `page` from file:// with an inline checker injected first in <head> (before the report's
    CSP, which would block it), dump the DOM, and return the checker's JSON and Chromium's stderr."""
    exe = _chromium()
    if exe is None:
        pytest.skip("headless Chromium not installed (apt-get install chromium; .ci/run installs it)")
    probe = page.with_name("_probe_" + page.name)
    probe.write_text(
        page.read_text(encoding="utf-8").replace("<head>", "<head>" + CHECKER, 1), encoding="utf-8"
    )
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=10000",
        "--dump-dom",
        probe.as_uri(),
    ]
    for _attempt in range(2):  # one retry: a starved CI machine can kill the renderer on its first start
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        m = re.search(r'<pre id="__check">(.*?)</pre>', r.stdout, re.S)
        if m:
            break
    probe.unlink()
    assert m, f"checker did not report (rc={r.returncode}): {r.stderr[-2000:]}"
    import html as _html

    return json.loads(_html.unescape(m.group(1))), r.stderr


@pytest.mark.slow
def test_report_in_headless_chromium(rendered, tmp_path):
    """In a real browser from file://: every <img> decodes (naturalWidth > 0), no console/JS errors, no CSP
    violation (nothing tried to load from outside the file), and the injected label did not execute."""
    out, html, _ = rendered("nsp", evil=True)
    result, stderr = _open_in_chromium(out, tmp_path)
    n_figs = len(re.findall(r"<img ", html))
    assert result["n"] == n_figs >= 2
    assert all(w > 0 for w in result["widths"]), result
    assert result["errs"] == [] and result["csp"] == [], result
    console = [ln for ln in stderr.splitlines() if "CONSOLE" in ln and "_probe_" in ln]
    assert console == [], console
    render_index(out.parent.parent)
    result, _ = _open_in_chromium(out.parent.parent / "index.html", tmp_path)
    assert result["errs"] == [] and result["csp"] == []


@pytest.mark.slow
def test_browser_checker_catches_broken_images_and_network(tmp_path):
    """The browser check can fail: a broken data: image and an external image are both reported."""
    page = tmp_path / "index.html"
    page.write_text(
        '<!doctype html><html><head><meta http-equiv="Content-Security-Policy" '
        f'content="{"default-src &#39;none&#39;; img-src data:"}"></head><body>'
        '<img src="data:image/png;base64,AAAA"><img src="https://example.invalid/x.png"></body></html>'
    )
    result, _ = _open_in_chromium(page, tmp_path)
    assert result["n"] == 2 and result["widths"] == [0, 0]
    assert any("example.invalid" in c for c in result["csp"])


def test_answer_gives_no_direction_from_runs_on_the_plateau(rendered, tmp_path):
    """The floor guard (issue 21): when a compared run did not learn past the most-frequent-token floor, the
    answer says so instead of giving a direction; the same study with every run learned keeps its direction."""
    out, html, study_dir = rendered("depth")
    answer = re.search(r'id="answer">([^<]+)<', html).group(1)
    assert "not trained past the plateau: 1 of" in answer and "model.layers=4 seed 2" in answer
    assert "no best level is named" in answer and "best model.layers" not in answer
    for kind in ("nsp", "replacement"):  # healthy fixtures: a direction (or a verdict), never the guard
        assert "not trained past the plateau" not in rendered(kind)[1]


def test_papers_markdown_gives_the_reports_rows_and_verdicts(rendered):
    """`study papers` (docs' replication table): the same comparison rows and verdicts as the HTML."""
    from study.report.papers import papers_markdown
    from study.report.studyfiles import load_study_dir

    _, html, study_dir = rendered("nsp", evil=True)
    md = papers_markdown(load_study_dir(study_dir))
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| column")]
    html_rows = re.findall(r'<td class="(?:good|bad|meh)">([^<]+)</td></tr>', html)
    assert rows and [r.rsplit("|", 2)[1].strip() for r in rows] == [v.strip() for v in html_rows]
    sst2 = next(r for r in rows if r.startswith("| SST-2 | SST-2 finetune accuracy | BERT-base"))
    assert sst2.rstrip(" |").endswith(
        "disagrees"
    )  # the planted effect contradicts BERT Table 5, as the HTML says
    assert "arXiv:1810.04805, Table 5" in md and 'Matched levels: ours `nsp` = paper "BERT-base"' in md


def test_a_depth_studys_scale_lists_its_shapes_smallest_first():
    """The "Ours:" scale line of a study over depth names every shape in order of size, not in the order
    the aggregate lists its runs (hash order)."""
    from types import SimpleNamespace

    from study.report.papers import our_scale

    configs = {
        h: {"model": {"layers": n, "hidden": 128, "heads": 2}} for h, n in (("a1", 4), ("b2", 8), ("c3", 2))
    }
    sf = SimpleNamespace(runs=pd.DataFrame({"params": [1.9e6, 2.7e6, 1.5e6]}), study={"configs": configs})
    assert our_scale(sf)["model"] == "L=2 H=128 A=2; L=4 H=128 A=2; L=8 H=128 A=2"


def test_a_mean_and_its_interval_are_written_with_the_same_digits():
    """Perplexity 111 [88.87, 132] mixed three significant digits with two decimals: one rule for both."""
    from study.report.fmt import fmt_ci, fmt_value

    assert f"{fmt_value(111.04, 'ref_ppl')} {fmt_ci(88.87, 132.0, 'ref_ppl')}" == "111.0 [88.9, 132.0]"
    assert fmt_value(4.513, "ref_mlm_loss") == "4.51" and fmt_value(0.3456, "ref_mlm_acc") == "34.6"


def test_the_answer_names_the_runs_it_left_out(rendered, tmp_path):
    """A level compared on its survivors says so in the answer itself (before: only the problems section
    listed the failed and diverged runs, and the headline read "n=3 seeds" as if all had run)."""
    answer = re.search(r'id="answer">([^<]+)<', rendered("nsp")[1]).group(1)
    assert "n=3 seeds (left out: 2 of 5 runs at nsp: seed 0 failed, seed 1 diverged): " in answer
    _, plan, study_dir = rf.build(tmp_path / "ok", "nsp", failures=False)
    out = render_report(study_dir, tmp_path / "ok" / "report")
    assert "left out" not in re.search(r'id="answer">([^<]+)<', out.read_text(encoding="utf-8")).group(1)


def test_a_diverged_fine_tune_seed_is_listed_and_left_out(tmp_path):
    """A fine-tune seed whose loss turned non-finite (study/downstream/finetune.py writes `diverged`) is in
    study.json's finetune_problems and the report's problems section, and is in no mean."""
    from study.report.aggregate import aggregate_study

    layout, plan, study_dir = rf.build(tmp_path, "nsp", failures=False)
    run = plan["runs"][0]
    path = layout.finetune_dir(run["run_hash"]) / "SST-2" / "ft" / "finetune-seed1.json"
    before = json.loads(path.read_text())
    path.write_text(
        json.dumps(
            {
                **{k: v for k, v in before.items() if k not in ("metrics", "primary")},
                "diverged": "non-finite loss nan at step 7 (SST-2, seed 1)",
            }
        )
    )
    aggregate_study(plan, layout)
    probs = json.loads((study_dir / "study.json").read_text())["finetune_problems"]
    assert [(p["source_key"], p["task"], p["seed"]) for p in probs] == [(run["run_hash"], "SST-2", 1)]
    tidy = pd.read_csv(study_dir / "results.csv")
    mine = tidy[
        (tidy["source_key"] == run["run_hash"]) & (tidy["task"] == "SST-2") & (tidy["mode"] == "finetune")
    ]
    assert list(mine["finetune_seed"]) == [0]
    html = render_report(study_dir, tmp_path / "report").read_text(encoding="utf-8")
    assert (
        "Fine-tuning seeds whose loss turned non-finite" in html and "non-finite loss nan at step 7" in html
    )


def test_a_null_answer_with_a_pairing_note_keeps_its_mde():
    """A verdict followed by a note ("(paired on 3 of 4 seeds)") is still a null: it keeps its MDE clause."""
    text = _answer_of("indistinguishable from noise at n=3 seeds (paired on 3 of 4 seeds)", [(0.08, 0.03)])
    assert (
        "n=3 seeds: indistinguishable from noise (paired on 3 of 4 seeds); it could detect only "
        "differences of ≥ 5.9 pp" in text
    )


MR = "masking.rate"


def _masking_study(values: dict, learned=lambda lv, s: True, with_compare: bool = True) -> StudyFiles:
    """A masking-rate study (Wettig et al.'s table) from MNLI accuracies {level: {seed: [fine-tune scores]}},
    aggregated by the real compare/summarize; `learned(level, seed)` is each run's plateau flag."""
    from study.report.comparisons import compare
    from study.report.units import summarize

    rows = [
        {
            "run_hash": f"{lv}-{s}",
            "source_key": f"{lv}-{s}",
            "label": f"{MR}={lv}",
            "status": "done",
            "pretrain_seed": s,
            "finetune_seed": i,
            "task": "MNLI",
            "mode": "finetune",
            "init": "pretrained",
            "metric": "accuracy",
            "value": v,
            MR: lv,
        }
        for lv, per in values.items()
        for s, vals in per.items()
        for i, v in enumerate(vals)
    ]
    tidy = pd.DataFrame(rows)
    spec = {"factor": MR, "a": 0.15, "b": 0.4}
    c = compare(tidy, spec, ("MNLI", "finetune", "accuracy")) if with_compare else pd.DataFrame()
    pairs = [(lv, s) for lv, per in values.items() for s in per]
    plan = {
        "name": "m",
        "kind": "mask_rate",
        "primary_metric": "MNLI/finetune/accuracy",
        "compare": spec if with_compare else None,
        "runs": [
            {"run_hash": f"{lv}-{s}", "label": f"{MR}={lv}", "seed": s, "factors": {MR: lv}}
            for lv, s in pairs
        ],
    }
    runs = pd.DataFrame(
        [
            {
                "run_hash": f"{lv}-{s}",
                "label": f"{MR}={lv}",
                "seed": s,
                "status": "done",
                "learned": learned(lv, s),
            }
            for lv, s in pairs
        ]
    )
    return StudyFiles(
        Path("."),
        {"plan": plan, "answer": c.iloc[0].to_dict() if len(c) else None},
        summarize(tidy, [MR]),
        c,
        pd.DataFrame(),
        runs,
        pd.DataFrame(),
        factor_keys=[MR],
    )


def _paper_verdicts(sf: StudyFiles) -> list[str]:
    from study.report.papers import reference_sections

    return [r["verdict"] for sec in reference_sections(sf) for r in sec["rows"]]


def test_papers_verdicts_keep_the_answers_plateau_guard():
    """Every 15% run is on the plateau: the answer claims no direction, and neither may the papers row
    (it said "agrees" with Wettig et al. from the same runs)."""
    vals = {
        0.15: {s: [0.60 + 0.004 * s * s] for s in range(3)},
        0.4: {s: [0.66 + 0.003 * s] for s in range(3)},
    }
    sf = _masking_study(vals, learned=lambda lv, s: lv != 0.15)
    assert answer_sentence(sf)["kind"] == "plateau"
    assert set(_paper_verdicts(sf)) == {"not trained past the plateau"}
    assert "agrees" in _paper_verdicts(_masking_study(vals))  # every run learned: the direction is given


def test_the_same_difference_in_every_seed_reads_as_no_test_beside_the_papers():
    """A paired difference that is the same in every seed has no test: the papers row said "no CI (too few
    seeds)" at n=3; it now says why."""
    vals = {
        0.15: {s: [v] for s, v in enumerate((0.60, 0.64, 0.61))},
        0.4: {s: [v + 2 / 87] for s, v in enumerate((0.60, 0.64, 0.61))},
    }
    sf = _masking_study(vals)
    assert sf.comparisons.iloc[0]["ci_method"] == "none (the same difference in every seed)"
    assert "same direction, but no test: the same difference in every seed" in _paper_verdicts(sf)


def test_an_interval_of_no_width_is_no_test_beside_the_papers_or_between_levels():
    """Every seed at the majority class (0.509) at 15% and one dev example more (0.5095) at 40%: intervals
    of no width. Set side by side they looked "clear" of each other and gave a direction the paired rule
    refuses; now neither the papers row nor the best-level answer calls them apart."""
    vals = {0.15: {s: [0.5090, 0.5090] for s in range(3)}, 0.4: {s: [0.5095, 0.5095] for s in range(3)}}
    rows = R.paper_vs_ours(
        R.load_reference("wettig_masking"),
        [{MR: 0.15}, {MR: 0.4}],
        {
            (i, "MNLI", "finetune", "accuracy"): {"mean": m, "ci_low": m, "ci_high": m}
            for i, m in enumerate((0.5090, 0.5095))
        },
    )["rows"]
    assert {r["verdict"] for r in rows} == {
        "same direction, but no test: every seed at a level scored the same"
    }
    assert set(_paper_verdicts(_masking_study(vals, with_compare=False))) == {
        "same direction, but no test: every seed at a level scored the same"
    }
    best = answer_sentence(_masking_study(vals, with_compare=False))["text"]
    assert "clear of" not in best and "every seed at it scored the same" in best
    vals[0.4] = {s: [0.60 + 0.01 * s] for s in range(3)}  # best level with spread, the other without
    best = answer_sentence(_masking_study(vals, with_compare=False))["text"]
    assert "clear of" not in best and "every seed of 0.15 scored the same" in best


def test_runs_at_a_level_are_found_when_the_level_reads_as_a_float():
    """The answer's plateau guard and left-out clause find a plan's runs at 4 when the level comes back as
    4.0 (a float64 column), as the comparison itself does."""
    from study.report.problems import left_out, plateau_runs

    plan = {
        "name": "d",
        "runs": [
            {"run_hash": f"h{s}", "label": "model.layers=4", "seed": s, "factors": {"model.layers": 4}}
            for s in range(3)
        ],
    }
    runs = pd.DataFrame(
        [
            {"run_hash": "h0", "label": "model.layers=4", "seed": 0, "status": "done", "learned": False},
            {"run_hash": "h1", "label": "model.layers=4", "seed": 1, "status": "failed", "learned": None},
            {"run_hash": "h2", "label": "model.layers=4", "seed": 2, "status": "done", "learned": True},
        ]
    )
    sf = StudyFiles(
        Path("."), {"plan": plan}, pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), runs, pd.DataFrame()
    )
    assert plateau_runs(sf, "model.layers", (4.0,)) == ["model.layers=4 seed 0"]
    assert left_out(sf, "model.layers", (4.0,)) == " (left out: 1 of 3 runs at 4.0: seed 1 failed)"


def test_recipe_states_each_tasks_own_dev_rows(rendered, tmp_path):
    """The recipe said "scored on 872 dev rows" for every task, MRPC (408 dev rows) too (before): the
    aggregate's per-task counts (study.json eval_rows) are stated; without them a cap is an upper bound."""
    spec = tmp_path / "r.yaml"
    spec.write_text("name: r\ndefaults:\n  finetune: {tasks: [SST-2, MRPC], max_eval_examples: 872}\n")
    plan = load_study(spec).plan_dict(Layout(root=tmp_path / "results"))
    assert "scored on at most 872 dev rows per task." in recipe_sentence(plan)
    assert "scored on 872 (SST-2) / 408 (MRPC) dev rows." in recipe_sentence(
        plan, {"SST-2": [872], "MRPC": [408]}
    )
    _, _, study_dir = rendered("depth")
    copy = tmp_path / "depth"
    shutil.copytree(study_dir, copy)
    st = json.loads((copy / "study.json").read_text())
    (copy / "study.json").write_text(json.dumps({**st, "eval_rows": {"SST-2": [80], "MRPC": [40]}}))
    html = render_report(copy, tmp_path / "out").read_text()
    assert "scored on 80 (SST-2) / 40 (MRPC) dev rows." in re.search(r'id="recipe">([^<]+)<', html).group(1)


@pytest.mark.parametrize("text", ['{"plan": ', "[1, 2]", "\udcff"])
def test_a_corrupt_study_json_exits_2_naming_it(tmp_path, capsys, text):
    """A truncated, foreign or non-UTF-8 study.json was a JSONDecodeError traceback in `report` and `papers`."""
    from study.cli import main

    spec = tmp_path / "t.yaml"
    spec.write_text("name: t\ndefaults:\n  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64}\n")
    results, reports = tmp_path / "results", tmp_path / "reports"
    bad = results / "studies" / "t" / "study.json"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(text.encode("utf-8", "surrogateescape"))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for cmd in ("report", "papers"):
        assert main(["--results", str(results), "--reports", str(reports), cmd, str(spec)]) == 2
        err = capsys.readouterr().err
        assert f"{bad}:" in err and "study aggregate" in err and "Traceback" not in err, err
    assert not reports.exists() and {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_results_path_that_is_a_file_exits_2_naming_the_flag(tmp_path, capsys):
    """`--results README.md aggregate` was a NotADirectoryError traceback."""
    from study.cli import main

    spec = tmp_path / "t.yaml"
    spec.write_text("name: t\ndefaults:\n  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64}\n")
    readme = tmp_path / "README.md"
    readme.write_text("notes\n")
    for flag, path in (("--results", readme), ("--results", readme / "sub"), ("--reports", readme)):
        assert main([flag, str(path), "aggregate", str(spec)]) == 2
        assert f"{flag}:" in capsys.readouterr().err
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "t.yaml"]
        and readme.read_text() == "notes\n"
    )


def test_paper_and_our_differences_share_one_unit_rule():
    """The paper's Δ of a score (its table in percent) prints in pp like ours, and an unbounded difference
    takes its value's precision (one decimal from 10 up): "-0.10" beside "+3.2 pp" read as two units."""
    from study.report.fmt import fmt_diff
    from study.report.papers import paper_diff_s

    assert paper_diff_s(92.6 - 92.7, "accuracy") == "-0.1 pp" and paper_diff_s(-1.85, "ref_ppl") == "-1.85"
    assert fmt_diff(-38.53, "ref_ppl") == "-38.5" and fmt_diff(-1.853, "ref_ppl") == "-1.85"


def test_training_curves_plot_the_mlm_loss_and_mark_the_short_row_switch():
    """The total loss adds NSP's (≈ ln 2) to one level only, so the figure plots the MLM loss (the total
    beside it); the end of the train.short_len warmup is a vertical line, said in the caption."""
    from study.report import figures as F

    rows = [
        {
            "run_hash": lab,
            "label": lab,
            "step": s,
            "tokens": 100 * s,
            "mlm_loss": 8.0 - s / 100,
            "loss": 8.0 - s / 100 + (0.69 if lab == "nsp" else 0),
        }
        for lab in ("nsp", "none")
        for s in range(10, 210, 10)
    ]
    plan = {
        "recipe": {
            "objective.sentence": ["nsp", "none"],
            "train.budget": ["steps"],
            "train.amount": [200.0],
            "train.short_fraction": [0.6],
            "train.short_len": [16],
        }
    }
    d = F.training_curves(pd.DataFrame(rows), None, plan)
    ax0, ax1 = d.fig.axes[:2]
    assert ax0.get_ylabel() == "training MLM loss" and "total" in ax1.get_ylabel()
    assert any(list(ln.get_xdata()) == [120.0, 120.0] for ln in ax0.get_lines())
    assert "16 tokens (train.short_len)" in d.caption and "MLM loss alone" in d.caption
    old = pd.DataFrame(rows).drop(columns="mlm_loss")
    d = F.training_curves(old, None, {"recipe": {"objective.sentence": ["none"]}})
    assert d.fig.axes[0].get_ylabel() == "training loss (MLM)"  # an older aggregate, no sentence task


def test_paired_figure_labels_points_without_interval_and_marks_the_primary_row():
    """n=2: bare dots under a caption about intervals read as intervals too small to see; each is labelled,
    the primary row starred, and the y-range padded so no dot sits on the frame."""
    from study.report import figures as F

    nan = float("nan")
    c = pd.DataFrame(
        {
            "task": ["SST-2", "SST-2", "pretrain"],
            "mode": ["finetune", "probe", "pretrain"],
            "metric": ["accuracy", "accuracy", "ref_ppl"],
            "diff": [0.03, 0.02, -21.0],
            "ci_low": [nan] * 3,
            "ci_high": [nan] * 3,
            "n": [2, 2, 2],
            "primary": [True, False, False],
        }
    )
    d = F.paired_differences(c, {"compare": {"a": "nsp", "b": "none"}})
    ax = d.fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["n=2: no interval"] * 2
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "SST-2 finetune accuracy ★",
        "SST-2 probe accuracy",
    ]
    assert ax.get_ylim()[0] < -0.5 and ax.get_ylim()[1] > 1.5 and "no interval" in d.caption


def test_replacement_figure_draws_the_floor_and_keeps_its_legends_off_the_intervals():
    """The reference-accuracy panel draws the most-frequent-token floor (runs.csv ref_mode_acc) dashed, as
    curves.py does; legends sit below the panels (inside, they covered interval tops); tick labels end at
    their tick."""
    from study.report import figures as F

    keys = list(REPLACEMENT_KEYS)
    rows = [
        {
            "task": t,
            "mode": m,
            "metric": met,
            "init": "pretrained",
            "mean": v,
            "ci_low": v - 0.01,
            "ci_high": v + 0.01,
            "n": 3,
            "masking.mask": mk,
            "masking.keep": 0.1,
            "masking.random": 0.9 - mk,
        }
        for mk in (0.8, 0.0)
        for t, m, met, v in (
            ("pretrain", "pretrain", "ref_mlm_acc", 0.3),
            ("SST-2", "finetune", "accuracy", 0.7),
        )
    ]
    d = F.replacement(pd.DataFrame(rows), {}, keys, pd.DataFrame({"ref_mode_acc": [0.05, 0.05]}))
    ax = d.fig.axes[0]
    assert any(ln.get_linestyle() == "--" and list(ln.get_ydata()) == [0.05, 0.05] for ln in ax.get_lines())
    for a in d.fig.axes[:2]:
        assert a.get_legend()._loc == 9 and a.get_legend().get_bbox_to_anchor()._bbox.y0 < 0
        assert {t.get_ha() for t in a.get_xticklabels()} == {"right"}


def test_report_is_readable_without_colour_or_images_and_defines_its_terms(rendered):
    """Alt text says what a figure shows, the primary Summary row is marked in text (not only by colour),
    tables carry caption/thead/scope; the glossary defines the formats, tasks, tests and hashes the page
    uses, in the recipe's [MASK]/unchanged/random order."""
    _, html, _ = rendered("nsp")
    alts = re.findall(r'<img src="[^"]+" alt="([^"]+)"', html)
    assert alts and all(": " in a and len(a) > 40 for a in alts)
    summary = html.split('id="summary"')[1].split("<h2")[0]
    assert '<tr class="primary">' in summary and "★ primary</b>" in summary
    assert html.count("<table>") == html.count("<caption>") == html.count("<thead>")
    assert '<th scope="col">level</th>' in summary
    glossary = html.split('id="glossary"')[1].split("</details>")[0]
    for term in (
        "segment_pair",
        "sentence_pair",
        "full_sentences",
        "doc_sentences",
        "sop",
        "Holm",
        "Welch",
        "BCa",
        "design point",
        "run hash",
        "data hash",
        "fine-tune recipe hash",
        "<dt>std</dt>",
    ):
        assert term in glossary, term
    assert "[MASK]/unchanged/random" in glossary and "[MASK]/random/unchanged" not in glossary
