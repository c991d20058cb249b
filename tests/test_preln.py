"""model.arch: pre_ln is a stock HF RoBERTa-PreLayerNorm checkpoint with BertForPreTraining's surface, and
post_ln (the default) is exactly the model and the run identity it was before the setting existed."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from study.config import ImplConfig, ModelConfig, RunConfig
from study.errors import StudyError
from study.model.bert import build_model, pretraining_loss, use_bits_dropout
from study.model.preln import MASKED_LM, MODEL_TYPE, PreLNForPreTraining

VOCAB, B, L, PAD, MASK = 300, 4, 24, 0, 4
POST = ModelConfig(
    layers=2, hidden=64, heads=2, intermediate=128, dropout=0.0, attention_dropout=0.0, max_positions=32
)
PRE = POST.model_copy(update={"arch": "pre_ln"})


def batch(seed: int = 0, pad_tail: int = 5) -> dict:
    """Token types 0/1, the last `pad_tail` positions of two rows padded with [PAD], 15% asked."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (B, L), generator=g)
    attn = torch.ones_like(ids)
    if pad_tail:
        attn[:2, -pad_tail:] = 0
    types = torch.zeros_like(ids)
    types[:, L // 2 :] = 1
    sel = (torch.rand(B, L, generator=g) < 0.15) & attn.bool()
    sel[:, 3] = True
    labels = torch.full_like(ids, -100)
    labels[sel] = ids[sel]
    inputs = ids.masked_fill(sel, MASK).masked_fill(~attn.bool(), PAD)
    return dict(
        input_ids=inputs,
        attention_mask=attn,
        token_type_ids=types.masked_fill(~attn.bool(), 0),
        labels=labels,
        sentence_label=torch.randint(0, 2, (B,), generator=g),
    )


def inputs(b: dict) -> dict:
    return {k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]
    core = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return BertTokenizerFast(
        tokenizer_object=core,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        do_lower_case=False,
    )


def saved(tmp_path, cfg: ModelConfig = PRE, seed: int = 4):
    """A pre-LN model as the trainer saves it on CPU (bits dropout on), with its tokenizer."""
    m = use_bits_dropout(
        build_model(
            cfg.model_copy(update={"dropout": 0.1, "attention_dropout": 0.1}),
            VOCAB,
            True,
            ImplConfig(),
            seed=seed,
        )
    )
    with torch.no_grad():  # a trained-looking model: non-trivial LayerNorms, biases and pad rows untouched
        for n, p in m.named_parameters():
            if "LayerNorm" in n or "layer_norm" in n or n.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.1)
    m.save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    return m.eval()


# --------------------------------------------------------------------------- the setting
def test_default_is_post_ln_with_the_run_identity_it_had_before():
    """`arch` is left out of the dump at its default: a post-LN config hashes as before the field existed
    (existing run folders keep their names), and a pre-LN one is a new run and a new random baseline."""
    from study.io import hash_obj

    assert ModelConfig().arch == "post_ln" and "arch" not in ModelConfig().model_dump(mode="json")
    post, pre = RunConfig(model=ModelConfig(layers=3)), RunConfig(model=ModelConfig(layers=3, arch="pre_ln"))
    assert RunConfig(model=ModelConfig(arch="post_ln")).run_hash() == RunConfig().run_hash()
    before = (
        "layers",
        "hidden",
        "heads",
        "intermediate",
        "activation",
        "dropout",
        "attention_dropout",
        "max_positions",
        "init_range",
    )  # the model section the hash covered before model.arch
    legacy = {**post.semantic(), "model": {k: getattr(post.model, k) for k in before}}
    assert post.run_hash() == hash_obj(legacy) and post.run_hash() != pre.run_hash()
    assert pre.model_dump(mode="json")["model"]["arch"] == "pre_ln"
    assert pre.baseline_key() != post.baseline_key()
    for cfg in (post, pre):  # config.json round-trips
        assert RunConfig.model_validate(json.loads(json.dumps(cfg.model_dump(mode="json")))) == cfg


def test_bad_arch_names_the_field_and_the_allowed_values():
    from study.studies.spec import build_run_config

    with pytest.raises(StudyError) as err:
        build_run_config({}, {"model.arch": "preln"}, 0, "spec.yaml")
    e = err.value
    assert e.field == "model.arch" and "post_ln" in e.allowed and "pre_ln" in e.allowed, str(e)
    assert "preln" in str(e) and str(e).startswith("spec.yaml: model.arch:")


def test_post_ln_model_is_bitwise_the_old_bert_for_the_same_seed():
    """The default builds what build_model built before model.arch: BertForPreTraining from the same
    BertConfig, the same forked-RNG init."""
    from transformers import BertConfig, BertForPreTraining

    for cfg, seed in ((POST, 3), (ModelConfig(), 0)):
        old_conf = BertConfig(
            vocab_size=VOCAB,
            hidden_size=cfg.hidden,
            num_hidden_layers=cfg.layers,
            num_attention_heads=cfg.heads,
            intermediate_size=cfg.intermediate,
            hidden_act=cfg.activation,
            hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.attention_dropout,
            max_position_embeddings=cfg.max_positions,
            type_vocab_size=2,
            initializer_range=cfg.init_range,
            architectures=["BertForPreTraining"],
        )
        old_conf._attn_implementation = "eager"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            old = BertForPreTraining(old_conf)
        new = build_model(cfg, VOCAB, True, ImplConfig(), seed=seed)
        assert type(new) is BertForPreTraining and new.config.to_dict() == old.config.to_dict()
        a, b = old.state_dict(), new.state_dict()
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


# --------------------------------------------------------------------------- the model
def test_preln_model_layout_init_and_surface():
    m = build_model(PRE.model_copy(update={"init_range": 0.05}), VOCAB, True, ImplConfig(), seed=1)
    assert isinstance(m, PreLNForPreTraining) and m.config.model_type == MODEL_TYPE
    assert m.config.max_position_embeddings == PRE.max_positions + PAD + 1 and m.config.pad_token_id == PAD
    assert m.config.type_vocab_size == 2 and m.config.initializer_range == 0.05
    emb = m.bert.embeddings
    assert not emb.word_embeddings.weight[PAD].any() and not emb.position_embeddings.weight[PAD].any()
    q = m.bert.encoder.layer[0].attention.self.query.weight
    assert 0.04 < float(q.detach().std()) < 0.06  # model.init_range is respected
    assert (
        0.03 < float(m.cls.seq_relationship.weight.detach().std()) < 0.07
        and not m.cls.seq_relationship.bias.any()
    )
    assert m.cls.predictions.decoder.weight is emb.word_embeddings.weight  # tied, as RoBERTa's
    assert m.bert.pooler is not None and m.bert.LayerNorm is not None  # pooler and the final LayerNorm
    b = batch(1)
    with torch.no_grad():
        out = m.bert(**inputs(b))
        assert torch.equal(out[1], out.pooler_output) and out[0].shape == (B, L, PRE.hidden)
        full = m(**inputs(b))
        assert torch.equal(full.prediction_logits, m.cls.predictions(out[0]))
        assert torch.equal(full.seq_relationship_logits, m.cls.seq_relationship(out[1]))
        # a row of max_positions tokens fits (positions count from pad_id + 1)
        long = torch.randint(5, VOCAB, (1, PRE.max_positions))
        assert m.bert(input_ids=long).last_hidden_state.shape == (1, PRE.max_positions, PRE.hidden)
    other = build_model(PRE, VOCAB, True, ImplConfig(), seed=1)
    again = build_model(PRE, VOCAB, True, ImplConfig(), seed=1)
    for (n, p), (_, q2) in zip(other.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(p, q2), n  # seeded init


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_preln_sparse_head_and_bits_dropout_are_loss_neutral(attn):
    b = batch(2)
    m = build_model(PRE, VOCAB, True, ImplConfig(attention=attn), seed=2)
    outs, gs = [], []
    for sparse in (True, False):
        m.zero_grad()
        o = pretraining_loss(m, **b, sparse=sparse)
        o.loss.backward()
        outs.append(o)
        gs.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert torch.allclose(outs[0].loss, outs[1].loss, atol=1e-5) and outs[0].sentence_loss is not None
    assert outs[0].mlm_correct == outs[1].mlm_correct and gs[0].keys() == gs[1].keys()
    for n in gs[0]:
        assert torch.allclose(gs[0][n], gs[1][n], atol=1e-5, rtol=1e-4), n
    tiny = PRE.model_copy(update={"dropout": 1e-9, "attention_dropout": 1e-9})
    bits = use_bits_dropout(build_model(tiny, VOCAB, True, ImplConfig(attention=attn), seed=2))
    assert bits.config._attn_implementation == f"bits-{attn}"
    assert all(type(x) is not torch.nn.Dropout for x in bits.modules())
    with torch.no_grad():
        assert torch.equal(pretraining_loss(m.eval(), **b).loss, pretraining_loss(bits.eval(), **b).loss)
    bits.train()
    assert torch.allclose(pretraining_loss(bits, **b).loss, outs[0].loss, rtol=1e-5, atol=1e-6)
    if attn == "sdpa":  # padding handled as eager handles it
        eager = build_model(PRE, VOCAB, True, ImplConfig(attention="eager"), seed=2).eval()
        with torch.no_grad():
            assert torch.allclose(
                pretraining_loss(eager, **b).loss, pretraining_loss(m.eval(), **b).loss, atol=1e-5
            )


def test_param_groups_leave_every_bias_and_layernorm_undecayed():
    """runtime.param_groups (ndim < 2) on the pre-LN model and the fine-tuning classifier on its encoder:
    no decay on exactly the biases and the LayerNorms (RoBERTa's head names one `layer_norm`), decay on
    every matrix and embedding, the tied decoder counted once."""
    from study.downstream.classifier import Classifier
    from study.runtime import param_groups

    model = use_bits_dropout(build_model(PRE, VOCAB, True, ImplConfig(), seed=0))
    clf = Classifier(model.bert, 3, 0.1, 0.02, torch.Generator().manual_seed(0))
    for m in (model, clf):
        names = {id(p): n for n, p in m.named_parameters()}
        decay, no_decay = param_groups(m, 0.01)
        got = [names[id(p)] for p in no_decay["params"]]
        assert got == [
            n for n in names.values() if n.endswith("bias") or "LayerNorm" in n or "layer_norm" in n
        ]
        assert all(p.ndim == 2 for p in decay["params"]) and len(got) + len(decay["params"]) == len(names)
    b = batch(3)
    assert clf(**inputs(b)).shape == (B, 3)  # Classifier reads .bert(**batch).pooler_output


def test_preln_trains():
    """40 AdamW steps as the trainer takes them (lr 4e-3, bits dropout, clipping) on four batches: the loss
    falls well below where it started (6.4 -> ~2.3 when written)."""
    m = use_bits_dropout(
        build_model(
            PRE.model_copy(update={"dropout": 0.1, "attention_dropout": 0.1}),
            VOCAB,
            True,
            ImplConfig(),
            seed=5,
        )
    )
    from study.runtime import param_groups

    opt = torch.optim.AdamW(param_groups(m, 0.01), lr=4e-3)
    torch.manual_seed(0)
    losses = []
    for step in range(40):
        o = pretraining_loss(m, **batch(200 + step % 4), accuracy=False)
        opt.zero_grad()
        o.loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        losses.append(float(o.loss.detach()))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert all(torch.isfinite(torch.tensor(losses))) and last < 0.7 * first, (first, last)


# --------------------------------------------------------------------------- the checkpoint
def test_preln_checkpoint_loads_in_stock_hf_classes_with_the_same_logits(tmp_path):
    from transformers import AutoModel, AutoModelForMaskedLM, pipeline

    ours = saved(tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["model_type"] == MODEL_TYPE and conf["architectures"] == [MASKED_LM]
    assert conf["max_position_embeddings"] == PRE.max_positions + 1 and conf["pad_token_id"] == PAD
    assert "bits" not in json.dumps(conf) and "auto_map" not in conf  # no custom code is named
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model.safetensors"]
    b = batch(7)
    with torch.no_grad():
        ref = ours(**inputs(b))
        mlm = AutoModelForMaskedLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
        assert type(mlm).__name__ == MASKED_LM
        assert torch.equal(mlm(**inputs(b)).logits, ref.prediction_logits)  # bitwise, same kernel
        default = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()  # transformers' default kernel
        assert torch.allclose(default(**inputs(b)).logits, ref.prediction_logits, atol=1e-5)
        enc = AutoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
        assert torch.equal(enc(**inputs(b)).pooler_output, ours.bert(**inputs(b)).pooler_output)
    fill = pipeline("fill-mask", model=str(tmp_path), top_k=3)
    res = fill("w1 w2 [MASK] w3")
    assert len(res) == 3 and all("token_str" in r for r in res)


def test_sentence_head_and_pooler_survive_save_and_load(tmp_path):
    """study.model.load.load_pretrained (rescore, fine-tuning) gives back every weight, the heads included,
    and the same pre-training loss, MLM and sentence parts."""
    from study.model.load import load_pretrained

    ours = saved(tmp_path)
    back = load_pretrained(tmp_path, "eager")
    assert isinstance(back, PreLNForPreTraining)
    a, b = ours.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and any(k.startswith("seq_relationship.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert back.cls.predictions.decoder.weight is back.bert.embeddings.word_embeddings.weight
    x = batch(8)
    with torch.no_grad():
        o1, o2 = pretraining_loss(ours, **x), pretraining_loss(back.eval(), **x)
    assert torch.equal(o1.mlm_loss, o2.mlm_loss) and torch.equal(o1.sentence_loss, o2.sentence_loss)
    post = tmp_path / "post"
    build_model(POST, VOCAB, True, ImplConfig(), seed=0).save_pretrained(post)
    assert type(load_pretrained(post, "eager")).__name__ == "BertForPreTraining"  # post-LN folders as before
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(StudyError, match="model.arch"):
        load_pretrained(bad, "eager")
