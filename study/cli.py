"""Command line: `study <command> ...`. Thin: parse arguments, call the library, map errors to exit codes.

A `StudyError` (bad spec, bad input) prints one clear message and exits 2 before anything is
written. Each subcommand's work lives in its own module; this file only wires them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from study import parallel
from study.cpu import add_threads_option, threads_from_args
from study.errors import EXIT_DIVERGED, StudyError, run_main
from study.executors import Steps, add_executor_options, add_status_parser
from study.makecli import add_parser as add_make_parser
from study.paths import SAFE_NAME_ALLOWED, Layout, check_folders, safe_name
from study.root import project_root
from study.rundir import RunDir
from study.search.cli import add_parser as add_search_parser
from study.work import finetune_items, finetune_one, ft_summary, pct, pretrain_one, progress, rescore_runs


def _layout(args) -> Layout:
    return Layout(root=Path(args.results), reports=Path(args.reports))


def _study(args):
    return _load_checked(args.spec, args.profile)


def _load_checked(path, profile):
    """The spec, with its `search:` block checked too (keys, ranges, objective) when it has one."""
    # lazy: spec.py imports scipy (3 s of study --help)
    from study.studies.spec import load_study

    if profile is not None and not safe_name(profile):  # it names folders (results/studies/<name>-<profile>)
        raise StudyError(f"{profile!r} is not a profile name", field="--profile", allowed=SAFE_NAME_ALLOWED)
    study = load_study(path, profile=profile)
    if study.spec.search is not None:
        from study.search import load_search  # lazy like load_study: `study --help` stays light

        load_search(path, profile=profile)
    return study


# --------------------------------------------------------------------------- commands
def cmd_validate(args) -> int:
    # lazy: spec.py imports scipy (3 s of study --help)
    from study.studies.hints import hint_warnings, study_factors
    from study.studies.spec import load_study

    for path in args.specs:
        study = _load_checked(path, args.profile)
        # every profile's values too (not its corpus files: this machine may lack them)
        if args.profile is None:
            for name in study.spec.profiles:
                try:
                    load_study(path, profile=name, fingerprint=False)
                except StudyError as exc:  # say which profile, unless the field already does (profiles.<p>.x)
                    if (exc.field or "").startswith(f"profiles.{name}."):
                        raise
                    raise exc.replace(message=f"{exc.message} (with --profile {name})") from None
        r = study.spec.report  # report hints about other factors than the study's: a warning, exit 0
        for w in hint_warnings(r.kind, r.references, study_factors(study)):
            print(f"{path}: warning: {w}", file=sys.stderr)
        print(f"{path}: ok ({len(study.runs)} runs)")
    return 0


def cmd_plan(args) -> int:
    # lazy: spec.py imports scipy (3 s of study --help)
    from study.studies.plan import left_to_train, plan_detect, plan_lines, plan_rows

    study, layout = _study(args), _layout(args)
    if args.detect is not None:
        print(plan_detect(study, layout, args.detect, args.sd))
        return 0
    if args.sd is not None:  # silently ignoring it would look like an answer that used it
        raise StudyError("is used only with --detect", field="--sd", allowed="--detect EFFECT --sd SD")
    # --jobs: each run timed with the threads it would get beside the others, the wall time scheduled
    jobs = parallel.resolve_jobs(args.jobs, left_to_train(study.runs, layout))
    rows, ft = plan_rows(study, layout, jobs, timed=not args.no_time)
    print(
        json.dumps(rows, indent=2)
        if args.json
        else "\n".join(plan_lines(study, rows, ft, jobs, not args.no_time))
    )
    return 0


def cmd_data(args) -> int:
    # lazy: tokenizers and transformers (1.5 s)
    from study.data.prepare import describe, prepare_data

    study = _study(args)
    if args.samples < 0:  # checked before the data is prepared
        raise StudyError(f"got {args.samples}", field="--samples", allowed="an integer >= 0")
    run = study.select([args.run] if args.run else None)[0]  # --run: its masking shown, not the first run's
    prepared = prepare_data(run.config, _layout(args), progress=not args.quiet)
    print(f"run {run.run_hash} ({run.label}, seed {run.seed}): masking {run.config.masking.model_dump()}")
    print(describe(prepared, n=args.samples))
    return 0


def cmd_prepare(args) -> int:
    # lazy: tokenizers and transformers (1.5 s)
    from study.data.prepare import prepare_data

    study = _study(args)
    known = sorted({r.config.data_hash() for r in study.runs})
    if unknown := sorted(set(args.data or []) - set(known)):  # all checked before any is prepared
        raise StudyError(
            f"no run of this spec uses data {', '.join(unknown)}", field="--data", allowed=", ".join(known)
        )
    done = set()
    for run in study.runs:
        if run.config.data_hash() in done or (args.data and run.config.data_hash() not in args.data):
            continue
        prepared = prepare_data(run.config, _layout(args), progress=not args.quiet)
        done.add(run.config.data_hash())
        print(f"data {run.config.data_hash()} ready at {prepared.dir}")
    return 0


def cmd_pretrain(args) -> int:
    """Train the study's runs. A failed or diverged run is recorded and the others go on;
    the exit status says what happened (0 all done, 3 a run diverged, 1 a run failed) unless
    --keep-going (used by dvc.yaml) asks for 0 so the pipeline carries on to the report.
    --jobs N trains N runs side by side, one process each (study/parallel.py), the longest (in training
    FLOPs) first."""
    # lazy: spec.py imports scipy (3 s of study --help)
    from study.studies.cost import training_flops
    from study.studies.plan import left_to_train

    study, layout = _study(args), _layout(args)
    runs = study.select(args.run)
    jobs = parallel.resolve_jobs(getattr(args, "jobs", 1), left_to_train(runs, layout))
    if jobs > 1:  # the longest runs first, so that none of them starts last beside idle cores
        runs = sorted(runs, key=lambda r: -training_flops(r.config))
    items = [(run, (parallel.with_threads(run.config, jobs), layout, args.quiet, run.label)) for run in runs]
    worst, t0 = 0, time.monotonic()
    for i, (run, (code, seconds)) in enumerate(parallel.run_all(pretrain_one, items, jobs), 1):
        worst = max(worst, code)
        rd = RunDir(layout, run.run_hash)
        rd.publish()  # metrics and loss-curve copies for `dvc metrics/plots show`
        progress(
            f"pretrain {i}/{len(runs)} {run.run_hash} {rd.status().status} in {seconds:.0f} s, "
            f"ref acc {pct(rd.metrics().get('ref_mlm_acc'))}  {run.label} seed{run.seed}"
            + (f" ({time.monotonic() - t0:.0f} s since start, {jobs} jobs)" if jobs > 1 else "")
        )
    return 0 if args.keep_going else worst


def cmd_finetune(args) -> int:
    """Fine-tune (and probe) finished runs, or with --baseline KEY the random-init baseline.
    --jobs N fine-tunes N models side by side, one process each (study/parallel.py)."""

    study, layout = _study(args), _layout(args)
    parallel.resolve_jobs(
        getattr(args, "jobs", 1), []
    )  # a bad --jobs fails here, before a skipped.json is written
    runs = None if args.baseline or not args.run else study.select(args.run)
    items = finetune_items(study, layout, runs, args.baseline, args.quiet)
    jobs = parallel.resolve_jobs(getattr(args, "jobs", 1), [cfg for _, (_, cfg, _, _) in items])
    items = [
        (label, (kind, parallel.with_threads(cfg, jobs), lay, quiet))
        for label, (kind, cfg, lay, quiet) in items
    ]
    for i, (label, (res, seconds)) in enumerate(parallel.run_all(finetune_one, items, jobs), 1):
        progress(
            f"{label} ({i}/{len(items)}) done in {seconds:.0f} s: {ft_summary(res)}  ({study.name} recipe)"
        )
    return 0


def cmd_rescore(args) -> int:
    """Score finished runs again on the fixed reference; add the metrics fields they lack (study/pretrain/rescore.py)."""
    study, layout = _study(args), _layout(args)
    failed, added = rescore_runs(study.select(args.run), layout, args.quiet)
    if added:
        print(
            "next: `study aggregate` and `study report` (or `study run`, which reuses every finished run); "
            "under DVC, `dvc repro -f -s study-<name>`: run folders are not DVC outputs, so DVC does not see "
            "the rescore; the forced stage retrains nothing (every run is finished) and re-aggregates"
        )
    return 1 if failed else 0


def cmd_aggregate(args) -> int:
    # lazy: pandas, matplotlib (seconds)
    from study.report.aggregate import aggregate_study

    study, layout = _study(args), _layout(args)
    out = aggregate_study(study.plan_dict(layout), layout)
    print(f"aggregate written to {out}")
    return 0


def cmd_report(args) -> int:
    # lazy: pandas, matplotlib (seconds)
    from study.report.render import render_index, render_report
    from study.report.searchreport import search_inputs

    study, layout = _study(args), _layout(args)
    # a search's trials table (results/search/<name>/trials.csv) is read with the search's own direction:
    # the best trial of a maximized objective is the largest value
    search = study.spec.search
    # a search renders with its trials and their plateau guard, aggregated first if need be (searchreport.py)
    trials = search_inputs(study.plan_dict(layout), layout, args.quiet) if search is not None else None
    out = render_report(
        layout.study_dir(study.name),
        layout.report_dir(study.name),
        search_trials=trials,
        search_direction=search.resolved_direction if search is not None else "minimize",
    )
    render_index(layout.reports)
    print(f"report written to {out}")
    return 0


def cmd_papers(args) -> int:
    """The study's "beside the papers" rows as Markdown on stdout (from its aggregate, as the report)."""
    # lazy: pandas, matplotlib (seconds)
    from study.report.papers import papers_markdown
    from study.report.studyfiles import load_study_dir

    study, layout = _study(args), _layout(args)
    print(papers_markdown(load_study_dir(layout.study_dir(study.name))), end="")
    return 0


def cmd_run(args) -> int:
    """Everything for one study without DVC: data, pre-training, fine-tuning, aggregate, report."""

    parallel.resolve_jobs(args.jobs, [])  # a bad --jobs or --run fails before the data is prepared
    _study(args).select(args.run)
    args.keep_going, args.baseline, args.data = True, None, None
    for step in (cmd_prepare, cmd_pretrain, cmd_finetune, cmd_aggregate, cmd_report):
        step(args)
    return 0


def cmd_curve(args) -> int:
    """Learning curve of one run (study/pretrain/curve.py): trained with evals every K steps into the run's
    own folder (impl.eval_every is outside the run hash), or read from the finished run; CSV + PNG."""
    # lazy: torch; pandas, matplotlib (seconds)
    from study.pretrain.curve import curves_dir, learning_curve, select_run, summary, write_csv
    from study.report.curves import save_curve_png

    study, layout = _study(args), _layout(args)
    run = select_run(study, args.run)
    curve = learning_curve(run.config, layout, args.every, quiet=args.quiet)
    out = curves_dir(layout)
    write_csv(curve.rows, out / f"{curve.run_hash}.csv")
    save_curve_png(
        {f"{run.label}, seed {run.seed}": curve.rows},
        out / f"{curve.run_hash}.png",
        title=f"{study.name}: run {curve.run_hash}",
    )
    print(summary(curve, run.label, run.seed))
    print(f"curve written to {out / curve.run_hash}.csv and .png")
    return EXIT_DIVERGED if curve.status == "diverged" else 0


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="study", description="BERT pre-training ablation studies.")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--reports", default="reports", help="reports folder (default: reports)")
    sub = p.add_subparsers(dest="command", required=True)
    v_help = "check specs (every profile, every run built); exit 2 naming the bad field; warn on report hints"
    v = sub.add_parser("validate", help=v_help, description=v_help)
    v.add_argument("specs", nargs="+", help="spec files, e.g. ablations/*.yaml")
    v.add_argument("--profile", help="check this profile only (default: the spec and each of its profiles)")
    v.set_defaults(fn=cmd_validate)
    _add_plan(sub)
    _add_training(sub)
    _add_results(sub)
    for name in (
        "plan",
        "pretrain",
        "finetune",
        "run",
        "curve",
        "rescore",
    ):  # every command that trains or scores
        add_threads_option(sub.choices[name])
    add_search_parser(sub)  # `study search`, `study search-best`
    add_make_parser(sub)  # `study new`, `export`, `sync`, `select`, `deselect`
    return p


def _spec_cmd(sub, name, fn, help_, runs=False):
    """A command on one spec: `study NAME SPEC [--profile P] [--quiet] [--run R ...]`."""
    sp = sub.add_parser(name, help=help_, description=help_)
    sp.add_argument("spec", help="a study spec, e.g. ablations/smoke.yaml")
    sp.add_argument("--profile", help="a profile defined in the spec (e.g. cpu, gpu)")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    if runs:
        sp.add_argument(
            "--run",
            action="append",
            help="only this run: its hash, or a label (all its seeds); repeatable",
        )
    sp.set_defaults(fn=fn)
    return sp


def _add_plan(sub) -> None:
    plan = _spec_cmd(
        sub, "plan", cmd_plan, "the runs table: hash, factors, status, estimated tokens and time"
    )
    plan.add_argument("--json", action="store_true", help="the runs table as JSON on stdout")
    plan.add_argument("--no-time", action="store_true", help="skip timing a few steps of each model")
    plan.add_argument(
        "--jobs",
        default="auto",
        help="estimate for `--jobs N|auto`: each run timed with cores/N "
        "threads, the wall time scheduled over N workers (default auto, as the DVC stages run them; "
        "give the --jobs you will give `study run`)",
    )
    plan.add_argument(
        "--detect",
        metavar="EFFECT",
        help="instead of the runs table: pre-training seeds needed to "
        "detect this difference on the primary metric (1pp, or 0.01 in the metric's units)",
    )
    plan.add_argument(
        "--sd",
        type=float,
        help="with --detect: SD of paired differences between seeds (default: "
        "measured in the study's aggregate, else a 1 pp pilot guess for scores)",
    )


def _add_training(sub) -> None:
    """data, prepare, pretrain, finetune, rescore, run: the commands that compute."""
    d = _spec_cmd(
        sub, "data", cmd_data, "prepare the corpus and tokenizer; print stats and decoded sample instances"
    )
    d.add_argument(
        "--samples", type=int, default=3, help="training instances shown with their masks (default 3)"
    )
    d.add_argument(
        "--run", help="the run (hash or label) whose masking and objective are shown (default: the first)"
    )
    _spec_cmd(
        sub, "prepare", cmd_prepare, "prepare corpus, tokenizer and tokenized splits for every run"
    ).add_argument("--data", action="append", help="only this data hash (repeatable; dvc.yaml's data stages)")
    pre = _spec_cmd(sub, "pretrain", cmd_pretrain, "pre-train the study's runs (or --run HASH)", runs=True)
    pre.add_argument(
        "--keep-going", action="store_true", help="exit 0 after recording a failed/diverged run (dvc.yaml)"
    )
    ft = _spec_cmd(sub, "finetune", cmd_finetune, "fine-tune and probe the study's finished runs", runs=True)
    ft.add_argument(
        "--baseline", action="append", help="only the random-init baseline with this key (repeatable)"
    )
    _spec_cmd(
        sub,
        "rescore",
        cmd_rescore,
        "score finished runs again on the fixed reference; add the metrics "
        "fields they lack (e.g. ref_mode_acc); exit 1 if stored scores do not reproduce",
        runs=True,
    )
    run = _spec_cmd(sub, "run", cmd_run, "everything for one study, without DVC", runs=True)
    for sp in (pre, ft, run):
        sp.add_argument(
            "--jobs",
            default="1",
            help="runs trained / fine-tuned side by side, one process "
            "each with cores/N threads (speed only: the run hashes are unchanged; default 1); auto: "
            "one per core when the runs train on the CPU, 1 on an accelerator (the DVC stages' choice)",
        )
        add_executor_options(sp, Steps(pretrain_one, main, cmd_aggregate, cmd_report))  # --executor slurm
    add_status_parser(sub)


def _add_results(sub) -> None:
    """aggregate, report, papers, curve: the commands that read results into tables and figures."""
    _spec_cmd(sub, "aggregate", cmd_aggregate, "build the study's tidy tables from its run folders")
    _spec_cmd(sub, "report", cmd_report, "render the study's HTML report from its aggregate")
    _spec_cmd(
        sub,
        "papers",
        cmd_papers,
        'print the report\'s "beside the papers" rows as Markdown (from the aggregate)',
    )
    c = _spec_cmd(
        sub,
        "curve",
        cmd_curve,
        "learning curve of one run: reference MLM accuracy/loss vs tokens and "
        "seconds, evals every K steps (same run folder as the study's); CSV + PNG in results/curves/",
    )
    c.add_argument("--run", help="the run's hash or label (default: the spec's first run)")
    c.add_argument(
        "--every", type=int, default=50, help="steps between evals when the run trains (default 50)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)

    def body() -> int:
        with project_root(args, argv):  # study/root.py: the folder with params.yaml, as git/DVC find theirs
            check_folders({"--results": args.results, "--reports": args.reports})
            with threads_from_args(args):
                return args.fn(args)

    return run_main(body)
