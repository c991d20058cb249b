"""The CUDA code paths: the speed settings stay loss-neutral on a GPU, bf16 autocast tracks fp32, a run
resumes, fine-tuning trains, `study plan` times on the GPU, a checkpoint trained there loads on a CPU, and
masks and batches made on the GPU are the CPU's bit for bit.

CI has no GPU, so every test here is skipped there (the CPU versions of these checks live in
test_model.py, test_train.py and test_finetune.py). bench/gpu_check.sh runs this file on a GPU machine.
With STUDY_GPU_REPORT=<file> each test also writes what it measured (differences, bitwise or not) as
JSON lines, so that a note or the README can quote the numbers rather than only "passed".
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU; CI has none (bench/gpu_check.sh runs this on one)",
)

# the CPU tests' fixtures and helpers: one tiny corpus, one prepared data folder, one config builder
from test_finetune import make_cfg as finetune_cfg
from test_finetune import make_glue, write_model
from test_model import CFG, VOCAB, batch, sparse_and_full
from test_train import Stop, _stop_at, corpus, data_dir, layout, losses, make_cfg, weights  # noqa: F401 - fixtures pytest finds by name

from study.config import ImplConfig, RunConfig
from study.data.batches import Batches
from study.model.bert import build_model, pretraining_loss
from study.pretrain.trainer import train_run

CUDA = torch.device("cuda")


@pytest.fixture
def record(request):
    """record(name=value, ...): one JSON line per test in $STUDY_GPU_REPORT (nothing when unset)."""
    path = os.environ.get("STUDY_GPU_REPORT")

    def write(**values):
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": request.node.name, **values}, default=float) + "\n")

    return write


def _on_cuda(b: dict) -> dict:
    return {k: v.to(CUDA) for k, v in b.items()}


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def test_sparse_head_and_sdpa_are_loss_neutral_on_cuda(record):
    # the sparse MLM head (masked positions only) against the full head: loss and every gradient, fp32
    outs, gs = sparse_and_full(
        build_model(CFG, VOCAB, True, ImplConfig(), seed=1).to(CUDA), _on_cuda(batch())
    )
    grad_diff = max(float((gs[0][n] - gs[1][n]).abs().max()) for n in gs[0])
    assert torch.allclose(outs[0].loss, outs[1].loss, atol=1e-5)
    assert int(outs[0].mlm_correct) == int(outs[1].mlm_correct)
    for n in gs[0]:
        assert torch.allclose(gs[0][n], gs[1][n], atol=1e-5, rtol=1e-4), n
    # SDPA against eager attention, with padding, in fp32 and under bf16 autocast
    b = _on_cuda(batch(1))
    b["attention_mask"][:, -5:] = 0
    attn = {}
    for prec in ("fp32", "bf16"):
        for kind in ("eager", "sdpa"):
            model = build_model(CFG, VOCAB, True, ImplConfig(attention=kind), seed=2).to(CUDA).eval()
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
                attn[prec, kind] = float(pretraining_loss(model, **b).loss)
    record(
        sparse_vs_full_loss=float((outs[0].loss - outs[1].loss).detach().abs()),
        sparse_vs_full_grad=grad_diff,
        sdpa_vs_eager_fp32=abs(attn["fp32", "sdpa"] - attn["fp32", "eager"]),
        sdpa_vs_eager_bf16=abs(attn["bf16", "sdpa"] - attn["bf16", "eager"]),
    )
    assert attn["fp32", "sdpa"] == pytest.approx(attn["fp32", "eager"], abs=1e-5)
    assert attn["bf16", "sdpa"] == pytest.approx(attn["bf16", "eager"], rel=1e-2)  # bf16 rounding


def test_training_on_cuda_impl_settings_seed_and_bf16(corpus, layout, record):
    """20 steps of the real trainer on the GPU. Without dropout (whose CUDA kernel draws its own stream)
    sparse/full head x eager/SDPA give the same curve; the same config twice gives the same curve (bitwise
    for this tiny model on an H200, but not at the gpu profile's scale: README "GPU"); bf16 autocast
    (precision auto on CUDA) tracks fp32 within 2%, as on the CPU."""
    curves, evals, runs = {}, {}, {}
    for sparse in (True, False):
        for attn in ("eager", "sdpa"):
            cfg = make_cfg(
                corpus,
                train__amount=20,
                impl__device="cuda",
                impl__precision="fp32",
                impl__sparse_head=sparse,
                impl__attention=attn,
                model__dropout=0.0,
                model__attention_dropout=0.0,
            )
            lay = layout(f"{sparse}-{attn}")
            m = train_run(cfg, lay, quiet=True)
            assert m["device"].startswith("cuda")
            runs[sparse, attn] = lay.run_dir(cfg.run_hash())
            curves[sparse, attn], evals[sparse, attn] = (
                np.array(losses(runs[sparse, attn])),
                m["ref_mlm_loss"],
            )
    base = curves[True, "eager"]
    assert len(base) == 20 and base[-1] < base[0]
    impl_diff = max(_max_diff(c, base) for c in curves.values())
    for k, c in curves.items():
        np.testing.assert_allclose(c, base, rtol=1e-3, atol=1e-3, err_msg=str(k))
        assert evals[k] == pytest.approx(evals[True, "eager"], rel=1e-3)
    # the same config again, dropout on: is a seed enough on the GPU?
    twice = []
    for name in ("seed-a", "seed-b"):
        cfg = make_cfg(corpus, train__amount=20, impl__device="cuda", impl__precision="fp32")
        lay = layout(name)
        train_run(cfg, lay, quiet=True)
        twice.append(lay.run_dir(cfg.run_hash()))
    wa, wb = weights(twice[0]), weights(twice[1])
    rerun_bitwise = all(torch.equal(wa[k], wb[k]) for k in wa)
    rerun_diff = _max_diff(losses(twice[0]), losses(twice[1]))
    np.testing.assert_allclose(losses(twice[1]), losses(twice[0]), rtol=1e-4, atol=1e-4)
    # bf16 autocast: what precision "auto" resolves to on CUDA
    cfg = make_cfg(corpus, train__amount=20, impl__device="cuda")
    lay = layout("auto")
    m = train_run(cfg, lay, quiet=True)
    run = lay.run_dir(cfg.run_hash())
    # MFU against a bf16 peak for a bf16 run (an fp32 peak put the gpu profile's model at 1.2)
    assert (m["precision"], m["peak_kind"]) == ("bf16", "bf16 matmul 8192^3, measured")
    assert 0 < m["mfu"] < 1
    meta = json.loads((run / "meta.json").read_text())
    fp32 = np.array(losses(twice[0]))
    rel = float(np.max(np.abs(np.array(losses(run)) - fp32) / fp32))
    record(
        impl_max_abs_diff=impl_diff,
        rerun_bitwise=rerun_bitwise,
        rerun_max_abs_diff=rerun_diff,
        bf16_vs_fp32_max_rel=rel,
        resolved_precision=meta.get("precision"),
    )
    assert meta["precision"] == "bf16"
    assert 0 < rel < 0.02, rel


def test_resume_on_cuda_continues_the_run(corpus, layout, record):
    """Stopped at step 20 of 30 and resumed from its checkpoint: the curve and weights of the run that was
    never stopped (bitwise where the GPU's kernels are deterministic; the measurement is recorded)."""
    cfg = make_cfg(corpus, impl__device="cuda", impl__eval_every=10, impl__checkpoint_every=10)
    ref = layout("ref")
    train_run(cfg, ref, quiet=True)
    lay = layout("b")
    with pytest.raises(Stop):
        train_run(cfg, lay, quiet=True, on_eval=_stop_at(20))
    train_run(cfg, lay, quiet=True)
    a, b = ref.run_dir(cfg.run_hash()), lay.run_dir(cfg.run_hash())
    wa, wb = weights(a), weights(b)
    record(
        resume_bitwise=all(torch.equal(wa[k], wb[k]) for k in wa),
        resume_max_abs_loss_diff=_max_diff(losses(a), losses(b)),
        resume_max_abs_weight_diff=max(float((wa[k] - wb[k]).abs().max()) for k in wa),
    )
    np.testing.assert_allclose(losses(b), losses(a), rtol=1e-4, atol=1e-4)


def test_finetune_on_cuda_learns_the_fixture_task(tmp_path, record):
    from study.downstream.finetune import finetune_run, result_path
    from study.paths import Layout

    glue = make_glue(tmp_path / "glue")
    scores = {}
    for device in ("cuda", "cpu"):
        d = finetune_cfg(glue, tasks=["SST-2"], seeds=[0]).model_dump()
        d["impl"]["device"] = device
        cfg = RunConfig.model_validate(d)
        lay = Layout(root=tmp_path / device)
        write_model(cfg, lay)
        finetune_run(cfg, lay, quiet=True)
        fh = cfg.finetune_hash()
        scores[device] = {
            mode: json.loads(result_path(lay, cfg.run_hash(), "SST-2", fh, mode, 0).read_text())["metrics"][
                "accuracy"
            ]
            for mode in ("finetune", "probe")
        }
    record(**{f"{d}_{m}": v for d, s in scores.items() for m, v in s.items()})
    assert scores["cuda"]["finetune"] >= 0.85  # one word decides the label (test_finetune.py)
    assert scores["cuda"]["probe"] > 0.5


def test_plan_times_steps_on_the_gpu(corpus):
    from study.studies import cost

    cfg = make_cfg(corpus, train__amount=20)  # impl.device auto: CUDA here, as training would use
    torch.cuda.reset_peak_memory_stats()
    assert cost.time_pretrain_step(cfg) > 0
    assert torch.cuda.max_memory_allocated() > 0


def test_checkpoint_trained_on_cuda_loads_on_cpu(corpus, layout):
    from transformers import AutoModelForMaskedLM

    cfg = make_cfg(corpus, train__amount=10, impl__device="cuda")
    lay = layout("ck")
    train_run(cfg, lay, quiet=True)
    model = AutoModelForMaskedLM.from_pretrained(str(lay.run_dir(cfg.run_hash()) / "model"))
    assert next(model.parameters()).device.type == "cpu"
    ids = torch.tensor([[2, 10, 11, 4, 3]])
    assert torch.isfinite(model(input_ids=ids).logits).all()


# --------------------------------------------------------------------------- masks and batches made on the GPU
@pytest.mark.parametrize("unit", ["token", "whole_word", "span"])
def test_masks_on_cuda_equal_the_cpu_bitwise(unit, record):
    """masking.generator "counter" (the default) on CUDA rows, keyed by a CUDA tensor: the CPU's masks, bit
    for bit, in every count mode, with and without max_predictions; "numpy" too (drawn on the host)."""
    from test_masking import SP, _batch

    from study.config import MaskingConfig
    from study.data.masking import mask_rows, mask_units, reference_masking

    ids = torch.cat([_batch(b=128, seed=s) for s in range(4)])  # 512 rows of 128
    ids[7, 1:] = SP.pad  # a row with nothing to mask
    cont = torch.zeros(1000, dtype=torch.bool)
    cont[600:900] = True
    keys = torch.stack([torch.full((512,), 3), torch.arange(10_000, 10_512), torch.full((512,), 2)], 1)
    diffs = {}
    for generator in ("counter", "numpy"):
        for count, cap, rate in (("exact", None, 0.15), ("bernoulli", None, 0.3), ("exact", 9, 0.5)):
            cfg = MaskingConfig(unit=unit, count=count, max_predictions=cap, rate=rate, generator=generator)
            cpu = mask_rows(ids, cfg, SP, cont, keys)
            gpu = mask_rows(ids.to(CUDA), cfg, SP, cont.to(CUDA), keys.to(CUDA))
            assert all(t.device.type == "cuda" for t in gpu)
            diffs[f"{generator}-{count}-{cap}"] = sum(
                int((a != b.cpu()).sum()) for a, b in zip(cpu, gpu, strict=True)
            )
            g = mask_units(ids.to(CUDA), cfg, SP, cont, torch.Generator().manual_seed(1))
            c = mask_units(ids, cfg, SP, cont, torch.Generator().manual_seed(1))
            assert all(torch.equal(a, b.cpu()) for a, b in zip(c, g, strict=True)), (generator, count, cap)
    ref_cpu = reference_masking(ids, SP, torch.arange(512))
    ref_gpu = reference_masking(ids.to(CUDA), SP, torch.arange(512))
    record(unit=unit, differing_elements=diffs)
    assert all(v == 0 for v in diffs.values()), diffs
    assert torch.equal(ref_cpu[0], ref_gpu[0].cpu()) and torch.equal(ref_cpu[1], ref_gpu[1].cpu())


@pytest.mark.parametrize("unit", ["token", "span"])
def test_batches_made_on_cuda_equal_the_cpu_bitwise(unit):
    """Batches(device=cuda): the epoch's instances live on the GPU as one tensor per field, a batch is
    gathered and masked there, and every micro-batch equals the CPU's bit for bit (any rank split)."""
    from test_batches import cfg_of, fake_prepared, rows, same

    prepared = fake_prepared()
    for world, accum in ((1, 1), (2, 2)):
        cfg = cfg_of(masking__unit=unit, train__grad_accum=accum)
        for rank in range(world):
            cpu = Batches(cfg, prepared, rank, world)
            gpu = Batches(cfg, prepared, rank, world, device=CUDA)
            assert gpu._epoch(0).input_ids.device.type == "cuda"
            for pos in ((0, 0), (0, 5), (1, 1)):
                a, b = cpu.make(*pos), gpu.make(*pos)
                assert a["tokens"] == b["tokens"]
                assert all(t.device.type == "cuda" for p in b["parts"] for t in p["tensors"].values())
                assert [{k: v for k, v in p.items() if k != "tensors"} for p in a["parts"]] == [
                    {k: v for k, v in p.items() if k != "tensors"} for p in b["parts"]
                ]
                assert same(rows(a), rows(b))


def test_static_shapes_and_compile_are_loss_neutral_on_cuda(corpus, layout, record):
    """The speed settings that make a step capturable, on the GPU: every batch padded to max_seq_len, and
    torch.compile of the encoder on those static shapes, track the trimmed eager run (fp32, no dropout:
    the CPU versions are tests/test_train.py's test_pad_to_max_is_loss_neutral and the slow compile test)."""
    curves, refs = {}, {}
    for name, impl in (
        ("batch", {}),
        ("max", {"pad_to": "max"}),
        ("compiled", {"pad_to": "max", "compile": True}),
    ):
        cfg = make_cfg(
            corpus,
            train__amount=12,
            model__dropout=0.0,
            model__attention_dropout=0.0,
            objective__max_seq_len=64,
            impl__device="cuda",
            impl__precision="fp32",
            **{f"impl__{k}": v for k, v in impl.items()},
        )
        lay = layout(name)
        m = train_run(cfg, lay, quiet=True)
        curves[name], refs[name] = np.array(losses(lay.run_dir(cfg.run_hash()))), m["ref_mlm_loss"]
    record(
        pad_max_abs_diff=_max_diff(curves["max"], curves["batch"]),
        compile_max_abs_diff=_max_diff(curves["compiled"], curves["batch"]),
        ref_loss={k: float(v) for k, v in refs.items()},
    )
    for name in ("max", "compiled"):
        # 1e-3 as for the other impl settings on CUDA: other shapes pick other GEMM kernels there
        np.testing.assert_allclose(curves[name], curves["batch"], rtol=1e-3, atol=1e-3, err_msg=name)
        assert refs[name] == pytest.approx(refs["batch"], rel=1e-3)
