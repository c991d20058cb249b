"""A GLUE split as token ids, and the batches fine-tuning and prediction cut from it.

Everything here depends on the data, the tokenizer and the fine-tuning recipe only, not on the encoder's
weights: every run and its random-init baseline see the same rows in the same batches, and `study plan`
(study/studies/cost.py) counts the same rows.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from study.config import FinetuneConfig
from study.data.corpus import file_digest
from study.downstream.tasks import HUB, TaskData
from study.io import atomic_write_bytes, hash_obj
from study.paths import Layout

EVAL_BATCH = 128
SUBSET_SEED = 20181011  # which rows a cap keeps; a constant so every run sees the same rows


@dataclass
class Encoded:
    """A tokenized split: per-row token ids and token types (unpadded), and the labels."""

    ids: list[np.ndarray]
    types: list[np.ndarray]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def cap_rows(data: TaskData, n: int | None) -> TaskData:
    """At most `n` rows of a split. Which rows depends on the split's size and n only (not the seed or the
    model), so every run, its baseline and `study plan`'s estimate see the same examples."""
    if n is None or len(data) <= n:
        return data
    rng = np.random.default_rng(np.random.SeedSequence([SUBSET_SEED, len(data), n]))
    return data.subset(np.sort(rng.choice(len(data), size=n, replace=False)))


def encode(tokenizer, data: TaskData, max_length: int, layout: Layout, glue_dir: str) -> Encoded:
    """Tokenize a (capped) split, cached by tokenizer + file content + max_length + rows kept. The cache
    key holds the tokenizer's full serialized state (vocab, normalizer, post-processor)."""
    src = data.source
    content = file_digest(Path(src)) if glue_dir != HUB and Path(src).is_file() else src
    key = hash_obj(
        {
            "tok": hash_obj(tokenizer.backend_tokenizer.to_str(), length=16),
            "task": data.task,
            "split": data.split,
            "content": content,
            "max_length": max_length,
            "rows": hash_obj([data.text_a, data.text_b]),
        },
        length=20,
    )
    path = layout.cache_dir("finetune") / f"{data.task}-{data.split}-{key}.npz"
    if path.is_file():
        with np.load(path) as z:
            offs = z["offsets"]
            ids = np.split(z["ids"], offs[1:-1])
            types = np.split(z["types"], offs[1:-1])
    else:
        out = tokenizer(
            data.text_a,
            data.text_b,
            truncation=True,
            max_length=max_length,
            return_token_type_ids=True,
            return_attention_mask=False,
        )
        ids = [np.asarray(x, dtype=np.int32) for x in out["input_ids"]]
        types = [np.asarray(x, dtype=np.int8) for x in out["token_type_ids"]]
        offs = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in ids], out=offs[1:])
        buf = io.BytesIO()
        np.savez(buf, ids=np.concatenate(ids), types=np.concatenate(types), offsets=offs)
        atomic_write_bytes(path, buf.getvalue())
    return Encoded(ids, types, data.labels)


def collate(
    e: Encoded, idx: np.ndarray, device: torch.device, width: int | None = None
) -> dict[str, torch.Tensor]:
    """Pad a batch to its own longest row (GLUE sentences are mostly far shorter than max_length), or to
    `width` (batched seeds pad their K batches to one width)."""
    width = width or max(len(e.ids[i]) for i in idx)
    ids = np.zeros((len(idx), width), dtype=np.int64)  # [PAD] is id 0 (study.data.tokenizer.SPECIALS)
    types = np.zeros((len(idx), width), dtype=np.int64)
    mask = np.zeros((len(idx), width), dtype=np.int64)
    for r, i in enumerate(idx):
        n = len(e.ids[i])
        ids[r, :n], types[r, :n], mask[r, :n] = e.ids[i], e.types[i], 1
    return {
        "input_ids": torch.from_numpy(ids).to(device),
        "token_type_ids": torch.from_numpy(types).to(device),
        "attention_mask": torch.from_numpy(mask).to(device),
    }


def eval_batches(e: Encoded) -> list[np.ndarray]:
    # length-sorted batches: little padding; predictions are put back in row order by the caller
    order = np.argsort([len(x) for x in e.ids], kind="stable")
    return [order[i : i + EVAL_BATCH] for i in range(0, len(order), EVAL_BATCH)]


def epoch_batches(e: Encoded, ft: FinetuneConfig, seed: int, epoch: int) -> list[np.ndarray]:
    """The training batches (row indices) of one seed's epoch: a permutation seeded by (seed, epoch), cut
    into batch_size rows. With finetune.length_groups = k >= 2 (HF's group_by_length), each run of k batches
    of that permutation is sorted by row length, longest first, before the cut: the same rows per epoch and
    per run of k batches, batches of similar lengths (less padding), a different batch composition."""
    order = np.random.default_rng(np.random.SeedSequence([seed, epoch])).permutation(len(e))
    if ft.length_groups >= 2:
        lengths = np.array([len(x) for x in e.ids])
        size = ft.length_groups * ft.batch_size
        order = np.concatenate(
            [
                g[np.argsort(-lengths[g], kind="stable")]
                for g in (order[i : i + size] for i in range(0, len(order), size))
            ]
        )
    return [order[b : b + ft.batch_size] for b in range(0, len(order), ft.batch_size)]
