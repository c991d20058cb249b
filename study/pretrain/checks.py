"""What a run's config and prepared data must satisfy before training starts (StudyError names the field).
No torch: `study search` checks every trial config with `check_config` before any training."""

from __future__ import annotations

import numpy as np

from study.config import RunConfig
from study.errors import StudyError


def check_config(cfg: RunConfig, world: int = 1) -> None:
    """What the model/loop cannot take, found before any data or compute (StudyError names the field).

    RunConfig validates these at construction, but `validate_assignment` does not re-run the
    cross-section check, so a config mutated after construction is checked again here.
    """
    t = cfg.train
    if cfg.objective.max_seq_len > cfg.model.max_positions:
        raise StudyError(
            f"max_seq_len {cfg.objective.max_seq_len} exceeds model.max_positions {cfg.model.max_positions}",
            field="objective.max_seq_len",
            allowed=f"<= model.max_positions ({cfg.model.max_positions})",
        )
    if t.batch_size < 1:
        raise StudyError(f"batch size {t.batch_size}", field="train.batch_size", allowed=">= 1")
    if t.grad_accum < 1:
        raise StudyError(f"grad_accum {t.grad_accum}", field="train.grad_accum", allowed=">= 1")
    split = t.grad_accum * world
    if t.batch_size % split:
        raise StudyError(
            f"batch size {t.batch_size} does not split into grad_accum ({t.grad_accum}) x "
            f"processes ({world}) equal micro-batches",
            field="train.batch_size",
            allowed=f"a positive multiple of {split}",
        )
    if cfg.model.hidden % cfg.model.heads:
        raise StudyError(
            f"hidden {cfg.model.hidden} not divisible by heads {cfg.model.heads}",
            field="model.heads",
            allowed=f"a divisor of {cfg.model.hidden}",
        )
    if cfg.impl.compile and cfg.impl.pad_to != "max":  # ImplConfig refuses it too, unless set unvalidated
        raise StudyError(
            "torch.compile needs static shapes: set impl.pad_to to max",
            field="impl.compile",
            allowed="false, or true with impl.pad_to=max",
        )


def check_data(cfg: RunConfig, prepared, instances) -> int:
    """The tokenizer, the cached token ids and the instances must fit the model. Returns the vocab size."""
    vocab = len(prepared.tokenizer)
    if prepared.special.vocab_size != vocab:
        raise StudyError(
            f"special ids say vocab {prepared.special.vocab_size}, tokenizer has {vocab}",
            field="tokenizer.vocab_size",
            allowed="a data folder prepared by this version",
        )
    ids = np.asarray(instances.input_ids)
    if ids.size and int(ids.max()) >= vocab:
        raise StudyError(
            f"token id {int(ids.max())} outside the tokenizer's vocabulary of {vocab} "
            f"(stale data folder {prepared.dir}?)",
            field="tokenizer.vocab_size",
            allowed=f"ids < {vocab}; delete the data folder to rebuild it",
        )
    if ids.ndim != 2 or ids.shape[1] > cfg.model.max_positions:
        raise StudyError(
            f"instances of length {ids.shape[-1]} exceed model.max_positions {cfg.model.max_positions}",
            field="objective.max_seq_len",
            allowed=f"<= {cfg.model.max_positions}",
        )
    if len(ids) < cfg.train.batch_size:
        raise StudyError(
            f"the training split yields only {len(ids)} instances, fewer than one batch",
            field="train.batch_size",
            allowed=f"<= {len(ids)} (or a larger corpus)",
        )
    return vocab
