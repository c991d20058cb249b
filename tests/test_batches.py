"""Pre-training batches (study/data/batches.py): a global batch is a pure function of (config, epoch, step),
whatever the number of ranks, the micro-batch split, the call order, prefetching or the device the batches
are made on; static masks repeat per instance, dynamic ones do not. On a small synthetic split (no
tokenizer); the CUDA device is checked against the CPU in test_cuda.py."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from study.config import RunConfig
from study.data.batches import Batches, micro_batches
from study.data.masking import mask_rows
from study.data.tokens import SpecialIds, TokenizedSplit

SP = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=400)


def fake_prepared(n_docs: int = 40, seed: int = 0):
    """What Batches reads of a prepared data folder: special ids, continuation mask, the train split."""
    rng = np.random.default_rng(seed)
    docs = [
        [
            rng.integers(5, 400, size=int(rng.integers(3, 15))).tolist()
            for _ in range(int(rng.integers(4, 12)))
        ]
        for _ in range(n_docs)
    ]
    split = TokenizedSplit.from_lists(docs)
    continuation = np.arange(400) >= 300  # ids 300.. continue the previous piece's word
    return types.SimpleNamespace(special=SP, continuation=continuation, split=lambda name: split)


def cfg_of(**over) -> RunConfig:
    d = {"objective": {"max_seq_len": 32}, "train": {"batch_size": 8}, "masking": {}}
    for key, value in over.items():
        section, _, name = key.partition("__")
        if name:
            d.setdefault(section, {})[name] = value
        else:
            d[section] = value
    return RunConfig.model_validate(d)


def rows(batch: dict) -> dict:
    """A batch's parts as full-width rows (padding restored), concatenated."""
    out = {}
    for k in ("input_ids", "attention_mask", "token_type_ids", "labels"):
        fill = -100 if k == "labels" else 0
        out[k] = torch.cat(
            [
                torch.nn.functional.pad(p["tensors"][k].cpu(), (0, 32 - p["tensors"][k].shape[1]), value=fill)
                for p in batch["parts"]
            ]
        )
    out["sentence_label"] = torch.cat([p["tensors"]["sentence_label"].cpu() for p in batch["parts"]])
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("generator", ["counter", "numpy"])
@pytest.mark.parametrize("unit", ["token", "span"])
def test_a_batch_is_the_same_for_any_ranks_split_order_and_prefetch(generator, unit):
    prepared = fake_prepared()
    cfg = cfg_of(masking__generator=generator, masking__unit=unit)
    one = Batches(cfg, prepared)
    positions = [(0, 0), (0, 3), (1, 2), (2, 0)]
    want = {pos: one.make(*pos) for pos in positions}
    for batch in want.values():
        assert batch["tokens"] == int(rows(batch)["attention_mask"].sum())
        assert (rows(batch)["labels"] != -100).sum() > 0
    # two ranks, each with 2 micro-batches: the same global rows, the same global token count
    ranks = [
        Batches(
            cfg_of(masking__generator=generator, masking__unit=unit, train__grad_accum=2),
            prepared,
            rank=r,
            world=2,
        )
        for r in (0, 1)
    ]
    for pos in reversed(positions):  # another call order, too
        parts = [b.make(*pos) for b in ranks]
        assert all(p["tokens"] == want[pos]["tokens"] for p in parts)
        joined = {k: torch.cat([rows(p)[k] for p in parts]) for k in rows(want[pos])}
        assert same(joined, rows(want[pos]))
        assert sum(p["n_mlm"] for b in parts for p in b["parts"]) == sum(
            p["n_mlm"] for p in want[pos]["parts"]
        )
    # prefetched on a worker thread
    pre = Batches(cfg_of(masking__generator=generator, masking__unit=unit, impl__workers=1), prepared)
    try:
        e, b = 0, 0
        for _ in range(6):
            got = pre.get(e, b)
            assert same(rows(got), rows(one.make(e, b)))
            e, b = pre.next_position(e, b)
    finally:
        pre.close()


def test_rows_are_masked_by_seed_instance_and_epoch():
    """Today's keying, whatever the generator: a row's masks are mask_rows(ids, key (seed, index, epoch))."""
    prepared = fake_prepared()
    for generator in ("counter", "numpy"):
        cfg = cfg_of(masking__generator=generator, seed=5)
        bt = Batches(cfg, prepared)
        ep = bt._epoch(1)
        idx = ep.host_perm[8:16]
        got = rows(bt.make(1, 1))
        inputs, labels = mask_rows(
            ep.input_ids[idx].long(),
            cfg.masking,
            SP,
            torch.as_tensor(prepared.continuation),
            [(5, int(i), 1) for i in idx],
        )
        assert torch.equal(got["input_ids"], inputs) and torch.equal(got["labels"], labels)


def _masks_by_instance(bt: Batches, epoch: int) -> dict[int, torch.Tensor]:
    ep = bt._epoch(epoch)
    out = {}
    for b in range(bt.batches_per_epoch(epoch)):
        labels = rows(bt.make(epoch, b))["labels"]
        for i, lab in zip(ep.host_perm[b * bt.B : (b + 1) * bt.B].tolist(), labels, strict=True):
            out[i] = lab
    return out


@pytest.mark.parametrize("generator", ["counter", "numpy"])
def test_static_masks_repeat_every_epoch_and_dynamic_ones_do_not(generator):
    prepared = fake_prepared()
    static = Batches(
        cfg_of(masking__generator=generator, masking__dynamic=False, objective__dupe_factor=2), prepared
    )
    e0, e1 = _masks_by_instance(static, 0), _masks_by_instance(static, 1)
    common = e0.keys() & e1.keys()
    assert len(common) > 20 and all(torch.equal(e0[i], e1[i]) for i in common)
    assert not np.array_equal(static._epoch(0).host_perm, static._epoch(1).host_perm)  # reshuffled
    # dupe_factor copies are instances of their own: other cuts, other masks
    n = len(static._epoch(0).host_perm) // 2
    assert any(not torch.equal(e0[i], e0[i + n]) for i in e0 if i < n and i + n in e0)
    dynamic = Batches(cfg_of(masking__generator=generator), prepared)
    d0, d1 = _masks_by_instance(dynamic, 0), _masks_by_instance(dynamic, 1)
    common = d0.keys() & d1.keys()
    assert sum(not torch.equal(d0[i], d1[i]) for i in common) > 0.9 * len(common)


def test_instances_live_on_the_device_as_one_tensor_per_epoch():
    """Batches(device=...): an epoch is one tensor per field on that device, batches are made there; the
    same batches as the default (the CPU), in CUDA's case bitwise too (test_cuda.py)."""
    prepared = fake_prepared()
    cfg = cfg_of(masking__unit="whole_word")
    bt, ref = Batches(cfg, prepared, device="cpu"), Batches(cfg, prepared)
    ep = bt._epoch(0)
    n = len(ep.host_perm)
    assert ep.input_ids.shape == (n, 32) and ep.input_ids.device == bt.device
    assert all(t.device == bt.device for t in (ep.token_type_ids, ep.lengths, ep.sentence_label, ep.perm))
    got = bt.make(0, 2)
    assert all(t.device == bt.device for p in got["parts"] for t in p["tensors"].values())
    assert same(rows(got), rows(ref.make(0, 2)))


def test_micro_batches_trim_and_count_in_one_read():
    ids = torch.arange(5, 5 + 4 * 8).view(4, 8)
    att = (torch.arange(8) < torch.tensor([[3], [8], [5], [2]])).long()
    labels = (
        torch.where(torch.rand(4, 8, generator=torch.Generator().manual_seed(0)) < 0.5, ids, -100) * att
        + (att - 1) * 100
    )
    sl = torch.tensor([0, -1, 1, 1])
    parts = micro_batches(ids, att, torch.zeros_like(ids), labels, sl, 2)
    again = micro_batches(ids, att, torch.zeros_like(ids), labels, sl, 2, lengths=[3, 8, 5, 2])
    for p, q in zip(parts, again, strict=True):
        assert {k: v for k, v in p.items() if k != "tensors"} == {
            k: v for k, v in q.items() if k != "tensors"
        }
    assert [p["tensors"]["input_ids"].shape[1] for p in parts] == [8, 5]
    assert [p["positions"] for p in parts] == [16, 10]
    assert [p["n_sent"] for p in parts] == [1, 2]
    assert [p["n_mlm"] for p in parts] == [int((labels[:2] != -100).sum()), int((labels[2:] != -100).sum())]
