"""`--executor slurm` against a real Slurm (CI starts a one-node cluster with .ci/slurm/start.sh), and the
lease that keeps a run trained once across hosts (study/lease.py).

Skipped, with the reason, only where `sbatch` is absent or no controller answers; CI fails instead of
skipping (.ci/run). Every Slurm behaviour is shown on the real Slurm: submitit's local executor is not
used. Tiny specs keep the file to a few minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from study.errors import StudyError
from study.executors import SlurmOptions, slurm_options
from study.executors.slurm import check_environment, make_executor
from study.lease import STALE_S, lease, read_holder
from study.paths import Layout

REPO = Path(__file__).resolve().parents[1]
SPEC = """
name: {name}
question: runs through Slurm
defaults:
  corpus: {{sources: ["text:corpus"], valid_fraction: 0.1, test_fraction: 0.1}}
  tokenizer: {{vocab_size: 200, min_frequency: 1}}
  objective: {{format: segment_pair, max_seq_len: 32}}
  model: {{layers: 1, hidden: 32, heads: 2, intermediate: 64, max_positions: 32, dropout: 0.0,
          attention_dropout: 0.0}}
  train: {{amount: {amount}, batch_size: 8, eval_sequences: 16}}
  impl: {{checkpoint_every: 20, log_every: 10, threads: 1}}
  finetune: {{tasks: [SST-2], glue_dir: glue, seeds: [0], epochs: 1, batch_size: 16, max_length: 32,
             probe: false, baseline: true}}
factors:
  objective.sentence: [nsp, none]
seeds: [0]
"""
WORDS = "the cat dog sat on mat a bird flew over tree river ran fast slow red blue house man saw big".split()
SPEED_ONLY = {"time_s", "tokens_per_s", "wall_s", "mfu", "peak_flops", "peak_kind"}


def _slurm_up() -> str | None:
    if shutil.which("sbatch") is None:
        return "sbatch is not installed (CI starts a one-node Slurm with .ci/slurm/start.sh)"
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if out.returncode or not out.stdout.strip():
        return f"no Slurm controller answers: {out.stderr.strip()} (.ci/slurm/start.sh starts one)"
    return None


if os.environ.get("STUDY_REQUIRE_SLURM") and _slurm_up() is not None:  # CI (.ci/run): never a silent skip
    raise RuntimeError(f"STUDY_REQUIRE_SLURM is set but {_slurm_up()}")
needs_slurm = pytest.mark.skipif(_slurm_up() is not None, reason=_slurm_up() or "")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    rng = random.Random(0)
    docs = [
        " ".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))).capitalize() + "."
            for _ in range(rng.randint(4, 7))
        )
        for _ in range(30)
    ]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "docs.txt").write_text("\n\n".join(docs) + "\n")
    for split, n in (("train", 64), ("dev", 24)):
        rows = ["sentence\tlabel"] + [
            f"{' '.join(rng.choice(WORDS) for _ in range(5))} {'good' if y else 'bad'}\t{y}"
            for y in (rng.randint(0, 1) for _ in range(n))
        ]
        (tmp_path / "glue" / "SST-2").mkdir(parents=True, exist_ok=True)
        (tmp_path / "glue" / "SST-2" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    (tmp_path / "params.yaml").write_text("studies: []\n")  # a project root (study/root.py)
    (tmp_path / "par.yaml").write_text(SPEC.format(name="par", amount=8))
    (tmp_path / "long.yaml").write_text(SPEC.format(name="long", amount=1200))
    # long enough that a warning 5-35 s into the session lands in training on an idle machine too (1,200
    # steps ended before it there)
    (tmp_path / "limit.yaml").write_text(SPEC.format(name="limit", amount=6000))
    return tmp_path


def _env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return {**env, **extra}


def study(cwd: Path, *argv: str, check: bool = True, env: dict | None = None, timeout: float = 600):
    proc = subprocess.run(
        [sys.executable, "-m", "study", *argv],
        cwd=cwd,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode:
        raise AssertionError(
            f"study {' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def _runs(results: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted((results / "runs").iterdir()) if (p / "config.json").exists()}


def _trained(run: Path) -> dict:
    """What training computed (metrics without the speed-only fields, and the logged curve)."""
    metrics = json.loads((run / "metrics.json").read_text())
    hist = [line for line in (run / "history.jsonl").read_text().splitlines()]
    return {
        "metrics": {k: v for k, v in metrics.items() if k not in SPEED_ONLY},
        "history": [{k: v for k, v in json.loads(h).items() if k != "tokens_per_s"} for h in hist],
    }


def _finetuned(results: Path) -> dict:
    out = {}
    for f in sorted((results / "finetune").rglob("*seed*.json")):
        d = json.loads(f.read_text())
        out[str(f.relative_to(results))] = (d.get("primary"), d.get("metrics"), d.get("train_loss"))
    return out


def _wait_for(pred, timeout: float = 240, what: str = "") -> None:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _run_dir(project: Path, spec: str, label: str) -> tuple[str, Path]:
    from study.studies.spec import load_study

    with contextlib.chdir(project):  # the spec's corpus path is relative to the project
        (run,) = [r for r in load_study(spec).runs if r.label == label]
    return run.run_hash, project / "results" / "runs" / run.run_hash


def _requeued(project: Path) -> bool:
    logs = (project / "results" / "slurm" / "logs").rglob("*_log.err")
    return any("requeueing Slurm job" in p.read_text(errors="replace") for p in logs)


def _step(run: Path) -> int:
    lines = (run / "history.jsonl").read_text().splitlines() if (run / "history.jsonl").exists() else []
    return max([json.loads(x).get("step", 0) for x in lines if x.strip()] or [0])


# --------------------------------------------------------------------------- no Slurm needed
def test_stale_lease_of_a_sigkilled_holder_is_taken_over(tmp_path: Path):
    path = tmp_path / "x.lease"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from study.lease import lease\nwith lease({str(path)!r}):\n print('held', flush=True)\n input()",
        ],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with lease(path, blocking=False) as got:
        assert not got, "a live holder's lease was taken"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert read_holder(path) is not None  # SIGKILL left the file behind
    t0 = time.monotonic()
    with lease(path, blocking=True) as got:
        assert got and read_holder(path).pid == os.getpid()
    assert time.monotonic() - t0 < 5, "a dead holder on this host is stale at once"
    assert not path.exists()


def test_a_frozen_remote_holder_is_stale_after_ttl_only(tmp_path: Path):
    path = tmp_path / "y.lease"
    body = {"host": "another-node", "pid": 1, "job": "9_1", "token": "t", "beat": 3, "taken": 0.0}
    path.write_text(json.dumps(body))
    with lease(path, blocking=False, ttl=0.6) as got:
        assert not got  # another host's holder is never judged by its pid
    t0 = time.monotonic()
    with lease(path, blocking=True, ttl=0.6) as got:
        assert got
    assert 0.6 <= time.monotonic() - t0 < 5 and STALE_S >= 60


def test_options_from_params_yaml_and_the_command_line(tmp_path: Path):
    params = tmp_path / "params.yaml"
    params.write_text(
        "studies: [smoke]\nslurm:\n  partition: p1\n  time: '10'\n  opts: {qos: low}\n"
        "  profiles: {gpu: {partition: g, gpus_per_run: 2}}\n"
    )
    ns = type("A", (), {"profile": "gpu", "partition": None, "time": "5", "slurm_opt": ["account=me"]})()
    o = slurm_options(ns, params)
    assert (o.partition, o.time, o.gpus_per_run, o.opts) == ("g", "5", 2, {"qos": "low", "account": "me"})
    params.write_text("slurm: {partitoin: x}\n")
    with pytest.raises(StudyError, match="partitoin"):
        slurm_options(ns, params)


def test_results_on_a_node_local_path_is_refused_on_a_real_cluster(tmp_path: Path):
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch is not installed")
    with pytest.raises(StudyError, match="local to each node"):
        check_environment(tmp_path, nodes=["node1", "node2"])
    check_environment(tmp_path, nodes=[os.uname().nodename])  # the one-node cluster of CI


# --------------------------------------------------------------------------- real Slurm
@needs_slurm
@pytest.mark.slow
def test_wait_equals_jobs_1_bitwise_and_status(project: Path):
    local = project / "local"
    study(
        project,
        "--results",
        str(local),
        "--reports",
        "rep-local",
        "run",
        "par.yaml",
        "--jobs",
        "1",
        "--quiet",
    )
    sl = project / "results"
    proc = study(project, "run", "par.yaml", "--executor", "slurm", "--wait", "--quiet")
    assert "submitted pretrain: array" in proc.stdout
    assert proc.stderr.count("pretrain ") >= 2 and "done" in proc.stderr  # a line per finished run
    assert (project / "reports" / "par" / "index.html").exists() or list(
        (project / "reports").rglob("*.html")
    )
    runs = _runs(sl)
    assert set(runs) == set(_runs(local))
    for h, run in runs.items():
        assert _trained(run) == _trained(local / "runs" / h), h
        assert json.loads((run / "slurm.json").read_text())["job"]  # the job id is in the run folder
    assert _finetuned(sl) == _finetuned(local) and len(_finetuned(sl)) == 3  # two runs + baseline
    status = study(project, "status", "par.yaml").stdout
    assert status.count(" done [job ") == 2, status
    again = study(project, "run", "par.yaml", "--executor", "slurm", "--quiet").stdout
    assert "submitted pretrain" not in again  # nothing to train: done runs are not resubmitted


@needs_slurm
@pytest.mark.slow
def test_scancel_kill_mid_run_then_resubmit_resumes_equal(project: Path):
    ref = project / "ref"
    study(
        project, "--results", str(ref), "pretrain", "long.yaml", "--run", "objective.sentence=none", "--quiet"
    )
    out = study(
        project, "pretrain", "long.yaml", "--run", "objective.sentence=none", "--executor", "slurm"
    ).stdout
    h, run = _run_dir(project, "long.yaml", "objective.sentence=none")
    job = json.loads((run / "slurm.json").read_text())["job"]
    assert job in out or job.split("_")[0] in out
    _wait_for(
        lambda: (
            (run / "checkpoints").is_dir()
            and any((run / "checkpoints").glob("step-*.pt"))
            and _step(run) >= 60
        ),
        what="a checkpoint",
    )
    status = study(project, "status", "long.yaml").stdout
    assert f"{h}  running, step " in status and "tokens/s" in status, status
    # the job step, not the job: `scancel --signal=KILL JOB` cancels gracefully (SIGTERM, then KILL after
    # KillWait); the step's processes get SIGKILL at once, as on a lost node or an OOM kill
    subprocess.run(["scancel", "--signal=KILL", f"{job}.0"], check=True)
    _wait_for(
        lambda: (
            job
            not in subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True).stdout
        ),
        what="the killed task to leave the queue",
    )
    status = study(project, "status", "long.yaml").stdout
    assert f"{h}  interrupted, resumable from step " in status, status
    proc = study(
        project,
        "pretrain",
        "long.yaml",
        "--run",
        "objective.sentence=none",
        "--executor",
        "slurm",
        "--wait",
        "--quiet",
    )
    new = json.loads((run / "slurm.json").read_text())["job"]
    log = project / "results" / "slurm" / "logs" / new / f"{new}_0_log.err"
    assert new != job and "took over from pid" in log.read_text(), proc.stderr  # the dead holder's lease
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert any(e.get("resumed") for e in events if e.get("event") == "start"), proc.stderr
    assert not any(e.get("event") == "interrupted" for e in events)  # killed outright: no SIGTERM checkpoint
    assert _trained(run) == _trained(ref / "runs" / h)


@needs_slurm
@pytest.mark.slow
def test_short_time_limit_warns_checkpoints_requeues_and_ends_equal(project: Path):
    # 1 minute, warned (USR2) 55 s before it: Slurm's timer sends it 5-35 s into each session (it checks
    # limits every ~30 s). Once a warned session has checkpointed and requeued, the test lifts the limit,
    # so the resumed session can finish whatever the machine's speed (a loaded machine would otherwise
    # spend each short session starting up).
    h, run = _run_dir(project, "limit.yaml", "objective.sentence=nsp")
    argv = ["pretrain", "limit.yaml", "--run", "objective.sentence=nsp", "--executor", "slurm", "--wait"]
    argv += ["--time", "1", "--slurm-opt", "signal=USR2@55", "--quiet"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "study", *argv],
        cwd=project,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def warned() -> bool:
        events = (run / "events.jsonl").read_text() if (run / "events.jsonl").exists() else ""
        return (
            '"interrupted"' in events and json.loads((run / "slurm.json").read_text()).get("job") is not None
        )

    _wait_for(warned, timeout=400, what="a time-limit warning during training")
    job = json.loads((run / "slurm.json").read_text())["job"]
    _wait_for(lambda: _requeued(project), timeout=120, what="the requeue")
    subprocess.run(["scontrol", "update", f"jobid={job}", "TimeLimit=30"], check=True)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    ref = project / "ref"
    study(
        project, "--results", str(ref), "pretrain", "limit.yaml", "--run", "objective.sentence=nsp", "--quiet"
    )
    h, run = _run_dir(project, "limit.yaml", "objective.sentence=nsp")
    log = "".join(p.read_text() for p in (project / "results" / "slurm" / "logs").rglob("*_log.err"))
    assert "requeueing Slurm job" in log, log[-2000:]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "interrupted" for e in events)
    assert json.loads((run / "status.json").read_text())["status"] == "done"
    assert _trained(run) == _trained(ref / "runs" / h)


@needs_slurm
@pytest.mark.slow
def test_a_failing_task_is_reported_failed_while_the_other_finishes(project: Path):
    from study.studies.spec import load_study

    with contextlib.chdir(project):
        victim = load_study("par.yaml").runs[0].run_hash
    (project / "results" / "runs" / victim).mkdir(parents=True)
    (project / "results" / "runs" / victim / "checkpoints").write_text("a file where a folder must be\n")
    proc = study(project, "pretrain", "par.yaml", "--executor", "slurm", "--wait", "--quiet", check=False)
    assert proc.returncode == 1, proc.stderr
    status = study(project, "status", "par.yaml").stdout
    lines = {line.split()[0]: line for line in status.splitlines() if line[:12].isalnum()}
    assert f"{victim}  failed, " in status, status
    others = [v for k, v in lines.items() if k != victim and len(k) == 12]
    assert others and all(" done " in v for v in others), status
    assert "      | " in status  # the last lines of its log


@needs_slurm
@pytest.mark.slow
def test_two_submissions_at_once_train_each_run_once(project: Path):
    trace = project / "trace.txt"
    env = _env(STUDY_TRACE=str(trace))
    cmd = [sys.executable, "-m", "study", "pretrain", "long.yaml", "--executor", "slurm", "--wait", "--quiet"]
    a = subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # and a --jobs run beside them
    c = study(project, "pretrain", "long.yaml", "--jobs", "1", "--quiet", env=env)
    for p in (a, b):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    assert c.returncode == 0
    starts = [line.split()[2] for line in trace.read_text().splitlines() if " train.start " in line]
    assert sorted(starts) == sorted(set(starts)) and len(starts) == 2, starts


@needs_slurm
def test_bad_partition_is_exit_2_with_slurms_message(project: Path):
    proc = study(project, "pretrain", "par.yaml", "--executor", "slurm", "--partition", "nosuch", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "invalid partition" in proc.stderr.lower(), proc.stderr
    assert not list((project / "results" / "slurm").glob("submissions/*.json"))


def test_no_time_limit_is_the_partitions_not_submitits_5_minutes(tmp_path: Path):
    pytest.importorskip("submitit")

    ex = make_executor(Layout(root=tmp_path), SlurmOptions(), "x")
    assert ex.parameters["time"] is None  # seen: smoke runs warned and requeued at 3 min
    ex = make_executor(Layout(root=tmp_path), SlurmOptions(time="90", max_parallel=3), "x")
    assert ex.parameters["additional_parameters"]["time"] == "90" and ex.parameters["array_parallelism"] == 3
