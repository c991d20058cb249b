"""MLM masking engine: choose positions, then replace them with [MASK] / random id / kept.

Only unit="token" is implemented in this build; whole_word and span raise StudyError
(field masking.unit) rather than silently falling back to token masking.
Never selected: pad, cls, sep, mask. [UNK] is an ordinary, selectable token.
Random replacements come uniformly from the non-special vocabulary.
"""
from __future__ import annotations

import numpy as np
import torch

from study.config import MaskingConfig
from study.errors import StudyError
from study.tokens import SpecialIds

IGNORE = -100
REFERENCE = MaskingConfig(rate=0.15, mask=0.8, random=0.1, keep=0.1, unit="token", count="exact")
REFERENCE_SEED = 1234


def _non_special_table(special: SpecialIds) -> torch.Tensor:
    keep = torch.ones(special.vocab_size, dtype=torch.bool)
    keep[list(special.all)] = False
    return torch.nonzero(keep).squeeze(1)


def mask_tokens(input_ids: torch.Tensor, cfg: MaskingConfig, special: SpecialIds,
                continuation: torch.Tensor | None, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (inputs, labels); labels hold the original id at selected positions, -100 elsewhere."""
    if cfg.unit != "token":
        raise StudyError(f"unit {cfg.unit!r} is not implemented in this build", field="masking.unit",
                         allowed="token")
    ids = input_ids.long()
    blocked = torch.tensor([special.pad, special.cls, special.sep, special.mask], dtype=torch.long)
    maskable = ~torch.isin(ids, blocked)
    scores = torch.rand(ids.shape, generator=generator)
    if cfg.count == "bernoulli":
        selected = (scores < cfg.rate) & maskable
    else:
        # exact: per row round(rate * maskable), at least 1 if any maskable, capped by max_predictions.
        m = maskable.sum(dim=1)
        n_sel = torch.clamp(torch.round(m.double() * cfg.rate).long(), min=1)
        n_sel = torch.where(m > 0, torch.minimum(n_sel, m), torch.zeros_like(m))
        if cfg.max_predictions is not None:
            n_sel = torch.clamp(n_sel, max=cfg.max_predictions)
        # Lowest random scores among maskable positions win: rank via a double argsort.
        keyed = torch.where(maskable, scores, torch.full_like(scores, 2.0))
        rank = keyed.argsort(dim=1).argsort(dim=1)
        selected = rank < n_sel.unsqueeze(1)
    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE))
    u = torch.rand(ids.shape, generator=generator)
    to_mask = selected & (u < cfg.mask)
    to_random = selected & (u >= cfg.mask) & (u < cfg.mask + cfg.random)
    table = _non_special_table(special)
    rand_ids = table[torch.randint(len(table), ids.shape, generator=generator)]
    inputs = ids.clone()
    inputs[to_mask] = special.mask
    inputs[to_random] = rand_ids[to_random]
    return inputs, labels


def row_generator(key) -> torch.Generator:
    """A generator that depends only on `key` (a tuple of ints): no global RNG, no batch coupling."""
    state = np.random.SeedSequence([int(k) for k in key]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def mask_rows(input_ids: torch.Tensor, cfg: MaskingConfig, special: SpecialIds,
              continuation: torch.Tensor | None, row_keys) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask each row with its own generator seeded by its key, e.g. (run seed, instance index, epoch).

    A row's mask then depends only on (key, ids): batch size, order and sharding (DDP) cannot change
    it, static masking is "same key every epoch" and dynamic masking is "epoch in the key".
    """
    ins, labs = [], []
    for row, key in zip(input_ids, row_keys):
        i, l = mask_tokens(row.unsqueeze(0), cfg, special, continuation, row_generator(key))
        ins.append(i); labs.append(l)
    return torch.cat(ins), torch.cat(labs)


def reference_masking(input_ids: torch.Tensor, special: SpecialIds, instance_index: torch.Tensor,
                      generator_seed: int = REFERENCE_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """Evaluation masks that depend only on (seed, instance index, ids): batch order/size cannot change them."""
    return mask_rows(input_ids, REFERENCE, special, None,
                     [(generator_seed, int(i)) for i in instance_index.tolist()])
