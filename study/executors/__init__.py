"""Where a study's runs execute: here (`--executor local`, with `--jobs`), or as Slurm job-array tasks
(`--executor slurm`, study/executors/slurm.py through submitit). `study status` (status.py) shows every
run's state from its folder, whichever executor trains it.

The executor and its options are speed only, outside the run hash (like `impl`). Defaults may come from
params.yaml's `slurm:` block, with per-profile overrides under `slurm: {profiles: {gpu: {...}}}`; the
command line wins:

    slurm:
      partition: gpu
      time: "2:00:00"
      gpus_per_run: 1
      opts: {account: myproj, qos: normal}   # --slurm-opt key=value
      profiles:
        cpu: {gpus_per_run: 0, cpus_per_run: 2}
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from study.errors import StudyError
from study.root import find_root

PARAMS = "params.yaml"  # in the project root (study/root.py)
OPTIONS = ("partition", "time", "gpus_per_run", "cpus_per_run", "mem", "max_parallel")
DEFAULTS_HELP = "default from params.yaml's slurm: block, else Slurm's"


@dataclass(frozen=True)
class Steps:
    """The CLI's entry points a Slurm submission calls (passed in: the CLI imports this package, so this
    package does not import the CLI). pretrain_one is what a --jobs worker calls; main runs one
    fine-tune (`finetune SPEC --run H`) with the CLI's own skip rule; aggregate/report finish `run`."""

    pretrain_one: Callable
    main: Callable
    aggregate: Callable
    report: Callable


@dataclass
class SlurmOptions:
    partition: str | None = None
    time: str | None = None
    gpus_per_run: int = 0
    cpus_per_run: int | None = None
    mem: str | None = None
    max_parallel: int | None = None
    opts: dict[str, str] = field(default_factory=dict)
    wait: bool = False


def add_executor_options(sp: argparse.ArgumentParser, steps: Steps) -> None:
    """--executor and the Slurm options on `sp` (run / pretrain / finetune); `sp`'s command runs as
    before with --executor local, and is submitted to Slurm with --executor slurm."""
    g = sp.add_argument_group("executor (speed only: outside the run hash)")
    g.add_argument("--executor", choices=("local", "slurm"), default="local", help="where runs execute")
    g.add_argument("--partition", help=f"Slurm partition ({DEFAULTS_HELP})")
    g.add_argument("--time", help=f"per-task time limit, e.g. 90 or 1:30:00 ({DEFAULTS_HELP})")
    g.add_argument("--gpus-per-run", type=int, help="GPUs per run; >1 trains under torchrun (DDP, one node)")
    g.add_argument("--cpus-per-run", type=int, help="CPUs per task (also the run's impl.threads)")
    g.add_argument("--mem", help="memory per task, e.g. 16G")
    g.add_argument("--max-parallel", type=int, help="tasks of an array running at once (the array's %%K)")
    g.add_argument(
        "--slurm-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any sbatch option, repeatable (e.g. account=proj, qos=high, gres=gpu:1)",
    )
    g.add_argument("--wait", action="store_true", help="block until the tasks end, then aggregate and report")
    sp.set_defaults(fn=functools.partial(dispatch, sp.get_default("fn"), steps))


def dispatch(local: Callable, steps: Steps, args) -> int:
    if getattr(args, "executor", "local") == "local":
        return local(args)
    # lazy: submitit and the stages are imported only when submitting (`study --help` stays light)
    from study.executors.slurm import submit

    return submit(args, slurm_options(args), steps)


def _params_block(path: Path | None = None) -> dict:
    path = path or (find_root(Path.cwd()) or Path.cwd()) / PARAMS
    if not path.is_file():
        return {}
    try:
        block = (yaml.safe_load(path.read_text()) or {}).get("slurm") or {}
    except yaml.YAMLError as exc:
        raise StudyError(f"{path} is not valid YAML: {exc}", field="params.yaml", allowed="YAML") from None
    if not isinstance(block, dict):
        raise StudyError("slurm: must be a mapping", field="params.yaml slurm", allowed="a mapping")
    return block


def _checked(block: dict, where: str) -> dict:
    bad = sorted(set(block) - set(OPTIONS) - {"opts"})
    if bad:
        raise StudyError(
            f"unknown key {bad[0]!r}",
            field=f"params.yaml {where}.{bad[0]}",
            allowed=", ".join(OPTIONS + ("opts",)),
        )
    return block


def slurm_options(args, params: Path | None = None) -> SlurmOptions:
    """params.yaml's slurm: block, its profile's overrides, then the command line (module doc)."""
    block = _params_block(params)
    profiles = block.pop("profiles", None) or {}
    merged = dict(_checked(block, "slurm"))
    prof = getattr(args, "profile", None)
    if prof and prof in profiles:
        over = _checked(dict(profiles[prof] or {}), f"slurm.profiles.{prof}")
        merged = {**merged, **over, "opts": {**(merged.get("opts") or {}), **(over.get("opts") or {})}}
    for name in OPTIONS:
        given = getattr(args, name, None)
        if given is not None:
            merged[name] = given
    opts = {str(k): str(v) for k, v in (merged.pop("opts", None) or {}).items()}
    for kv in getattr(args, "slurm_opt", []) or []:
        key, sep, value = kv.partition("=")
        if not sep or not key.strip():
            raise StudyError(
                f"{kv!r} is not KEY=VALUE", field="--slurm-opt", allowed="KEY=VALUE, e.g. qos=high"
            )
        opts[key.strip().lstrip("-")] = value
    out = SlurmOptions(**merged, opts=opts, wait=bool(getattr(args, "wait", False)))
    for name in ("gpus_per_run", "cpus_per_run", "max_parallel"):
        v = getattr(out, name)
        if v is not None and (not isinstance(v, int) or v < (0 if name == "gpus_per_run" else 1)):
            raise StudyError(
                f"{v!r}",
                field=f"--{name.replace('_', '-')}",
                allowed="a whole number >= 0" if name == "gpus_per_run" else ">= 1",
            )
    out.gpus_per_run = out.gpus_per_run or 0
    return out


def add_status_parser(sub) -> None:
    """`study status SPEC [--profile P]` (study/executors/status.py)."""
    help_ = "every run's state from its folder: pending, queued, running (step, tokens/s, ETA), interrupted, done, failed"
    sp = sub.add_parser("status", help=help_, description=help_)
    sp.add_argument("spec", help="a study spec, e.g. ablations/smoke.yaml")
    sp.add_argument("--profile", help="a profile defined in the spec (e.g. cpu, gpu)")
    sp.set_defaults(fn=_status)


def _status(args) -> int:
    # lazy: status reads checkpoints' names through study.pretrain (torch), not needed for `study --help`
    from study.executors.status import cmd_status

    return cmd_status(args)
