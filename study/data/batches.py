"""Pre-training batches: global batch `b` of epoch `e` is a pure function of (config, e, b).

Data order: epoch e's instances are permuted by SeedSequence(seed, e, ORDER_TAG); batch b is rows
perm[b*B:(b+1)*B] (the ragged tail of an epoch is dropped, so every step has B sequences). Instances
are rebuilt per epoch when masking is dynamic (fresh pairs and masks, RoBERTa style) and fixed
(epoch 0, the same masks every epoch; dupe_factor gives copies) when it is static. Masks are drawn
per row, keyed by (seed, global instance index, epoch), on full-length rows; padding is trimmed per
micro-batch afterwards, so neither the number of processes nor grad_accum changes what is asked.

Because a batch depends on nothing else, prefetching it on a worker thread (impl.workers > 0), or
building it again after a resume, cannot change what is trained on.

Under DDP each rank takes its contiguous share of the global batch's rows; `tokens` is still the
global count (from the attention masks, without communication).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from study.config import RunConfig
from study.data.instances import build_instances
from study.data.masking import mask_rows

ORDER_TAG = 0x0DE7     # separates the data-order stream from other streams seeded by (seed, epoch)


def micro_batches(inputs: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                  labels: torch.Tensor, sentence_label: torch.Tensor, micro: int) -> list[dict]:
    """Split one process's rows into micro-batches of `micro` rows, each trimmed to its longest row.

    A part is {"tensors": the model's keyword arguments, "n_mlm": masked tokens, "n_sent": sentence
    labels, "positions": computed positions}; the pre-training step weights each part's loss by its
    share of the global masked and sentence counts."""
    parts = []
    for m in range(0, len(inputs), micro):
        s = slice(m, m + micro)
        width = int(attention_mask[s].sum(1).max())
        parts.append({"tensors": dict(input_ids=inputs[s, :width], attention_mask=attention_mask[s, :width],
                                      token_type_ids=token_type_ids[s, :width], labels=labels[s, :width],
                                      sentence_label=sentence_label[s]),
                      "n_mlm": int((labels[s] != -100).sum()), "n_sent": int((sentence_label[s] >= 0).sum()),
                      "positions": micro * width})
    return parts


class Batches:
    """The batches of one run, for one process (`rank` of `world`), optionally prefetched."""

    def __init__(self, cfg: RunConfig, prepared, rank: int = 0, world: int = 1, first_instances=None):
        self.cfg, self.prepared, self.rank, self.world = cfg, prepared, rank, world
        self.special = prepared.special
        self.continuation = torch.as_tensor(np.asarray(prepared.continuation))
        self.B = cfg.train.batch_size
        self._cache: dict[int, tuple] = {}
        self._lock = threading.Lock()
        self._first = first_instances  # epoch-0 instances, already built for the data checks
        self.pool = ThreadPoolExecutor(cfg.impl.workers) if cfg.impl.workers > 0 else None
        self._pending: dict = {}

    def _epoch(self, epoch: int) -> tuple:
        """(instances, attention mask, permutation) of one epoch; the last two epochs are cached."""
        with self._lock:
            if epoch not in self._cache:
                ie = epoch if self.cfg.masking.dynamic else 0
                if ie == 0 and self._first is not None:
                    inst = self._first
                else:
                    inst = build_instances(self.prepared.split("train"), self.cfg.objective, self.special,
                                           self.cfg.seed, epoch=ie)
                ss = np.random.SeedSequence([self.cfg.seed, epoch, ORDER_TAG])
                perm = np.random.default_rng(ss).permutation(len(inst.input_ids))
                self._cache[epoch] = (inst, np.asarray(inst.attention_mask()), perm)
                for old in [e for e in self._cache if e < epoch - 1]:
                    del self._cache[old]
            return self._cache[epoch]

    def batches_per_epoch(self, epoch: int) -> int:
        return len(self._epoch(epoch)[2]) // self.B  # the ragged tail is dropped: every step has B sequences

    def next_position(self, epoch: int, b: int) -> tuple[int, int]:
        return (epoch, b + 1) if b + 1 < self.batches_per_epoch(epoch) else (epoch + 1, 0)

    def make(self, epoch: int, b: int) -> dict:
        """{"parts": this process's micro-batches (see micro_batches), "tokens": the global batch's tokens}."""
        inst, att_all, perm = self._epoch(epoch)
        B = self.B
        rows = perm[b * B:(b + 1) * B]
        tokens = int(att_all[rows].sum())          # global, without communication
        per_rank = B // self.world
        mine = rows[self.rank * per_rank:(self.rank + 1) * per_rank]
        ids = torch.as_tensor(np.asarray(inst.input_ids[mine]), dtype=torch.long)
        key_epoch = epoch if self.cfg.masking.dynamic else 0
        # masks on full-length rows (keyed by global instance index); padding is trimmed afterwards
        inputs, labels = mask_rows(ids, self.cfg.masking, self.special, self.continuation,
                                   [(self.cfg.seed, int(i), key_epoch) for i in mine])
        att = torch.as_tensor(att_all[mine], dtype=torch.long)
        tt = torch.as_tensor(np.asarray(inst.token_type_ids[mine]), dtype=torch.long)
        sl = torch.as_tensor(np.asarray(inst.sentence_label[mine]), dtype=torch.long)
        parts = micro_batches(inputs, att, tt, labels, sl, per_rank // self.cfg.train.grad_accum)
        return {"parts": parts, "tokens": tokens}

    def get(self, epoch: int, b: int) -> dict:
        """The batch at (epoch, b); with workers > 0 the next one is prepared in the background."""
        if self.pool is None:
            return self.make(epoch, b)
        fut = self._pending.pop((epoch, b), None)
        out = fut.result() if fut is not None else self.make(epoch, b)
        nxt = self.next_position(epoch, b)
        self._pending = {nxt: self.pool.submit(self.make, *nxt)}
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
