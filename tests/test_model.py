"""The model's speed settings are loss-neutral, and its checkpoint is a standard HF one."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from study.config import ImplConfig, ModelConfig, RunConfig
from study.errors import StudyError
from study.model.attention import check_registry, register_dropout_attention
from study.model.bert import (
    bits_dropout,
    build_model,
    model_flops_per_token,
    pretraining_loss,
    use_bits_dropout,
)

VOCAB, B, L = 300, 4, 32
CFG = ModelConfig(
    layers=2, hidden=64, heads=2, intermediate=128, dropout=0.0, attention_dropout=0.0, max_positions=64
)


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (B, L), generator=g)
    labels = torch.full_like(ids, -100)
    sel = torch.rand(B, L, generator=g) < 0.15
    sel[:, 3] = True  # every row predicts at least one token
    labels[sel] = ids[sel]
    inputs = ids.masked_fill(sel, 4)
    return dict(
        input_ids=inputs,
        attention_mask=torch.ones_like(ids),
        token_type_ids=torch.zeros_like(ids),
        labels=labels,
        sentence_label=torch.randint(0, 2, (B,), generator=g),
    )


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def sparse_and_full(model, b: dict) -> tuple[list, list]:
    """The loss outputs and gradients of one batch with the sparse MLM head, then with the full head."""
    outs, gs = [], []
    for sparse in (True, False):
        model.zero_grad()
        o = pretraining_loss(model, **b, sparse=sparse)
        o.loss.backward()
        outs.append(o)
        gs.append(grads(model))
    return outs, gs


def test_sparse_head_equals_full_head_loss_and_grads():
    outs, gs = sparse_and_full(build_model(CFG, VOCAB, True, ImplConfig(), seed=1), batch())
    assert torch.allclose(outs[0].loss, outs[1].loss, atol=1e-5)
    assert outs[0].mlm_correct == outs[1].mlm_correct and outs[0].mlm_count == outs[1].mlm_count
    assert gs[0].keys() == gs[1].keys()
    for n in gs[0]:
        assert torch.allclose(gs[0][n], gs[1][n], atol=1e-5, rtol=1e-4), n


@pytest.mark.parametrize("arch", ["post_ln", "pre_ln"])
def test_chunked_mlm_loss_equals_torch_loss_and_grads(arch, monkeypatch):
    """impl.mlm_loss "chunked" (study/model/xent.py): the projection and cross-entropy a few rows at a time
    give the loss and every parameter's gradient of F.cross_entropy over the whole logits, within float
    rounding, with and without the sentence task, for both encoder layouts; chunks of 5 rows so the batch's
    rows span several chunks and end in a partial one."""
    from study.model import xent

    monkeypatch.setattr(xent, "CHUNK", 5)
    cfg = CFG.model_copy(update={"arch": arch})
    model = build_model(cfg, VOCAB, True, ImplConfig(), seed=6)
    b = batch(5)
    n = int((b["labels"] != -100).sum())
    assert n % 5 and n > 10
    for sentence in (True, False):
        runs = []
        for chunked in (False, True):
            model.zero_grad()
            o = pretraining_loss(model, **b, accuracy=False, n_masked=n, sentence=sentence, chunked=chunked)
            o.loss.backward()
            runs.append((o.loss.detach(), o.mlm_loss.detach(), grads(model), int(o.mlm_count)))
        assert runs[0][3] == runs[1][3] == n
        torch.testing.assert_close(runs[1][0], runs[0][0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(runs[1][1], runs[0][1], rtol=1e-6, atol=1e-6)
        assert runs[0][2].keys() == runs[1][2].keys()
        for name in runs[0][2]:
            torch.testing.assert_close(runs[1][2][name], runs[0][2][name], rtol=1e-4, atol=1e-7, msg=name)
    # the chunk size is rounding only: 5 rows, 64 rows (one chunk here) and every row alone agree
    h = torch.randn(23, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(40, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 40, (23,))
    ref = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w, bias), t)
    want = torch.autograd.grad(2.5 * ref, (h, w, bias))
    for chunk in (1, 5, 64):
        loss = xent._LinearCrossEntropy.apply(h, w, bias, t, chunk)
        torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
        for got, exp in zip(torch.autograd.grad(2.5 * loss, (h, w, bias)), want, strict=True):
            torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("arch", ["post_ln", "pre_ln"])
def test_decoder_input_is_the_heads_own_forward_up_to_the_projection(arch):
    """The chunked loss re-computes the MLM head up to its decoder (study.model.bert.decoder_input): it must
    be transformers' own head, bitwise, or a transformers release that changes the head would go unnoticed."""
    from study.model.bert import decoder_input

    model = build_model(CFG.model_copy(update={"arch": arch}), VOCAB, True, ImplConfig(), seed=7)
    p = model.cls.predictions
    x = torch.randn(9, CFG.hidden)
    assert torch.equal(p.decoder(decoder_input(p, x)), p(x))


def test_mlm_loss_auto_is_chunked_on_a_cpu_in_fp32_only():
    from study.runtime import resolve, resolve_mlm_loss

    cpu = torch.device("cpu")
    assert resolve(ImplConfig(device="cpu")).chunked_mlm is True
    assert resolve(ImplConfig(device="cpu", mlm_loss="torch")).chunked_mlm is False
    assert resolve_mlm_loss("auto", cpu, torch.bfloat16) is False
    assert resolve_mlm_loss("auto", torch.device("cuda"), None) is False
    assert resolve_mlm_loss("chunked", torch.device("cuda"), torch.bfloat16) is True
    with pytest.raises(ValueError, match="mlm_loss"):
        ImplConfig(mlm_loss="fused")


def test_host_counts_give_the_boolean_index_loss_and_grads_bitwise():
    """The training step passes n_masked and `sentence` from the host (no device read on a GPU): the sorted
    row selection must pick the same rows in the same order as the boolean index, so nothing changes."""
    b = batch(3)
    model = build_model(CFG, VOCAB, True, ImplConfig(), seed=4)
    runs = []
    for host in (False, True):
        model.zero_grad()
        extra = dict(n_masked=int((b["labels"] != -100).sum()), sentence=True) if host else {}
        o = pretraining_loss(model, **b, accuracy=False, **extra)
        o.loss.backward()
        runs.append((o.loss.detach(), o.mlm_loss.detach(), o.sentence_loss.detach(), grads(model)))
    for x, y in zip(runs[0][:3], runs[1][:3], strict=True):
        assert torch.equal(x, y)
    assert runs[0][3].keys() == runs[1][3].keys()
    for n in runs[0][3]:
        assert torch.equal(runs[0][3][n], runs[1][3][n]), n


def test_sdpa_equals_eager():
    b = batch(1)
    losses = []
    for attn in ("eager", "sdpa"):
        m = build_model(CFG, VOCAB, True, ImplConfig(attention=attn), seed=2).eval()
        b2 = dict(b)
        b2["attention_mask"] = b["attention_mask"].clone()
        b2["attention_mask"][:, -5:] = 0  # padding must be handled identically
        with torch.no_grad():
            losses.append(pretraining_loss(m, **b2).loss)
    assert torch.allclose(losses[0], losses[1], atol=1e-5)


def test_same_seed_same_init_and_ambient_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model(CFG, VOCAB, True, ImplConfig(), seed=7)
    after = torch.rand(1)
    b = build_model(CFG, VOCAB, True, ImplConfig(), seed=7)
    assert torch.equal(before, after)
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(p, q), n


def test_init_range_sets_the_initial_weights_sd():
    # model.init_range is a recipe setting (the replacement study's cpu profile draws at 0.05, BERT at 0.02):
    # the post-LN model must draw its Linear and embedding weights with that SD, and the run hash must see it
    for sd in (0.02, 0.05):
        m = build_model(CFG.model_copy(update={"init_range": sd}), VOCAB, True, ImplConfig(), seed=1)
        q = m.bert.encoder.layer[0].attention.self.query.weight.detach()
        w = m.bert.embeddings.word_embeddings.weight.detach()
        assert abs(float(q.std()) / sd - 1) < 0.1 and abs(float(w.std()) / sd - 1) < 0.1, sd
    assert RunConfig(model={"init_range": 0.05}).run_hash() != RunConfig().run_hash()


def test_bf16_autocast_matches_fp32_curve():
    """30 steps of AdamW on the same batches: bf16 autocast tracks fp32 within 2% of the loss."""
    curves = {}
    for prec in ("fp32", "bf16"):
        m = build_model(CFG, VOCAB, True, ImplConfig(), seed=3)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        curve = []
        for step in range(30):
            b = batch(100 + step % 5)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=prec == "bf16"):
                o = pretraining_loss(m, **b)
            opt.zero_grad()
            o.loss.backward()
            opt.step()
            curve.append(float(o.loss.detach()))
        curves[prec] = torch.tensor(curve)
    rel = ((curves["bf16"] - curves["fp32"]).abs() / curves["fp32"]).max()
    assert 0 < rel < 0.02, f"max relative difference {rel:.4f}"  # > 0: autocast really ran in bf16
    assert curves["fp32"][-1] < curves["fp32"][0]  # it actually learned


def test_checkpoint_is_standard_hf(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModel, AutoModelForMaskedLM, BertTokenizerFast, pipeline

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]
    tok_core = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok_core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = BertTokenizerFast(
        tokenizer_object=tok_core,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        do_lower_case=False,
    )
    m = use_bits_dropout(
        build_model(CFG, VOCAB, True, ImplConfig(), seed=4)
    )  # as the trainer saves it on CPU
    m.save_pretrained(tmp_path)
    assert "bits" not in (tmp_path / "config.json").read_text()  # no custom attention name is written
    tok.save_pretrained(tmp_path)
    mlm = AutoModelForMaskedLM.from_pretrained(tmp_path)
    enc = AutoModel.from_pretrained(tmp_path)
    sd = m.state_dict()
    for k, v in mlm.state_dict().items():
        if k in sd:
            assert torch.equal(v, sd[k]), k
    assert torch.equal(enc.embeddings.word_embeddings.weight, m.bert.embeddings.word_embeddings.weight)
    fill = pipeline("fill-mask", model=str(tmp_path), top_k=3)
    res = fill("w1 w2 [MASK] w3")
    assert len(res) == 3 and all("token_str" in r for r in res)


def test_flops_formula():
    full = model_flops_per_token(CFG, 128, 8192, 128, sparse=False)
    sparse = model_flops_per_token(CFG, 128, 8192, 20, sparse=True)
    assert sparse < full
    dense = 6 * CFG.layers * (4 * 64 * 64 + 2 * 64 * 128)
    assert full == pytest.approx(dense + 12 * 2 * 128 * 64 + 6 * (64 * 64 + 64 * 8192))


def test_tiny_vocab_rejected():
    with pytest.raises(StudyError, match="tokenizer.vocab_size"):
        build_model(CFG, 4, True, ImplConfig())


def test_a_model_that_predicts_one_token_scores_exactly_the_mode_floor():
    """ref_mode_acc is what a collapsed model (the same token everywhere) scores; a run must beat it to
    have learned anything else. Forced here through the MLM decoder bias, for the mode and another token."""
    from study.pretrain.evaluate import EvalSet, evaluate, mode_accuracy

    b = batch()
    b["labels"][0, :6] = 7  # make token 7 the clear mode of the asked tokens
    b["input_ids"][0, :6] = 4
    es = EvalSet(
        input_ids=b["input_ids"],
        labels=b["labels"],
        attention_mask=b["attention_mask"],
        token_type_ids=b["token_type_ids"],
        sentence_label=None,
    )
    asked = b["labels"][b["labels"] != -100]
    floor = mode_accuracy(es)
    assert floor == pytest.approx((asked == 7).float().mean().item()) and floor > 1 / VOCAB
    m = build_model(CFG, VOCAB, True, ImplConfig(), seed=1)
    for token, expected in ((7, floor), (9, (asked == 9).float().mean().item())):
        with torch.no_grad():
            m.cls.predictions.bias.zero_()
            m.cls.predictions.bias[token] = 1e4  # every position -> `token`
        r = evaluate(m, es, None, torch.device("cpu"))
        assert r["ref_mode_acc"] == pytest.approx(floor)
        assert r["ref_mlm_acc"] == pytest.approx(expected)


def test_mask_position_accuracy_counts_only_positions_that_show_mask():
    """ref_mask_acc / ref_mask_mode_acc score the asked positions whose input is [MASK] only: a model that
    predicts one token everywhere gets that token's share among them, whatever the kept positions hold;
    sparse and full heads agree."""
    from study.pretrain.evaluate import EvalSet, evaluate

    b = batch()
    mask_id = 3
    asked = b["labels"] != -100
    shown = asked.clone()
    shown[0] = False  # row 0: the asked tokens shown unchanged (kept)
    b["input_ids"][shown] = mask_id
    b["input_ids"][0][asked[0]] = b["labels"][0][asked[0]]
    b["labels"][1][asked[1]] = 7  # token 7 is the answer at every [MASK] of row 1
    es = EvalSet(
        input_ids=b["input_ids"],
        labels=b["labels"],
        attention_mask=b["attention_mask"],
        token_type_ids=b["token_type_ids"],
        sentence_label=None,
        mask_id=mask_id,
    )
    at_mask = b["labels"][shown]
    m = build_model(CFG, VOCAB, True, ImplConfig(), seed=1)
    with torch.no_grad():
        m.cls.predictions.bias.zero_()
        m.cls.predictions.bias[7] = 1e4  # every position -> 7
    for sparse in (True, False):
        r = evaluate(m, es, None, torch.device("cpu"), sparse=sparse)
        assert r["ref_mask_count"] == int(shown.sum()) > 0
        assert r["ref_mask_acc"] == pytest.approx((at_mask == 7).float().mean().item())
        assert r["ref_mask_mode_acc"] == pytest.approx(r["ref_mask_acc"])  # 7 is the mode there
        assert r["ref_mlm_acc"] == pytest.approx((b["labels"][asked] == 7).float().mean().item())


def test_reference_accuracy_by_what_the_position_shows():
    """ref_mask_acc, ref_keep_acc and ref_rnd_acc split the asked positions by what they show ([MASK], the
    token itself, another token: a random draw that hit the original counts as kept) and partition them;
    a model that predicts one token everywhere gets that token's share in each, sparse and full heads alike."""
    from study.pretrain.evaluate import EvalSet, evaluate, shown_as

    b = batch(3)
    mask_id = 4  # batch() shows every asked position as 4
    asked = b["labels"] != -100
    rows = asked.nonzero()
    kept, rnd = rows[0::3], rows[1::3]  # a third kept, a third another token, a third [MASK]
    b["input_ids"][kept[:, 0], kept[:, 1]] = b["labels"][kept[:, 0], kept[:, 1]]
    other = b["labels"][rnd[:, 0], rnd[:, 1]] % (VOCAB - 6) + 5
    other[0] = b["labels"][rnd[0, 0], rnd[0, 1]]  # a "random" draw that hit the original: kept
    b["input_ids"][rnd[:, 0], rnd[:, 1]] = other
    es = EvalSet(
        input_ids=b["input_ids"],
        labels=b["labels"],
        attention_mask=b["attention_mask"],
        token_type_ids=b["token_type_ids"],
        sentence_label=None,
        mask_id=mask_id,
    )
    sel = shown_as(b["input_ids"], b["labels"], mask_id)
    assert sum(int(v.sum()) for v in sel.values()) == int(asked.sum())
    assert int(sel["keep"].sum()) == len(kept) + 1 and int(sel["rnd"].sum()) == len(rnd) - 1
    assert not (sel["mask"] & sel["keep"]).any() and not (sel["keep"] & sel["rnd"]).any()
    labels = b["labels"][asked]
    t = int(torch.mode(labels[sel["rnd"]]).values)  # the most frequent answer among the random ones
    m = build_model(CFG, VOCAB, True, ImplConfig(), seed=1)
    with torch.no_grad():
        m.cls.predictions.bias.zero_()
        m.cls.predictions.bias[t] = 1e4  # every position -> t
    for sparse in (True, False):
        r = evaluate(m, es, None, torch.device("cpu"), sparse=sparse)
        for k in ("mask", "keep", "rnd"):
            assert r[f"ref_{k}_count"] == int(sel[k].sum())
            assert r[f"ref_{k}_acc"] == pytest.approx((labels[sel[k]] == t).float().mean().item())
        assert r["ref_rnd_mode_acc"] == pytest.approx(r["ref_rnd_acc"])  # t is the mode there
        total = sum(r[f"ref_{k}_acc"] * r[f"ref_{k}_count"] for k in ("mask", "keep", "rnd"))
        assert total == pytest.approx(r["ref_mlm_acc"] * r["ref_masked"])


def test_the_plateau_test_uses_mask_positions_when_the_run_has_them():
    """A run on the copy plateau (docs/RESULTS.md: 15% overall, 96% of kept tokens copied, 5.8% at [MASK]
    against a 5.5% floor) passed the old test and fails the new one; a run scored before ref_mask_acc
    existed keeps the old test."""
    from study.report.collect import learned

    old = {"ref_mlm_acc": 0.146, "ref_mode_acc": 0.0543, "ref_masked": 4711}
    assert learned(old) is True
    assert (
        learned({**old, "ref_mask_acc": 0.0584, "ref_mask_mode_acc": 0.0552, "ref_mask_count": 3717}) is False
    )
    assert learned({**old, "ref_mask_acc": 0.20, "ref_mask_mode_acc": 0.0552, "ref_mask_count": 3717}) is True
    # the positions shown as another token count too: only context answers there (the plateau run copied
    # them to 3.7% against a ~5.5% floor), and a run trained without [MASK] never saw what [MASK] shows
    plateau = {**old, "ref_mask_acc": 0.0584, "ref_mask_mode_acc": 0.0552, "ref_mask_count": 3717}
    se = (0.055 * 0.945 / 465) ** 0.5
    assert (
        learned({**plateau, "ref_rnd_acc": 0.037, "ref_rnd_mode_acc": 0.055, "ref_rnd_count": 465}) is False
    )
    assert (
        learned({**plateau, "ref_rnd_acc": 0.055 + 2.9 * se, "ref_rnd_mode_acc": 0.055, "ref_rnd_count": 465})
        is False
    )
    assert (
        learned({**plateau, "ref_rnd_acc": 0.055 + 3.1 * se, "ref_rnd_mode_acc": 0.055, "ref_rnd_count": 465})
        is True
    )
    assert (
        learned(
            {
                **plateau,
                "ref_mask_acc": 0.20,
                "ref_rnd_acc": 0.01,
                "ref_rnd_mode_acc": 0.055,
                "ref_rnd_count": 465,
            }
        )
        is True
    )


# --------------------------------------------------------------------------- bits dropout (impl.dropout_masks)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bits_dropout_is_torch_dropout_given_its_mask(dtype):
    """Only the mask's random stream differs: given torch's own mask, the arithmetic (noise = mask in x's
    dtype / (1-p), x * noise: 1/0.9 rounds in bf16) is bitwise torch's."""
    x = torch.randn(64, 257, generator=torch.Generator().manual_seed(0)).to(dtype)
    for p in (0.1, 0.5):
        ref = torch.nn.functional.dropout(x, p, training=True)
        mask = ref != 0
        assert torch.equal(x * mask.to(dtype).div_(1 - p), ref)
        torch.manual_seed(1)
        ours = bits_dropout(x, p)
        kept = ours != 0
        assert torch.equal(ours[kept], (x * kept.to(dtype).div_(1 - p))[kept]) and not ours[~kept].any()
    assert bits_dropout(x, 0.0) is x


def test_bits_dropout_masks_are_bernoulli_and_seeded():
    n, p = 4_000_000, 0.1
    torch.manual_seed(0)
    keep = bits_dropout(torch.ones(n), p) != 0
    se = (p * (1 - p) / n) ** 0.5
    assert abs(keep.float().mean().item() - (1 - p)) < 4 * se
    k = keep.float() - (
        1 - p
    )  # neighbours (the two halves of one 64-bit word, and across words) uncorrelated
    for lag in (1, 2, 3):
        corr = (k[:-lag] * k[lag:]).mean().item() / (p * (1 - p))
        assert abs(corr) < 4 / n**0.5, (lag, corr)
    torch.manual_seed(0)
    assert torch.equal(bits_dropout(torch.ones(n), p) != 0, keep)  # the default generator's seed decides
    assert not torch.equal(bits_dropout(torch.ones(n), p) != 0, keep)  # and the stream moves on


@pytest.mark.parametrize("p", [1e-9, 1e-10, 1e-12, 2.0**-40])
def test_bits_dropout_keeps_almost_everything_at_a_tiny_p(p):
    """Below 2^-33, 1-p rounded to 2^32 and the keep threshold wrapped to int32's minimum: every element
    was dropped (kept fraction 0.0 at p = 1e-10)."""
    torch.manual_seed(0)
    assert (bits_dropout(torch.ones(100_000), p) != 0).float().mean().item() > 0.999


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_bits_dropout_model_computes_what_the_stock_model_does(attn):
    """Evaluation is bitwise the stock kernel's; in training (with a drop probability so small that nothing
    is dropped) the bits path, including its conversion of SDPA's boolean padding mask, gives the stock
    no-dropout loss and gradients."""
    b = batch(2)
    b["attention_mask"] = b["attention_mask"].clone()
    b["attention_mask"][:2, -6:] = 0
    stock = build_model(CFG, VOCAB, True, ImplConfig(attention=attn), seed=5)
    tiny = CFG.model_copy(update={"dropout": 1e-9, "attention_dropout": 1e-9})
    bits = use_bits_dropout(build_model(tiny, VOCAB, True, ImplConfig(attention=attn), seed=5))
    assert bits.config._attn_implementation == f"bits-{attn}"
    with torch.no_grad():
        assert torch.equal(pretraining_loss(stock.eval(), **b).loss, pretraining_loss(bits.eval(), **b).loss)
    stock.train(), bits.train()
    losses = []
    for m in (stock, bits):
        o = pretraining_loss(m, **b)
        o.loss.backward()
        losses.append(o.loss.detach())
    assert torch.allclose(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    gs, gb = grads(stock), grads(bits)
    for n in gs:
        assert torch.allclose(gs[n], gb[n], rtol=1e-4, atol=1e-6), n


# --------------------------------------------------------------------------- transformers' attention registry
# study/model/attention.py registers the bits- and seed- dropout kernels through transformers' attention
# registries; these tests fail with a message naming what changed when an upgrade moves them.


def test_transformers_attention_registry_still_has_what_we_register_through():
    check_registry()  # raises a RuntimeError naming the missing entry


def test_a_changed_registry_is_reported_by_name(monkeypatch):
    from transformers.masking_utils import AttentionMaskInterface

    monkeypatch.setattr(
        AttentionMaskInterface, "__getitem__", lambda self, key: (_ for _ in ()).throw(KeyError(key))
    )
    with pytest.raises(
        RuntimeError, match=r"changed its attention registry: AttentionMaskInterface\['eager'\]"
    ):
        check_registry()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_registered_dropout_attention_is_what_the_model_calls(attn):
    """A registered name in config._attn_implementation must reach our function: every layer's attention
    probabilities pass through `drop` once in training (attention dropout > 0), never in evaluation."""
    calls = []

    def drop(probs, p):
        calls.append((tuple(probs.shape), p))
        return probs

    assert register_dropout_attention("pin", drop) == ["pin-eager", "pin-sdpa"]
    cfg = CFG.model_copy(update={"attention_dropout": 0.25})
    m = build_model(cfg, VOCAB, True, ImplConfig(attention=attn), seed=1)
    m.config._attn_implementation = f"pin-{attn}"
    b = batch(3)
    pretraining_loss(m.train(), **b)
    assert calls == [((B, CFG.heads, L, L), 0.25)] * CFG.layers, (
        f"transformers no longer routes attention through the registered 'pin-{attn}' kernel: "
        "study/model/attention.py needs updating"
    )
    calls.clear()
    with torch.no_grad():
        pretraining_loss(m.eval(), **b)
    assert calls == []


# --------------------------------------------------------------------------- study.runtime
def _bert_rule(model) -> list[str]:
    """BERT's recipe as the trainer wrote it: no decay on biases and LayerNorm, by parameter name."""
    return [n for n, _ in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]


def _ndim_or_layernorm_rule(model) -> list[str]:
    """The rule fine-tuning used: fewer than two dimensions, or a LayerNorm."""
    return [n for n, p in model.named_parameters() if p.ndim < 2 or "LayerNorm" in n]


@pytest.mark.parametrize("sentence_head", [True, False])
@pytest.mark.parametrize("bits", [False, True])
def test_one_param_group_rule_partitions_every_model_as_both_old_rules(sentence_head, bits):
    """runtime.param_groups (ndim < 2: no decay) gives the pre-training model, and the fine-tuning classifier
    on its encoder, exactly the groups (members and order) of the trainer's name rule and of fine-tuning's
    ndim-or-LayerNorm rule: unifying them changed no optimizer state and no result."""
    from study.downstream.classifier import Classifier
    from study.runtime import param_groups

    for cfg in (CFG, ModelConfig()):  # a test-sized model and the default architecture
        model = build_model(cfg, VOCAB, sentence_head, ImplConfig(), seed=0)
        if bits:
            use_bits_dropout(model)
        clf = Classifier(model.bert, 3, 0.1, 0.02, torch.Generator().manual_seed(0))
        for m in (model, clf):
            names = {id(p): n for n, p in m.named_parameters()}
            decay, no_decay = param_groups(m, 0.01)
            assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
            got = [names[id(p)] for p in no_decay["params"]]
            assert got == _bert_rule(m) == _ndim_or_layernorm_rule(m)
            assert [names[id(p)] for p in decay["params"]] == [n for n in names.values() if n not in got]
            assert len(got) > 0 and len(decay["params"]) > 0
            assert len(got) + len(decay["params"]) == len(list(m.parameters()))  # tied decoder counted once


def test_bf16_on_a_cpu_without_bf16_hardware_is_warned_once(monkeypatch):
    """Emulated bf16 (an AVX2-only CPU) ran a 512^3 matmul 45x slower than fp32: say so, once, keep bf16."""
    import warnings

    from study import runtime

    cpu = torch.device("cpu")
    for has, expect in ((True, 0), (None, 0), (False, 1)):
        monkeypatch.setattr(runtime, "cpu_has_bf16", lambda has=has: has)
        monkeypatch.setattr(runtime, "_WARNED", [])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert runtime.resolve_precision("bf16", cpu) is torch.bfloat16
            assert runtime.resolve_precision("bf16", cpu) is torch.bfloat16
            assert runtime.resolve_precision("auto", cpu) is None
        assert len(seen) == expect
        assert all("impl.precision: bf16" in str(w.message) for w in seen)


def test_runtime_device_precision_and_threads(monkeypatch):
    from study.runtime import Dist, autocast_factory, resolve, resolve_device, resolve_precision, threads

    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) is None and resolve_precision("bf16", cpu) is torch.bfloat16
    assert resolve_precision("fp32", cpu) is None
    with autocast_factory(cpu, torch.bfloat16)():
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast_factory(cpu, None)():
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == cpu
    rt = resolve(ImplConfig(precision="bf16"))
    assert (rt.device, rt.dtype, rt.precision) == (cpu, torch.bfloat16, "bf16")
    for name in ("cuda", "mps"):  # an explicit device this machine lacks names impl.device
        with pytest.raises(StudyError) as err:
            resolve_device(name, Dist())
        assert err.value.field == "impl.device" and err.value.allowed == "auto, cpu"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")  # fine-tuning too picks MPS now (one rule)
    before = torch.get_num_threads()
    with threads(1):
        assert torch.get_num_threads() == 1
    with threads(None):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before


def test_transformers_quiet_restores_the_callers_progress_bar_setting(tmp_path):
    from transformers.utils import logging as hf_logging

    from study.model.load import load_pretrained
    from study.runtime import transformers_quiet

    build_model(CFG, VOCAB, True, ImplConfig(), seed=0).save_pretrained(tmp_path)
    for enabled in (True, False):
        (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
        with transformers_quiet(True):
            assert not hf_logging.is_progress_bar_enabled()
        assert load_pretrained(tmp_path, "eager", quiet=True).config.hidden_size == CFG.hidden
        assert hf_logging.is_progress_bar_enabled() == enabled
    hf_logging.enable_progress_bar()


def test_reference_spread_measures_how_much_the_encoder_output_varies_between_asked_positions():
    """ref_spread is sqrt(1 - |mean h|^2 / mean |h|^2) over the encoder outputs the MLM head reads at the asked
    positions, the same with sparse and full heads; an encoder that sends one vector everywhere (the collapse
    of the replacement study's SAME-0 runs, docs/RESULTS.md) scores 0."""
    from study.pretrain.evaluate import EvalSet, evaluate, spread

    b = batch(5)
    es = EvalSet(
        input_ids=b["input_ids"],
        labels=b["labels"],
        attention_mask=b["attention_mask"],
        token_type_ids=b["token_type_ids"],
        sentence_label=None,
        mask_id=4,
    )
    m = build_model(CFG, VOCAB, True, ImplConfig(), seed=2).eval()
    with torch.no_grad():
        h = m.bert(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], token_type_ids=b["token_type_ids"]
        )[0][b["labels"] != -100].double()
    want = (1 - h.mean(0).square().sum() / h.square().sum(1).mean()).sqrt().item()
    assert 0.3 < want < 1
    for sparse in (True, False):
        assert evaluate(m, es, None, torch.device("cpu"), sparse=sparse)["ref_spread"] == pytest.approx(
            want, rel=1e-6
        )
    last = m.bert.encoder.layer[-1].output.LayerNorm
    with torch.no_grad():  # the last LayerNorm's gain 0: every position's output is its bias
        last.weight.zero_()
        last.bias.copy_(torch.randn(CFG.hidden, generator=torch.Generator().manual_seed(0)))
    assert evaluate(m, es, None, torch.device("cpu"))["ref_spread"] == pytest.approx(0, abs=1e-6)
    v = torch.ones(3, dtype=torch.float64)
    assert spread(None, 0.0, 0) != spread(None, 0.0, 0)  # nothing asked: nan
    assert spread(v - v, 6.0, 2) == pytest.approx(1.0)  # h and -h: no common part
