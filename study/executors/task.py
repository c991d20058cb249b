"""What runs inside one Slurm array task (submitted by study/executors/slurm.py, run by submitit's
`python -m submitit.core._submit` with the submitting interpreter).

Time limits and preemption:
- Slurm sends USR2 `signal_s` seconds before the time limit (sbatch --signal, set by the submitter). The
  task turns it into the trainer's SIGTERM: the step in progress finishes, its checkpoint is written,
  the trainer raises Interrupted (study/pretrain/checkpoint.py). The task then requeues itself
  (`scontrol requeue`, the job is submitted with --requeue) and exits; the requeued task loads the same
  submission and train_run resumes from that checkpoint, bitwise on CPU. A USR2 outside the training
  loop (data loading, evaluation, fine-tuning) requeues at once: what is in flight is redone from its
  last saved piece.
- SIGTERM (preemption, scancel): the trainer checkpoints and stops; the task exits without requeueing.
  A cluster whose PreemptMode is REQUEUE requeues it itself; otherwise running the command again
  resubmits the run, which resumes from that checkpoint.
- SIGKILL (scancel --signal=KILL, a node lost): nothing can run; the next submission resumes from the
  last periodic checkpoint (impl.checkpoint_every / checkpoint_minutes) and takes the dead holder's lease
  over (study/lease.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from study.errors import EXIT_INTERRUPTED, Interrupted
from study.io import atomic_write_json, read_json
from study.lease import job_id

SLURM_RECORD = "slurm.json"  # in a run's folder: the Slurm job that trains it (study status reads it)
_WARNED = False  # USR2 arrived: requeue after the checkpoint


def record_path(run_dir: Path) -> Path:
    return Path(run_dir) / SLURM_RECORD


def update_record(path: Path, **fields) -> None:
    """Merge `fields` into a run's slurm.json."""
    try:
        old = read_json(path)
    except (OSError, ValueError):
        old = {}
    atomic_write_json(path, {**(old if isinstance(old, dict) else {}), **fields})


def _requeue_and_exit() -> None:
    jid = job_id()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Slurm's own SIGTERM to the requeued step: we are leaving
    print(f"study: requeueing Slurm job {jid} after its time-limit warning", file=sys.stderr, flush=True)
    subprocess.run(["scontrol", "requeue", str(jid)], check=False, timeout=60)
    sys.exit(1)  # SystemExit: submitit writes no result, so the requeued task runs the submission again


def _outside_training(signum, frame) -> None:
    """SIGTERM while no trainer (or torchrun) handles it: stop now; what is in flight is redone."""
    raise Interrupted(None)


def _on_usr2(signum, frame) -> None:
    global _WARNED
    _WARNED = True
    if signal.getsignal(signal.SIGTERM) is _outside_training:
        _requeue_and_exit()
    os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler: checkpoint after this step, Interrupted


def run_task(fn: Callable, args: tuple, record: str | None = None):
    """fn(*args) in a Slurm task (the CLI's pretrain_one or main), with the module doc's signals.
    `record`: the run's slurm.json, where the task's host and start are kept for `study status`."""
    signal.signal(signal.SIGTERM, _outside_training)  # replaces submitit's, which only logs SIGTERM
    signal.signal(signal.SIGUSR2, _on_usr2)
    if record is not None:
        update_record(Path(record), job=job_id(), host=socket.gethostname(), started=time.time())
    try:
        out = fn(*args)
    except Interrupted:
        if _WARNED:
            _requeue_and_exit()
        raise
    if _WARNED:  # the warning came after the last step: nothing left to requeue for
        print("study: time-limit warning after the work ended", file=sys.stderr)
    return out


def pretrain_torchrun(cfg, layout, nproc: int, quiet: bool, label: str) -> tuple[int, float]:
    """One run on `nproc` GPUs of this node under torchrun (the trainer's DDP path). SIGTERM and USR2 are
    passed to torchrun, which passes them to its workers; rank 0 checkpoints."""
    cfg_path = layout.slurm_dir("configs") / f"{cfg.run_hash()}.json"
    atomic_write_json(cfg_path, cfg.model_dump(mode="json"))
    cmd = torchrun_command(cfg_path, Path(layout.root), nproc, quiet)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    old = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signal.SIGTERM))
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, old)
    if code == EXIT_INTERRUPTED:
        raise Interrupted(None)
    print(f"run {label}: torchrun exited {code}", file=sys.stderr)
    return code, time.monotonic() - t0


def torchrun_command(cfg_path: Path, results: Path, nproc: int, quiet: bool) -> list[str]:
    """One node, `nproc` processes: `python -m torch.distributed.run --standalone` (README: several nodes
    take srun and a rendezvous endpoint instead)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "study.pretrain",
        str(cfg_path),
        "--results",
        str(results),
    ] + (["--quiet"] if quiet else [])
