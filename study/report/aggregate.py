"""Turn a study's run folders + fine-tune results into tidy tables (see docs/ARCHITECTURE.md).

Built ONLY from files on disk plus the plan dict, so a report can be regenerated
without any training code. Outputs go to layout.study_dir(plan["name"]):
results.parquet/.csv (tidy), runs.csv, summary.csv, comparisons.csv, baseline.csv, curves.csv, study.json.

Confidence intervals: percentile bootstrap over seeds, 10,000 resamples, numpy
Generator seeded from BOOTSTRAP_SEED. Paired test: scipy.stats.ttest_rel.
"""
from __future__ import annotations

import io as _io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from study.errors import StudyError
from study.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from study.paths import Layout

N_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95
NOISE_WORDS = "indistinguishable from noise"
PRETRAIN_METRICS = ("ref_mlm_loss", "ref_mlm_acc", "ref_ppl", "sentence_acc")
# Cost metrics ride along as tidy rows too, so the depth figure gets seed CIs for them.
COST_METRICS = ("tokens_per_s", "params", "tokens_seen", "mfu", "wall_s")


def bootstrap_ci(values, *, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                 level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean; (nan, nan) for fewer than 2 values."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)
    a = (1 - level) / 2
    return (float(np.quantile(means, a)), float(np.quantile(means, 1 - a)))


def bootstrap_diff_ci(a, b, *, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                      level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(a) - mean(b) for two UNPAIRED samples (each resampled alone)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    dx = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)
    dy = y[rng.integers(0, y.size, size=(n_resamples, y.size))].mean(axis=1)
    a_ = (1 - level) / 2
    return (float(np.quantile(dx - dy, a_)), float(np.quantile(dx - dy, 1 - a_)))


def interpret(lo: float, hi: float, n: int, p: float = float("nan"), a: str = "a", b: str = "b") -> str:
    """Words for a paired difference b - a.

    A difference counts as real only when the bootstrap CI excludes zero AND the paired
    t-test agrees (p < 0.05): with 3 seeds a percentile bootstrap alone is overconfident.
    """
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"not enough seeds for a CI (n={n})"
    if lo == hi == 0:  # e.g. the parameter count of two arms that differ only in masking
        return f"equal in every seed (n={n})"
    if lo <= 0 <= hi or not (np.isfinite(p) and p < 0.05):
        return f"{NOISE_WORDS} at n={n} seeds"
    return f"{b} {'higher' if lo > 0 else 'lower'} than {a} beyond seed noise at n={n} seeds"


def learned_beyond_mode(acc: Any, floor: Any, n: Any) -> bool | None:
    """Did a run learn more than its reference set's most frequent token? True when its reference
    accuracy beats always predicting that token (`ref_mode_acc`) by more than 3 binomial standard
    errors over the n asked positions. False flags a collapsed run (deep post-LN models at too high an
    lr predict one token everywhere): comparing it with others measures the failure, not the factor.
    None when the run predates the floor or has no accuracy."""
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (acc, floor, n)) or n <= 0:
        return None
    return bool(acc - floor > 3 * math.sqrt(floor * (1 - floor) / n))


def _read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_status(run_dir: Path) -> tuple[str, str | None, int | None]:
    # A folder without status.json is not complete, whatever else it holds.
    if not (run_dir / "status.json").exists():
        return "pending", None, None
    s = read_json(run_dir / "status.json")
    return s["status"], s.get("error"), s.get("step")


def collect(plan: dict, layout: Layout) -> dict[str, pd.DataFrame]:
    """Read every run of the plan into tidy/runs/curves frames."""
    for key in ("name", "runs", "finetune_hash"):
        if key not in plan:
            raise StudyError("missing from the study plan", field=key)
    factor_keys = sorted({k for r in plan["runs"] for k in r.get("factors", {})})
    tidy, runs, curves = [], [], []
    for r in plan["runs"]:
        rd = layout.run_dir(r["run_hash"])
        status, error, step = _run_status(rd)
        meta = read_json(rd / "meta.json") if (rd / "meta.json").exists() else {}
        metrics = read_json(rd / "metrics.json") if (rd / "metrics.json").exists() else {}
        base = {"run_hash": r["run_hash"], "source_key": r["run_hash"], "label": r["label"], "status": status,
                "pretrain_seed": r["seed"], **{k: r.get("factors", {}).get(k) for k in factor_keys}}
        runs.append({"run_hash": r["run_hash"], "label": r["label"], "status": status, "error": error,
                     "step": step, "params": meta.get("params", metrics.get("params")),
                     "tokens_per_s": metrics.get("tokens_per_s"), "wall_s": meta.get("wall_s"),
                     "device": meta.get("device"), "data_hash": meta.get("data_hash"),
                     "tokens_seen": metrics.get("tokens_seen"), "steps": metrics.get("steps"),
                     "mfu": metrics.get("mfu"), "baseline_key": r.get("baseline_key"), "seed": r["seed"],
                     "ref_mlm_acc": metrics.get("ref_mlm_acc"), "ref_mode_acc": metrics.get("ref_mode_acc"),
                     "learned": learned_beyond_mode(metrics.get("ref_mlm_acc"), metrics.get("ref_mode_acc"),
                                                    metrics.get("ref_masked"))})
        if status == "done":
            for m in (*PRETRAIN_METRICS, *COST_METRICS):
                if isinstance(metrics.get(m), (int, float)) and not isinstance(metrics.get(m), bool):
                    tidy.append({**base, "finetune_seed": None, "task": "pretrain", "mode": "pretrain",
                                 "init": "pretrained", "metric": m, "value": float(metrics[m])})
        for ev in _read_history(rd / "history.jsonl"):
            if "loss" in ev and "eval" not in ev:
                curves.append({"run_hash": r["run_hash"], "label": r["label"], "step": ev["step"],
                               "tokens": ev.get("tokens"), "loss": ev["loss"]})
        keys = [(r["run_hash"], "pretrained")]
        if r.get("baseline_key"):
            keys.append((r["baseline_key"], "random"))
        for run_key, init in keys:
            for f in sorted(layout.finetune_dir(run_key).glob(f"*/{plan['finetune_hash']}/*-seed*.json")):
                res = read_json(f)
                if "skipped" in res:
                    continue
                for m, v in res["metrics"].items():
                    if isinstance(v, (int, float)):
                        tidy.append({**base, "source_key": run_key, "finetune_seed": res["seed"], "task": res["task"],
                                     "mode": res["mode"], "init": res.get("init", init),
                                     "metric": m, "value": float(v)})
    cols = ["run_hash", "source_key", "label", "status", "pretrain_seed", "finetune_seed", "task", "mode", "init",
            "metric", "value", *factor_keys]
    return {"tidy": pd.DataFrame(tidy, columns=cols), "runs": pd.DataFrame(runs),
            "curves": pd.DataFrame(curves, columns=["run_hash", "label", "step", "tokens", "loss"]),
            "factor_keys": factor_keys}


def _per_seed(tidy: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    # Average fine-tune seeds within a pre-training seed: the pre-training seed is the unit.
    return tidy.groupby([*by, "pretrain_seed"], dropna=False)["value"].mean().reset_index()


FT_UNIT = "ft"  # prefix of a unit that is one fine-tune seed (of a single model) rather than a model


def _units_of(rows: pd.DataFrame, by: list[str], source: str) -> pd.DataFrame:
    """One row per independent unit: the `source` (a model) when a group has several, else the single
    model's fine-tune seeds. Returned with the unit in the `pretrain_seed` column."""
    if rows.empty:
        return pd.DataFrame(columns=[*by, "pretrain_seed", "value"])
    n = rows.groupby(by, dropna=False)[source].transform("nunique")
    rows = rows.assign(unit=np.where(n > 1, rows[source].astype(str), FT_UNIT + rows["finetune_seed"].astype(str)))
    rows = rows.groupby([*by, "unit"], dropna=False)["value"].mean().reset_index()
    return rows.rename(columns={"unit": "pretrain_seed"})


def _pretrained_units(tidy: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Pre-trained rows per unit: the pre-training seed, or, with a single pre-training seed, its
    fine-tune seeds (the comparison then speaks for that checkpoint, not for the pre-training recipe;
    `baseline_gain` says so in its words)."""
    return _units_of(tidy, by, "pretrain_seed")


def _random_units(tidy: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Random-init rows, one per independent unit.

    collect() repeats a `random-<hash>` baseline's results once per run that points at it; counting
    those copies as seeds would fake precision, so copies are dropped first. The unit is then the
    baseline itself when a group has several (one per pre-training seed: fine-tune seeds averaged
    within it, as for pre-trained runs), else the single baseline's fine-tune seed.
    Returned with the unit in the `pretrain_seed` column so it lines up with `_per_seed`.
    """
    return _units_of(tidy[tidy["init"] == "random"].drop_duplicates([*by, "source_key", "finetune_seed"]),
                     by, "source_key")


def _units(tidy: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    pre = _per_seed(tidy[tidy["init"] != "random"], by)
    return pd.concat([pre, _random_units(tidy, by)], ignore_index=True) if (tidy["init"] == "random").any() else pre


def summarize(tidy: pd.DataFrame, factor_keys: list[str]) -> pd.DataFrame:
    by = ["task", "mode", "init", "metric", *factor_keys]
    rows = []
    if tidy.empty:
        return pd.DataFrame(columns=[*by, "mean", "std", "n", "ci_low", "ci_high", "ci_method"])
    for key, g in _units(tidy, by).groupby(by, dropna=False):
        lo, hi = bootstrap_ci(g["value"])
        rows.append({**dict(zip(by, key)), "mean": g["value"].mean(), "std": g["value"].std(ddof=1),
                     "n": len(g), "ci_low": lo, "ci_high": hi, "ci_method": "percentile bootstrap, 10k"})
    return pd.DataFrame(rows)


def compare(tidy: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """Paired difference b - a per task/mode/metric, paired by pre-training seed."""
    fac = spec["factor"]
    if fac not in tidy.columns:
        raise StudyError(f"factor {fac!r} is not a factor of any run", field="compare.factor",
                         allowed=", ".join(c for c in tidy.columns if "." in c) or "none")
    t = tidy[tidy["init"] == "pretrained"]
    per = _per_seed(t, ["task", "mode", "metric", fac])
    rows = []
    for (task, mode, metric), g in per.groupby(["task", "mode", "metric"]):
        a = g[g[fac].astype(str) == str(spec["a"])].set_index("pretrain_seed")["value"]
        b = g[g[fac].astype(str) == str(spec["b"])].set_index("pretrain_seed")["value"]
        seeds = sorted(set(a.index) & set(b.index))
        if not seeds:
            continue
        d = (b[seeds] - a[seeds]).to_numpy()
        lo, hi = bootstrap_ci(d)
        p = float(stats.ttest_rel(b[seeds], a[seeds]).pvalue) if len(seeds) > 1 else float("nan")
        rows.append({"task": task, "mode": mode, "metric": metric, "a": spec["a"], "b": spec["b"],
                     "mean_a": a[seeds].mean(), "mean_b": b[seeds].mean(), "diff": d.mean(),
                     "ci_low": lo, "ci_high": hi, "n": len(seeds), "p_value": p,
                     "test": "scipy.stats.ttest_rel", "interpretation": interpret(lo, hi, len(seeds), p, str(spec["a"]), str(spec["b"]))})
    return pd.DataFrame(rows)


def _one_model(units: pd.DataFrame) -> bool:
    return bool(units["pretrain_seed"].astype(str).str.startswith(FT_UNIT).all())


def _replicates(units: pd.DataFrame) -> pd.DataFrame:
    """Fine-tune-seed units that all scored exactly the same are one measurement, not several: a
    deterministic procedure (the logistic probe on frozen features ignores the seed) repeated is not a
    replicate, and counting it would give a zero-width CI and p = 0."""
    if len(units) > 1 and _one_model(units) and units["value"].nunique() == 1:
        return units.iloc[:1]
    return units


def baseline_gain(tidy: pd.DataFrame, factor_keys: list[str]) -> pd.DataFrame:
    """What pre-training bought: pretrained minus random-init, per task/mode/metric and factor level.

    Unpaired (the baseline has no pre-training seed), so the CI is a two-sample bootstrap. The unit is
    the pre-training seed; a level with one pre-training seed falls back to its fine-tune seeds.
    """
    by = ["task", "mode", "metric", *factor_keys]
    t = tidy[tidy["task"] != "pretrain"]
    cols = [*by, "mean_pretrained", "mean_random", "diff", "ci_low", "ci_high", "n_pretrained", "n_random",
            "p_value", "interpretation"]
    if t.empty or not (t["init"] == "random").any():
        return pd.DataFrame(columns=cols)
    pre = _pretrained_units(t[t["init"] == "pretrained"], by)
    rnd = _random_units(t, by)
    rows = []
    for key, g in pre.groupby(by, dropna=False):
        sel = np.ones(len(rnd), dtype=bool)
        for k, v in zip(by, key):
            sel &= (rnd[k].isna() if pd.isna(v) else (rnd[k] == v)).to_numpy()
        r = rnd[sel]
        if r.empty:
            continue
        g, r = _replicates(g), _replicates(r)
        lo, hi = bootstrap_diff_ci(g["value"], r["value"])
        # Same rule as interpret(): the CI must exclude 0 AND a t-test (Welch, unpaired) must agree.
        p = float(stats.ttest_ind(g["value"], r["value"], equal_var=False).pvalue) \
            if len(g) > 1 and len(r) > 1 else float("nan")
        sizes = (f"n={len(g)} fine-tuning seeds of one pre-trained model, {len(r)} random" if _one_model(g)
                 else f"n={len(g)} pre-trained, {len(r)} random")
        if not (np.isfinite(lo) and np.isfinite(hi)):
            words = f"not enough seeds for a CI ({sizes})"
        elif lo <= 0 <= hi or not (np.isfinite(p) and p < 0.05):
            words = f"{NOISE_WORDS} ({sizes})"
        else:
            words = f"pre-training {'raises' if lo > 0 else 'lowers'} it beyond seed noise ({sizes})"
        rows.append({**dict(zip(by, key)), "mean_pretrained": g["value"].mean(), "mean_random": r["value"].mean(),
                     "diff": g["value"].mean() - r["value"].mean(), "ci_low": lo, "ci_high": hi,
                     "n_pretrained": len(g), "n_random": len(r), "p_value": p, "interpretation": words})
    return pd.DataFrame(rows, columns=cols)


def _run_configs(plan: dict, layout: Layout) -> dict[str, dict]:
    """The semantic config of each run (corpus, model, budget): the report's scale statement needs it."""
    out = {}
    for r in plan["runs"]:
        p = layout.run_dir(r["run_hash"]) / "config.json"
        if p.exists():
            c = read_json(p)
            out[r["run_hash"]] = {k: c.get(k) for k in ("seed", "corpus", "tokenizer", "objective", "masking",
                                                        "model", "train")}
    return out


def _num(x: Any) -> float | int | None:
    """JSON-safe number: NaN/inf become null (DVC's metrics reader rejects NaN)."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, (int, np.integer)):
        return int(x)
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def study_metrics(plan: dict, runs: pd.DataFrame, summary: pd.DataFrame, answer: dict | None,
                  factor_keys: list[str]) -> dict:
    """The headline of a study for `dvc metrics show` (results/metrics/study-<name>.json, outside the
    study folder because DVC forbids a metrics file inside another output): run counts, the paired
    answer on the primary metric, and the primary metric per factor level."""
    status = runs["status"].value_counts().to_dict() if len(runs) else {}
    parts = str(plan.get("primary_metric", "ref_ppl")).split("/")
    task, mode, metric = parts if len(parts) == 3 else ("pretrain", "pretrain", parts[-1])
    primary: dict[str, dict] = {}
    if len(summary):
        sel = summary[(summary["task"] == task) & (summary["mode"] == mode) & (summary["metric"] == metric)
                      & (summary["init"] == "pretrained")]
        for r in sel.to_dict("records"):
            level = ",".join(f"{k}={r[k]}" for k in factor_keys) or "base"
            primary[level] = {k: _num(r[k]) for k in ("mean", "ci_low", "ci_high", "n")}
    ans = None
    if answer:
        ans = {k: _num(answer.get(k)) for k in ("diff", "ci_low", "ci_high", "n", "p_value", "mean_a", "mean_b")}
        ans.update({"a": str(answer.get("a")), "b": str(answer.get("b")),
                    "interpretation": answer.get("interpretation")})
    collapsed = int((runs["learned"] == False).sum()) if "learned" in runs else 0  # noqa: E712 - None is unknown
    return {"study": plan["name"], "primary_metric": plan.get("primary_metric"),
            "runs": {"total": int(len(runs)), **{str(k): int(v) for k, v in status.items()},
                     "not_beyond_mode": collapsed},
            "answer": ans, "primary": primary}


def _csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False)


def aggregate_study(plan: dict, layout: Layout) -> Path:
    c = collect(plan, layout)
    out = layout.study_dir(plan["name"])
    tidy = c["tidy"]
    buf = _io.BytesIO()
    tidy.to_parquet(buf, index=False)
    atomic_write_bytes(out / "results.parquet", buf.getvalue())
    atomic_write_text(out / "results.csv", _csv(tidy))
    atomic_write_text(out / "runs.csv", _csv(c["runs"]))
    atomic_write_text(out / "curves.csv", _csv(c["curves"]))
    done = tidy[tidy["status"] == "done"]
    atomic_write_text(out / "summary.csv", _csv(summarize(done, c["factor_keys"])))
    comps = compare(done, plan["compare"]) if plan.get("compare") else pd.DataFrame()
    atomic_write_text(out / "comparisons.csv", _csv(comps))
    atomic_write_text(out / "baseline.csv", _csv(baseline_gain(done, c["factor_keys"])))
    provenance: dict[str, Any] = {}
    for r in plan["runs"]:
        mp = layout.run_dir(r["run_hash"]) / "meta.json"
        if mp.exists():
            m = read_json(mp)
            provenance[r["run_hash"]] = {"data_hash": m.get("data_hash"), "device": m.get("device"),
                                         "provenance": m.get("provenance")}
    answer = None
    if len(comps):
        pm = plan.get("primary_metric", "")
        parts = pm.split("/")
        sel = comps[(comps["task"] == parts[0]) & (comps["mode"] == parts[1]) & (comps["metric"] == parts[2])] \
            if len(parts) == 3 else comps[(comps["task"] == "pretrain") & (comps["metric"] == pm)]
        if len(sel):
            answer = sel.iloc[0].to_dict()
    atomic_write_json(layout.root / "metrics" / f"study-{plan['name']}.json",
                      study_metrics(plan, c["runs"], summarize(done, c["factor_keys"]), answer, c["factor_keys"]))
    atomic_write_json(out / "study.json", {"plan": plan, "provenance": provenance, "answer": answer,
                                           "factor_keys": c["factor_keys"], "configs": _run_configs(plan, layout),
                                           "ci_method": "percentile bootstrap, 10k resamples, seed 0",
                                           "test": "scipy.stats.ttest_rel"})
    return out
