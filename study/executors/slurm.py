"""`study run|pretrain|finetune SPEC --executor slurm`: a study's pending runs as Slurm job-array tasks,
submitted through submitit with the submitting interpreter.

What is submitted (one array task per unit of work; each calls the CLI entry point a --jobs worker
calls, through study/executors/task.py's run_task):
- pretrain: the runs not done or diverged, not held by a live lease (study/lease.py) and not in a live
  earlier submission (its record in results/slurm/submissions/ and its task still in `squeue`);
- run / finetune: each run's fine-tuning (`study finetune SPEC --run H`, whose own rule writes
  skipped.json for a run that did not finish) and the random-init baselines. The fine-tuning of a run
  submitted in the same command is a task of a second array that depends on the pretrain array with
  `aftercorr` (task i starts when pretrain task i ended well; a cancelled pretrain task cancels it:
  kill-on-invalid-dep). The rest need no pretrain task and go in a third array.
Data is prepared here, before submitting: one host builds it (the lease-free flock of data/prepare.py
is not to be trusted across hosts), and a corpus path that does not resolve fails here with exit 2.

Non-blocking by default (prints the job ids). --wait polls `squeue` (never sacct, which many clusters
lack), prints a line per run as it ends, releases a requeued task from Slurm's 2-minute hold, then
aggregates and reports where the command runs. Every Slurm error (no sbatch, no submitit, a bad
partition, a refused sbatch) is a StudyError with Slurm's own message: exit 2.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from study.errors import StudyError
from study.executors import SlurmOptions, Steps
from study.executors.status import alive_jobs, run_state
from study.executors.task import pretrain_torchrun, record_path, run_task, update_record
from study.executors.wait import wait_and_finish
from study.io import atomic_write_json, read_json
from study.paths import Layout
from study.rundir import RunDir
from study.studies.spec import load_study

LOCAL_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # node-local on every cluster we know
SIGNAL_S = 120  # USR2 this long before the time limit (a third of the limit when that is shorter)
POLL_S = 2.0


def _slurm(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise StudyError(
            f"{cmd[0]} not found", field="--executor", allowed="local, or slurm on a Slurm host"
        ) from None
    if out.returncode:
        raise StudyError(
            f"{' '.join(cmd[:2])}: {out.stderr.strip()}",
            field="--executor slurm",
            allowed="see Slurm's message",
        )
    return out.stdout


def check_environment(root: Path, nodes: list[str] | None = None) -> None:
    """What the nodes need and this host can check: sbatch and submitit here, and results/ on a
    filesystem the nodes share (not node-local), unless this host is the cluster's only node."""
    if shutil.which("sbatch") is None:
        raise StudyError("sbatch is not on PATH", field="--executor slurm", allowed="local (no Slurm here)")
    try:
        import submitit  # noqa: F401 - lazy: optional dependency, checked before anything is written
    except ImportError as exc:
        raise StudyError(
            f"submitit is not installed ({exc})", field="--executor slurm", allowed="pip install submitit"
        ) from None
    where = Path(os.path.realpath(root))
    local = next((r for r in LOCAL_ROOTS if where == Path(r) or Path(r) in where.parents), None)
    if local is None:
        return
    nodes = nodes if nodes is not None else _slurm(["sinfo", "-h", "-N", "-o", "%N"]).split()
    if set(nodes) <= {socket.gethostname(), socket.gethostname().split(".")[0]}:
        return  # a one-node cluster on this host (CI): /tmp is shared with itself
    raise StudyError(
        f"results folder {where} is under {local}, which is local to each node: the tasks would write where "
        "this command cannot read",
        field="--results",
        allowed="a folder on a filesystem every node mounts (the project's, a shared scratch)",
    )


def _minutes(time_limit: str | None) -> float | None:
    if time_limit is None:
        return None
    days, _, rest = time_limit.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    m = {1: lambda p: p[0], 2: lambda p: p[0] + p[1] / 60, 3: lambda p: 60 * p[0] + p[1] + p[2] / 60}
    return (float(days) * 1440 if days else 0) + m[len(parts)](parts) if len(parts) <= 3 else None


def make_executor(layout: Layout, opts: SlurmOptions, name: str, dependency: str | None = None):
    import submitit  # noqa: PLC0415 - optional dependency (check_environment has checked it)

    ex = submitit.SlurmExecutor(folder=layout.slurm_dir("logs").resolve() / "%j", python=sys.executable)
    limit = _minutes(opts.time)
    extra = {"requeue": True, **({"time": opts.time} if opts.time else {})}
    if dependency:
        extra.update(dependency=dependency, kill_on_invalid_dep="yes")
    params = {"job_name": name, "signal_delay_s": int(min(SIGNAL_S, limit * 20)) if limit else SIGNAL_S}
    params["time"] = None  # submitit's default is 5 minutes; without --time the partition's limit applies
    for key, val in (("partition", opts.partition), ("cpus_per_task", opts.cpus_per_run), ("mem", opts.mem)):
        if val is not None:
            params[key] = val
    if opts.gpus_per_run:
        params["gpus_per_node"] = opts.gpus_per_run
    if opts.max_parallel:
        params["array_parallelism"] = opts.max_parallel
    ex.update_parameters(**params, additional_parameters={**extra, **opts.opts})
    return ex


def _submit_array(layout, opts, name, calls, dependency=None) -> list[str]:
    """One array of run_task(*call) tasks; their job ids (ARRAY_TASK). A refused sbatch is exit 2."""
    if not calls:
        return []
    ex = make_executor(layout, opts, name, dependency)
    try:
        with ex.batch():
            jobs = [ex.submit(run_task, *call) for call in calls]
    except Exception as exc:  # noqa: BLE001 - submitit raises its own types with sbatch's stderr inside
        msg = str(exc).strip().splitlines()
        slurm = [line for line in msg if "error" in line.lower()] or msg[-1:]
        raise StudyError(
            f"sbatch refused the {name} array: {' '.join(slurm)}",
            field="--executor slurm",
            allowed="see Slurm's message",
        ) from None
    return [j.job_id for j in jobs]


def _submitted(layout: Layout, alive: set[str]) -> dict[tuple, str]:
    """(kind, key) -> job id of the units of earlier submissions whose task is still queued or running."""
    out = {}
    folder = layout.slurm_dir("submissions")
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            for t in read_json(f).get("tasks", []):
                if t["job"] in alive:
                    out[(t["kind"], t["key"])] = t["job"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def _with_threads(cfg, opts: SlurmOptions):
    if opts.cpus_per_run is None or cfg.impl.threads is not None:
        return cfg
    out = cfg.model_copy(deep=True)
    out.impl.threads = opts.cpus_per_run
    return out


def _plan_pretrain(runs, layout, opts, steps, alive, queued, busy) -> tuple[list, list]:
    """(calls, runs) of the runs to pretrain: not done or diverged, not running, not queued."""
    calls, units = [], []
    for run in runs:
        state = run_state(layout, run.run_hash, alive)
        if state.name in ("done", "diverged"):
            continue
        if state.name == "running" or ("pretrain", run.run_hash) in queued:
            busy.append(f"{run.run_hash} {state.describe()}")
            continue
        cfg = _with_threads(run.config, opts)
        fn, fargs = (
            (pretrain_torchrun, (cfg, layout, opts.gpus_per_run, True, run.label))
            if opts.gpus_per_run > 1
            else (steps.pretrain_one, (cfg, layout, True, run.label))
        )
        calls.append((fn, fargs, str(record_path(RunDir(layout, run.run_hash).path))))
        units.append(run)
    return calls, units


def _plan_finetune(args, study, runs, layout, steps, alive, queued, chained, busy) -> dict[str, list]:
    """Fine-tune calls grouped by what they wait for: "after" (aftercorr on this command's pretrain
    array, in its order), a job id of an earlier submission (afterok), or "free" (nothing)."""
    base = ["--results", str(layout.root), "--reports", str(layout.reports), "finetune"]
    base += [str(Path(args.spec).resolve()), "--quiet"] + (
        ["--profile", args.profile] if args.profile else []
    )
    groups: dict[str, list] = {"after": [], "free": []}
    for run in runs:
        unit, h = ("finetune", run.run_hash), run.run_hash
        call = ((steps.main, (base + ["--run", h],), None), unit)
        if unit in queued:
            busy.append(f"{h} fine-tuning queued as {queued[unit]}")
        elif h in chained:
            groups["after"].append(call)
        elif ("pretrain", h) in queued:
            groups.setdefault(queued[("pretrain", h)], []).append(call)
        elif run_state(layout, h, alive).name == "running":
            busy.append(f"{h} fine-tuning: its run trains elsewhere; submit again once it is done")
        else:
            groups["free"].append(call)
    if not getattr(args, "run", None):
        for key in sorted({r.config.baseline_key() for r in study.runs if r.config.finetune.baseline}):
            if ("baseline", key) in queued:
                busy.append(f"baseline {key} queued as {queued[('baseline', key)]}")
            else:
                groups["free"].append(((steps.main, (base + ["--baseline", key],), None), ("baseline", key)))
    order = list(chained)  # aftercorr pairs task i with pretrain task i
    groups["after"].sort(key=lambda c: order.index(c[1][1]))
    return groups


def _record(layout: Layout, args, tasks: list[dict]) -> None:
    """results/slurm/submissions/<first job>.json: what this command submitted so far (rewritten after each
    array, so a later sbatch that fails leaves the earlier arrays recorded, and resubmitting skips them)."""
    first = tasks[0]["job"].split("_")[0]
    atomic_write_json(
        layout.slurm_dir("submissions") / f"{first}.json",
        {"spec": str(args.spec), "profile": args.profile, "command": args.command, "tasks": tasks},
    )


def submit(args, opts: SlurmOptions, steps: Steps) -> int:
    """The whole submission (module doc): checks, data here, the arrays, a record; --wait finishes."""
    study = load_study(args.spec, profile=args.profile)
    layout = Layout(root=Path(args.results).resolve(), reports=Path(args.reports).resolve())
    runs = study.select(getattr(args, "run", None))
    check_environment(layout.root)
    if args.command in ("run", "pretrain"):
        from study.data.prepare import prepare_data  # noqa: PLC0415 - torch-heavy, only when submitting

        for h, run in {r.config.data_hash(): r for r in runs}.items():
            print(f"data {h} ready at {prepare_data(run.config, layout, progress=not args.quiet).dir}")
    alive = alive_jobs()
    queued, busy = _submitted(layout, alive), []
    calls, units = [], []
    if args.command in ("run", "pretrain"):
        calls, units = _plan_pretrain(runs, layout, opts, steps, alive, queued, busy)
    groups = {}
    if args.command in ("run", "finetune"):
        chained = {r.run_hash: None for r in units}
        groups = _plan_finetune(args, study, runs, layout, steps, alive, queued, chained, busy)
    for line in busy:
        print(f"skip {line}")
    name = study.name + (f"-{args.profile}" if args.profile else "")
    tasks: list[dict] = []
    for run in units:  # before sbatch: a task may start (and write its start) before sbatch returns
        update_record(
            record_path(RunDir(layout, run.run_hash).path), job=None, submitted=time.time(), started=None
        )
    ids = _submit_array(layout, opts, f"pretrain-{name}", calls)
    for run, jid in zip(units, ids, strict=True):
        update_record(record_path(RunDir(layout, run.run_hash).path), job=jid)
        tasks.append({"kind": "pretrain", "key": run.run_hash, "job": jid})
    if ids:
        _record(layout, args, tasks)
        print(f"submitted pretrain: array {ids[0].split('_')[0]} ({len(ids)} tasks)")
    for wait_on, group in groups.items():
        dep = {"after": f"aftercorr:{ids[0].split('_')[0]}" if ids else None, "free": None}.get(wait_on)
        dep = dep if wait_on in ("after", "free") else f"afterok:{wait_on}"
        got = _submit_array(layout, opts, f"finetune-{name}", [c for c, _ in group], dep)
        tasks += [{"kind": k, "key": key, "job": jid} for (_, (k, key)), jid in zip(group, got, strict=True)]
        if got:
            _record(layout, args, tasks)
            print(
                f"submitted fine-tune{' after ' + dep if dep else ''}: {got[0].split('_')[0]} ({len(got)} tasks)"
            )
    if not tasks:
        print("nothing to submit: every run is done, queued or running (study status shows which)")
    if not opts.wait:
        print(f"watch: study status {args.spec}" + (f" --profile {args.profile}" if args.profile else ""))
        return 0
    return wait_and_finish(args, study, layout, [t["job"] for t in tasks] + list(queued.values()), steps)
