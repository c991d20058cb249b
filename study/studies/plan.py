"""`study plan`: what a study will cost (tokens, parameters, measured step times x steps, scheduled over
`--jobs`) and, with `--detect EFFECT`, how many pre-training seeds its primary comparison needs. The
numbers come from studies/cost.py and report/stats.py; this module only tabulates and words them."""

from __future__ import annotations

from study.parallel import with_threads
from study.paths import Layout
from study.studies import cost  # estimate_seconds through the module: tests replace it there
from study.studies.cost import (
    finetune_is_bound,
    makespan,
    param_count,
    planned_tokens,
    study_finetune_seconds,
)
from study.studies.spec import PlannedRun, Study


def left_to_train(runs: list[PlannedRun], layout: Layout) -> list:
    """Configs of the runs that still train (what `--jobs auto` is sized by): a finished or diverged run
    returns at once."""
    return [r.config for r in runs if r.status(layout) not in ("done", "diverged")]


def plan_rows(study: Study, layout: Layout, jobs: int, timed: bool) -> tuple[list[dict], list]:
    """One row per run (what `study plan --json` prints), and the fine-tuning seconds of every run and
    baseline (None where a task's data is not on disk). Each run is timed with the threads it would get
    beside `jobs - 1` others."""
    ft_runs, ft_base = study_finetune_seconds(study.runs, layout, jobs) if timed else ({}, {})
    rows = []
    for run in study.runs:
        t = run.config.train
        secs = cost.estimate_seconds(with_threads(run.config, jobs)) if timed else None
        ft = ft_runs.get(run.run_hash)
        rows.append(
            {
                "hash": run.run_hash,
                "label": run.label,
                "seed": run.seed,
                "status": run.status(layout),
                "factors": run.factors,
                "est_tokens": planned_tokens(run.config),
                "est_seconds": round(secs, 3) if secs is not None else None,
                "est_finetune_seconds": round(ft, 3) if ft is not None else None,
                "finetune_upper_bound": finetune_is_bound(run.config),
                "budget": f"{t.amount:g} {t.budget}",
                "params_M": round(param_count(run.config) / 1e6, 2),
            }
        )
    return rows, [*ft_runs.values(), *ft_base.values()]


def plan_lines(study: Study, rows: list[dict], ft: list, jobs: int, timed: bool) -> list[str]:
    """The table and the totals `study plan` prints."""
    lines = [
        f"study {study.name}: {len(rows)} runs  ({study.spec.question})",
        f"{'hash':12}  {'status':8}  {'seed':>4}  {'params':>7}  {'tokens':>10}  {'est.time':>8}  label",
    ]
    for r in rows:
        est = f"{r['est_seconds'] / 60:.1f}min" if r["est_seconds"] is not None else "-"
        lines.append(
            f"{r['hash']:12}  {r['status']:8}  {r['seed']:>4}  {r['params_M']:>6}M  "
            f"{r['est_tokens'] or '-':>10}  {est:>8}  {r['label']}"
        )
    lines.append(f"total: {sum(r['est_tokens'] or 0 for r in rows):,} training tokens")
    if study.spec.search is not None:
        lines.append(plan_search(study, cost.estimate_seconds(study.runs[0].config) if timed else None))
    if not timed:
        return [*lines, "time: not estimated (--no-time)"]
    pending = [r["est_seconds"] or 0 for r in rows if r["status"] != "done"]
    return lines + _time_lines(pending, ft, jobs, any(r["finetune_upper_bound"] for r in rows))


def plan_search(study: Study, trial_run_s: float | None) -> str:
    """`study plan` on a spec with a `search:` block: trials x seeds x the spec's run, as a worker trains it
    (the searched values change each trial's cost: the spec's own run is the one timed)."""
    s = study.spec.search
    runs = f"{len(s.seeds)} run{'s' if len(s.seeds) > 1 else ''}"
    tokens = (planned_tokens(study.runs[0].config) or 0) * len(s.seeds)
    if s.n_trials is None:
        return f"search: until {s.timeout:g} s per worker; each trial {runs} ({tokens:,} tokens)"
    per = f", ~{trial_run_s * len(s.seeds) / 60:.1f} min each" if trial_run_s is not None else ""
    total = f": ~{trial_run_s * len(s.seeds) * s.n_trials / 60:.0f} min on one worker" if per else ""
    return (
        f"search: {s.n_trials} trials x {runs} ({tokens:,} tokens{per}){total}; then search-best's "
        f"{len(s.best_seeds)} seeds as a study (pruned trials stop early; the searched values change each "
        "trial's cost, the spec's own run is the one timed)"
    )


def _time_lines(pending: list[float], ft: list, jobs: int, bound: bool) -> list[str]:
    ft_wall = None if None in ft else (sum(ft) if jobs == 1 else makespan(ft, jobs))
    if ft_wall is None:
        ft_text = "unknown (task data not on disk)"
    else:
        amount = f"{ft_wall / 60:.0f} min" if jobs == 1 else f"{ft_wall / 60:.0f} min wall"
        ft_text = (
            f"at most {amount} (GLUE from the hub, not downloaded: its published row counts, every row "
            "at finetune.max_length)"
            if bound
            else f"~{amount}"
        )
    pre_wall = sum(pending) if jobs == 1 else makespan(pending, jobs)
    pre_text = (
        f"~{pre_wall / 60:.0f} min"
        if jobs == 1
        else f"~{pre_wall / 60:.0f} min wall ({sum(pending) / 60:.0f} min of runs, {jobs} at a time)"
    )
    lines = [
        f"still to do on this machine: pre-training {pre_text}, fine-tuning and probes {ft_text} (measured "
        f"step times x steps{'; side-by-side contention not modelled' if jobs > 1 else ''}; data preparation "
        "and evaluation not included)"
    ]
    if (
        ft_wall is not None
    ):  # the figure to hold against a budget (issue 21: a cpu study within 3 h on 2 cores)
        h, m = divmod(round((pre_wall + ft_wall) / 60), 60)
        lines.append(
            f"in all: ~{h} h {m:02d} min{' wall' if jobs > 1 else ''} (the two above; against cpu studies measured "
            "whole, 5-20% low: evaluation, loading and contention are not in it)"
        )
    return lines


def plan_detect(study: Study, layout: Layout, effect: str, sd: str | None) -> str:
    """`study plan SPEC --detect 1pp [--sd S]`: pre-training seeds the primary comparison needs."""
    # Lazy: the aggregate imports pandas; only --detect needs it, not every `study plan`.
    from study.metrics import metric_range, parse_metric
    from study.report.aggregate import measured_sd
    from study.report.stats import detect_plan

    metric = parse_metric(study.spec.report.primary_metric, field="report.primary_metric")
    bounds = metric_range(metric.name)
    bounded = bounds is not None
    span = bounds[1] - bounds[0] if bounds else 1.0  # the widest difference
    d = detect_plan(
        effect, sd=sd, measured=measured_sd(layout.study_dir(study.name)), bounded=bounded, span=span
    )
    unit = (lambda v: f"{100 * v:.2g} pp") if bounded else (lambda v: f"{v:.3g}")
    seeds = f"{d['seeds']} pre-training seeds" if d["seeds"] else "more than 10,000 pre-training seeds"
    return (
        f"study {study.name}, primary metric {metric}: to detect a difference of {unit(d['effect'])} with "
        f"{100 * d['power']:.0f}% power (two-sided paired t-test, alpha {d['alpha']:g}) at an SD of paired "
        f"differences of {unit(d['sd'])} ({d['sd_source']}): {seeds} per level."
    )
