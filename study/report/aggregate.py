"""Turn a study's run folders + fine-tune results into tidy tables (see docs/ARCHITECTURE.md).

Built ONLY from files on disk plus the plan dict, so a report can be regenerated
without any training code. Outputs go to layout.study_dir(plan["name"]):
results.parquet/.csv (tidy), runs.csv, summary.csv, comparisons.csv, baseline.csv, curves.csv, study.json.

Intervals, tests, the Holm correction and the minimum detectable effect come from
study.report.stats (docs/STATISTICS.md): one rule, an interval excludes 0 exactly when its test decides.
"""

from __future__ import annotations

import io as _io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from study.errors import StudyError
from study.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from study.levels import MISSING, level_key
from study.metrics import COST_METRICS, PRETRAIN, PRETRAIN_METRICS, parse_metric
from study.paths import Layout
from study.report import pooled as P
from study.report import sees as SP
from study.report import stats as S
from study.rundir import RunDir

NOISE_WORDS = "indistinguishable from noise"
TOO_FEW_WORDS = "too few seeds for an interval"
SAME_WORDS = "no test of seed noise"
# compare's notes after a verdict, "(paired on k of m seeds)" and "(averaged over X within each seed)":
# the report's headline keeps them when it shortens the verdict (render._verdict_words)
PAIRED_NOTE, AVERAGED_NOTE = "paired on", "averaged over"


def interpret(
    n: int, lo: float, hi: float, p_decide: float, a: str = "a", b: str = "b", *, method: str = ""
) -> str:
    """Words for a paired difference b - a under the one rule (study.report.stats): beyond seed noise
    exactly when `p_decide` (Holm-adjusted, or raw for the primary comparison) < ALPHA, which is
    exactly when the interval [lo, hi] drawn at the matching level excludes 0. `method` is the
    interval's: S.SAME_DIFF (the same non-zero difference in every seed) gets no test and no direction."""
    if n >= S.MIN_N and method == S.SAME_DIFF:
        return f"the same difference in every seed (n={n}): {SAME_WORDS}"
    if n < S.MIN_N or not (np.isfinite(lo) and np.isfinite(hi)):
        return f"n={n}: {TOO_FEW_WORDS}"
    if lo == hi == 0:  # e.g. the parameter count of two arms that differ only in masking
        return f"no difference in any seed (n={n})"
    if not p_decide < S.ALPHA:
        return f"{NOISE_WORDS} at n={n} seeds"
    return f"{b} {'higher' if lo > 0 else 'lower'} than {a} beyond seed noise at n={n} seeds"


def primary_key(plan: dict) -> tuple[str, str, str]:
    """(task, mode, metric) of the study's primary metric: the comparison that stays uncorrected."""
    return tuple(parse_metric(plan.get("primary_metric"), field="report.primary_metric"))  # type: ignore[return-value]


def holm_family(
    keys: list[tuple], ps: list[float], primary: tuple | None, ns: list[int] | None = None
) -> list[dict]:
    """Per row: the p that decides, the interval level that matches it, and the correction's name.

    The family is every row with a test (finite p) except the primary one and cost metrics (speed
    and size are descriptive, not hypotheses); those keep ALPHA and their raw p. A row without a
    test (NaN p) is never rejected and keeps a NaN p_adjusted; `ns` (units per row) tells "n<3" from
    "no test" (the same difference in every seed)."""
    fam = [
        i
        for i, (k, p) in enumerate(zip(keys, ps, strict=True))
        if np.isfinite(p) and k != primary and k[2] not in COST_METRICS
    ]
    adj, lev = S.holm([ps[i] for i in fam]), S.holm_levels([ps[i] for i in fam])
    out = []
    for i, (k, p) in enumerate(zip(keys, ps, strict=True)):
        if i in fam:
            j = fam.index(i)
            out.append(
                {
                    "p_adjusted": float(adj[j]),
                    "alpha": float(lev[j]),
                    "primary": False,
                    "correction": f"Holm over {len(fam)}",
                }
            )
        else:
            why = (
                "none (primary)"
                if k == primary
                else "none (cost metric)"
                if k[2] in COST_METRICS
                else f"none (n<{S.MIN_N})"
                if ns is None or ns[i] < S.MIN_N
                else "none (no test)"
            )
            out.append({"p_adjusted": p, "alpha": S.ALPHA, "primary": k == primary, "correction": why})
    return out


def learned(metrics: dict) -> bool | None:
    """The plateau test of one run's metrics: on the asked positions that show [MASK] (ref_mask_acc and
    its floor) when the run has them, else (a run scored before they existed; `study rescore` adds them)
    on every asked position. Why [MASK] only: the reference shows 10% of the asked tokens unchanged, any
    trained model copies them, so a model that knows only unigrams scores about 0.1 + 0.9 x the floor
    over all positions and passed the old test (docs/RESULTS.md, "the copy plateau").
    Where the run has them, beating the floor on the positions shown as another token (ref_rnd_acc) also
    counts: there too only context can answer (a copier scores below the floor), and a run trained
    without [MASK] (masking.mask 0, BERT Table 8) has never seen the token the [MASK] test shows it."""
    if metrics.get("ref_mask_acc") is not None:
        at_mask = learned_beyond_mode(
            metrics.get("ref_mask_acc"), metrics.get("ref_mask_mode_acc"), metrics.get("ref_mask_count")
        )
        at_rnd = learned_beyond_mode(
            metrics.get("ref_rnd_acc"), metrics.get("ref_rnd_mode_acc"), metrics.get("ref_rnd_count")
        )
        return True if at_rnd else at_mask
    return learned_beyond_mode(
        metrics.get("ref_mlm_acc"), metrics.get("ref_mode_acc"), metrics.get("ref_masked")
    )


def learned_beyond_mode(acc: Any, floor: Any, n: Any) -> bool | None:
    """Did a run learn more than its reference set's most frequent token? True when its reference
    accuracy beats always predicting that token (`ref_mode_acc`) by more than 3 binomial standard
    errors over the n asked positions. False flags a collapsed run (deep post-LN models at too high an
    lr predict one token everywhere) or one still on the unigram plateau: comparing it with others
    measures the failure, not the factor. None when the run predates the floor or has no accuracy."""
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (acc, floor, n)) or n <= 0:
        return None
    return bool(acc - floor > 3 * math.sqrt(floor * (1 - floor) / n))


def collect(plan: dict, layout: Layout) -> dict[str, pd.DataFrame]:
    """Read every run of the plan into tidy/runs/curves frames, and the fine-tune seeds that diverged."""
    for key in ("name", "runs", "finetune_hash"):
        if key not in plan:
            raise StudyError("missing from the study plan", field=key)
    factor_keys = sorted({k for r in plan["runs"] for k in r.get("factors", {})})
    tidy, runs, curves, ft_problems, ft_prov = [], [], [], [], {}
    eval_rows: dict[str, set] = {}  # task -> the dev rows its scores were computed on (the report's recipe)
    for r in plan["runs"]:
        # Run folders are read with study/rundir.py's one error policy (a damaged status.json is "pending").
        rd = RunDir(layout, r["run_hash"])
        st = rd.status()
        status, error, step = st.status, st.error, st.step
        meta, metrics = rd.meta(), rd.metrics()
        base = {
            "run_hash": r["run_hash"],
            "source_key": r["run_hash"],
            "label": r["label"],
            "status": status,
            "pretrain_seed": r["seed"],
            **{k: r.get("factors", {}).get(k) for k in factor_keys},
        }
        runs.append(
            {
                "run_hash": r["run_hash"],
                "label": r["label"],
                "status": status,
                "error": error,
                "step": step,
                "params": meta.get("params", metrics.get("params")),
                "tokens_per_s": metrics.get("tokens_per_s"),
                "wall_s": meta.get("wall_s"),
                "device": meta.get("device"),
                "data_hash": meta.get("data_hash"),
                "finished": meta.get("finished"),
                "precision": meta.get("precision"),
                "tokens_seen": metrics.get("tokens_seen"),
                "steps": metrics.get("steps"),
                "mfu": metrics.get("mfu"),
                "baseline_key": r.get("baseline_key"),
                "seed": r["seed"],
                "ref_mlm_acc": metrics.get("ref_mlm_acc"),
                "ref_mode_acc": metrics.get("ref_mode_acc"),
                "ref_mask_acc": metrics.get("ref_mask_acc"),
                "ref_mask_mode_acc": metrics.get("ref_mask_mode_acc"),
                # the kept and the randomly replaced asked positions, which BERT Table 8's splits train
                # differently: per run here, and tidy rows (summary, comparisons) as PRETRAIN_METRICS
                "ref_keep_acc": metrics.get("ref_keep_acc"),
                "ref_rnd_acc": metrics.get("ref_rnd_acc"),
                "ref_rnd_mode_acc": metrics.get("ref_rnd_mode_acc"),
                "ref_spread": metrics.get("ref_spread"),
                "learned": learned(metrics),
            }
        )
        if status == "done":
            for m in (*PRETRAIN_METRICS, *COST_METRICS):
                if isinstance(metrics.get(m), (int, float)) and not isinstance(metrics.get(m), bool):
                    tidy.append(
                        {
                            **base,
                            "finetune_seed": None,
                            "task": PRETRAIN,
                            "mode": PRETRAIN,
                            "init": "pretrained",
                            "metric": m,
                            "value": float(metrics[m]),
                        }
                    )
        for ev in rd.loss_curve():
            curves.append(
                {
                    "run_hash": r["run_hash"],
                    "label": r["label"],
                    "step": ev["step"],
                    "tokens": ev.get("tokens"),
                    "loss": ev["loss"],
                    "mlm_loss": ev.get("mlm_loss"),
                }
            )
        keys = [(r["run_hash"], "pretrained")]
        if r.get("baseline_key"):
            keys.append((r["baseline_key"], "random"))
        for run_key, init in keys:
            for f in sorted(layout.finetune_dir(run_key).glob(f"*/{plan['finetune_hash']}/*-seed*.json")):
                res = read_json(f)
                # seeds and tasks are not in the finetune_hash: files of ones the plan no longer asks for stay out
                if "skipped" in res or any(
                    r.get(k) is not None and res.get(x) not in r[k]
                    for k, x in (("finetune_seeds", "seed"), ("finetune_tasks", "task"))
                ):
                    continue
                if "diverged" in res:  # no score: listed in the report, never averaged as one
                    # a random-init baseline may be shared by several runs: named as what it is
                    ft_problems.append(
                        {
                            "run_hash": r["run_hash"],
                            "source_key": run_key,
                            "label": "random init" if init == "random" else r["label"],
                            "init": res.get("init", init),
                            "task": res["task"],
                            "mode": res["mode"],
                            "seed": res["seed"],
                            "error": res["diverged"],
                        }
                    )
                    continue
                if isinstance(res.get("provenance"), dict):  # the report lists fine-tuning's commits too
                    ft_prov[f"{run_key}/{res['task']}/{res['mode']}/{res['seed']}"] = res["provenance"].get(
                        "git"
                    )
                if isinstance(res.get("n_eval"), int):
                    eval_rows.setdefault(res["task"], set()).add(res["n_eval"])
                for m, v in res["metrics"].items():
                    if isinstance(v, (int, float)):
                        tidy.append(
                            {
                                **base,
                                "source_key": run_key,
                                "finetune_seed": res["seed"],
                                "task": res["task"],
                                "mode": res["mode"],
                                "init": res.get("init", init),
                                "metric": m,
                                "value": float(v),
                            }
                        )
    cols = [
        "run_hash",
        "source_key",
        "label",
        "status",
        "pretrain_seed",
        "finetune_seed",
        "task",
        "mode",
        "init",
        "metric",
        "value",
        *factor_keys,
    ]
    return {
        "tidy": pd.DataFrame(tidy, columns=cols),
        "runs": pd.DataFrame(runs),
        "curves": pd.DataFrame(curves, columns=["run_hash", "label", "step", "tokens", "loss", "mlm_loss"]),
        # a random-init baseline shared by several runs is one model: listed once
        "finetune_problems": list(
            {(p["source_key"], p["task"], p["mode"], p["seed"]): p for p in ft_problems}.values()
        ),
        "finetune_provenance": ft_prov,  # result file -> its git record
        "factor_keys": factor_keys,
        "eval_rows": {t: sorted(v) for t, v in sorted(eval_rows.items())},
    }


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
    rows = rows.assign(
        unit=np.where(n > 1, rows[source].astype(str), FT_UNIT + rows["finetune_seed"].astype(str))
    )
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
    return _units_of(
        tidy[tidy["init"] == "random"].drop_duplicates([*by, "source_key", "finetune_seed"]), by, "source_key"
    )


def _units(tidy: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    pre = _per_seed(tidy[tidy["init"] != "random"], by)
    return (
        pd.concat([pre, _random_units(tidy, by)], ignore_index=True)
        if (tidy["init"] == "random").any()
        else pre
    )


def summarize(tidy: pd.DataFrame, factor_keys: list[str]) -> pd.DataFrame:
    """Mean and 95% interval per task/mode/init/metric and factor level, one value per unit."""
    by = ["task", "mode", "init", "metric", *factor_keys]
    cols = [*by, "mean", "std", "n", "ci_low", "ci_high", "ci_method"]
    if tidy.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, g in _units(tidy, by).groupby(by, dropna=False):
        g = _replicates(g)  # a deterministic probe copied per fine-tune seed is one unit, as in baseline_gain
        iv = S.mean_interval(g["value"])  # iv.n: the finite units the mean and the interval use
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "mean": g["value"].mean(),
                "std": g["value"].std(ddof=1),
                "n": iv.n,
                "ci_low": iv.low,
                "ci_high": iv.high,
                "ci_method": iv.method,
            }
        )
    return pd.DataFrame(rows, columns=cols)


COMPARE_COLS = [
    "task",
    "mode",
    "metric",
    "a",
    "b",
    "mean_a",
    "mean_b",
    "diff",
    "sd_diff",
    "ci_low",
    "ci_high",
    "ci_level",
    "ci_method",
    "n",
    "n_a",
    "n_b",
    "p_value",
    "p_adjusted",
    "correction",
    "primary",
    "mde",
    "test",
    "interpretation",
    "model",  # the pooled level + seed model, or the paired t and why (pooled.pooled_interval's note)
]


def plateau_hashes(runs: pd.DataFrame) -> set[str]:
    """Run hashes of the finished runs that did not learn past always predicting the most frequent token
    (`learned` False in runs.csv, read back as a bool or a string): the report's floor guard, for the
    answer (render.plateau_runs) and beside the papers alike."""
    if runs.empty or not {"learned", "status", "run_hash"} <= set(runs.columns):
        return set()
    flat = (runs["status"].astype(str) == "done") & (runs["learned"].astype(str) == "False")
    return set(runs.loc[flat, "run_hash"].astype(str))


def compare(
    tidy: pd.DataFrame, spec: dict, primary: tuple | None = None, others: list[str] = ()
) -> pd.DataFrame:
    """Paired difference b - a per task/mode/metric, paired by pre-training seed.

    `primary` (task, mode, metric) is the study's headline: tested at ALPHA alone. Every other
    non-cost row is in one Holm family; its interval is drawn at the level Holm tests it at, so it
    excludes 0 exactly when p_adjusted < ALPHA. `mde`: the smallest difference a paired t-test at the
    row's own alpha (ALPHA for the primary and cost rows, the Holm level for the others) detects with
    80% power at this n, from this row's SD of the differences; NaN for a row without a test.
    `n_a`, `n_b`: the seeds each level has; `n` the seeds both have (the pairs), and the words say
    "(paired on k of m seeds)" when pairing dropped some (a row with no pair is kept, n = 0, and says so).

    `others`: the study's other factors. Only the cells (their value combinations) that both levels have
    are compared: in a one-at-a-time design the runs at a's default level include those that vary
    another factor, which b has no counterpart of, so averaging them in would confound the comparison.
    Where several cells are shared (a grid), fine-tune seeds are averaged within each cell and seed, only
    the seeds that have every shared cell at both levels are paired, each cell weighs the same within a
    seed, and the words say so."""
    fac = spec["factor"]
    if fac not in tidy.columns:
        raise StudyError(
            f"factor {fac!r} is not a factor of any run",
            field="compare.factor",
            allowed=", ".join(c for c in tidy.columns if "." in c) or "none",
        )
    t = tidy[tidy["init"] == "pretrained"]
    others = [k for k in others if k != fac and k in t.columns]
    if t.empty:
        return pd.DataFrame(columns=COMPARE_COLS)
    # Levels and cells as level keys (study/levels.py): a float64 column (a run without the factor,
    # levels 0.5 and 1) reads 4 as 4.0
    lv = t[fac].map(level_key)  # every level with a value stays: the pooled model's other levels (pooled.py)
    side = lv.map({level_key(spec["a"]): "a", level_key(spec["b"]): "b"}).fillna(
        ("=" + lv).where(lv != MISSING)
    )
    cell = t[others].map(level_key).agg("|".join, axis=1) if others else pd.Series("", index=t.index)
    t = t.assign(_side=side, _cell=cell)
    t = t[t["_side"].notna() & np.isfinite(t["value"].to_numpy(dtype=float))]
    # Fine-tune seeds averaged within each (cell, pre-training seed) first, so that every cell weighs the same
    per = (
        t.groupby(["task", "mode", "metric", "_side", "_cell", "pretrain_seed"])["value"].mean().reset_index()
    )
    pairs = []
    for (task, mode, metric), g in per.groupby(["task", "mode", "metric"]):
        shared = sorted(set(g.loc[g["_side"] == "a", "_cell"]) & set(g.loc[g["_side"] == "b", "_cell"]))
        if not shared:
            continue
        seeds = pd.Index(sorted(set(g["pretrain_seed"])))
        wa, wb = (
            g[g["_side"] == x]
            .pivot(index="pretrain_seed", columns="_cell", values="value")
            .reindex(index=seeds, columns=shared)
            for x in ("a", "b")
        )
        has_a, has_b = wa.notna().any(axis=1), wb.notna().any(axis=1)
        # Only seeds with every shared cell at both levels: a seed missing one would compare other cells
        full = wa.notna().all(axis=1) & wb.notna().all(axis=1)
        a, b = wa[full].mean(axis=1).to_numpy(), wb[full].mean(axis=1).to_numpy()
        averaged = f" ({AVERAGED_NOTE} {', '.join(others)} within each seed)" if len(shared) > 1 else ""
        rest = [
            _level_row(g[g["_side"] == x], seeds, shared)[full.to_numpy()]
            for x in sorted(set(g["_side"]) - {"a", "b"})
        ]
        pairs.append(
            (
                (task, mode, metric),
                a,
                b,
                int(has_a.sum()),
                int(has_b.sum()),
                int((has_a | has_b).sum()),
                averaged,
                rest,
            )
        )
    if not pairs:
        return pd.DataFrame(columns=COMPARE_COLS)
    first = [P.pooled_interval(p[2], p[1], p[7]) for p in pairs]
    fam = holm_family([p[0] for p in pairs], [iv.p for iv in first], primary, [iv.n for iv in first])
    rows = []
    for ((task, mode, metric), a, b, n_a, n_b, n_any, averaged, rest), iv0, h in zip(
        pairs, first, fam, strict=True
    ):
        iv = P.pooled_interval(b, a, rest, level=1 - h["alpha"]) if np.isfinite(iv0.p) else iv0
        words = interpret(
            iv.n, iv.low, iv.high, h["p_adjusted"], str(spec["a"]), str(spec["b"]), method=iv.method
        )
        if iv.n < n_any:  # seeds without a counterpart cannot be paired: say so, never drop them silently
            words += f" ({PAIRED_NOTE} {iv.n} of {n_any} seeds)"
        words += averaged
        rows.append(
            {
                "task": task,
                "mode": mode,
                "metric": metric,
                "a": spec["a"],
                "b": spec["b"],
                "mean_a": a.mean() if a.size else math.nan,
                "mean_b": b.mean() if b.size else math.nan,
                "diff": iv.estimate,
                "sd_diff": iv.sd,
                "ci_low": iv.low,
                "ci_high": iv.high,
                "ci_level": iv.level,
                "ci_method": iv.method,
                "n": iv.n,
                "n_a": n_a,
                "n_b": n_b,
                "p_value": iv0.p,
                "p_adjusted": h["p_adjusted"],
                "correction": h["correction"],
                "primary": h["primary"],
                # at the alpha this row's test uses (the Holm level for a secondary row); no test, no MDE
                "mde": S.mde(iv.sd, iv.n, alpha=h["alpha"], df=iv.df) if np.isfinite(iv0.p) else float("nan"),
                "test": _test_name(iv.method, "paired t-test"),
                "model": iv.note or "paired t on the two levels",
                "interpretation": words,
            }
        )
    return pd.DataFrame(rows, columns=COMPARE_COLS)


def _level_row(rows: pd.DataFrame, seeds: pd.Index, shared: list) -> np.ndarray:
    # One level's value per seed, averaged over the shared cells as compare averages a and b: NaN where the
    # seed lacks a cell, so pooled_interval leaves the level out of the pool (a complete block only)
    w = rows.pivot(index="pretrain_seed", columns="_cell", values="value").reindex(
        index=seeds, columns=shared
    )
    return w.mean(axis=1, skipna=False).to_numpy()


def _test_name(method: str, t_name: str) -> str:
    if method.startswith(P.POOLED):
        return f"t-test ({P.POOLED})"
    if method.startswith(("t on", "Welch")):
        return t_name
    return "inverted BCa interval" if method.startswith("BCa") else method


def _one_model(units: pd.DataFrame) -> bool:
    return bool(units["pretrain_seed"].astype(str).str.startswith(FT_UNIT).all())


def _replicates(units: pd.DataFrame) -> pd.DataFrame:
    """Fine-tune-seed units that all scored exactly the same are one measurement, not several: a
    deterministic procedure (the logistic probe on frozen features ignores the seed) repeated is not a
    replicate, and counting it would give a zero-width CI and p = 0."""
    if len(units) > 1 and _one_model(units) and units["value"].nunique() == 1:
        return units.iloc[:1]
    return units


def baseline_gain(tidy: pd.DataFrame, factor_keys: list[str], primary: tuple | None = None) -> pd.DataFrame:
    """What pre-training bought: pretrained minus random-init, per task/mode/metric and factor level.

    Unpaired (the baseline has no pre-training seed): Welch's t-interval and test, Holm across the
    table's rows (a family of its own). `primary` (task, mode, metric) is exempt from the correction
    only when one row answers it (a study with one design point, whose headline is this row). The
    unit is the pre-training seed; a level with one pre-training seed falls back to its fine-tune seeds.
    """
    by = ["task", "mode", "metric", *factor_keys]
    t = tidy[tidy["task"] != "pretrain"]
    cols = [
        *by,
        "mean_pretrained",
        "mean_random",
        "diff",
        "ci_low",
        "ci_high",
        "ci_level",
        "n_pretrained",
        "n_random",
        "p_value",
        "p_adjusted",
        "correction",
        "primary",
        "test",
        "interpretation",
    ]
    if t.empty or not (t["init"] == "random").any():
        return pd.DataFrame(columns=cols)
    pre = _pretrained_units(t[t["init"] == "pretrained"], by)
    rnd = _random_units(t, by)
    found = []
    for key, g in pre.groupby(by, dropna=False):
        sel = np.ones(len(rnd), dtype=bool)
        for k, v in zip(by, key, strict=True):
            sel &= (rnd[k].isna() if pd.isna(v) else (rnd[k] == v)).to_numpy()
        if sel.any():
            found.append(
                (
                    key,
                    _replicates(g)["value"].to_numpy(),
                    _replicates(rnd[sel])["value"].to_numpy(),
                    _one_model(g),
                )
            )
    keys = [tuple(k[:3]) for k, *_ in found]
    first = [S.welch_interval(g, r) for _, g, r, _ in found]
    fam = holm_family(
        keys, [iv.p for iv in first], primary if keys.count(primary) == 1 else None, ns=[iv.n for iv in first]
    )
    rows = []
    for (key, g, r, one), iv0, h in zip(found, first, fam, strict=True):
        iv = S.welch_interval(g, r, level=1 - h["alpha"]) if np.isfinite(iv0.p) else iv0
        sizes = (
            f"n={len(g)} fine-tuning seeds of one pre-trained model, {len(r)} random"
            if one
            else f"n={len(g)} pre-trained, {len(r)} random"
        )
        if iv.method == S.NO_SPREAD:
            words = f"every score the same on each side ({sizes}): {SAME_WORDS}"
        elif not (np.isfinite(iv.low) and np.isfinite(iv.high)):
            words = f"{TOO_FEW_WORDS} ({sizes}; {S.MIN_N} a side needed)"
        elif not h["p_adjusted"] < S.ALPHA:
            words = f"{NOISE_WORDS} ({sizes})"
        else:
            words = f"pre-training {'raises' if iv.low > 0 else 'lowers'} it beyond seed noise ({sizes})"
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "mean_pretrained": g.mean(),
                "mean_random": r.mean(),
                "diff": iv.estimate,
                "ci_low": iv.low,
                "ci_high": iv.high,
                "ci_level": iv.level,
                "n_pretrained": len(g),
                "n_random": len(r),
                "p_value": iv0.p,
                "p_adjusted": h["p_adjusted"],
                "correction": h["correction"],
                "primary": h["primary"],
                "test": _test_name(iv.method, "Welch t-test"),
                "interpretation": words,
            }
        )
    return pd.DataFrame(rows, columns=cols)


def _run_configs(plan: dict, layout: Layout) -> dict[str, dict]:
    """The semantic config of each run (corpus, model, budget): the report's scale statement needs it."""
    out = {}
    for r in plan["runs"]:
        if c := RunDir(layout, r["run_hash"]).config():
            out[r["run_hash"]] = {
                k: c.get(k) for k in ("seed", "corpus", "tokenizer", "objective", "masking", "model", "train")
            }
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


def study_metrics(
    plan: dict, runs: pd.DataFrame, summary: pd.DataFrame, answer: dict | None, factor_keys: list[str]
) -> dict:
    """The headline of a study for `dvc metrics show` (results/metrics/study-<name>.json, outside the
    study folder because DVC forbids a metrics file inside another output): run counts, the paired
    answer on the primary metric, and the primary metric per factor level."""
    status = runs["status"].value_counts().to_dict() if len(runs) else {}
    task, mode, metric = primary_key(plan)
    primary: dict[str, dict] = {}
    if len(summary):
        sel = summary[
            (summary["task"] == task)
            & (summary["mode"] == mode)
            & (summary["metric"] == metric)
            & (summary["init"] == "pretrained")
        ]
        for r in sel.to_dict("records"):
            level = ",".join(f"{k}={r[k]}" for k in factor_keys) or "base"
            primary[level] = {k: _num(r[k]) for k in ("mean", "ci_low", "ci_high", "n")}
    ans = None
    if answer:
        ans = {
            k: _num(answer.get(k))
            for k in ("diff", "ci_low", "ci_high", "n", "p_value", "mean_a", "mean_b", "sd_diff", "mde")
        }
        ans.update(
            {
                "a": str(answer.get("a")),
                "b": str(answer.get("b")),
                "interpretation": answer.get("interpretation"),
            }
        )
    collapsed = len(plateau_hashes(runs))  # the report's rule: finished runs only
    return {
        "study": plan["name"],
        "primary_metric": plan.get("primary_metric"),
        "runs": {
            "total": int(len(runs)),
            **{str(k): int(v) for k, v in status.items()},
            "not_beyond_mode": collapsed,
        },
        "answer": ans,
        "primary": primary,
    }


STATS_METHOD = (
    f"t-interval on n-1 df over pre-training seeds (BCa bootstrap, {S.N_RESAMPLES:,} resamples, "
    f"seed {S.BOOTSTRAP_SEED}, from n={S.BOOTSTRAP_MIN_N}); Welch t for pre-trained vs random init; "
    f"no interval below n={S.MIN_N}"
)
STATS_TEST = "two-sided paired t-test; Holm across the secondary comparisons, the primary one uncorrected"


def statistics_note(comps: pd.DataFrame) -> dict:
    """The numbers the report's methods paragraph states: alpha, thresholds, the Holm family's size,
    and the primary comparison's n, SD of paired differences and minimum detectable effect."""
    note = {
        "alpha": S.ALPHA,
        "min_n": S.MIN_N,
        "bootstrap_min_n": S.BOOTSTRAP_MIN_N,
        "power": S.POWER,
        "family": 0,
        "primary": None,
    }
    if len(comps):
        note["family"] = int(comps["correction"].astype(str).str.startswith("Holm").sum())
        p = comps[comps["primary"]]
        if len(p):
            r = p.iloc[0]
            note["primary"] = {
                "task": r["task"],
                "mode": r["mode"],
                "metric": r["metric"],
                "n": int(r["n"]),
                "sd_diff": _num(r["sd_diff"]),
                "mde": _num(r["mde"]),
                "model": r.get("model"),  # pooled level + seed model or paired t: the SD and MDE are its
            }
    return note


def measured_sd(study_dir: Path) -> dict | None:
    """The primary comparison's measured SD of paired differences and its n, from an aggregate's
    study.json (for `study plan --detect`); None when there is no aggregate or no finite SD yet."""
    p = Path(study_dir) / "study.json"
    if not p.exists():
        return None
    prim = ((read_json(p).get("statistics") or {}).get("primary")) or {}
    sd = prim.get("sd_diff")
    return prim if isinstance(sd, (int, float)) and math.isfinite(sd) and sd > 0 else None


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
    key = primary_key(plan)
    comps = (
        compare(
            done,
            plan["compare"],
            key,
            others=[] if plan["compare"].get("factor") == "label" else c["factor_keys"],
        )
        if plan.get("compare")
        else pd.DataFrame()
    )
    # Without a `compare`, a one-design-point study's headline is its baseline row: exempt it then only.
    base = baseline_gain(done, c["factor_keys"], None if plan.get("compare") else key)
    # Which metrics see pre-training (sees.py), per metric the tables list; a column of comparisons.csv too
    sees = SP.sees_pretraining(base, c["runs"], done[["task", "mode", "metric"]].itertuples(index=False))
    if len(comps):
        comps = comps.merge(sees[["task", "mode", "metric", "sees_pretraining"]], how="left")
    atomic_write_text(out / "comparisons.csv", _csv(comps))
    atomic_write_text(out / "baseline.csv", _csv(base))
    provenance: dict[str, Any] = {}
    for r in plan["runs"]:
        if m := RunDir(layout, r["run_hash"]).meta():
            provenance[r["run_hash"]] = {
                "data_hash": m.get("data_hash"),
                "device": m.get("device"),
                "provenance": m.get("provenance"),
            }
    answer = None
    if len(comps) and comps["primary"].any():
        # numpy scalars -> Python ones: study.json is written with default=str, which would quote them.
        answer = {
            k: (v.item() if isinstance(v, np.generic) else v)
            for k, v in comps[comps["primary"]].iloc[0].to_dict().items()
        }
    atomic_write_json(
        layout.root / "metrics" / f"study-{plan['name']}.json",
        study_metrics(plan, c["runs"], summarize(done, c["factor_keys"]), answer, c["factor_keys"]),
    )
    atomic_write_json(
        out / "study.json",
        {
            "plan": plan,
            "provenance": provenance,
            "answer": answer,
            "factor_keys": c["factor_keys"],
            "configs": _run_configs(plan, layout),
            "finetune_problems": c["finetune_problems"],
            "eval_rows": c["eval_rows"],
            "finetune_provenance": c["finetune_provenance"],
            "ci_method": STATS_METHOD,
            "test": STATS_TEST,
            "statistics": statistics_note(comps),
            "sees_pretraining": SP.records(sees),
            "primary_sees_pretraining": SP.primary_check(key, sees),
        },
    )
    return out
