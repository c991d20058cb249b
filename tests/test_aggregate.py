"""Aggregation: the statistics wired into the tables (one rule, Holm, MDE), wording, tidy table from run folders.

The statistics themselves are checked against scipy in tests/test_stats.py."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from study.paths import Layout
from study.report import stats as S
from study.report.aggregate import aggregate_study
from study.report.comparisons import NOISE_WORDS, TOO_FEW_WORDS, compare, interpret
from study.report.units import summarize


def test_wording():
    """One rule: the words follow the deciding p, never a second criterion; n<3 gets no direction."""
    assert NOISE_WORDS in interpret(3, -0.1, 0.3, 0.4)
    assert interpret(5, 0.1, 0.3, 0.01, "nsp", "none").startswith("none higher than nsp")
    assert interpret(5, -0.3, -0.1, 0.01, "nsp", "none").startswith("none lower than nsp")
    assert interpret(3, 0.0, 0.0, 1.0) == "no difference in any seed (n=3)"  # not "noise"
    nan = float("nan")
    assert interpret(3, nan, nan, nan, method=S.SAME_DIFF) == (
        "the same difference in every seed (n=3): no test of seed noise"
    )
    # the smoke report's n=2 "interval excluding 0 read as noise": now no interval and no direction
    assert interpret(2, -0.081, -0.001, 0.04) == f"n=2: {TOO_FEW_WORDS}"
    assert interpret(2, float("nan"), float("nan"), float("nan")) == f"n=2: {TOO_FEW_WORDS}"


def _fake_run(layout, h, sentence, seed, ppl, acc):
    d = layout.run_dir(h)
    d.mkdir(parents=True)
    (d / "status.json").write_text(json.dumps({"status": "done", "error": None, "step": 10}))
    (d / "metrics.json").write_text(
        json.dumps(
            {
                "ref_mlm_loss": float(np.log(ppl)),
                "ref_ppl": ppl,
                "ref_mlm_acc": 0.3,
                # by what the asked position showed ([MASK], another token, its own): evaluation only
                "ref_mask_acc": 0.2 + 0.01 * seed,
                "ref_rnd_acc": 0.1 + 0.004 * seed**2 + 0.02 * (sentence == "none"),
                "ref_keep_acc": 0.9 - 0.01 * seed,
                "sentence_acc": None,
                "tokens_seen": 100,
                "steps": 10,
                "tokens_per_s": 1.0,
                "mfu": 0.1,
                "params": 5,
                "wall_s": 1.0,
            }
        )
    )
    (d / "history.jsonl").write_text(json.dumps({"step": 1, "tokens": 10, "loss": 5.0}) + "\n")
    for fs in (0, 1):
        f = layout.finetune_dir(h) / "SST-2" / "ft" / f"finetune-seed{fs}.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(
            json.dumps(
                {
                    "run_key": h,
                    "task": "SST-2",
                    "mode": "finetune",
                    "init": "pretrained",
                    "seed": fs,
                    "metrics": {"accuracy": acc + 0.01 * fs},
                    "primary_metric": "accuracy",
                    "primary": acc + 0.01 * fs,
                }
            )
        )
    return {
        "run_hash": h,
        "label": f"objective.sentence={sentence}",
        "seed": seed,
        "factors": {"objective.sentence": sentence},
    }


def test_aggregate_from_run_folders(tmp_path):
    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    runs = [
        _fake_run(layout, f"{s}{seed}", s, seed, 100 + 10 * (s == "none") + seed, 0.7 + 0.01 * seed)
        for s in ("nsp", "none")
        for seed in (0, 1, 2)
    ]
    plan = {
        "name": "t",
        "question": "q",
        "kind": "nsp",
        "primary_metric": "SST-2/finetune/accuracy",
        "x": "objective.sentence",
        "hue": None,
        "compare": {"factor": "objective.sentence", "a": "nsp", "b": "none"},
        "finetune_hash": "ft",
        "runs": runs,
        "references": [],
    }
    out = aggregate_study(plan, layout)
    import pandas as pd

    tidy = pd.read_csv(out / "results.csv")
    assert set(tidy["run_hash"]) == {r["run_hash"] for r in runs}
    comp = pd.read_csv(out / "comparisons.csv")
    ppl = comp[comp["metric"] == "ref_ppl"].iloc[0]
    assert ppl["diff"] == pytest.approx(10.0)
    # the reference accuracy by how the asked position was shown is compared like any pre-training metric
    rnd = comp[comp["metric"] == "ref_rnd_acc"].iloc[0]
    assert rnd["diff"] == pytest.approx(0.02) and {"ref_mask_acc", "ref_keep_acc"} <= set(comp["metric"])


def test_comparisons_one_rule_holm_and_primary(tmp_path):
    """comparisons.csv: the primary row is uncorrected at 95% and marked; the other non-cost rows are one
    Holm family whose interval level matches the adjusted p (interval excludes 0 <=> p_adjusted < 0.05);
    cost rows are descriptive; every row carries the MDE from its own SD of differences."""
    import sys
    from pathlib import Path

    import pandas as pd

    from study.report import stats as S

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report_fixtures as rf

    _, _, out = rf.build(tmp_path, "nsp", failures=False)
    c = pd.read_csv(out / "comparisons.csv")
    prim = c[c["primary"]]
    assert len(prim) == 1 and tuple(prim.iloc[0][["task", "mode", "metric"]]) == (
        "SST-2",
        "finetune",
        "accuracy",
    )
    r = prim.iloc[0]
    assert r["correction"] == "none (primary)" and r["ci_level"] == 0.95 and r["p_adjusted"] == r["p_value"]
    cost = c[c["metric"].isin(["tokens_per_s", "params", "tokens_seen", "mfu", "wall_s"])]
    assert len(cost) and (cost["correction"] == "none (cost metric)").all()
    fam = c[c["correction"].str.startswith("Holm")]
    m = len(fam)
    # ref_ppl differs by exactly 10 in every seed in the fixture: no test, so not in the family
    untested = c[c["correction"] == "none (no test)"]
    assert list(untested["metric"]) == ["ref_ppl"] and np.isnan(untested["p_adjusted"]).all()
    assert m == len(c) - 1 - len(cost) - len(untested) and (fam["correction"] == f"Holm over {m}").all()
    assert np.allclose(fam["p_adjusted"], S.holm(fam["p_value"]))
    assert np.allclose(1 - fam["ci_level"], S.holm_levels(fam["p_value"]))
    tested = c[np.isfinite(c["p_value"]) & (c["ci_low"] != c["ci_high"])]
    excl = (tested["ci_low"] > 0) | (tested["ci_high"] < 0)
    assert (excl == (tested["p_adjusted"] < 0.05)).all()
    assert (tested["interpretation"].str.contains("beyond seed noise") == excl).all()
    # the primary row's interval is scipy's t-interval on the per-seed paired differences
    tidy = pd.read_csv(out / "results.csv")
    sel = tidy[
        (tidy["task"] == "SST-2")
        & (tidy["mode"] == "finetune")
        & (tidy["metric"] == "accuracy")
        & (tidy["init"] == "pretrained")
    ]
    per = sel.groupby(["objective.sentence", "pretrain_seed"])["value"].mean()
    d = (per["none"] - per["nsp"]).to_numpy()
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((lo, hi))
    assert r["p_value"] == pytest.approx(stats.ttest_rel(per["none"], per["nsp"]).pvalue)
    assert r["sd_diff"] == pytest.approx(d.std(ddof=1)) and r["mde"] == pytest.approx(S.mde(d.std(ddof=1), 3))
    st = json.loads((out / "study.json").read_text())["statistics"]
    assert st["family"] == m and st["primary"]["n"] == 3 and st["primary"]["mde"] == pytest.approx(r["mde"])


def test_random_baseline_counted_once_and_baseline_gain(tmp_path):
    """Every run points at the same random-init baseline; its results count once per fine-tune seed
    (3 here), not once per run (which would fake precision), and baseline.csv = pretrained - random."""
    import sys
    from pathlib import Path

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report_fixtures as rf

    layout, plan, out = rf.build(tmp_path, "nsp", failures=False)
    summ = pd.read_csv(out / "summary.csv")
    rnd = summ[(summ["init"] == "random") & (summ["task"] == "SST-2")]
    assert set(rnd["n"]) == {3}
    tidy = pd.read_csv(out / "results.csv")
    raw = tidy[(tidy["init"] == "random") & (tidy["task"] == "SST-2")].drop_duplicates(
        ["source_key", "finetune_seed"]
    )
    assert rnd["mean"].iloc[0] == pytest.approx(raw["value"].mean())
    base = pd.read_csv(out / "baseline.csv")
    row = base[(base["task"] == "SST-2") & (base["objective.sentence"] == "none")].iloc[0]
    pre = summ[
        (summ["init"] == "pretrained")
        & (summ["task"] == "SST-2")
        & (summ["mode"] == "finetune")
        & (summ["objective.sentence"] == "none")
    ]["mean"].iloc[0]
    assert row["diff"] == pytest.approx(pre - raw["value"].mean())
    assert row["ci_low"] < row["diff"] < row["ci_high"] and row["n_random"] == 3 and row["n_pretrained"] == 3
    # Welch interval and test, Holm across the baseline table (no compare-less primary in an nsp study)
    assert (base["test"] == "Welch t-test").all() and base["correction"].str.startswith("Holm").all()
    # Cost metrics ride along as tidy rows; study.json carries the run configs and factor keys.
    assert {"params", "tokens_per_s", "tokens_seen"} <= set(tidy[tidy["task"] == "pretrain"]["metric"])
    study = json.loads((out / "study.json").read_text())
    assert study["factor_keys"] == ["objective.sentence"]
    assert study["configs"]["nsp0"]["model"]["layers"] == 2


def test_one_random_baseline_per_seed_is_the_unit(tmp_path):
    """When each pre-training seed has its own random-init baseline (as the smoke study does), the
    baseline is the unit (its fine-tune seeds averaged), so n_random counts baselines, not files."""
    import sys
    from pathlib import Path

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report_fixtures as rf

    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    rng = np.random.default_rng(1)
    runs = [
        rf._run(
            layout,
            f"r{s}",
            "x",
            s,
            {"objective.sentence": "nsp"},
            ppl=100.0,
            acc=0.7,
            rng=rng,
            baseline=f"random-s{s}",
            tasks=("SST-2",),
        )
        for s in (0, 1)
    ]
    plan = {"name": "t", "runs": runs, "finetune_hash": "ft", "compare": None, "primary_metric": "ref_ppl"}
    out = aggregate_study(plan, layout)
    base = pd.read_csv(out / "baseline.csv")
    assert list(base["n_random"]) == [2] and list(base["n_pretrained"]) == [2]
    tidy = pd.read_csv(out / "results.csv")
    rnd = tidy[tidy["init"] == "random"].drop_duplicates(["source_key", "finetune_seed"])
    per_baseline = rnd.groupby("source_key")["value"].mean()
    assert base["mean_random"].iloc[0] == pytest.approx(per_baseline.mean())
    # two baselines against two pre-training seeds: too few for an interval, so no test and no direction
    assert np.isnan(base["p_value"].iloc[0]) and np.isnan(base["ci_low"].iloc[0])
    assert (
        base["interpretation"].iloc[0].startswith("too few seeds for an interval (n=2 pre-trained, 2 random")
    )


def test_one_pretrained_model_uses_its_fine_tune_seeds_and_says_so(tmp_path):
    """A study with ONE pre-training seed (ablations/pretrain_vs_random.yaml) still gets a CI against
    the random-init baseline: the unit falls back to fine-tune seeds, and the words say that the
    comparison speaks for that one checkpoint."""
    import sys
    from pathlib import Path

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report_fixtures as rf

    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    runs = [
        rf._run(
            layout,
            "r0",
            "pretrained",
            0,
            {},
            ppl=100.0,
            acc=0.7,
            rng=np.random.default_rng(2),
            tasks=("SST-2",),
        )
    ]
    # a third fine-tune seed for the pre-trained model: an interval needs 3 units a side
    rf._w(
        layout.finetune_dir("r0") / "SST-2" / "ft" / "finetune-seed2.json",
        {
            "run_key": "r0",
            "task": "SST-2",
            "mode": "finetune",
            "init": "pretrained",
            "seed": 2,
            "metrics": {"accuracy": 0.70},
            "primary_metric": "accuracy",
            "primary": 0.70,
        },
    )
    for key, init, v, seeds in (
        ("r0", "pretrained", 0.65, (0, 1)),
        ("random-base", "random", 0.55, (0, 1, 2)),
    ):
        for fs in seeds:  # a probe that ignores its seed: the same score every time
            rf._w(
                layout.finetune_dir(key) / "SST-2" / "ft" / f"probe-seed{fs}.json",
                {
                    "run_key": key,
                    "task": "SST-2",
                    "mode": "probe",
                    "init": init,
                    "seed": fs,
                    "metrics": {"accuracy": v},
                    "primary_metric": "accuracy",
                    "primary": v,
                },
            )
    plan = {"name": "t", "runs": runs, "finetune_hash": "ft", "compare": None, "primary_metric": "ref_ppl"}
    base = pd.read_csv(aggregate_study(plan, layout) / "baseline.csv")
    row = base[base["mode"] == "finetune"].iloc[0]
    assert row["n_pretrained"] == 3 and row["n_random"] == 3  # 3 fine-tune seeds vs 3 baseline seeds
    assert row["ci_low"] > 0 and "fine-tuning seeds of one pre-trained model" in row["interpretation"]
    assert "raises it beyond seed noise" in row["interpretation"]
    # the probe ignores its seed here (identical scores): one measurement per side, so no CI
    probe = base[base["mode"] == "probe"].iloc[0]
    assert probe["n_pretrained"] == 1 and probe["n_random"] == 1 and TOO_FEW_WORDS in probe["interpretation"]
    # with one design point, the report's one-sentence answer is that comparison
    from study.report.prose import answer_sentence
    from study.report.studyfiles import load_study_dir

    plan["primary_metric"] = "SST-2/finetune/accuracy"
    ans = answer_sentence(load_study_dir(aggregate_study(plan, layout)))
    assert ans["kind"] == "baseline" and "pre-trained minus random init: +" in ans["text"], ans


def test_study_metrics_file_for_dvc(tmp_path):
    """results/metrics/study-<name>.json (the aggregate stage's DVC metric) holds the answer and the
    primary metric per level, as strict JSON (no NaN)."""
    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    runs = [
        _fake_run(layout, f"{s}{seed}", s, seed, 100 + 10 * (s == "none") + seed, 0.7 + 0.01 * seed)
        for s in ("nsp", "none")
        for seed in (0, 1)
    ]
    plan = {
        "name": "t",
        "primary_metric": "SST-2/finetune/accuracy",
        "finetune_hash": "ft",
        "runs": runs,
        "compare": {"factor": "objective.sentence", "a": "nsp", "b": "none"},
    }
    aggregate_study(plan, layout)
    text = (layout.root / "metrics" / "study-t.json").read_text()
    m = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert m["runs"] == {"total": 4, "done": 4, "not_beyond_mode": 0}
    assert m["answer"]["a"] == "nsp" and m["answer"]["n"] == 2 and m["answer"]["diff"] == pytest.approx(0.0)
    assert set(m["primary"]) == {"objective.sentence=nsp", "objective.sentence=none"}


def _tidy(metric_values: dict, fac: str = "objective.sentence") -> pd.DataFrame:
    """Pre-trained tidy rows: {metric: {level: {pretrain seed: value}}}, one fine-tune seed each."""
    rows = [
        {
            "run_hash": f"{lv}{seed}",
            "source_key": f"{lv}{seed}",
            "label": lv,
            "status": "done",
            "pretrain_seed": seed,
            "finetune_seed": 0,
            "task": "SST-2",
            "mode": "finetune",
            "init": "pretrained",
            "metric": metric,
            "value": v,
            fac: lv,
        }
        for metric, levels in metric_values.items()
        for lv, per in levels.items()
        for seed, v in per.items()
    ]
    return pd.DataFrame(rows)


SPEC = {"factor": "objective.sentence", "a": "nsp", "b": "none"}


def test_same_difference_in_every_seed_is_not_beyond_seed_noise(tmp_path):
    """Accuracy on a dev set of N examples moves in steps of 1/N: three seeds can each gain exactly 2/N.
    sd = 0 gave p = 0 ("none higher than nsp beyond seed noise" at n=3, passing any Holm level); now it
    is no test: NaN p, no interval, no MDE, not in the Holm family, and the words say why."""
    nsp = {0: 0.70, 1: 0.74, 2: 0.71}
    t = _tidy(
        {
            "accuracy": {"nsp": nsp, "none": {s: v + 2 / 87 for s, v in nsp.items()}},
            "f1": {"nsp": nsp, "none": {0: 0.75, 1: 0.76, 2: 0.78}},
            "mcc": {"nsp": nsp, "none": {0: 0.77, 1: 0.74, 2: 0.76}},
        }
    )
    c = compare(t, SPEC, ("SST-2", "finetune", "f1")).set_index("metric")
    r = c.loc["accuracy"]
    assert (
        np.isnan(r["p_value"]) and np.isnan(r["p_adjusted"]) and np.isnan(r["ci_low"]) and np.isnan(r["mde"])
    )
    assert r["diff"] == pytest.approx(2 / 87) and r["n"] == 3 and r["correction"] == "none (no test)"
    assert r["interpretation"] == "the same difference in every seed (n=3): no test of seed noise"
    assert c.loc["mcc", "correction"] == "Holm over 1"  # the untested row does not count in m
    # the fixture's ref_ppl (exactly +10 in every seed) renders its p as a dash, not "< 0.001"
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report_fixtures as rf

    from study.report.render import _comparison_rows, load_study_dir

    _, _, out = rf.build(tmp_path, "nsp", failures=False)
    row = next(x for x in _comparison_rows(load_study_dir(out)) if x["metric"] == "ref_ppl")
    assert row["p"] == row["p_adj"] == "–" and "beyond seed noise" not in row["interpretation"]


def test_seeds_one_level_lacks_are_counted_and_said():
    """Pairing uses the seeds both levels have; n_a and n_b say how many each has, and the words say
    "(paired on k of m seeds)" when a seed was dropped. summarize's n counts the finite units it uses."""
    t = _tidy(
        {
            "accuracy": {
                "nsp": {0: 0.70, 1: 0.72, 2: 0.71, 3: 0.69},
                "none": {0: 0.73, 1: 0.74, 2: 0.76, 3: float("nan")},
            }
        }
    )
    r = compare(t, SPEC, ("SST-2", "finetune", "accuracy")).iloc[0]
    assert (r["n"], r["n_a"], r["n_b"]) == (3, 4, 3)
    assert r["interpretation"].endswith("(paired on 3 of 4 seeds)"), r["interpretation"]
    full = _tidy({"accuracy": {"nsp": {0: 0.70, 1: 0.72, 2: 0.71}, "none": {0: 0.73, 1: 0.74, 2: 0.76}}})
    r = compare(full, SPEC, ("SST-2", "finetune", "accuracy")).iloc[0]
    assert (r["n"], r["n_a"], r["n_b"]) == (3, 3, 3) and "paired on" not in r["interpretation"]
    s = summarize(t, ["objective.sentence"]).set_index("objective.sentence")
    assert s.loc["none", "n"] == 3 and s.loc["nsp", "n"] == 4  # the NaN unit is not counted


def test_mde_at_the_alpha_its_row_is_tested_at(tmp_path):
    """A secondary row is tested at its Holm level, so its MDE is computed at that alpha (larger than
    at 0.05); the primary row's stays at 0.05."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report_fixtures as rf

    _, _, out = rf.build(tmp_path, "nsp", failures=False)
    c = pd.read_csv(out / "comparisons.csv")
    fam = c[c["correction"].str.startswith("Holm")]
    assert len(fam) and (fam["ci_level"] > 0.95).all()
    for r in fam.itertuples():
        assert r.mde == pytest.approx(S.mde(r.sd_diff, r.n, alpha=1 - r.ci_level), rel=1e-9)
        assert r.mde > S.mde(r.sd_diff, r.n) * 1.05
    p = c[c["primary"]].iloc[0]
    assert p["mde"] == pytest.approx(S.mde(p["sd_diff"], p["n"], alpha=0.05), rel=1e-9)


def test_baseline_with_no_spread_on_either_side_is_no_test():
    """Three pre-trained seeds that all score 0.8 against three random-init baselines that all score 0.7
    (e.g. the majority class): no spread, so no test and no direction, not "raises it beyond seed noise"."""
    from study.report.comparisons import SAME_WORDS, baseline_gain

    rows = [
        {
            "task": "SST-2",
            "mode": "finetune",
            "metric": "accuracy",
            "init": init,
            "pretrain_seed": s,
            "source_key": f"{init}{s}",
            "finetune_seed": f,
            "value": v,
        }
        for init, v in (("pretrained", 0.8), ("random", 0.7))
        for s in range(3)
        for f in range(2)
    ]
    row = baseline_gain(pd.DataFrame(rows), []).iloc[0]
    assert np.isnan(row["p_value"]) and np.isnan(row["ci_low"]) and row["diff"] == pytest.approx(0.1)
    assert SAME_WORDS in row["interpretation"] and "beyond" not in row["interpretation"]
    assert row["correction"] == "none (no test)"


def test_compare_in_a_one_at_a_time_design_uses_only_the_matching_cells():
    """One-at-a-time over f (default 0.15, level 0.3) and g (default 2, level 4): the runs at f = 0.15
    include g = 4's, which f = 0.3 has no counterpart of. Averaging them in would move the difference by
    half of g's effect; only the cell both levels share (g = 2) is compared. In a grid every cell is
    shared, and the words say the difference is averaged over g."""
    from study.report.comparisons import compare

    def tidy(cells):
        return pd.DataFrame(
            [
                {
                    "task": "SST-2",
                    "mode": "finetune",
                    "metric": "accuracy",
                    "init": "pretrained",
                    "pretrain_seed": s,
                    "f": f,
                    "g": g,
                    "value": v + 0.01 * s + 0.001 * s * s,
                }
                for f, g, v in cells
                for s in range(3)
            ]
        )

    spec = {"factor": "f", "a": 0.15, "b": 0.3}
    oat = tidy([(0.15, 2, 0.70), (0.3, 2, 0.72), (0.15, 4, 0.90)])  # g = 4 is +20 pp
    row = compare(oat, spec, others=["f", "g"]).iloc[0]
    assert row["diff"] == pytest.approx(0.02) and row["mean_a"] == pytest.approx(0.71 + 0.005 / 3 * 1)
    assert "averaged" not in row["interpretation"]
    assert compare(oat, spec).iloc[0]["diff"] == pytest.approx(0.02 - 0.10)  # what ignoring g gave
    grid = tidy([(0.15, 2, 0.70), (0.3, 2, 0.72), (0.15, 4, 0.90), (0.3, 4, 0.96)])
    row = compare(grid, spec, others=["f", "g"]).iloc[0]
    assert row["diff"] == pytest.approx(0.04) and row["interpretation"].endswith(
        "(averaged over g within each seed)"
    )


def _grid(cells: list[tuple], fac: str = "f", other: str = "g") -> pd.DataFrame:
    """Pre-trained tidy rows from (level, other factor's value, pre-training seed, fine-tune scores)."""
    return pd.DataFrame(
        [
            {
                "task": "SST-2",
                "mode": "finetune",
                "metric": "accuracy",
                "init": "pretrained",
                "pretrain_seed": s,
                "finetune_seed": i,
                fac: lv,
                other: g,
                "value": v,
            }
            for lv, g, s, vals in cells
            for i, v in enumerate(vals)
        ]
    )


GRID = {"factor": "f", "a": 0.15, "b": 0.4}


def test_compare_pairs_a_quoted_level():
    """A level written '0.15' (as a spec may quote it) is the level 0.15 (study/levels.py)."""
    cells = [(lv, 0, s, [0.7 + 0.1 * (lv == 0.3) + 0.01 * s]) for lv in (0.15, 0.3) for s in (0, 1)]
    row = compare(_grid(cells), {"factor": "f", "a": "0.15", "b": "0.3"}).iloc[0]
    assert row["n"] == 2 and row["diff"] == pytest.approx(0.1)


def test_a_grid_pairs_only_the_seeds_that_have_every_shared_cell():
    """b is +0.5 pp in every cell and seed; cell g=4 is +10 pp. Seed 3 lost its b run at g=4: its b mean
    covered only g=2 while its a mean covered both, a -4.5 pp difference that made the average -0.7 pp.
    Now seed 3 is left out of the pairs, and the words say so."""
    cells = []
    for s in range(4):
        for g, off in ((2, 0.0), (4, 0.10)):
            cells.append((0.15, g, s, [0.70 + off + 0.01 * s + 0.001 * s * s]))
            if not (s == 3 and g == 4):
                cells.append((0.4, g, s, [0.705 + off + 0.01 * s + 0.001 * s * s]))
    r = compare(_grid(cells), GRID, others=["g"]).iloc[0]
    assert r["diff"] == pytest.approx(0.005) and (r["n"], r["n_a"], r["n_b"]) == (3, 4, 4)
    assert r["interpretation"].endswith("(paired on 3 of 4 seeds) (averaged over g within each seed)")


def test_a_grid_weighs_each_cell_the_same_whatever_its_fine_tune_seed_count():
    """Cell g=4 (+20 pp) kept 1 of its 3 fine-tune seeds at b for seed 0: averaging rows weighted g=2 three
    to one there (-10 pp). Fine-tune seeds are averaged within each cell first: the difference is 0."""
    noise = {0: 0.004, 1: -0.007, 2: 0.012}
    cells = [
        (lv, g, s, [v + noise[s]] * (1 if (lv == 0.4 and g == 4 and s == 0) else 3))
        for lv in (0.15, 0.4)
        for g, v in ((2, 0.70), (4, 0.90))
        for s in range(3)
    ]
    r = compare(_grid(cells), GRID, others=["g"]).iloc[0]
    assert r["diff"] == pytest.approx(0.0, abs=1e-12) and r["n"] == 3


def test_levels_match_when_the_factor_column_is_float():
    """A factor column turns float64 when a run lacks the factor (one-at-a-time: the base run sets
    neither) or its levels mix int and float (0.5 and 1): 4 then reads 4.0, 1 reads 1.0, and matching
    by str() lost the comparison without a word."""
    rng = np.random.default_rng(1)
    rows = [
        {
            "task": "SST-2",
            "mode": "finetune",
            "metric": "accuracy",
            "init": "pretrained",
            "pretrain_seed": s,
            "finetune_seed": 0,
            "value": 0.7 + 0.02 * rng.standard_normal(),
            **{k: f.get(k) for k in ("r", "L")},
        }
        for f in ({}, {"L": 4}, {"L": 6}, {"r": 0.4})
        for s in range(3)
    ]
    t = pd.DataFrame(rows)
    assert t["L"].dtype == float
    r = compare(t, {"factor": "L", "a": 4, "b": 6}, others=["r", "L"])
    assert len(r) == 1 and r.iloc[0]["n"] == 3
    mixed = _grid([(lv, 2, s, [0.7 + 0.05 * (lv == 1) + 0.01 * s * s]) for lv in (0.5, 1) for s in range(3)])
    assert mixed["f"].dtype == float
    r = compare(mixed, {"factor": "f", "a": 1, "b": 0.5}).iloc[0]
    assert r["diff"] == pytest.approx(-0.05) and r["n"] == 3


def test_a_pair_without_a_shared_seed_is_kept_and_the_answer_says_so():
    """Seeds 0, 1 ran at a and seed 2 at b: no pair. The row used to vanish and the answer fell back to
    the best level as if no comparison had been asked for; it is kept with n = 0 and the note."""
    from pathlib import Path

    from study.report.prose import answer_sentence
    from study.report.studyfiles import StudyFiles

    t = _tidy({"accuracy": {"nsp": {0: 0.70, 1: 0.71}, "none": {2: 0.75}}})
    c = compare(t, SPEC, ("SST-2", "finetune", "accuracy"))
    r = c.iloc[0]
    assert len(c) == 1 and (r["n"], r["n_a"], r["n_b"]) == (0, 2, 1) and np.isnan(r["diff"])
    assert r["interpretation"] == f"n=0: {TOO_FEW_WORDS} (paired on 0 of 3 seeds)" and bool(r["primary"])
    plan = {"name": "t", "runs": [], "primary_metric": "SST-2/finetune/accuracy", "compare": SPEC}
    sf = StudyFiles(
        Path("."),
        {"plan": plan, "answer": r.to_dict()},
        summarize(t, [SPEC["factor"]]),
        c,
        pd.DataFrame(),
        pd.DataFrame(),
        pd.DataFrame(),
        factor_keys=[SPEC["factor"]],
    )
    text = answer_sentence(sf)["text"]
    assert text.startswith("none minus nsp") and "(paired on 0 of 3 seeds)" in text and "best" not in text


def test_an_exact_zero_difference_has_no_mde():
    """Every seed scored the same at both levels: the difference is exactly 0 with p = 1, but an SD of 0
    bounds no hidden effect, so the row has no MDE and the methods do not claim "differences of >= 0.0 pp"."""
    from pathlib import Path

    from study.report.aggregate import statistics_note
    from study.report.prose import methods_sentence
    from study.report.studyfiles import StudyFiles

    same = {0: 0.509, 1: 0.509, 2: 0.509}
    c = compare(_tidy({"accuracy": {"nsp": same, "none": same}}), SPEC, ("SST-2", "finetune", "accuracy"))
    r = c.iloc[0]
    assert (r["diff"], r["ci_low"], r["ci_high"], r["p_value"]) == (0, 0, 0, 1) and np.isnan(r["mde"])
    sf = StudyFiles(
        Path("."), {"plan": {"name": "t"}, "statistics": statistics_note(c)}, *[pd.DataFrame()] * 5
    )
    text = methods_sentence(sf)
    assert "could detect" not in text and "no minimum detectable effect" in text


def test_only_the_plans_fine_tune_seeds_and_tasks_are_read(tmp_path):
    """Seeds and tasks are not in the finetune_hash: after a spec drops a seed or a task, its old files
    still lie under the same hash and were averaged in (before); the plan's seeds and tasks decide."""
    from study.report.collect import collect

    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    run = _fake_run(layout, "r0", "nsp", 0, 100.0, 0.7)  # SST-2 finetune seeds 0 and 1
    f = layout.finetune_dir("r0") / "MRPC" / "ft" / "finetune-seed0.json"
    f.parent.mkdir(parents=True)
    f.write_text(
        json.dumps(
            {
                "run_key": "r0",
                "task": "MRPC",
                "mode": "finetune",
                "init": "pretrained",
                "seed": 0,
                "metrics": {"f1": 0.1},
                "primary_metric": "f1",
                "primary": 0.1,
                "n_eval": 408,
            }
        )
    )
    plan = {
        "name": "t",
        "finetune_hash": "ft",
        "runs": [{**run, "finetune_seeds": [0], "finetune_tasks": ["SST-2"]}],
    }
    ft = collect(plan, layout)["tidy"].query("task != 'pretrain'")
    assert set(ft["task"]) == {"SST-2"} and set(ft["finetune_seed"]) == {0}
    # a plan from before it carried them reads every file, as it did
    assert set(collect({**plan, "runs": [run]}, layout)["tidy"]["task"]) == {"pretrain", "SST-2", "MRPC"}
    # the dev rows each task was scored on, for the report's recipe sentence
    assert collect({**plan, "runs": [run]}, layout)["eval_rows"] == {"MRPC": [408]}


def test_a_deterministic_probe_of_one_random_baseline_is_one_unit_in_the_summary(tmp_path):
    """The probe ignores its seed, so one random baseline's probe written once per fine-tune seed is one
    measurement: summary.csv counted it n=3 with a zero-width CI (before); baseline_gain's rule now for both."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report_fixtures as rf

    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    runs = [
        rf._run(
            layout, f"r{s}", "x", s, {}, ppl=100.0, acc=0.7, rng=np.random.default_rng(s), tasks=("SST-2",)
        )
        for s in (0, 1, 2)
    ]
    for fs in (0, 1, 2):
        rf._w(
            layout.finetune_dir("random-base") / "SST-2" / "ft" / f"probe-seed{fs}.json",
            {
                "run_key": "random-base",
                "task": "SST-2",
                "mode": "probe",
                "init": "random",
                "seed": fs,
                "metrics": {"accuracy": 0.55},
                "primary_metric": "accuracy",
                "primary": 0.55,
            },
        )
    plan = {"name": "t", "runs": runs, "finetune_hash": "ft", "compare": None, "primary_metric": "ref_ppl"}
    summ = pd.read_csv(aggregate_study(plan, layout) / "summary.csv")
    rnd = summ[(summ["init"] == "random") & (summ["metric"] == "accuracy")].set_index("mode")
    assert rnd.loc["probe", "n"] == 1 and np.isnan(rnd.loc["probe", "ci_low"])
    assert rnd.loc["finetune", "n"] == 3  # the fine-tune seeds differ: three units, as before


def test_aggregate_carries_mlm_loss_finish_date_precision_and_fine_tune_commits(tmp_path):
    """curves.csv keeps the MLM loss apart from the total (which adds NSP/SOP's), runs.csv the finish date
    and precision of meta.json, and study.json each fine-tune result's git record (the report lists its commit)."""
    layout = Layout(root=tmp_path / "results", reports=tmp_path / "reports")
    runs = [_fake_run(layout, f"nsp{seed}", "nsp", seed, 100.0, 0.7) for seed in (0, 1)]
    d = layout.run_dir("nsp0")
    (d / "history.jsonl").write_text(
        json.dumps({"step": 1, "tokens": 10, "loss": 5.7, "mlm_loss": 5.0, "sentence_loss": 0.7}) + "\n"
    )
    (d / "meta.json").write_text(json.dumps({"finished": "2026-01-02T03:04:05+00:00", "precision": "bf16"}))
    f = layout.finetune_dir("nsp0") / "SST-2" / "ft" / "finetune-seed0.json"
    res = json.loads(f.read_text())
    f.write_text(
        json.dumps({**res, "provenance": {"git": {"commit": "f1e2", "dirty": None, "source": "git archive"}}})
    )
    plan = {
        "name": "t",
        "question": "q",
        "kind": "generic",
        "primary_metric": "SST-2/finetune/accuracy",
        "x": None,
        "hue": None,
        "finetune_hash": "ft",
        "runs": runs,
        "references": [],
    }
    out = aggregate_study(plan, layout)
    curves = pd.read_csv(out / "curves.csv").set_index("run_hash")
    assert curves.loc["nsp0", "mlm_loss"] == 5.0 and curves.loc["nsp0", "loss"] == 5.7
    assert pd.isna(curves.loc["nsp1", "mlm_loss"])  # a history without the key: empty, not an error
    r = pd.read_csv(out / "runs.csv").set_index("run_hash")
    assert r.loc["nsp0", "finished"].startswith("2026-01-02") and r.loc["nsp0", "precision"] == "bf16"
    ft = json.loads((out / "study.json").read_text())["finetune_provenance"]
    assert ft == {"nsp0/SST-2/finetune/0": {"commit": "f1e2", "dirty": None, "source": "git archive"}}


def test_the_dvc_metrics_count_of_runs_on_the_plateau_is_the_reports():
    """`not_beyond_mode` in results/metrics/study-<name>.json counted every run with learned False, the
    report only finished ones (a run killed between its metrics and its status reads pending): one rule now,
    collect.plateau_hashes."""
    from study.report.aggregate import study_metrics
    from study.report.collect import plateau_hashes

    runs = pd.DataFrame(
        {"run_hash": ["a", "b", "c"], "status": ["done", "pending", "done"], "learned": [False, False, True]}
    )
    plan = {"name": "t", "primary_metric": "ref_mlm_acc"}
    m = study_metrics(plan, runs, pd.DataFrame(), None, [])
    assert m["runs"]["not_beyond_mode"] == len(plateau_hashes(runs)) == 1


# --------------------------------------------------------------------------- pooled model, sees pre-training
def _six_levels(seed: int, sds=(1, 1, 1, 1, 1, 1)) -> dict:
    rng = np.random.default_rng(seed)
    seeds = rng.normal(0, 0.03, 3)
    names = ["nsp", "none", "sop", "fs", "ds", "sp"]
    return {
        lv: {s: 0.7 + seeds[s] + rng.normal(0, 0.01 * sd) for s in range(3)}
        for lv, sd in zip(names, sds, strict=True)
    }


def test_compare_uses_the_pooled_level_plus_seed_model_of_every_level():
    """6 levels x 3 seeds: compare's row is pooled.pooled_interval over all six levels (10 df), its MDE from
    that model's SD and df; a level missing a seed leaves the pool; a pair whose variance fails the check is
    the paired t, and the `model` column says which and why."""
    from study.report import pooled as P

    for seed in range(50):  # a draw that passes the variance check (about half do)
        v = _six_levels(seed)
        rest = [[v[lv][s] for s in range(3)] for lv in ("sop", "fs", "ds", "sp")]
        a, b = ([v[x][s] for s in range(3)] for x in ("nsp", "none"))
        iv = P.pooled_interval(b, a, rest)
        if iv.method.startswith(P.POOLED):
            break
    r = compare(_tidy({"accuracy": v}), SPEC, ("SST-2", "finetune", "accuracy")).iloc[0]
    assert (r["ci_low"], r["ci_high"], r["p_value"]) == pytest.approx((iv.low, iv.high, iv.p), rel=1e-12)
    assert r["model"].startswith(f"{P.POOLED} over 6 levels x 3 seeds (10 df") and r["test"].endswith(
        f"({P.POOLED})"
    )
    assert r["mde"] == pytest.approx(S.mde(iv.sd, 3, df=10), rel=1e-9) and r["mde"] < S.mde(iv.sd, 3)
    del v["sp"][2]  # level sp lacks seed 2: pooled over the 5 complete levels
    r = compare(_tidy({"accuracy": v}), SPEC, ("SST-2", "finetune", "accuracy")).iloc[0]
    rest[3][2] = float("nan")
    assert r["model"] == P.pooled_interval(b, a, rest).note and "5 levels" in r["model"]
    two = compare(_tidy({"accuracy": {k: v[k] for k in ("nsp", "none")}}), SPEC).iloc[0]
    assert two["model"] == "paired t on the two levels" and two["test"] == "paired t-test"
    wild = _six_levels(0, sds=(1, 30, 1, 1, 1, 1))
    r = compare(_tidy({"accuracy": wild}), SPEC, ("SST-2", "finetune", "accuracy")).iloc[0]
    assert (
        r["model"].startswith("paired t on the two levels: variance check failed")
        and r["test"] == "paired t-test"
    )


def test_sees_pretraining_rule_and_primary_check():
    """A downstream metric sees pre-training where some level's baseline interval lies above 0; none
    judged without an interval; reference metrics by the plateau test; cost metrics never. The primary
    check says which primary is used and whether it passes."""
    from study.report.sees import primary_check, sees_pretraining, sees_sentence

    base = pd.DataFrame(
        [
            {"task": "SST-2", "mode": "finetune", "metric": "accuracy", "diff": 0.01, "ci_low": -0.01},
            {"task": "SST-2", "mode": "finetune", "metric": "accuracy", "diff": 0.04, "ci_low": 0.005},
            {"task": "SST-2", "mode": "probe", "metric": "accuracy", "diff": -0.01, "ci_low": -0.03},
            {"task": "RTE", "mode": "finetune", "metric": "accuracy", "diff": 0.01, "ci_low": float("nan")},
        ]
    )
    runs = pd.DataFrame({"status": ["done", "done", "failed"], "learned": [True, False, None]})
    keys = [
        ("SST-2", "finetune", "accuracy"),
        ("SST-2", "probe", "accuracy"),
        ("RTE", "finetune", "accuracy"),
        ("MRPC", "finetune", "f1"),
        ("pretrain", "pretrain", "ref_mask_acc"),
        ("pretrain", "pretrain", "ref_keep_acc"),
        ("pretrain", "pretrain", "tokens_per_s"),
    ]
    s = sees_pretraining(base, runs, keys).set_index(["task", "mode", "metric"])
    verdicts = [s.loc[k, "sees_pretraining"] for k in keys]
    assert verdicts == [True, False, None, None, True, None, None]
    assert s.loc[keys[0], "why"].startswith(
        "pre-trained beats random init beyond seed noise at 1 of 2 levels"
    )
    assert "1 of 2 finished runs" in s.loc[keys[4], "why"]
    blind = primary_check(("SST-2", "probe", "accuracy"), s.reset_index())
    assert blind["passes"] is False and blind["metric"] == "SST-2/probe/accuracy"
    assert "does not see pre-training" in blind["sentence"] and "may not be primary" in blind["sentence"]
    ok = primary_check(("SST-2", "finetune", "accuracy"), s.reset_index())
    assert ok["passes"] is True and "so it may be primary" in sees_sentence(ok)
    assert primary_check(("pretrain", "pretrain", "ref_ppl"), s.reset_index())["passes"] is None


def test_aggregate_writes_sees_pretraining_and_the_pooled_model(tmp_path):
    """nsp_labels (5 labels x 3 seeds, compared by label): comparisons.csv has the model and a sees
    column, study.json the per-metric table and the primary check; reference accuracy by how the asked
    position was shown (mask / random / kept) is a tidy metric."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report_fixtures as rf

    from study.metrics import PRETRAIN_METRICS

    assert {"ref_mask_acc", "ref_rnd_acc", "ref_keep_acc"} <= set(PRETRAIN_METRICS)
    _, _, out = rf.build(tmp_path, "nsp_labels", failures=False)
    c = pd.read_csv(out / "comparisons.csv")
    assert c["model"].notna().all() and "sees_pretraining" in c
    prim = c[c["primary"]].iloc[0]
    assert str(prim["sees_pretraining"]) == "True"
    st = json.loads((out / "study.json").read_text())
    assert st["primary_sees_pretraining"]["passes"] is True
    assert st["statistics"]["primary"]["model"] == prim["model"]
    metrics = {r["metric"]: r["sees_pretraining"] for r in st["sees_pretraining"]}
    assert metrics["ref_mlm_acc"] is True and metrics["tokens_per_s"] is None
