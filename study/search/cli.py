"""`study search SPEC` and `study search-best SPEC` (registered on study/cli.py's parser by `add_parser`),
and `python -m study.search ...`: the same commands without the rest of the CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from study.cpu import add_threads_option, threads_from_args
from study.errors import run_main
from study.paths import Layout
from study.search.storage import STORAGE_HELP


def _layout(args) -> Layout:
    return Layout(root=Path(args.results), reports=Path(args.reports))


def cmd_search(args) -> int:
    # lazy: the search modules import studies/spec.py and, through it, scipy (study/search/__init__.py)
    from study.search.worker import run_search

    ostudy = run_search(
        args.spec,
        storage=args.storage,
        n_trials=args.n_trials,
        timeout=args.timeout,
        layout=_layout(args),
        profile=args.profile,
        quiet=args.quiet,
    )
    # lazy: optuna is loaded by now; at the top it would cost `study --help` about 1 s
    from optuna.trial import TrialState

    done = [t for t in ostudy.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if done:
        b = ostudy.best_trial
        print(
            f"search {ostudy.study_name}: {len(done)} complete trials; best #{b.number} value={b.value:.6g} "
            f"params={json.dumps(b.params, sort_keys=True)} run={b.user_attrs.get('run_hash')}"
        )
    else:
        print(f"search {ostudy.study_name}: no complete trial yet")
    return 0


def cmd_search_best(args) -> int:
    from study.search.trials import write_best  # lazy: as run_search in cmd_search

    out = write_best(args.spec, args.out, storage=args.storage, layout=_layout(args), profile=args.profile)
    print(f"best configuration written to {out} (re-train: study run {out})")
    return 0


def add_parser(sub) -> None:
    """Register `study search` and `study search-best` on the CLI's subparsers."""
    s = sub.add_parser(
        "search",
        help="optuna search over the spec's `search:` block (one worker)",
        description="Run one search worker; start several (any machines) with the same --storage.",
    )
    s.add_argument("spec", help="a spec with a `search:` block")
    s.add_argument("--profile", help="a profile defined in the spec")
    s.add_argument(
        "--storage", help=f"optuna storage URL (default: SQLite under results/search/<name>/): {STORAGE_HELP}"
    )
    s.add_argument(
        "--n-trials",
        type=int,
        help="finished trials the study stops at, once no trial still runs (default: search.n_trials)",
    )
    s.add_argument("--timeout", type=float, help="seconds this worker runs at most (default: search.timeout)")
    s.add_argument("--quiet", action="store_true", help="no progress bars or per-trial log")
    add_threads_option(s)
    s.set_defaults(fn=cmd_search)
    b_help = "write the best trial as a spec that `study run` re-trains (warns when it did not learn)"
    b = sub.add_parser("search-best", help=b_help, description=b_help)
    b.add_argument("spec", help="the spec with a `search:` block that was searched")
    b.add_argument("--profile", help="the profile the search ran at")
    b.add_argument("--storage", help=STORAGE_HELP)
    b.add_argument("--out", help="output spec (default: <spec folder>/<name>-best.yaml)")
    b.set_defaults(fn=cmd_search_best)


def main(argv: list[str] | None = None) -> int:
    """`python -m study.search search|search-best ...`; errors end as `study`'s do (errors.run_main)."""
    p = argparse.ArgumentParser(prog="python -m study.search")
    p.add_argument("--results", default="results")
    p.add_argument("--reports", default="reports")
    add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)

    def body() -> int:
        with threads_from_args(args):
            return args.fn(args)

    return run_main(body)
