import pytest
import torch

from study.config import MaskingConfig
from study.errors import StudyError
from study.masking import mask_tokens, reference_masking
from study.tokens import SpecialIds

SP = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=1000)


def _batch(b=64, l=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 1000, (b, l), generator=g)
    ids[:, 0] = SP.cls; ids[:, 60] = SP.sep; ids[:, -1] = SP.sep; ids[:, 100:127] = SP.pad
    return ids


@pytest.mark.parametrize("rate", [0.05, 0.15, 0.3, 0.5, 0.8])
@pytest.mark.parametrize("count", ["exact", "bernoulli"])
def test_rates_and_split(rate, count):
    ids = _batch(b=512, seed=1)
    cfg = MaskingConfig(rate=rate, count=count)
    inp, lab = mask_tokens(ids, cfg, SP, None, torch.Generator().manual_seed(0))
    sel = lab != -100
    maskable = ~torch.isin(ids, torch.tensor([0, 2, 3, 4]))
    assert not (sel & ~maskable).any()
    frac = sel.sum().item() / maskable.sum().item()
    assert abs(frac - rate) < (0.005 if count == "exact" else 0.01)
    assert (lab[sel] == ids[sel]).all()
    n = sel.sum().item()
    fm = (inp[sel] == SP.mask).sum().item() / n
    changed = (inp[sel] != ids[sel]) & (inp[sel] != SP.mask)
    assert abs(fm - 0.8) < 0.02 and abs(changed.sum().item() / n - 0.1) < 0.02
    assert not torch.isin(inp[sel][changed], torch.tensor(SP.all)).any()
    assert torch.equal(ids, _batch(b=512, seed=1))  # not modified in place


def test_seed_determinism():
    ids = _batch()
    a = mask_tokens(ids, MaskingConfig(), SP, None, torch.Generator().manual_seed(0))
    b = mask_tokens(ids, MaskingConfig(), SP, None, torch.Generator().manual_seed(0))
    c = mask_tokens(ids, MaskingConfig(), SP, None, torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[1], c[1])


def test_reference_independent_of_batching():
    ids = _batch(b=16)
    idx = torch.arange(16)
    full = reference_masking(ids, SP, idx)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(3))
    part = reference_masking(ids[perm[:5]], SP, idx[perm[:5]])
    assert torch.equal(full[1][perm[:5]], part[1]) and torch.equal(full[0][perm[:5]], part[0])


def test_unimplemented_unit_names_field():
    with pytest.raises(StudyError, match="masking.unit"):
        mask_tokens(_batch(), MaskingConfig(unit="span"), SP, None, torch.Generator().manual_seed(0))
