"""The fine-tune result files: where each lives, what it records, when an existing one is reused (the content
digests of the task files and encoder weights it was made from) and why a task is skipped instead. The
orchestration and training that fill them are in finetune.py; the file format is in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from study.config import FinetuneConfig
from study.data.corpus import file_digest
from study.downstream.tasks import HUB, TaskData, TaskSpec, get_task, task_path
from study.io import hash_obj, read_json
from study.paths import Layout


def result_path(layout: Layout, run_key: str, task: str, finetune_hash: str, mode: str, seed: int) -> Path:
    return layout.finetune_dir(run_key) / task / finetune_hash / f"{mode}-seed{seed}.json"


def task_digest(spec: TaskSpec, glue_dir: str) -> str | None:
    """The content of a task's local train and dev files (None for the hub or a missing file). Kept in each
    result (`task_data`): a result computed from other task files is recomputed, never reused, as a run is
    retrained when its corpus changes. The recipe hash leaves glue_dir out, so a moved folder reuses."""
    if glue_dir == HUB:
        return None
    files = [task_path(spec.name, glue_dir, split) for split in ("train", "dev")]
    # file_digest: cached by size and mtime, so a call whose results are all done does not re-read the files
    return hash_obj([file_digest(f) for f in files], length=16) if all(f.is_file() for f in files) else None


def encoder_digest(model_dir: Path) -> str | None:
    """The content of a pre-trained run's weights, kept in each result (`encoder_data`): a run trained again
    under the same hash (after its folder was deleted; on a GPU not bitwise the same) is fine-tuned again,
    never matched with the old encoder's results. None where there are no weights yet."""
    files = sorted(model_dir.glob("*.safetensors"))
    return hash_obj([file_digest(f) for f in files], length=16) if files else None


def existing_result(path: Path, want: dict[str, str | None] | None = None) -> dict | None:
    """A finished result at `path`, unless it was made from other inputs than `want` says (task_data,
    encoder_data): then it is recomputed. A result written before a key was kept has none: reused."""
    if not path.is_file():
        return None
    try:
        res = read_json(path)
    except (OSError, json.JSONDecodeError):
        return None  # unreadable: recompute (writes are atomic, so this is only a hand-edited file)
    if "skipped" in res:
        return None
    return None if any(v is not None and res.get(k, v) != v for k, v in (want or {}).items()) else res


def unavailable(spec: TaskSpec, glue_dir: str) -> str | None:
    if glue_dir == HUB:
        return None
    for split in ("train", "dev"):
        p = task_path(spec.name, glue_dir, split)
        if not p.is_file():
            return f"no {split} split: {p} does not exist"
    return None


def degenerate(train: TaskData, cap: int | None) -> str | None:
    """Why a (capped) training split teaches nothing: no rows, or one label only (the probe's sklearn head
    refuses it, a fine-tune learns a constant). Recorded as a skipped task: the other tasks and models go on."""
    values = np.unique(train.labels)
    if len(values) > 1:
        return None
    names = get_task(train.task).labels
    what = (
        "no rows"
        if not len(values)
        else f"a single label ({names[int(values[0])] if names else f'{float(values[0]):g}'})"
    )
    capped = (
        f" (capped at {cap:,} rows: finetune.max_train_examples)"
        if cap is not None and len(train) >= cap
        else ""
    )
    return f"nothing to learn: the training split{capped} has {what}"


def recipe(ft: FinetuneConfig) -> dict:
    """The resolved recipe behind the finetune hash, every field spelled out (readers ignore it; older files
    lack it): each result and diverged file keeps it."""
    return {k: getattr(ft, k) for k in type(ft).model_fields if k not in ("seeds", "tasks")}


@dataclass
class TaskRecords:
    """What every result file of one task under one recipe records, and the two files a seed can get: a
    result (its metrics and the mode's other outputs) or, where it diverged, the reason instead."""

    run_key: str
    spec: TaskSpec
    init: str
    n_train: int
    n_eval: int
    finetune_hash: str
    recipe: dict
    digest: dict  # task_data, encoder_data: the content digests of its inputs
    provenance: dict
    encoder: str  # where the encoder came from

    def _inputs(self) -> dict:
        return {
            "finetune_hash": self.finetune_hash,
            "recipe": self.recipe,
            **self.digest,
            "provenance": self.provenance,
            "encoder": self.encoder,
        }

    def result(self, mode: str, seed: int, out: dict) -> dict:
        m = out["metrics"]
        return {
            "run_key": self.run_key,
            "task": self.spec.name,
            "mode": mode,
            "init": self.init,
            "seed": seed,
            "metrics": m,
            "primary_metric": self.spec.primary,
            "primary": m[self.spec.primary],
            "n_train": self.n_train,
            "n_eval": self.n_eval,
            **self._inputs(),
            **{k: v for k, v in out.items() if k != "metrics"},
        }

    def diverged(self, seed: int, reason: str) -> dict:
        return {
            "run_key": self.run_key,
            "task": self.spec.name,
            "mode": "finetune",
            "init": self.init,
            "seed": seed,
            "diverged": reason,
            **self._inputs(),
        }
