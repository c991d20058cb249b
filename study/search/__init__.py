"""The search stage: an optuna search over any spec key (`study search SPEC`, `study search-best SPEC`).

Each trial is an ordinary run of the harness (the spec's defaults plus the sampled values), so a
trial reuses a grid study's finished run and a pruned trial leaves a resumable run folder. Modules:

    checks.py     load_search: the spec's `search:` block checked before any training
    configs.py    the search space -> RunConfigs (through study/studies/spec.py's build_run_config)
    storage.py    the shared optuna storage (SQLite, any RDB URL, journal file) with heartbeats
    samplers.py   sampler and pruner from the spec
    objective.py  one trial: train or reuse the runs, evaluate, report to the pruner
    grid.py       racing workers on a grid point
    worker.py     run_search: one worker's loop
    trials.py     trials.csv (columns: study/metrics.py), best.json, the best trial as a spec
    cli.py        the commands; `python -m study.search` runs them alone

Entry points load on first use (study/lazy.py): `study --help` imports this package (the parser registers
`search`), and the search modules import studies/spec.py, which imports report/ and scipy (3.4 s of
`study --help`, measured with `python -X importtime`). Of the modules `study --help` loads (cli.py,
storage.py), optuna only inside functions; the modules a running search loads import it at the top.
"""

from study.lazy import exports

__all__ = ["load_search", "run_search", "write_best"]
__getattr__ = exports(
    __name__,
    {
        "load_search": "study.search.checks",
        "run_search": "study.search.worker",
        "write_best": "study.search.trials",
    },
)
