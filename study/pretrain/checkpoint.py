"""Resumable training state on disk: `<run>/checkpoints/step-<step:08d>.pt`, one file per checkpoint.

File format: MAGIC + sha256(payload) hex + "\\n" + payload, where payload is `torch.save` of a dict
{"format", "run_hash", "step", "model", "optimizer", "scheduler", "state", "rng"}. Written atomically;
on load the digest is verified (a file cut by a kill or flipped on disk is caught, not half-loaded),
then `torch.load(weights_only=True)`. The newest KEEP_CHECKPOINTS files are kept: the newest may be
damaged, the one before it is the fallback (a rejected file of a later step is removed by the next write).
An intact file that does not load into the code (the model's or optimizer's keys or shapes, TrainState's
fields) is an error naming it, not a fallback: the file before it was written by the same code, and a
fresh start would throw away the training it holds.

RNG state (torch's CPU generator, and the CUDA one of the run's device) is captured per rank, so a
resumed run draws the same dropout masks as an uninterrupted one.

When (CheckpointClock): every impl.checkpoint_every steps when set, and whenever impl.checkpoint_minutes
of wall time passed since the last checkpoint (or the session's start) when > 0, whichever comes first;
the trainer adds one at the end of training and one on SIGTERM: the step in progress finishes, its
checkpoint is written, and `Interrupted` is raised (no status is written: the run is pending and resumes
from that checkpoint; `python -m study.pretrain` exits EXIT_INTERRUPTED = 143, 128 + SIGTERM).
Where a checkpoint falls changes nothing trained (checkpoints draw no random numbers), so a time rule
keeps resume bitwise on CPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from study.io import atomic_write_bytes
from study.runtime import Dist, all_reduce_sum

CKPT_MAGIC = b"STUDYCKPT1\n"
CKPT_FORMAT = 1
KEEP_CHECKPOINTS = 2  # the newest may be damaged; the one before is the fallback


@dataclass
class TrainState:
    """Everything the training loop needs to continue, besides model/optimizer/RNG (a checkpoint's
    "state"). Plain values only."""

    step: int = 0
    tokens: int = 0  # non-pad tokens trained on (all ranks)
    positions: int = 0  # positions computed (per micro-batch width: trimmed, or max_seq_len)
    masked: int = 0  # MLM predictions trained on
    sequences: int = 0
    epoch: int = 0  # data position: batch `batch` of epoch `epoch` is next
    batch: int = 0
    phase: int = 1  # 0: the short rows of train.short_len (epochs counted apart), 1: max_seq_len
    train_s: float = 0.0  # seconds in training steps (not eval/checkpoint); drives `seconds` budgets
    wall_s: float = 0.0  # wall seconds of all sessions up to the last checkpoint
    history_bytes: int = 0  # history.jsonl is truncated to this on resume
    started: str = ""
    sessions: int = 0
    last_eval: dict = field(default_factory=dict)
    last_loss: float | None = None
    window: dict = field(default_factory=dict)  # running sums since the last history line (resumed too)


def checkpoint_path(d: Path, step: int) -> Path:
    return d / f"step-{step:08d}.pt"


def checkpoint_files(d: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint file in `d`, newest first."""
    out = []
    for p in d.glob("step-*.pt"):
        m = re.fullmatch(r"step-(\d+)\.pt", p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def write_checkpoint(d: Path, step: int, obj: dict) -> Path:
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    path = checkpoint_path(d, step)
    atomic_write_bytes(path, CKPT_MAGIC + digest + b"\n" + payload)
    # A file of a later step was rejected on resume (training goes on from the newest intact one): it must
    # not count as one of the newest, or a run restarted from scratch would delete its own checkpoints.
    files = checkpoint_files(d)
    later, kept = [p for s, p in files if s > step], [p for s, p in files if s <= step]
    for old in later + kept[KEEP_CHECKPOINTS:]:
        old.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> dict:
    """Verify magic and sha256, then `torch.load(weights_only=True)`. Raises ValueError when damaged."""
    data = path.read_bytes()
    head = len(CKPT_MAGIC) + 65
    if len(data) < head or not data.startswith(CKPT_MAGIC) or data[head - 1 : head] != b"\n":
        raise ValueError("not a checkpoint or truncated header")
    digest, payload = data[len(CKPT_MAGIC) : head - 1].decode("ascii", "replace"), data[head:]
    actual = hashlib.sha256(payload).hexdigest()
    if actual != digest:
        raise ValueError(f"sha256 mismatch ({len(payload)} payload bytes; truncated or corrupted)")
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)


def load_latest_checkpoint(d: Path, run_hash: str, report: Callable[[str], None]) -> dict | None:
    """Newest intact checkpoint of this run, or None. Every rejected file is reported, never skipped silently."""
    files = checkpoint_files(d) if d.exists() else []
    for step, path in files:
        try:
            ck = read_checkpoint(path)
            if ck.get("format") != CKPT_FORMAT or ck.get("run_hash") != run_hash or ck.get("step") != step:
                raise ValueError("checkpoint belongs to another run, format or step")
            return ck
        except Exception as exc:  # noqa: BLE001 - any unreadable file is reported and the previous one tried
            report(f"checkpoint {path.name} rejected: {type(exc).__name__}: {exc}")
    if files:
        report("no intact checkpoint left; training starts from scratch")
    return None


def remove_checkpoints(d: Path) -> None:
    """Resume state is useless once a run is done."""
    for _, p in checkpoint_files(d) if d.exists() else []:
        p.unlink(missing_ok=True)


def rng_state(device: torch.device) -> dict:
    """The random state dropout draws from on `device`, as CPU tensors (what a checkpoint stores)."""
    out = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def rng_states(device: torch.device, dist: Dist) -> list[dict]:
    """rng_state of every rank, in rank order (a collective under DDP: every rank calls it)."""
    mine = rng_state(device)
    if not dist.on:
        return [mine]
    gathered = [None] * dist.world
    torch.distributed.all_gather_object(gathered, {k: v.cpu() for k, v in mine.items()})
    return gathered


def set_rng_state(states: list[dict], rank: int, device: torch.device) -> bool:
    """Restore `rank`'s state of a checkpoint's list (rng_states); False when the list has none for it."""
    if rank >= len(states):
        return False
    torch.set_rng_state(states[rank]["torch"])
    if device.type == "cuda" and "cuda" in states[rank]:
        torch.cuda.set_rng_state(states[rank]["cuda"], device)
    return True


# --------------------------------------------------------------------------- when
class CheckpointClock:
    """The checkpoint rules of one training session (see the module doc) and its SIGTERM flag."""

    def __init__(self, every: int | None, minutes: float):
        self.every, self.seconds = every, 60.0 * minutes
        self.last = time.monotonic()
        self.stop_requested = False

    def by_steps(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def by_time(self) -> bool:
        return self.seconds > 0 and time.monotonic() - self.last >= self.seconds

    def written(self) -> None:
        self.last = time.monotonic()

    def decide(self, step: int, log_step: bool, dist: Dist, device: torch.device) -> tuple[bool, bool]:
        """(checkpoint now, stop now) after `step`. The step rule holds on every rank alike; the time rule
        and SIGTERM are per process, so under DDP they act at log steps only, where rank 0's clock and any
        rank's SIGTERM are shared (a collective every step would be a host sync every step)."""
        if not dist.on:
            return self.by_steps(step) or self.by_time(), self.stop_requested
        if not log_step:
            return self.by_steps(step), False
        by_time, stop = all_reduce_sum(
            [float(dist.main and self.by_time()), float(self.stop_requested)], dist, device
        )
        return self.by_steps(step) or by_time > 0, stop > 0

    @contextlib.contextmanager
    def sigterm(self) -> Iterator[None]:
        """SIGTERM sets stop_requested for the block, and so does Ctrl-C where Python's own SIGINT handler
        is in place (a run in the command's process; a --jobs worker ignores SIGINT, its parent decides);
        a second Ctrl-C stops at once, without a checkpoint. The previous handlers are restored after. Only
        in the main thread, the one Python delivers signals to; elsewhere the handlers stay as they are."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = signal.signal(signal.SIGTERM, self._on_sigterm)
        old_int = signal.getsignal(signal.SIGINT)
        if old_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, old)
            if old_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, old_int)

    def _on_sigterm(self, signum, frame) -> None:
        self.stop_requested = True

    def _on_sigint(self, signum, frame) -> None:
        if self.stop_requested:
            raise KeyboardInterrupt
        self.stop_requested = True
        print(
            "\nCtrl-C: the step finishes and the run checkpoints (Ctrl-C again stops at once)",
            file=sys.stderr,
        )
