"""Pre-training batches: global batch `b` of epoch `e` is a pure function of (config, e, b).

Data order: epoch e's instances are permuted by SeedSequence(seed, e, ORDER_TAG); batch b is rows
perm[b*B:(b+1)*B] (the ragged tail of an epoch is dropped, so every step has B sequences). Instances
are rebuilt per epoch when masking is dynamic (fresh pairs and masks, RoBERTa style) and fixed
(epoch 0, the same masks every epoch; dupe_factor gives copies) when it is static. Masks are drawn
per row, keyed by (seed, global instance index, epoch), on full-length rows; padding is trimmed per
micro-batch afterwards, so neither the number of processes nor grad_accum changes what is asked.

Where batches are made: `device` (default CPU). An epoch's instances live there as one tensor each (ids,
token types, lengths, sentence labels; built on the host, copied once per epoch), and a batch is gathered,
keyed and masked there (masking.generator "counter": the same bits on CPU and CUDA). The host keeps the
permutation and the lengths, so the token count and the micro-batch widths need no device read; the
masked and sentence-label counts of all micro-batches are read back together, once per batch.

Because a batch depends on nothing else, prefetching it on a worker thread (impl.workers > 0), or
building it again after a resume, cannot change what is trained on.

Under DDP each rank takes its contiguous share of the global batch's rows; `tokens` is still the
global count (from the instance lengths, without communication).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from study.config import RunConfig
from study.data.instances import build_instances
from study.data.masking import mask_rows
from study.data.units import check_continuation
from study.labels import IGNORE

ORDER_TAG = 0x0DE7  # separates the data-order stream from other streams seeded by (seed, epoch)


def micro_batches(
    inputs: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor,
    labels: torch.Tensor,
    sentence_label: torch.Tensor,
    micro: int,
    lengths=None,
) -> list[dict]:
    """Split one process's rows into micro-batches of `micro` rows, each trimmed to its longest row.

    A part is {"tensors": the model's keyword arguments, "n_mlm": masked tokens, "n_sent": sentence
    labels, "positions": computed positions}; the pre-training step weights each part's loss by its
    share of the global masked and sentence counts. `lengths` (host ints, the rows' attention lengths)
    spares reading the attention mask; the counts of all parts are read in one transfer."""
    if lengths is None:
        lengths = attention_mask.sum(1).tolist()
    lengths = np.asarray(lengths)
    slices = [slice(m, m + micro) for m in range(0, len(inputs), micro)]
    if not slices:
        return []
    counts = torch.stack(
        [torch.stack([(labels[s] != IGNORE).sum(), (sentence_label[s] >= 0).sum()]) for s in slices]
    ).tolist()
    parts = []
    for s, (n_mlm, n_sent) in zip(slices, counts, strict=True):
        width = int(lengths[s].max())
        parts.append(
            {
                "tensors": dict(
                    input_ids=inputs[s, :width],
                    attention_mask=attention_mask[s, :width],
                    token_type_ids=token_type_ids[s, :width],
                    labels=labels[s, :width],
                    sentence_label=sentence_label[s],
                ),
                "n_mlm": int(n_mlm),
                "n_sent": int(n_sent),
                "positions": micro * width,
            }
        )
    return parts


@dataclass
class Epoch:
    """One epoch's instances on the batches' device, and what the host keeps of them."""

    input_ids: torch.Tensor  # int32 [N, L]
    token_type_ids: torch.Tensor  # int8  [N, L]
    lengths: torch.Tensor  # int64 [N]
    sentence_label: torch.Tensor  # int8  [N]
    perm: torch.Tensor  # int64 [N]: the epoch's order
    host_perm: np.ndarray
    host_lengths: np.ndarray


class Batches:
    """The batches of one run, for one process (`rank` of `world`), optionally prefetched, made on `device`."""

    def __init__(
        self,
        cfg: RunConfig,
        prepared,
        rank: int = 0,
        world: int = 1,
        first_instances=None,
        device: torch.device | str | None = None,
    ):
        self.cfg, self.prepared, self.rank, self.world = cfg, prepared, rank, world
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.special = prepared.special
        self.continuation = torch.as_tensor(np.asarray(prepared.continuation), dtype=torch.bool).to(
            self.device
        )
        self.B = cfg.train.batch_size
        self._cache: dict[int, Epoch] = {}
        self._lock = threading.Lock()
        self._first = first_instances  # epoch-0 instances, already built for the data checks
        self.pool = ThreadPoolExecutor(cfg.impl.workers) if cfg.impl.workers > 0 else None
        self._pending: dict = {}

    def _epoch(self, epoch: int) -> Epoch:
        """The instances and permutation of one epoch; the last two epochs are cached."""
        with self._lock:
            if epoch not in self._cache:
                ie = epoch if self.cfg.masking.dynamic else 0
                if ie == 0 and self._first is not None:
                    inst = self._first
                else:
                    inst = build_instances(
                        self.prepared.split("train"),
                        self.cfg.objective,
                        self.special,
                        self.cfg.seed,
                        epoch=ie,
                    )
                ss = np.random.SeedSequence([self.cfg.seed, epoch, ORDER_TAG])
                perm = np.random.default_rng(ss).permutation(len(inst.input_ids))
                if self.device.type != "cpu" and self.cfg.masking.unit != "token" and len(inst):
                    check_continuation(
                        len(self.continuation), int(inst.input_ids.max())
                    )  # masking can't there
                lengths = np.asarray(inst.lengths, dtype=np.int64)
                dev = self.device
                self._cache[epoch] = Epoch(
                    torch.as_tensor(np.asarray(inst.input_ids)).to(dev),
                    torch.as_tensor(np.asarray(inst.token_type_ids)).to(dev),
                    torch.as_tensor(lengths).to(dev),
                    torch.as_tensor(np.asarray(inst.sentence_label)).to(dev),
                    torch.as_tensor(perm).to(dev),
                    perm,
                    lengths,
                )
                for old in [e for e in self._cache if e < epoch - 1]:
                    del self._cache[old]
            return self._cache[epoch]

    def batches_per_epoch(self, epoch: int) -> int:
        return (
            len(self._epoch(epoch).host_perm) // self.B
        )  # the ragged tail is dropped: every step has B sequences

    def next_position(self, epoch: int, b: int) -> tuple[int, int]:
        return (epoch, b + 1) if b + 1 < self.batches_per_epoch(epoch) else (epoch + 1, 0)

    def make(self, epoch: int, b: int) -> dict:
        """{"parts": this process's micro-batches (see micro_batches), "tokens": the global batch's tokens}."""
        ep = self._epoch(epoch)
        B = self.B
        tokens = int(
            ep.host_lengths[ep.host_perm[b * B : (b + 1) * B]].sum()
        )  # global, without communication
        per_rank = B // self.world
        first = b * B + self.rank * per_rank
        mine = ep.perm[first : first + per_rank]  # global instance indices
        key_epoch = epoch if self.cfg.masking.dynamic else 0
        keys = torch.stack([torch.full_like(mine, self.cfg.seed), mine, torch.full_like(mine, key_epoch)], 1)
        # masks on full-length rows (keyed by global instance index); padding is trimmed afterwards
        inputs, labels = mask_rows(
            ep.input_ids[mine], self.cfg.masking, self.special, self.continuation, keys
        )
        L = inputs.shape[1]
        att = (torch.arange(L, device=self.device) < ep.lengths[mine].unsqueeze(1)).long()
        tt = ep.token_type_ids[mine].long()
        sl = ep.sentence_label[mine].long()
        host_len = ep.host_lengths[ep.host_perm[first : first + per_rank]]
        parts = micro_batches(inputs, att, tt, labels, sl, per_rank // self.cfg.train.grad_accum, host_len)
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
