"""What a run will cost before anyone commits hours to it: tokens, parameters and wall time here.

`study plan` prints these. The time is measured, not modelled: a few real optimizer steps of the
run's model at its batch and sequence length on this machine, times the step count. Evaluation,
checkpoints, data preparation and fine-tuning are not included (the plan says so).
"""
from __future__ import annotations

import time

from .config import RunConfig

_STEP_TIMES: dict[tuple, float] = {}  # one measurement per model shape and batch per process


def planned_steps(cfg: RunConfig) -> float | None:
    """Optimizer steps the budget allows; None for a wall-clock budget."""
    t, seq = cfg.train, cfg.objective.max_seq_len
    if t.budget == "steps":
        return t.amount
    if t.budget == "tokens":
        return t.amount / (t.batch_size * seq)
    return None


def planned_tokens(cfg: RunConfig) -> int | None:
    """Sequence slots the budget trains on (an upper bound on real tokens: short sequences pad)."""
    t, seq = cfg.train, cfg.objective.max_seq_len
    if t.budget == "tokens":
        return int(t.amount)
    if t.budget == "steps":
        return int(t.amount * t.batch_size * seq)
    return None


def param_count(cfg: RunConfig) -> int:
    """Encoder + pooler parameters of the BERT this config builds (the MLM head's decoder is tied)."""
    m, v = cfg.model, cfg.tokenizer.vocab_size
    per_layer = 4 * m.hidden * m.hidden + 2 * m.hidden * m.intermediate + 9 * m.hidden + m.intermediate
    return v * m.hidden + m.max_positions * m.hidden + m.layers * per_layer + m.hidden * m.hidden


def estimate_seconds(cfg: RunConfig) -> float:
    """Pre-training wall time on this machine: the fastest of a few warm steps times the step count
    (other processes only ever slow a step down, so the minimum is the machine's own speed)."""
    import torch
    steps = planned_steps(cfg)
    if steps is None:
        return cfg.train.amount
    t, seq = cfg.train, cfg.objective.max_seq_len
    key = (cfg.model.model_dump_json(), cfg.tokenizer.vocab_size, seq, t.batch_size, cfg.masking.rate,
           cfg.impl.sparse_head, cfg.impl.threads)
    if key not in _STEP_TIMES:
        threads = torch.get_num_threads()
        if cfg.impl.threads:
            torch.set_num_threads(cfg.impl.threads)
        try:
            _STEP_TIMES[key] = _time_steps(cfg)
        finally:
            torch.set_num_threads(threads)
    return _STEP_TIMES[key] * steps


def _time_steps(cfg: RunConfig, n: int = 6) -> float:
    import torch

    from .model import build_model, pretraining_loss
    t, seq, vocab = cfg.train, cfg.objective.max_seq_len, cfg.tokenizer.vocab_size
    model = build_model(cfg.model, vocab, True, cfg.impl)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)  # a local generator: planning never touches global RNG state
    ids = torch.randint(5, vocab, (t.batch_size, seq), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < cfg.masking.rate, ids, torch.full_like(ids, -100))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        out = pretraining_loss(model, ids, torch.ones_like(ids), torch.zeros_like(ids), labels,
                               torch.zeros(t.batch_size, dtype=torch.long), sparse=cfg.impl.sparse_head)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    return min(times[1:])  # the first step pays for allocation
