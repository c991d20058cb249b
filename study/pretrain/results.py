"""A finished run's results: metrics.json (the reference evaluation plus throughput, MFU and what ran),
the model folder with its tokenizer, meta.json (provenance), then status "done" and the checkpoints
removed. Called once by trainer.Trainer._finish, after every step was read back from the device."""

from __future__ import annotations

import torch

from study.data.tokenizer import save_beside_model
from study.io import atomic_dir
from study.model.bert import model_flops_per_token
from study.pretrain.checkpoint import remove_checkpoints
from study.pretrain.evaluate import matmul_peak_flops
from study.provenance import provenance
from study.runtime import transformers_quiet


def run_metrics(tr, wall: float) -> dict:
    """metrics.json of trainer `tr` (its state, runtime, model size) after `wall` seconds in all."""
    cfg, st, device = tr.cfg, tr.state, tr.device
    ev = {k: v for k, v in st.last_eval.items() if k != "step"}
    seq = cfg.objective.max_seq_len
    masked_per_seq = st.masked / st.sequences if st.sequences else 0.0
    # MFU counts the useful FLOPs (MLM head on predicted positions only, whatever impl.sparse_head
    # does), at the sequence length actually computed after trimming padding.
    mean_len = st.positions / st.sequences if st.sequences else float(seq)
    fpt = model_flops_per_token(
        cfg.model, max(1, round(mean_len)), tr.vocab, masked_per_seq * seq / max(mean_len, 1.0), sparse=True
    )
    tps = st.tokens / st.train_s if st.train_s else None
    pps = st.positions / st.train_s if st.train_s else None
    # The peak in the dtype the matmuls run in (bf16 under autocast): against an fp32 peak a bf16 run
    # reads above 1 (1.2 on an H200). 2048^3 is launch-bound on a large GPU, so CUDA times 8192^3.
    dtype = tr.rt.dtype or torch.float32
    n = 8192 if device.type == "cuda" else 2048
    where = device.type if device.type != "cuda" else str(device)
    peak = matmul_peak_flops(where, n=n, dtype=dtype) if tr.dist.main else None
    return {
        **ev,
        "tokens_seen": st.tokens,
        "steps": st.step,
        "sequences_seen": st.sequences,
        "positions_computed": st.positions,
        "masked_seen": st.masked,
        "epochs": st.epoch + (st.batch / tr.batches.batches_per_epoch(st.epoch) if st.batch else 0.0),
        "tokens_per_s": tps,
        # world-size processes share the work; the peak is one device's, so divide by world
        "mfu": (fpt * pps / (peak * tr.dist.world)) if (pps and peak) else None,
        "flops_per_token": fpt,
        "peak_flops": peak,
        "peak_kind": f"{tr.rt.precision} matmul {n}^3, measured",
        "params": tr.params,
        "vocab_size": tr.vocab,
        "wall_s": wall,
        "time_s": st.train_s,  # time_s: seconds inside training steps
        "final_loss": st.last_loss,
        "device": str(device),
        "precision": tr.rt.precision,
        "world_size": tr.dist.world,
        "budget": f"{cfg.train.amount:g} {cfg.train.budget}",
    }


def write_results(tr, metrics: dict, wall: float, finished: str) -> None:
    """Rank 0: metrics, model folder, meta, then status "done" (last: a kill before it retrains nothing,
    the final checkpoint is kept) and the checkpoints removed."""
    cfg, st, rd = tr.cfg, tr.state, tr.rd
    rd.write_metrics(metrics)
    with atomic_dir(rd.model_dir) as tmp, transformers_quiet(tr.quiet):  # its "Writing model shards" bar
        tr.model.save_pretrained(tmp)
        save_beside_model(tr.prepared.tokenizer, tmp, cfg.model.max_positions)
    rd.write_meta(
        {
            "run_hash": cfg.run_hash(),
            "data_hash": cfg.data_hash(),
            "provenance": provenance(str(tr.device)),
            "wall_s": wall,
            "device": str(tr.device),
            "params": tr.params,
            "started": st.started,
            "finished": finished,
            "sessions": st.sessions,
            "world_size": tr.dist.world,
            "precision": tr.rt.precision,  # the one name metrics.json uses too (fp32, bf16)
            "impl": cfg.impl.model_dump(mode="json"),
            "dropout_masks": tr.dropout_masks,
            "mlm_loss": "chunked" if tr.rt.chunked_mlm else "torch",  # what impl.mlm_loss resolved to
            "bitwise_resume": cfg.train.budget != "seconds" and tr.device.type == "cpu",
        }
    )
    rd.write_status("done", None, st.step)
    remove_checkpoints(rd.ckpt_dir)
