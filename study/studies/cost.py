"""What a run will cost before anyone commits hours to it: tokens, parameters and wall time here.

`study plan` prints these. The time is measured, not modelled: a few real optimizer steps of the
run's model at its batch and sequence length on this machine, times the step count. Evaluation,
checkpoints and data preparation are not included (the plan says so).

Fine-tuning is estimated the same way (`finetune_seconds`): its optimizer steps (from the task files'
row counts, the caps, epochs and seeds) times fine-tuning's own step timed over shuffled batches of
rows with the task's lengths, plus the forward passes of prediction and probe features. Row lengths
come from the run's tokenizer when its data is prepared, else from word counts x 1.5 (what the
8k-vocabulary cpu tokenizer gave on SST-2/MRPC: 1.40-1.56 tokens per word). Against measured cpu
studies it came out 5-20% low (evaluation, model loading, tokenization are not in it).
"""
from __future__ import annotations

import contextlib
import time

from study.config import RunConfig

_STEP_TIMES: dict[tuple, float] = {}  # one measurement per model shape and batch per process
TOKENS_PER_WORD = 1.5                 # used only when the run's tokenizer does not exist yet
_LENGTHS: dict[tuple, tuple] = {}     # task row lengths per (task, caps, tokenizer) per process


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
    steps = planned_steps(cfg)
    if steps is None:
        return cfg.train.amount
    t, seq = cfg.train, cfg.objective.max_seq_len
    key = (cfg.model.model_dump_json(), cfg.tokenizer.vocab_size, seq, t.batch_size, cfg.masking.rate,
           cfg.impl.sparse_head, cfg.impl.threads, cfg.impl.device, cfg.impl.precision)
    if key not in _STEP_TIMES:
        with _run_threads(cfg):
            _STEP_TIMES[key] = _time_steps(cfg)
    return _STEP_TIMES[key] * steps


@contextlib.contextmanager
def _run_threads(cfg: RunConfig):
    """Time with the thread count the run will use (impl.threads), then restore the caller's."""
    import torch
    threads = torch.get_num_threads()
    if cfg.impl.threads:
        torch.set_num_threads(cfg.impl.threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run_device(cfg: RunConfig):
    """The device and autocast the pre-training run will use (study.pretrain.trainer's own resolution), so that a
    plan made on a GPU machine times GPU steps in bf16, not CPU ones. impl.device=cuda on a machine
    without one is the same StudyError naming impl.device that training raises."""
    from study.pretrain.trainer import Dist, autocast_factory, resolve_device, resolve_precision
    device = resolve_device(cfg.impl.device, Dist())
    return device, autocast_factory(device, resolve_precision(cfg.impl.precision, device))


def _time_steps(cfg: RunConfig, n: int = 6) -> float:
    import sys

    import torch

    from study.pretrain.evaluate import device_sync
    from study.model.bert import build_model, pretraining_loss
    t, seq, vocab = cfg.train, cfg.objective.max_seq_len, cfg.tokenizer.vocab_size
    device, autocast = _run_device(cfg)
    m = cfg.model
    # a gpu-profile model on a CPU takes minutes here: say what is being timed
    print(f"plan: timing {n} steps of L{m.layers}/H{m.hidden} at batch {t.batch_size} x {seq} on {device}",
          file=sys.stderr, flush=True)
    model = build_model(cfg.model, vocab, True, cfg.impl).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)  # a local generator: planning never touches global RNG state
    ids = torch.randint(5, vocab, (t.batch_size, seq), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < cfg.masking.rate, ids, torch.full_like(ids, -100))
    ids, labels = ids.to(device), labels.to(device)
    times = []
    for _ in range(n):
        device_sync(device)
        start = time.perf_counter()
        with autocast():
            out = pretraining_loss(model, ids, torch.ones_like(ids), torch.zeros_like(ids), labels,
                                   torch.zeros(t.batch_size, dtype=torch.long, device=device),
                                   sparse=cfg.impl.sparse_head)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        device_sync(device)
        times.append(time.perf_counter() - start)
    return min(times[1:])  # the first step pays for allocation


# --------------------------------------------------------------------------- fine-tuning
def _row_lengths(cfg: RunConfig, layout, data):
    """Token lengths of the task rows as fine-tuning will see them (specials included, truncated)."""
    import numpy as np
    max_len = cfg.finetune.max_length
    tok_dir = layout.data_dir(cfg.data_hash()) / "tokenizer"
    if (tok_dir / "tokenizer.json").is_file():
        from transformers import BertTokenizerFast
        tok = BertTokenizerFast.from_pretrained(str(tok_dir))
        out = tok(data.text_a, data.text_b, truncation=True, max_length=max_len)
        return np.array([len(x) for x in out["input_ids"]])
    words = np.array([len(a.split()) + (len(b.split()) if data.text_b is not None else 0)
                      for a, b in zip(data.text_a, data.text_b or data.text_a)])
    specials = 3 if data.text_b is not None else 2
    return np.minimum(np.ceil(words * TOKENS_PER_WORD).astype(int) + specials, max_len)


def _batch_width(lengths, batch: int) -> int:
    """Mean padded width of shuffled batches (fine-tuning pads each batch to its longest row)."""
    import numpy as np
    order = np.random.default_rng(0).permutation(len(lengths))
    widths = [lengths[order[i:i + batch]].max() for i in range(0, len(order), batch)]
    return max(1, round(float(np.mean(widths))))


def _classifier_step(cfg: RunConfig, lengths, n: int = 9) -> float:
    """Seconds of one fine-tuning step on this machine: fine-tuning's own classifier, collate (pad to
    the batch's longest row), loss, clipping and AdamW, over shuffled batches with these row lengths
    (random ids: the cost does not depend on them). The median of the steps after the first (which
    pays for allocation) is robust to a busy moment. On SST-2 (nsp cpu) it gives 40 ms where a real
    fine-tune took 50 ms per step, counting its model copy and dev prediction."""
    import numpy as np
    import torch

    from study.downstream.finetune import _autocast, _Classifier, _collate, _device, _Encoded, _param_groups
    from study.model.bert import build_model
    ft, vocab = cfg.finetune, cfg.tokenizer.vocab_size
    device = _device(cfg.impl)  # fine-tuning's own device and precision, as for pre-training above
    key = ("ft", cfg.model.model_dump_json(), vocab, ft.batch_size, cfg.impl.threads, str(device),
           cfg.impl.precision, np.asarray(lengths).tobytes())
    if key in _STEP_TIMES:
        return _STEP_TIMES[key]
    with _run_threads(cfg):
        g = torch.Generator().manual_seed(0)  # local: planning never touches global RNG state
        rng = np.random.default_rng(0)
        order = rng.permutation(len(lengths))[:n * ft.batch_size]
        rows = _Encoded([rng.integers(5, vocab, int(lengths[i]), dtype=np.int32) for i in order],
                        [np.zeros(int(lengths[i]), dtype=np.int8) for i in order], np.zeros(len(order), np.int64))
        model = _Classifier(build_model(cfg.model, vocab, False, cfg.impl).bert, 2, cfg.model.dropout,
                            cfg.model.init_range, g).to(device)
        opt = torch.optim.AdamW(_param_groups(model, ft.weight_decay), lr=1e-5)
        times = []
        for b in range(0, len(order), ft.batch_size):
            idx = np.arange(b, min(b + ft.batch_size, len(order)))
            start = time.perf_counter()
            with _autocast(cfg.impl, device):
                logits = model(**_collate(rows, idx, device))
            loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(rows.labels[idx]).to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss.item()
            times.append(time.perf_counter() - start)
    _STEP_TIMES[key] = float(np.median(times[1:])) if len(times) > 1 else times[0]
    return _STEP_TIMES[key]


def finetune_seconds(cfg: RunConfig, layout, todo: dict[str, tuple[int, bool]]) -> float | None:
    """Fine-tuning time of one encoder (a run or its random-init baseline) on this machine.

    todo: task -> (fine-tune seeds still to run, probe still to run). None when a task's data is not
    on disk (the hub, or a missing folder): its row counts are unknown before download.
    """
    import math

    from study.errors import StudyError
    from study.downstream.finetune import _cap  # the rows a cap keeps: the same ones fine-tuning will use
    from study.downstream.tasks import HUB, load_task
    ft = cfg.finetune
    if ft.glue_dir == HUB:
        return None
    total = 0.0
    for task, (seeds, probe) in todo.items():
        if not seeds and not probe:
            continue
        key = (task, ft.glue_dir, ft.max_train_examples, ft.max_eval_examples, ft.max_length, cfg.data_hash(),
               (layout.data_dir(cfg.data_hash()) / "tokenizer").is_dir())
        if key not in _LENGTHS:  # a study's runs mostly share one tokenizer and one recipe: read once
            try:
                train = _cap(load_task(task, ft.glue_dir, "train"), ft.max_train_examples)
                dev = _cap(load_task(task, ft.glue_dir, "dev"), ft.max_eval_examples)
            except StudyError:
                return None
            _LENGTHS[key] = (_row_lengths(cfg, layout, train), _row_lengths(cfg, layout, dev))
        l_train, l_dev = _LENGTHS[key]
        width = _batch_width(l_train, ft.batch_size)
        step = _classifier_step(cfg, l_train)
        per_token = step / (ft.batch_size * width) / 3  # a forward pass is about a third of a step
        steps = max(1, math.ceil(ft.epochs * math.ceil(len(l_train) / ft.batch_size)))
        total += seeds * (steps * step + l_dev.sum() * per_token)
        if probe:
            total += (l_train.sum() + l_dev.sum()) * per_token
    return total


def _todo(cfg: RunConfig, layout, run_key: str) -> dict[str, tuple[int, bool]]:
    """What fine-tuning of one encoder has not written yet: task -> (seeds, probe)."""
    from study.downstream.finetune import result_path
    ft, fh = cfg.finetune, cfg.finetune_hash()

    def missing(task: str, mode: str) -> int:
        return sum(not result_path(layout, run_key, task, fh, mode, s).exists() for s in ft.seeds)
    return {task: (missing(task, "finetune"), ft.probe and missing(task, "probe") > 0) for task in ft.tasks}


def study_finetune_seconds(runs, layout) -> tuple[dict[str, float | None], float | None]:
    """Fine-tuning still to do for a study's runs (per run hash) and their random-init baselines
    (together: runs share them). A None anywhere means some task's size is unknown here."""
    from study.downstream.finetune import baseline_key
    per_run = {r.run_hash: finetune_seconds(r.config, layout, _todo(r.config, layout, r.run_hash)) for r in runs}
    seen: dict[str, float | None] = {}
    for r in runs:
        if r.config.finetune.baseline and (key := baseline_key(r.config)) not in seen:
            seen[key] = finetune_seconds(r.config, layout, _todo(r.config, layout, key))
    base = None if None in seen.values() else sum(seen.values())
    return per_run, base
