"""Resumable training state on disk: `<run>/checkpoints/step-<step:08d>.pt`, one file per checkpoint.

File format: MAGIC + sha256(payload) hex + "\\n" + payload, where payload is `torch.save` of a dict
{"format", "run_hash", "step", "model", "optimizer", "scheduler", "state", "rng"}. Written atomically;
on load the digest is verified (a file cut by a kill or flipped on disk is caught, not half-loaded),
then `torch.load(weights_only=True)`. The newest KEEP_CHECKPOINTS files are kept: the newest may be
damaged, the one before it is the fallback.

RNG state (torch's CPU generator, and the CUDA one of the run's device) is captured per rank, so a
resumed run draws the same dropout masks as an uninterrupted one.
"""
from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path
from typing import Callable

import torch

from study.io import atomic_write_bytes

CKPT_MAGIC = b"STUDYCKPT1\n"
CKPT_FORMAT = 1
KEEP_CHECKPOINTS = 2   # the newest may be damaged; the one before is the fallback


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
    for _, old in checkpoint_files(d)[KEEP_CHECKPOINTS:]:
        old.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> dict:
    """Verify magic and sha256, then `torch.load(weights_only=True)`. Raises ValueError when damaged."""
    data = path.read_bytes()
    head = len(CKPT_MAGIC) + 65
    if len(data) < head or not data.startswith(CKPT_MAGIC) or data[head - 1:head] != b"\n":
        raise ValueError("not a checkpoint or truncated header")
    digest, payload = data[len(CKPT_MAGIC):head - 1].decode("ascii", "replace"), data[head:]
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


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
