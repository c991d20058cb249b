"""What a run will cost before anyone commits hours to it: tokens, parameters and wall time here.

`study plan` prints these. The time is measured, not modelled: a few real optimizer steps of the
run's model at its batch and sequence length on this machine, times the step count. Evaluation,
checkpoints and data preparation are not included (the plan says so).

Fine-tuning is estimated the same way (`finetune_seconds`): its optimizer steps (from the task files'
row counts, the caps, epochs and seeds) times fine-tuning's own step timed over shuffled batches of
rows with the task's lengths, plus the forward passes of prediction and probe features. With
`impl.finetune_batched_seeds` the seeds of a task train as one stacked model, so the step timed is
batched.py's stacked step of all of them and it is paid once, not once per seed. Row lengths
come from the run's tokenizer when its data is prepared, else from word counts x 1.5 (what the
8k-vocabulary cpu tokenizer gave on SST-2/MRPC: 1.40-1.56 tokens per word). Against measured cpu
studies it came out 5-20% low (evaluation, model loading, tokenization are not in it).

Both timings run the training code itself, not a copy of it: pre-training's model, optimizer and
`study.pretrain.step.pretrain_step`, fine-tuning's classifier, optimizer and `finetune_step`, on the
device and precision `study.runtime` resolves for the run, so a plan cannot drift from training.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from study.config import RunConfig
from study.cpu import cores, load_average
from study.downstream.tasks import HUB, HUB_ROWS, load_task
from study.errors import StudyError
from study.labels import IGNORE
from study.parallel import with_threads

# torch, transformers and the training modules are imported inside the functions that time steps (each
# says `lazy`): `study plan --no-time` (tokens and parameters only) must not pay for importing torch (~2 s).

_STEP_TIMES: dict[tuple, float] = {}  # one measurement per model shape and batch per process
TOKENS_PER_WORD = 1.5  # used only when the run's tokenizer does not exist yet
_LENGTHS: dict[tuple, tuple] = {}  # task row lengths per (task, caps, tokenizer) per process


def _phases(cfg: RunConfig) -> list[tuple[float, RunConfig]]:
    """(share of the budget, the config its steps train): one phase, or the sequence-length warmup's short
    rows (RunConfig.short_phase) first."""
    short = cfg.short_phase()
    return (
        [(1.0, cfg)]
        if short is None
        else [(cfg.train.short_fraction, short), (1 - cfg.train.short_fraction, cfg)]
    )


def _phase_steps(share: float, c: RunConfig, t) -> float:
    """Optimizer steps of one phase (`_phases`) of a steps or tokens budget `t`."""
    return share * t.amount if t.budget == "steps" else share * t.amount / _slots(c)


def _slots(c: RunConfig) -> int:
    """Token slots of one step of `c`."""
    return c.train.batch_size * c.objective.max_seq_len


def planned_steps(cfg: RunConfig) -> float | None:
    """Optimizer steps the budget allows; None for a wall-clock budget."""
    t = cfg.train
    if t.budget == "steps":
        return t.amount
    if t.budget == "tokens":
        return sum(share * t.amount / _slots(c) for share, c in _phases(cfg))
    return None


def planned_tokens(cfg: RunConfig) -> int | None:
    """Sequence slots the budget trains on (an upper bound on real tokens: short sequences pad)."""
    t = cfg.train
    if t.budget == "tokens":
        return int(t.amount)
    if t.budget == "steps":
        return int(sum(share * t.amount * _slots(c) for share, c in _phases(cfg)))
    return None


def training_flops(cfg: RunConfig) -> float:
    """Model FLOPs the budget trains (study.model.model_flops_per_token over each phase's token slots; a
    budget in seconds: that amount). Used to start a study's runs longest first (`--jobs N`), so that the
    longest ones do not start last and leave cores idle at the end: an order, not a time."""
    # lazy: torch
    from study.model import model_flops_per_token

    t = cfg.train
    if planned_steps(cfg) is None:
        return float(t.amount)
    total = 0.0
    for share, c in _phases(cfg):
        seq = c.objective.max_seq_len
        per_token = model_flops_per_token(c.model, seq, c.tokenizer.vocab_size, c.masking.rate * seq)
        total += _phase_steps(share, c, t) * _slots(c) * per_token
    return total


def param_count(cfg: RunConfig) -> int:
    """Encoder + pooler parameters of the BERT this config builds (the MLM head's decoder is tied)."""
    m, v = cfg.model, cfg.tokenizer.vocab_size
    per_layer = 4 * m.hidden * m.hidden + 2 * m.hidden * m.intermediate + 9 * m.hidden + m.intermediate
    pre_ln = (
        3 * m.hidden if m.arch == "pre_ln" else 0
    )  # one more position row (RoBERTa's offset), a final LayerNorm
    return v * m.hidden + m.max_positions * m.hidden + m.layers * per_layer + m.hidden * m.hidden + pre_ln


def estimate_seconds(cfg: RunConfig) -> float:
    """Pre-training wall time on this machine: the fastest of a few warm steps times the step count
    (other processes only ever slow a step down, so the minimum is the machine's own speed)."""
    steps = planned_steps(cfg)
    if steps is None:
        return cfg.train.amount
    total, t = 0.0, cfg.train
    for share, c in _phases(cfg):  # a sequence-length warmup times its short steps apart
        # everything the step's cost depends on: shapes, the objective's heads, and every impl setting
        key = (
            c.model.model_dump_json(),
            c.tokenizer.vocab_size,
            c.objective.max_seq_len,
            c.objective.sentence,
            c.train.batch_size,
            t.grad_accum,
            t.clip,
            c.masking.rate,
            c.impl.model_dump_json(),
        )
        if key not in _STEP_TIMES:
            _STEP_TIMES[key] = time_pretrain_step(c)
        total += _STEP_TIMES[key] * _phase_steps(share, c, t)
    return total


def _synthetic_parts(cfg: RunConfig) -> list[dict]:
    """A global batch of the run's shape as the trainer feeds it: full-length rows (the upper bound: real
    batches trim padding), masking.rate of positions asked, split into grad_accum micro-batches by the
    trainer's own micro_batches. Random ids from a local generator: the cost does not depend on them."""
    # lazy: torch (`study plan --no-time` never imports it)
    import torch

    from study.data.batches import micro_batches

    t, seq, vocab = cfg.train, cfg.objective.max_seq_len, cfg.tokenizer.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (t.batch_size, seq), generator=g)
    labels = torch.where(
        torch.rand(ids.shape, generator=g) < cfg.masking.rate, ids, torch.full_like(ids, IGNORE)
    )
    sentence = torch.full((t.batch_size,), 0 if cfg.objective.sentence != "none" else -1, dtype=torch.long)
    return micro_batches(
        ids, torch.ones_like(ids), torch.zeros_like(ids), labels, sentence, t.batch_size // t.grad_accum
    )


def time_pretrain_step(cfg: RunConfig, n: int = 6) -> float:
    """Seconds of one pre-training step of `cfg` on this machine: the trainer's own model, optimizer and
    step function (study.pretrain.step.pretrain_step) on the device and precision the run will use
    (study.runtime), so that a plan made on a GPU machine times GPU steps in bf16, not CPU ones;
    impl.device=cuda on a machine without one is the same StudyError naming impl.device that training
    raises. The minimum over the steps after the first (which pays for allocation)."""
    # lazy: torch (`study plan --no-time` never imports it)
    import torch

    from study.pretrain.evaluate import device_sync
    from study.pretrain.step import LossModule, build_training_model, make_optimizer, pretrain_step
    from study.runtime import resolve, threads

    t, m = cfg.train, cfg.model
    rt = resolve(cfg.impl)
    # the dropout masks draw from torch's global generator: planning leaves the caller's state alone
    with (
        threads(cfg.impl.threads),
        torch.random.fork_rng(devices=[rt.device] if rt.device.type == "cuda" else []),
    ):
        # a gpu-profile model on a CPU takes minutes here: say what is being timed, on how many threads
        # (the --jobs share, --threads) and under what load (a busy machine times slower steps)
        print(
            f"plan: timing {n} steps of L{m.layers}/H{m.hidden} at batch {t.batch_size} x "
            f"{cfg.objective.max_seq_len} on {rt.device}, threads {torch.get_num_threads()}, load average "
            f"{'unknown' if (la := load_average()) is None else f'{la:.1f}'} on {cores()} cores",
            file=sys.stderr,
            flush=True,
        )
        model, _ = build_training_model(cfg, cfg.tokenizer.vocab_size, rt.device)
        opt, fused = make_optimizer(cfg, model, rt.device)
        module, parts = LossModule(model, cfg.impl.sparse_head, chunked=rt.chunked_mlm), _synthetic_parts(cfg)
        times = []
        for _ in range(n):
            device_sync(rt.device)
            start = time.perf_counter()
            pretrain_step(module, model, opt, parts, t.lr, clip=t.clip, rt=rt, fused=fused)
            device_sync(rt.device)
            times.append(time.perf_counter() - start)
    return min(times[1:])


# --------------------------------------------------------------------------- fine-tuning
def row_lengths(cfg: RunConfig, layout, data):
    """Token lengths of the task rows as fine-tuning will see them (specials included, truncated)."""
    max_len = cfg.finetune.max_length
    tok_dir = layout.data_dir(cfg.data_hash()) / "tokenizer"
    if (tok_dir / "tokenizer.json").is_file():
        from transformers import BertTokenizerFast  # lazy: transformers (seconds; plan --no-time)

        tok = BertTokenizerFast.from_pretrained(str(tok_dir))
        out = tok(data.text_a, data.text_b, truncation=True, max_length=max_len)
        return np.array([len(x) for x in out["input_ids"]])
    words = np.array(
        [
            len(a.split()) + (len(b.split()) if data.text_b is not None else 0)
            for a, b in zip(data.text_a, data.text_b or data.text_a, strict=True)
        ]
    )
    specials = 3 if data.text_b is not None else 2
    return np.minimum(np.ceil(words * TOKENS_PER_WORD).astype(int) + specials, max_len)


def batch_width(lengths, batch: int) -> int:
    """Mean padded width of shuffled batches (fine-tuning pads each batch to its longest row)."""
    order = np.random.default_rng(0).permutation(len(lengths))
    widths = [lengths[order[i : i + batch]].max() for i in range(0, len(order), batch)]
    return max(1, round(float(np.mean(widths))))


def _classifier_step(cfg: RunConfig, lengths, n: int = 9, k: int = 1) -> float:
    """Seconds of one fine-tuning step on this machine: fine-tuning's own classifier, optimizer, collate
    (pad to the batch's longest row) and step function (study.downstream.classifier.finetune_step), over
    shuffled batches with these row lengths (random ids: the cost does not depend on them), on the device
    and precision fine-tuning will use. The median of the steps after the first (which pays for
    allocation) is robust to a busy moment. On SST-2 (nsp cpu) it gave 40 ms where a real fine-tune took
    50 ms per step, counting its model copy and dev prediction.

    k > 1 times one step of k seeds stacked (`impl.finetune_batched_seeds`: study/downstream/batched.py's
    own SeedBatch.step on k batches padded to their common width), the step that trains all k at once."""
    # lazy: torch (`study plan --no-time` never imports it)
    import torch

    from study.downstream.classifier import Classifier, finetune_optimizer, finetune_step
    from study.downstream.encode import Encoded, collate
    from study.model import build_model
    from study.runtime import resolve, threads

    ft, vocab = cfg.finetune, cfg.tokenizer.vocab_size
    rt = resolve(cfg.impl)
    key = (
        "ft",
        cfg.model.model_dump_json(),
        vocab,
        ft.model_dump_json(),
        cfg.impl.model_dump_json(),
        str(rt.device),
        np.asarray(lengths).tobytes(),
        k,
    )
    if key in _STEP_TIMES:
        return _STEP_TIMES[key]
    with (
        threads(cfg.impl.threads),
        torch.random.fork_rng(devices=[rt.device] if rt.device.type == "cuda" else []),
    ):
        g = torch.Generator().manual_seed(0)  # local: planning never touches global RNG state
        rng = np.random.default_rng(0)
        order = rng.permutation(len(lengths))[: n * ft.batch_size * k]
        rows = Encoded(
            [rng.integers(5, vocab, int(lengths[i]), dtype=np.int32) for i in order],
            [np.zeros(int(lengths[i]), dtype=np.int8) for i in order],
            np.zeros(len(order), np.int64),
        )
        if k > 1:
            times = _seed_batch_steps(cfg, rows, k, rt)
            _STEP_TIMES[key] = float(np.median(times[1:])) if len(times) > 1 else times[0]
            return _STEP_TIMES[key]
        model = Classifier(
            build_model(cfg.model, vocab, False, cfg.impl).bert,
            2,
            cfg.model.dropout,
            cfg.model.init_range,
            g,
            ft.pooling,
        ).to(rt.device)
        model.train()
        opt = finetune_optimizer(model, ft)
        times = []
        for b in range(0, len(order), ft.batch_size):
            idx = np.arange(b, min(b + ft.batch_size, len(order)))
            start = time.perf_counter()
            loss = finetune_step(
                model,
                opt,
                collate(rows, idx, rt.device),
                torch.from_numpy(rows.labels[idx]).to(rt.device),
                False,
                rt.autocast,
            )
            loss.item()  # waits for the device, as fine-tuning's own loss log does
            times.append(time.perf_counter() - start)
    _STEP_TIMES[key] = float(np.median(times[1:])) if len(times) > 1 else times[0]
    return _STEP_TIMES[key]


def _seed_batch_steps(cfg: RunConfig, rows, k: int, rt) -> list[float]:
    """Seconds of each stacked step of k seeds over `rows` (k batches per step), as batched.py trains."""
    # lazy: torch (`study plan --no-time` never imports it)
    import torch

    from study.downstream.batched import SeedBatch, collate_seeds
    from study.model import build_model

    ft = cfg.finetune
    bert = build_model(cfg.model, cfg.tokenizer.vocab_size, False, cfg.impl).bert
    sb = SeedBatch(cfg, bert, 2, list(range(k)), rt, total_steps=1000, warmup=0)
    times, per = [], ft.batch_size
    for step, b in enumerate(range(0, len(rows) - k * per + 1, k * per)):
        idxs = [np.arange(b + j * per, b + (j + 1) * per) for j in range(k)]
        y = torch.zeros(k, per, dtype=torch.long, device=rt.device)
        start = time.perf_counter()
        sb.step(step, collate_seeds(rows, idxs, rt.device), y, False)  # syncs: it returns the K losses
        times.append(time.perf_counter() - start)
    return times


def finetune_seconds(cfg: RunConfig, layout, todo: dict[str, tuple[int, bool]]) -> float | None:
    """Fine-tuning time of one encoder (a run or its random-init baseline) on this machine.

    todo: task -> (fine-tune seeds still to run, probe still to run). None when a task's data is not in
    a folder that exists. On the hub (nothing downloaded yet) the rows are GLUE's published counts, every one
    at finetune.max_length tokens: an upper bound (`finetune_is_bound`).
    """
    from study.downstream.encode import cap_rows  # the rows a cap keeps: the same ones fine-tuning will use

    ft = cfg.finetune
    total = 0.0
    for task, (seeds, probe) in todo.items():
        if not seeds and not probe:
            continue
        key = (
            task,
            ft.glue_dir,
            ft.max_train_examples,
            ft.max_eval_examples,
            ft.max_length,
            cfg.data_hash(),
            (layout.data_dir(cfg.data_hash()) / "tokenizer").is_dir(),
        )
        if key not in _LENGTHS and ft.glue_dir == HUB:  # not downloaded: published counts at max_length
            n_train, n_dev = (
                n if cap is None else min(n, cap)
                for n, cap in zip(HUB_ROWS[task], (ft.max_train_examples, ft.max_eval_examples), strict=True)
            )
            _LENGTHS[key] = (np.full(n_train, ft.max_length), np.full(n_dev, ft.max_length))
        if key not in _LENGTHS:  # a study's runs mostly share one tokenizer and one recipe: read once
            try:
                train = cap_rows(load_task(task, ft.glue_dir, "train"), ft.max_train_examples)
                dev = cap_rows(load_task(task, ft.glue_dir, "dev"), ft.max_eval_examples)
            except StudyError:
                return None
            _LENGTHS[key] = (row_lengths(cfg, layout, train), row_lengths(cfg, layout, dev))
        l_train, l_dev = _LENGTHS[key]
        width = batch_width(l_train, ft.batch_size)
        steps = max(1, math.ceil(ft.epochs * math.ceil(len(l_train) / ft.batch_size)))
        if cfg.impl.finetune_batched_seeds and seeds > 1:  # one stacked model trains every missing seed
            step_k = _classifier_step(cfg, l_train, k=seeds)
            per_token = step_k / (seeds * ft.batch_size * width) / 3
            total += steps * step_k + seeds * l_dev.sum() * per_token
        else:
            step = _classifier_step(cfg, l_train)
            per_token = step / (ft.batch_size * width) / 3  # a forward pass is about a third of a step
            total += seeds * (steps * step + l_dev.sum() * per_token)
        if probe:
            total += (l_train.sum() + l_dev.sum()) * per_token
    return total


def finetune_is_bound(cfg: RunConfig) -> bool:
    """finetune_seconds is an upper bound, not an estimate: GLUE from the hub, rows not read yet."""
    return cfg.finetune.glue_dir == HUB


def _todo(cfg: RunConfig, layout, run_key: str) -> dict[str, tuple[int, bool]]:
    """What fine-tuning of one encoder has not written yet: task -> (seeds, probe)."""
    # lazy: torch
    from study.downstream.finetune import result_path

    ft, fh = cfg.finetune, cfg.finetune_hash()

    def missing(task: str, mode: str) -> int:
        return sum(not result_path(layout, run_key, task, fh, mode, s).exists() for s in ft.seeds)

    return {task: (missing(task, "finetune"), ft.probe and missing(task, "probe") > 0) for task in ft.tasks}


def study_finetune_seconds(
    runs, layout, jobs: int = 1
) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """Fine-tuning still to do for a study's runs (per run hash) and for their random-init baselines (per
    baseline key: runs share them). A None means that task's size is unknown here. jobs > 1: each timed
    with the threads one of `jobs` side-by-side workers gets (study/parallel.py with_threads)."""

    per_run = {
        r.run_hash: finetune_seconds(
            with_threads(r.config, jobs), layout, _todo(r.config, layout, r.run_hash)
        )
        for r in runs
    }
    base: dict[str, float | None] = {}
    for r in runs:
        if r.config.finetune.baseline and (key := r.config.baseline_key()) not in base:
            base[key] = finetune_seconds(with_threads(r.config, jobs), layout, _todo(r.config, layout, key))
    return per_run, base


def makespan(seconds: list[float], jobs: int) -> float:
    """Wall time of independent jobs on `jobs` workers that each take the next one when free, longest
    first (what `--jobs` does with a study's runs, which start in order of training_flops: a plan, not a
    promise)."""
    free = [0.0] * max(1, jobs)
    for t in sorted(seconds, reverse=True):
        i = free.index(min(free))
        free[i] += t
    return max(free)
