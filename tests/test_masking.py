"""The masking engine: rates, the per-unit mask/random/keep split, whole words, spans, determinism.

Statistics run on >= 1M real tokens (14 Gutenberg books, tokenizer trained here, cut into
doc_sentences rows of 128): tolerances are the brief's (rate +-0.2 pp, split +-1 pp, mean span
length +-5% of the exact clipped-geometric mean), on the default generator ("counter"). Synthetic
batches check the mechanics on both generators; the counter function is checked against a pure-Python
uint64 SplitMix64, and both generators' masks are pinned by digests (CPU against CUDA: test_cuda.py).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from study.config import MaskingConfig, ObjectiveConfig, RunConfig
from study.data import counter
from study.data.masking import (
    _non_special_table,
    mask_rows,
    mask_tokens,
    mask_units,
    reference_masking,
    select_units,
)
from study.data.tokens import SpecialIds
from study.errors import StudyError

SP = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=1000)
RATES = [0.05, 0.15, 0.3, 0.5, 0.8]
GENERATORS = ["counter", "numpy"]


@pytest.fixture(scope="session")
def rows(real):
    """(ids [N, 128] long, special, continuation bool tensor): >= 1M maskable real tokens."""
    from study.data.instances import build_instances

    split, sp, cont = real
    inst = build_instances(split, ObjectiveConfig(format="doc_sentences", sentence="none"), sp, seed=0)
    ids = torch.as_tensor(inst.input_ids).long()
    assert int(_maskable(ids, sp).sum()) >= 1_000_000
    return ids, sp, torch.as_tensor(cont)


@pytest.fixture(scope="session")
def pair_rows(real):
    """segment_pair rows (a [SEP] in the middle) for the structural span/word checks."""
    from study.data.instances import build_instances

    split, sp, cont = real
    inst = build_instances(split, ObjectiveConfig(format="segment_pair", sentence="nsp"), sp, seed=0)
    return torch.as_tensor(inst.input_ids[:3000]).long(), sp, torch.as_tensor(cont)


def _maskable(ids, sp):
    return ~torch.isin(ids, torch.tensor([sp.pad, sp.cls, sp.sep, sp.mask]))


def _words(ids, sp, cont):
    """Independent word segmentation: word id per position (-1 on specials), word-start flags."""
    m = _maskable(ids, sp)
    prev = torch.zeros_like(m)
    prev[:, 1:] = m[:, :-1]
    start = m & ~(cont[ids] & prev)
    wid = torch.cumsum(start.reshape(-1).long(), 0).view(ids.shape) - 1
    return torch.where(m, wid, torch.full_like(wid, -1)), start


def _fates(ids, inp, unit, sp):
    """Per selected unit: 'mask' if every token became [MASK], 'keep' if every token is unchanged,
    'random' if every token changed to a non-[MASK] id; 'mixed' otherwise (must never happen)."""
    sel = unit >= 0
    u = unit[sel]
    n = int(u.max()) + 1
    cnt = torch.bincount(u, minlength=n)
    is_mask = torch.bincount(u, weights=(inp[sel] == sp.mask).double(), minlength=n)
    same = torch.bincount(u, weights=(inp[sel] == ids[sel]).double(), minlength=n)
    # a random draw equal to the original id (1 in ~8k) is indistinguishable from keep
    rand = torch.bincount(u, weights=((inp[sel] != ids[sel]) & (inp[sel] != sp.mask)).double(), minlength=n)
    present = cnt > 0
    fm, fk = (is_mask == cnt) & present, (same == cnt) & present
    fr = (rand + same == cnt) & ~fk & present
    mixed = present & ~(fm | fk | fr)
    return fm, fr, fk, mixed, present


def _check_split(ids, inp, unit, sp, cfg, tol=0.01):
    fm, fr, fk, mixed, present = _fates(ids, inp, unit, sp)
    n = int(present.sum())
    assert int(mixed.sum()) <= 0.001 * n  # only via random draws equal to the original id
    for got, want in ((fm, cfg.mask), (fr, cfg.random), (fk, cfg.keep)):
        assert abs(int(got.sum()) / n - want) < tol, (int(got.sum()) / n, want)


def _check_no_specials(ids, inp, lab, sp):
    sel = lab != -100
    assert not (sel & ~_maskable(ids, sp)).any()  # never selects cls/sep/pad/mask
    assert (lab[sel] == ids[sel]).all() and (inp[~sel] == ids[~sel]).all()
    changed = sel & (inp != ids) & (inp != sp.mask)
    assert not torch.isin(inp[changed], torch.tensor(sp.all)).any()  # random ids never special


# --------------------------------------------------------------------------- synthetic mechanics
def _batch(b=64, length=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 1000, (b, length), generator=g)
    ids[:, 0] = SP.cls
    ids[:, 60] = SP.sep
    ids[:, -1] = SP.sep
    ids[:, 100:127] = SP.pad
    return ids


def test_random_table_is_the_non_special_vocab():
    t = _non_special_table(SP)
    assert len(t) == SP.vocab_size - 5 and not torch.isin(t, torch.tensor(SP.all)).any()


@pytest.mark.parametrize("generator", GENERATORS)
def test_seed_determinism(generator):
    ids = _batch()
    cont = torch.zeros(1000, dtype=torch.bool)
    cont[600:900] = True
    for unit in ("token", "whole_word", "span"):
        cfg = MaskingConfig(unit=unit, generator=generator)
        a = mask_tokens(ids, cfg, SP, cont, torch.Generator().manual_seed(0))
        b = mask_tokens(ids, cfg, SP, cont, torch.Generator().manual_seed(0))
        c = mask_tokens(ids, cfg, SP, cont, torch.Generator().manual_seed(1))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[1], c[1])
        keys = [(0, i, 0) for i in range(len(ids))]
        r1 = mask_rows(ids, cfg, SP, cont, keys)
        r2 = mask_rows(ids, cfg, SP, cont, keys)
        r3 = mask_rows(ids, cfg, SP, cont, [(1, i, 0) for i in range(len(ids))])
        assert torch.equal(r1[0], r2[0]) and torch.equal(r1[1], r2[1]) and not torch.equal(r1[1], r3[1])
        # a row's mask depends on its key only: any subset, any order gives the same rows
        perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(5))[:7]
        part = mask_rows(ids[perm], cfg, SP, cont, [keys[i] for i in perm.tolist()])
        assert torch.equal(part[0], r1[0][perm]) and torch.equal(part[1], r1[1][perm])


def test_reference_independent_of_batching():
    ids = _batch(b=16)
    idx = torch.arange(16)
    full = reference_masking(ids, SP, idx)
    for size in (1, 5):
        perm = torch.randperm(16, generator=torch.Generator().manual_seed(size))[:size]
        part = reference_masking(ids[perm], SP, idx[perm])
        assert torch.equal(full[1][perm], part[1]) and torch.equal(full[0][perm], part[0])


@pytest.mark.parametrize("generator", GENERATORS)
def test_max_predictions_is_a_hard_cap(generator):
    ids = _batch()
    cont = torch.zeros(1000, dtype=torch.bool)
    cont[600:900] = True
    for unit in ("token", "whole_word", "span"):
        for count in ("exact", "bernoulli"):
            cfg = MaskingConfig(rate=0.5, unit=unit, count=count, max_predictions=7, generator=generator)
            _, lab = mask_tokens(ids, cfg, SP, cont, torch.Generator().manual_seed(0))
            per_row = (lab != -100).sum(1)
            assert per_row.max() <= 7 and per_row.float().mean() > 5, (unit, count)


def test_whole_word_needs_continuation_mask():
    with pytest.raises(StudyError, match="masking.unit"):
        mask_tokens(_batch(), MaskingConfig(unit="whole_word"), SP, None, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("generator", GENERATORS)
def test_input_not_modified_and_rows_without_maskable_tokens(generator):
    ids = _batch()
    ids[3, 1:] = SP.pad
    before = ids.clone()
    cont = torch.zeros(1000, dtype=torch.bool)
    cont[600:900] = True
    for unit in ("token", "whole_word", "span"):
        for count in ("exact", "bernoulli"):
            inp, lab = mask_tokens(
                ids,
                MaskingConfig(unit=unit, count=count, generator=generator),
                SP,
                cont,
                torch.Generator().manual_seed(0),
            )
            assert torch.equal(ids, before) and (lab[3] == -100).all() and torch.equal(inp[3], ids[3])


# --------------------------------------------------------------------------- >= 1M real tokens
@pytest.mark.parametrize("unit", ["token", "whole_word"])
@pytest.mark.parametrize("count", ["exact", "bernoulli"])
def test_rates_and_split_real(rows, unit, count):
    ids, sp, cont = rows
    maskable = int(_maskable(ids, sp).sum())
    wid, _ = _words(ids, sp, cont)
    for k, rate in enumerate(RATES):
        # an uneven split too, so a swapped random/keep would show
        cfg = (
            MaskingConfig(rate=rate, unit=unit, count=count, mask=0.7, random=0.2, keep=0.1)
            if k % 2
            else MaskingConfig(rate=rate, unit=unit, count=count)
        )
        inp, lab, unit_ids = mask_units(ids, cfg, sp, cont, torch.Generator().manual_seed(k))
        assert torch.equal(lab != -100, unit_ids >= 0)
        sel = lab != -100
        assert abs(int(sel.sum()) / maskable - rate) < 0.002, (rate, int(sel.sum()) / maskable)
        _check_no_specials(ids, inp, lab, sp)
        _check_split(ids, inp, unit_ids, sp, cfg)
        if unit == "whole_word":
            # no word partially selected, and a unit is exactly one word
            w = wid[wid >= 0]
            n_sel = torch.bincount(w, weights=sel[wid >= 0].double())
            n_all = torch.bincount(w)
            assert ((n_sel == 0) | (n_sel == n_all)).all()
            assert torch.equal(
                torch.unique(unit_ids[sel]).numel() * torch.ones(1, dtype=torch.long),
                torch.unique(wid[sel]).numel() * torch.ones(1, dtype=torch.long),
            )
            multi = (n_all > 1) & (n_sel > 0)
            assert multi.sum() > 1000  # the property is exercised


def _clipped_geometric_mean(p, m):
    # independent of study.data.masking: sum over the pmf
    k = np.arange(1, m + 1)
    pmf = p * (1 - p) ** (k - 1)
    pmf[-1] = 1 - pmf[:-1].sum()
    return float((k * pmf).sum())


@pytest.mark.parametrize("count", ["exact", "bernoulli"])
def test_span_real(rows, count):
    ids, sp, cont = rows
    maskable = int(_maskable(ids, sp).sum())
    cfg = MaskingConfig(rate=0.15, unit="span", count=count)
    inp, lab, unit_ids = mask_units(ids, cfg, sp, cont, torch.Generator().manual_seed(0))
    sel = unit_ids >= 0
    assert torch.equal(lab != -100, sel)
    assert abs(int(sel.sum()) / maskable - cfg.rate) < 0.002
    wid, start = _words(ids, sp, cont)
    # span length in words = word starts inside the span
    words_per_span = torch.bincount(unit_ids[sel & start])
    words_per_span = words_per_span[words_per_span > 0]  # unit ids are unique, not contiguous
    assert len(words_per_span) == len(torch.unique(unit_ids[sel])) > 20_000
    expect = _clipped_geometric_mean(cfg.span_p, cfg.span_max)
    assert abs(words_per_span.double().mean().item() / expect - 1) < 0.05
    assert words_per_span.max() <= cfg.span_max and words_per_span.min() >= 1
    _check_no_specials(ids, inp, lab, sp)
    _check_split(ids, inp, unit_ids, sp, cfg)


def test_span_structure(pair_rows):
    """Spans are contiguous, whole words, never cross [SEP]; on rows with A [SEP] B."""
    ids, sp, cont = pair_rows
    unit_ids = select_units(
        ids, MaskingConfig(rate=0.3, unit="span"), sp, cont, torch.Generator().manual_seed(0)
    )
    sel = unit_ids >= 0
    wid, start = _words(ids, sp, cont)
    w = wid[wid >= 0]
    n_sel = torch.bincount(w, weights=sel[wid >= 0].double())
    assert ((n_sel == 0) | (n_sel == torch.bincount(w))).all()  # whole words
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    u = torch.unique(unit_ids[sel], return_inverse=True)[1]  # contiguous span numbers
    n = int(u.max()) + 1
    lo = torch.full((n,), 10**9).scatter_reduce(0, u, pos[sel], "amin")
    hi = torch.full((n,), -1).scatter_reduce(0, u, pos[sel], "amax")
    cnt = torch.bincount(u, minlength=n)
    assert torch.equal(hi - lo + 1, cnt)  # contiguous => no [SEP] inside
    row = torch.arange(ids.shape[0]).unsqueeze(1).expand_as(ids)[sel]
    assert torch.equal(
        torch.zeros(n, dtype=torch.long).scatter_reduce(0, u, row, "amax"),
        torch.full((n,), 10**9).scatter_reduce(0, u, row, "amin"),
    )  # one row per span


@pytest.mark.slow
@pytest.mark.parametrize("count", ["exact", "bernoulli"])
def test_span_rates_real(rows, count):
    """All rates: fraction +-0.2 pp. (At 0.8 rows are crowded and spans get cut: lengths not checked.)"""
    ids, sp, cont = rows
    maskable = int(_maskable(ids, sp).sum())
    for rate in (0.05, 0.3, 0.5, 0.8):
        cfg = MaskingConfig(rate=rate, unit="span", count=count)
        sel = select_units(ids, cfg, sp, cont, torch.Generator().manual_seed(1)) >= 0
        assert abs(int(sel.sum()) / maskable - rate) < 0.002, (rate, int(sel.sum()) / maskable)


@pytest.mark.parametrize("generator", GENERATORS)
def test_mask_tokens_is_mask_units(generator):
    ids = _batch()
    cont = torch.zeros(1000, dtype=torch.bool)
    cont[600:900] = True
    for unit in ("token", "whole_word", "span"):
        cfg = MaskingConfig(unit=unit, generator=generator)
        a = mask_tokens(ids, cfg, SP, cont, torch.Generator().manual_seed(0))
        b = mask_units(ids, cfg, SP, cont, torch.Generator().manual_seed(0))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert torch.equal(select_units(ids, cfg, SP, cont, torch.Generator().manual_seed(0)), b[2])


def test_mask_rows_equals_per_row_mask_tokens():
    """generator numpy: mask_rows draws per row, selects per batch: row i is exactly mask_tokens(row i, its
    generator). (The counter generator has no generator per row; its rows are keyed alike: test_seed_determinism.)"""
    from study.data.masking import row_generator

    ids = _batch(b=12)
    cont = torch.zeros(1000, dtype=torch.bool)
    cont[600:900] = True
    keys = [(7, i, 2) for i in range(12)]
    for unit in ("token", "whole_word", "span"):
        for count in ("exact", "bernoulli"):
            cfg = MaskingConfig(unit=unit, count=count, rate=0.3, generator="numpy")
            inp, lab = mask_rows(ids, cfg, SP, cont, keys)
            for i in (0, 5, 11):
                a, b = mask_tokens(ids[i : i + 1], cfg, SP, cont, row_generator(keys[i]))
                assert torch.equal(inp[i : i + 1], a) and torch.equal(lab[i : i + 1], b), (unit, count, i)
    for generator in GENERATORS:
        empty = mask_rows(ids[:0], MaskingConfig(generator=generator), SP, cont, [])
        assert empty[0].shape == empty[1].shape == (0, ids.shape[1])


# --------------------------------------------------------------------------- the counter generator
M64 = (1 << 64) - 1


def _splitmix64(state: int) -> int:
    """SplitMix64's output for a state, in Python's unbounded ints (Vigna's splitmix64.c)."""
    z = state & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _key_ref(parts) -> int:
    h = 0x6D61736B696E6721
    for p in parts:
        h = _splitmix64(((h ^ (p & M64)) + 0x9E3779B97F4A7C15) & M64)
    return h


def _bits_ref(key: int, stream: int, c: int) -> int:
    return _splitmix64(key + (((stream << 24) + c) * 0x9E3779B97F4A7C15))


def _u64(t: torch.Tensor) -> list[int]:
    return [v & M64 for v in t.reshape(-1).tolist()]


def test_counter_bits_equal_a_python_uint64_reference():
    """int64 torch arithmetic (wrapping products, masked shifts) gives SplitMix64's uint64 bits exactly."""
    # the first outputs of SplitMix64 seeded with 1234567 (the test vector of splitmix64.c)
    first = counter.bits(torch.tensor([1234567]), 0, torch.arange(1, 6))
    assert _u64(first) == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    rng = np.random.default_rng(0)
    parts = [[0, 0, 0], [2**32 - 1, 2**40 + 3, 7], [-1, -(2**63), 2**63 - 1]]
    parts += rng.integers(-(2**63), 2**63 - 1, size=(200, 3), dtype=np.int64, endpoint=True).tolist()
    keys = counter.row_keys(torch.tensor(parts, dtype=torch.int64))
    want = [_key_ref(p) for p in parts]
    assert _u64(keys) == want
    cs = torch.tensor([0, 1, 2, 127, 4095, 2**24 - 1])
    for stream in (counter.SCORE, counter.SPAN, 255):
        b = counter.bits(keys, stream, cs)
        assert _u64(b) == [_bits_ref(k, stream, c) for k in want for c in cs.tolist()]
        u = counter.uniform(b).reshape(-1).tolist()
        assert u == [(x >> 11) / 2.0**53 for x in _u64(b)] and 0 <= min(u) and max(u) < 1
        assert counter.below(b, 8187).reshape(-1).tolist() == [(x >> 1) % 8187 for x in _u64(b)]


def test_counter_uniforms_look_uniform():
    u = counter.uniform(
        counter.bits(counter.row_keys(torch.arange(4000).view(-1, 1)), counter.SCORE, torch.arange(256))
    )
    hist = torch.histc(u.float(), bins=16, min=0, max=1) / u.numel()
    assert (hist - 1 / 16).abs().max() < 0.002
    assert abs(float(torch.corrcoef(torch.stack([u[:, 0], u[:, 1]]))[0, 1])) < 0.03  # neighbours
    assert abs(float(torch.corrcoef(torch.stack([u[:-1, 0], u[1:, 0]]))[0, 1])) < 0.03  # neighbouring rows


def _digest(generator: str) -> str:
    """The masks of every unit and count mode on a fixed batch, plus the reference masks."""
    ids = _batch(b=16)
    cont = torch.zeros(1000, dtype=torch.bool)
    cont[600:900] = True
    h = hashlib.sha256()
    for unit in ("token", "whole_word", "span"):
        for count, cap in (("exact", None), ("bernoulli", None), ("exact", 9)):
            cfg = MaskingConfig(unit=unit, count=count, max_predictions=cap, rate=0.3, generator=generator)
            for t in mask_rows(ids, cfg, SP, cont, [(7, i, 2) for i in range(16)]):
                h.update(t.numpy().tobytes())
    for t in reference_masking(ids, SP, torch.arange(100, 116)):
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def test_mask_streams_are_pinned():
    """A change of either generator's masks must come with a new masking.generator value (a new run hash).
    numpy: the digest the engine gave before the counter generator existed (bitwise the old masks, and the
    reference masks every run is scored on)."""
    assert _digest("numpy") == "917e57b1c689a128"
    assert _digest("counter") == "7d8179f60537ca3c"


def test_generator_is_in_the_run_hash():
    a, b = RunConfig(), RunConfig.model_validate({"masking": {"generator": "numpy"}})
    assert a.masking.generator == "counter" and a.semantic()["masking"]["generator"] == "counter"
    assert b.semantic()["masking"]["generator"] == "numpy"
    assert a.run_hash() != b.run_hash()
    assert a.data_hash() == b.data_hash() and a.baseline_key() == b.baseline_key()  # masks only
    assert RunConfig.model_validate(b.model_dump(mode="json")).run_hash() == b.run_hash()  # round trip


@pytest.mark.parametrize("unit", ["token", "whole_word", "span"])
def test_tensor_keys_and_the_rows_device(unit):
    """Keys may be a tensor on the rows' device (nothing leaves it); outputs are on the input's device."""
    ids = _batch(b=12)
    cont = torch.zeros(1000, dtype=torch.bool)
    cont[600:900] = True
    keys = [(3, 1000 + i, 5) for i in range(12)]
    for generator in GENERATORS:
        cfg = MaskingConfig(unit=unit, generator=generator)
        a = mask_rows(ids, cfg, SP, cont, keys)
        b = mask_rows(ids.int(), cfg, SP, cont, torch.tensor(keys))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert all(t.device == ids.device and t.dtype == torch.long for t in b)


def test_counter_rows_differ_by_every_key_part():
    ids = _batch(b=4)
    base = mask_rows(ids, MaskingConfig(), SP, None, [(0, i, 0) for i in range(4)])[1]
    for keys in (
        [(1, i, 0) for i in range(4)],
        [(0, i + 4, 0) for i in range(4)],
        [(0, i, 1) for i in range(4)],
    ):
        other = mask_rows(ids, MaskingConfig(), SP, None, keys)[1]
        assert all(not torch.equal(base[r], other[r]) for r in range(4))
