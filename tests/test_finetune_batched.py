"""Speed settings of fine-tuning: several seeds in one vmapped step (impl.finetune_batched_seeds), and the
length-grouped batches of finetune.length_groups (semantic, hashed).

Loss-neutral claim of the batched path: without dropout, every seed's per-step losses, dev predictions and
scores are the sequential loop's within float rounding. With dropout, a seed's masks come from its own
generator: its result depends on that seed alone, not on the seeds it runs beside.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_finetune import make_cfg, make_glue, write_model  # rootdir-relative, as report_fixtures

from study.config import FinetuneConfig, ModelConfig, RunConfig
from study.downstream import batched as b_mod
from study.downstream import finetune as ft_mod
from study.downstream.encode import Encoded, epoch_batches
from study.downstream.finetune import finetune_run, result_path
from study.errors import StudyError
from study.paths import Layout


def with_(cfg: RunConfig, **sections) -> RunConfig:
    d = cfg.model_dump()
    for sec, vals in sections.items():
        d[sec] = {**d[sec], **vals}
    return RunConfig.model_validate(d)


def recording(monkeypatch):
    """Record every fine-tune's per-step losses and dev predictions, per (task, seed)."""
    rec: dict = {"losses": {}, "preds": {}}
    step_seq, step_bat = ft_mod.finetune_step, b_mod.SeedBatch.step

    def seq_step(model, opt, batch, y, regression, autocast):
        loss = step_seq(model, opt, batch, y, regression, autocast)
        rec["losses"].setdefault(rec["current"], []).append(loss.item())
        return loss

    def bat_step(self, step, batch, y, regression, widths=None):
        values = step_bat(self, step, batch, y, regression, widths)
        for s, v in zip(self.seeds, values, strict=True):
            rec["losses"].setdefault((rec["task"], s), []).append(v)
        return values

    def one(cfg, spec, bert, train, dev, seed, rt, desc, quiet):
        rec["current"] = (spec.name, seed)
        return orig_one(cfg, spec, bert, train, dev, seed, rt, desc, quiet)

    def seeds(cfg, spec, bert, train, dev, seeds, rt, desc, quiet):
        rec["task"] = spec.name
        return orig_seeds(cfg, spec, bert, train, dev, seeds, rt, desc, quiet)

    def metrics(spec, preds, labels):
        rec["preds"].setdefault(spec.name, []).append(np.array(preds))
        return orig_metrics(spec, preds, labels)

    orig_one, orig_seeds, orig_metrics = ft_mod._finetune_one, b_mod.finetune_seeds, ft_mod.compute_metrics
    monkeypatch.setattr(ft_mod, "finetune_step", seq_step)
    monkeypatch.setattr(b_mod.SeedBatch, "step", bat_step)
    monkeypatch.setattr(ft_mod, "_finetune_one", one)
    monkeypatch.setattr(b_mod, "finetune_seeds", seeds)
    monkeypatch.setattr(ft_mod, "compute_metrics", metrics)
    monkeypatch.setattr(b_mod, "compute_metrics", metrics)
    return rec


def run(cfg, root, name):
    layout = Layout(root=root / name)
    write_model(cfg, layout)
    return {(r["task"], r["seed"]): r for r in finetune_run(cfg, layout, quiet=True)}


def batched_vs_sequential(tmp_path, monkeypatch, cfg, rtol: float, atol: float, scores: bool = True) -> dict:
    """Fine-tune `cfg` sequentially and batched; every seed's per-step losses, dev predictions, train loss
    and (`scores`) metrics must agree within rtol/atol (metrics: within one or two dev rows)."""
    out, rec = {}, {}
    for batched in (False, True):
        with monkeypatch.context() as m:
            rec[batched] = recording(m)
            out[batched] = run(with_(cfg, impl={"finetune_batched_seeds": batched}), tmp_path, f"b{batched}")
    assert out[True].keys() == out[False].keys()
    for key, seq in out[False].items():
        bat = out[True][key]
        assert bat["batched_seeds"] == cfg.finetune.seeds and "batched_seeds" not in seq
        assert bat["steps"] == seq["steps"] == len(rec[False]["losses"][key])
        np.testing.assert_allclose(rec[True]["losses"][key], rec[False]["losses"][key], rtol=rtol, atol=atol)
        assert bat["train_loss"] == pytest.approx(seq["train_loss"], rel=rtol, abs=atol)
        for m, v in seq["metrics"].items() if scores else ():
            assert bat["metrics"][m] == pytest.approx(v, abs=2.5 / seq["n_eval"]), (key, m)
    for task in cfg.finetune.tasks:  # predictions: the sequential loop scores its seeds in turn
        for p_seq, p_bat in zip(rec[False]["preds"][task], rec[True]["preds"][task], strict=True):
            np.testing.assert_allclose(p_bat, p_seq, rtol=rtol, atol=10 * atol)
    return out[True]


@pytest.mark.parametrize(
    "groups,tasks,arch,pooling",
    [
        (0, ["SST-2", "STS-B"], "post_ln", "cls"),
        (4, ["SST-2"], "post_ln", "cls"),
        (0, ["SST-2"], "pre_ln", "cls"),
        (0, ["SST-2", "STS-B"], "post_ln", "mean"),
    ],
)
def test_batched_seeds_equal_sequential_without_dropout(tmp_path, monkeypatch, groups, tasks, arch, pooling):
    if arch != "post_ln" and "arch" not in ModelConfig.model_fields:
        pytest.skip("no model.arch in this tree")
    torch.set_num_threads(1)
    glue = make_glue(tmp_path / "glue")
    # mean pooling: the batched step pads the K batches to one width, so this also checks that padding
    # never enters the mean
    cfg = with_(
        make_cfg(
            glue, tasks=tasks, seeds=[0, 1, 2], epochs=4, probe=False, length_groups=groups, pooling=pooling
        ),
        model={"dropout": 0.0, "attention_dropout": 0.0, **({"arch": arch} if arch != "post_ln" else {})},
    )
    out = batched_vs_sequential(tmp_path, monkeypatch, cfg, rtol=1e-4, atol=1e-6)
    # the batched fine-tune learns too (one word carries the label; sorted batches learn it more slowly)
    assert groups or min(out[("SST-2", s)]["metrics"]["accuracy"] for s in (0, 1, 2)) >= 0.8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision,rtol", [("fp32", 1e-3), ("bf16", 5e-2)])
def test_batched_seeds_equal_sequential_on_cuda(tmp_path, monkeypatch, precision, rtol):
    """On CUDA with SDPA (vmap's rules for the fused attention kernels). bf16: sequential autocast keeps
    activations bf16 between matmuls, the vmapped linear adds its bias in fp32 (batched.py), hence the
    looser tolerance."""
    glue = make_glue(tmp_path / "glue")
    cfg = with_(
        make_cfg(glue, tasks=["SST-2", "STS-B"], seeds=[0, 1, 2], epochs=2, probe=False),
        model={"dropout": 0.0, "attention_dropout": 0.0},
        impl={"device": "cuda", "precision": precision, "attention": "sdpa"},
    )
    # bf16: a barely trained model's near-tied logits may flip a few dev rows, so its scores are not compared
    batched_vs_sequential(
        tmp_path,
        monkeypatch,
        cfg,
        rtol=rtol,
        atol=1e-5 if precision == "fp32" else 1e-2,
        scores=precision == "fp32",
    )


def test_batched_dropout_depends_on_the_seed_alone(tmp_path):
    """With dropout, seed 1 batched beside seed 0 is seed 1 batched alone; seeds differ; reruns agree."""
    torch.set_num_threads(1)
    glue = make_glue(tmp_path / "glue")
    cfg = with_(
        make_cfg(glue, tasks=["SST-2"], seeds=[0, 1], epochs=2, probe=False),
        model={"dropout": 0.1, "attention_dropout": 0.1},
        impl={"finetune_batched_seeds": True},
    )
    torch.manual_seed(5)
    before = torch.get_rng_state()
    pair = run(cfg, tmp_path, "pair")
    assert torch.equal(before, torch.get_rng_state())  # the caller's RNG is untouched
    alone = run(with_(cfg, finetune={"seeds": [1]}), tmp_path, "alone")
    again = run(cfg, tmp_path, "again")
    a, b = pair[("SST-2", 1)], alone[("SST-2", 1)]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5) and a["metrics"] == b["metrics"]
    assert pair[("SST-2", 0)]["train_loss"] != a["train_loss"]
    assert {k: v["train_loss"] for k, v in again.items()} == {k: v["train_loss"] for k, v in pair.items()}
    # dropout is on: the same seed without it trains differently
    nodrop = run(with_(cfg, model={"dropout": 0.0, "attention_dropout": 0.0}), tmp_path, "nodrop")
    assert nodrop[("SST-2", 1)]["train_loss"] != a["train_loss"]


def test_seed_dropout_masks():
    """Keep rate 1 - p, each seed its own mask drawn at its own width (padding dropped): seed 4's mask
    beside seed 3 (wider batch) is its mask alone."""
    d = b_mod._DRAWS

    def noise(seeds, widths, shape, seq_dims):
        d.gens, d.widths = [torch.Generator().manual_seed(s) for s in seeds], widths
        try:
            return torch.func.vmap(
                lambda ix: (
                    setattr(d, "index", ix),
                    d.noise(torch.Size(shape), seq_dims, 0.25, torch.float32, torch.device("cpu")),
                )[1],
                randomness="same",
            )(torch.arange(len(seeds)))
        finally:
            d.gens, d.widths, d.index = [], [], None

    pair = noise([3, 4], [40, 25], (8, 40, 16), (1,))
    alone = noise([4], [25], (8, 25, 16), (1,))
    assert pair.shape == (2, 8, 40, 16) and alone.shape == (1, 8, 25, 16)
    assert torch.equal(pair[1, :, :25], alone[0]) and not pair[1, :, 25:].any()
    assert pair[0].unique().tolist() == [0.0, torch.tensor(1.0).div_(0.75).item()]  # ATen: mask / (1 - p)
    assert (pair[0] > 0).float().mean().item() == pytest.approx(0.75, abs=0.01)
    assert not torch.equal(pair[0, :, :25], pair[1, :, :25])
    attn = noise([3, 4], [40, 25], (2, 2, 40, 40), (2, 3))  # attention probabilities: both width dims
    assert torch.equal(attn[1, :, :, :25, :25], noise([4], [25], (2, 2, 25, 25), (2, 3))[0])
    assert not attn[1, :, :, 25:].any() and not attn[1, :, :, :, 25:].any()
    assert b_mod.dropout_seed(1, 7) != b_mod.dropout_seed(1, 8) != b_mod.dropout_seed(2, 7)


def test_stray_dropout_is_refused(tmp_path, monkeypatch):
    """A dropout that is not SeedDropout (here a functional one in the head) would share its mask across
    the seeds: the first batched step refuses it."""
    glue = make_glue(tmp_path / "glue")
    cfg = with_(
        make_cfg(glue, tasks=["SST-2"], seeds=[0, 1], epochs=1, probe=False),
        model={"dropout": 0.1},
        impl={"finetune_batched_seeds": True},
    )

    def forward(self, **batch):
        return self.head(F.dropout(self.bert(**batch).pooler_output, 0.1, training=self.training)).float()

    monkeypatch.setattr(ft_mod.Classifier, "forward", forward)
    with pytest.raises(RuntimeError, match="shared by all seeds"):
        run(cfg, tmp_path, "stray")
    x = torch.ones(2, 3)
    with b_mod._NoStrayDropout():
        assert torch.equal(F.dropout(x, 0.0, training=True), x)  # p = 0: harmless
        assert torch.equal(F.dropout(x, 0.5, training=False), x)
        with pytest.raises(RuntimeError, match="shared by all seeds"):
            F.dropout(x, 0.5, training=True)
        with pytest.raises(RuntimeError, match="shared by all seeds"):
            torch.nn.functional.scaled_dot_product_attention(
                x[None, None], x[None, None], x[None, None], dropout_p=0.1
            )


# --------------------------------------------------------------------------- length groups
def encoded(lengths) -> Encoded:
    return Encoded(
        [np.zeros(n, np.int32) for n in lengths],
        [np.zeros(n, np.int8) for n in lengths],
        np.zeros(len(lengths), np.int64),
    )


def test_length_groups_keep_the_rows_and_cut_padding():
    rng = np.random.default_rng(0)
    e = encoded(rng.integers(3, 120, 1000))
    lengths = np.array([len(x) for x in e.ids])
    off, on = FinetuneConfig(batch_size=32), FinetuneConfig(batch_size=32, length_groups=8)
    for epoch in (0, 1):
        plain, grouped = epoch_batches(e, off, 7, epoch), epoch_batches(e, on, 7, epoch)
        assert len(plain) == len(grouped) == 32
        assert sorted(np.concatenate(grouped).tolist()) == list(range(1000))  # every row once per epoch
        for g in range(0, len(plain), 8):  # each run of 8 batches: the same rows, sorted longest first
            assert set(np.concatenate(plain[g : g + 8])) == set(np.concatenate(grouped[g : g + 8]))
            flat = lengths[np.concatenate(grouped[g : g + 8])]
            assert (np.diff(flat) <= 0).all()
        width = lambda batches: sum(lengths[b].max() * len(b) for b in batches)
        assert width(grouped) < 0.7 * width(plain)
    assert [b.tolist() for b in epoch_batches(e, off, 7, 0)] == [
        b.tolist() for b in epoch_batches(e, FinetuneConfig(batch_size=32), 7, 0)
    ]


def test_length_groups_identity():
    base = RunConfig()
    assert "length_groups" not in base.finetune.model_dump()  # off: the recipe's hash is unchanged
    grouped = with_(base, finetune={"length_groups": 8})
    assert grouped.finetune_hash() != base.finetune_hash()
    assert RunConfig.model_validate(json.loads(grouped.model_dump_json())).finetune.length_groups == 8
    assert with_(base, impl={"finetune_batched_seeds": True}).finetune_hash() == base.finetune_hash()
    assert with_(base, impl={"finetune_batched_seeds": True}).run_hash() == base.run_hash()


def test_length_groups_one_is_a_user_error(tmp_path):
    glue = make_glue(tmp_path / "glue")
    cfg = make_cfg(glue, length_groups=1)
    layout = Layout(root=tmp_path / "results")
    with pytest.raises(StudyError) as err:
        finetune_run(cfg, layout, quiet=True)
    assert err.value.field == "finetune.length_groups"
    assert not result_path(layout, cfg.run_hash(), "SST-2", cfg.finetune_hash(), "finetune", 0).exists()
