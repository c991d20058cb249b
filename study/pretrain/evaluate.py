"""The fixed-reference evaluation every run is compared on, and the hardware peak MFU divides by.

Reference MLM: the VALID split cut as `reference_instances` (doc_sentences blocks of the run's
max_seq_len, fixed seed) and masked by `reference_masking` (15%, 80/10/10, exact count, fixed seed
per instance index). Two runs on the same data and max_seq_len are therefore scored on exactly the
same positions, whatever their own objective, format or masking: a static-masking run and a
whole-word run are measured on the same questions.

Sentence task (NSP/SOP): valid instances built with the run's own objective and a FIXED seed
(`SENTENCE_EVAL_SEED`, not the run's seed), so seeds of one config are scored on the same pairs.
Those inputs carry reference masks too, because that is the distribution the head was trained on.

Masks are drawn on full-length rows and padding is trimmed per eval batch afterwards, so neither
the eval batch size nor the trimming changes which positions are asked. The model runs in the run's own
precision (bf16 autocast on a GPU): the questions are fixed, the arithmetic is the run's, so a bf16 and an
fp32 run of one config score within bf16 rounding of each other, not bitwise alike.

Two accuracies, each with its floor (always predicting the most frequent asked token):
- ref_mlm_acc / ref_mode_acc over every asked position, BERT's usual number;
- ref_mask_acc / ref_mask_mode_acc over the asked positions that show [MASK] (80% of them). The 10% shown
  unchanged are copied by any trained model, so ref_mlm_acc reads about 0.1 + 0.9 x mode (~15% at the
  cpu profile's vocabulary) for a model that knows nothing beyond unigrams; ref_mask_acc is what the
  context taught it, and the plateau test (report.collect.learned) uses it when present.
Beside them, by what an asked position shows (`shown_as`): ref_keep_acc over the positions shown unchanged,
ref_rnd_acc (with its floor, which the plateau test counts too) over those shown as another token. BERT
Table 8's splits train these differently (a 100%-[MASK] run never sees the kept or random cases, a
0%-[MASK] run never sees [MASK]), so they say where a split's reference score comes from.
ref_spread: how much the encoder's output at the asked positions varies between them (`spread`): 0 for an
encoder that answers every position with one vector (a collapsed run), which accuracy alone cannot tell
from a run that has not yet learned context.
short_mlm_acc, short_mask_acc / short_mask_mode_acc and short_spread: the same on the reference cut at the
sequence-length warmup's row length (`short_reference_set`), for runs that have one.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from study.config import RunConfig
from study.data.instances import REFERENCE_SEED, build_instances, reference_instances
from study.data.masking import reference_masking
from study.errors import StudyError
from study.labels import IGNORE
from study.model.bert import pretraining_loss

EVAL_BATCH = 64  # fixed, so results do not depend on the training batch size
SENTENCE_EVAL_SEED = 4321  # fixed: every run of one objective gets the same NSP/SOP pairs
SHOWN = ("mask", "keep", "rnd")  # what an asked position shows: [MASK], its own token, another token


@dataclass
class EvalSet:
    """Masked, padded CPU tensors; rows are scored in fixed order."""

    input_ids: torch.Tensor  # [N, L] long, masked inputs
    labels: torch.Tensor  # [N, L] long, -100 where not asked
    attention_mask: torch.Tensor  # [N, L] long
    token_type_ids: torch.Tensor  # [N, L] long
    sentence_label: torch.Tensor | None  # [N] long, or None when there is no sentence task
    mask_id: int | None = None  # the [MASK] id: asked positions that show it are scored apart too

    def __len__(self) -> int:
        return len(self.input_ids)


def _masked_set(inst, n: int, special, with_sentence: bool) -> EvalSet:
    """n rows spread over the whole split (instances come in corpus order; the first n would all be
    from the first documents), chosen by a fixed seed and kept in corpus order."""
    # which validation rows are scored: fixed, the reference seed
    rows = np.sort(np.random.default_rng(REFERENCE_SEED).permutation(len(inst.input_ids))[:n])
    ids = torch.as_tensor(np.asarray(inst.input_ids[rows]), dtype=torch.long)
    # the mask key is the row's index in the full instance list: stable whatever n is
    inputs, labels = reference_masking(ids, special, torch.as_tensor(rows))
    att = torch.as_tensor(np.asarray(inst.attention_mask()[rows]), dtype=torch.long)
    tt = torch.as_tensor(np.asarray(inst.token_type_ids[rows]), dtype=torch.long)
    sl = torch.as_tensor(np.asarray(inst.sentence_label[rows]), dtype=torch.long) if with_sentence else None
    return EvalSet(inputs, labels, att, tt, sl, special.mask)


def reference_set(cfg: RunConfig, prepared) -> EvalSet:
    """The first `train.eval_sequences` reference instances of the valid split, reference-masked."""
    inst = reference_instances(prepared.split("valid"), cfg.objective.max_seq_len, prepared.special)
    return _masked_set(inst, min(cfg.train.eval_sequences, len(inst.input_ids)), prepared.special, False)


def short_reference_set(cfg: RunConfig, prepared) -> EvalSet | None:
    """The reference cut at train.short_len, the sequence-length warmup's rows (None without the warmup):
    as many token slots as the reference (eval_sequences x max_seq_len // short_len rows), masked the same
    way. Why: while the rows are short, the reference asks about positions the model has not trained yet
    (16-127 of 128 at the cpu profile), so it cannot tell whether the warmup is teaching context; this can."""
    short = cfg.short_phase()
    if short is None:
        return None
    short.train.eval_sequences = cfg.train.eval_sequences * (cfg.objective.max_seq_len // cfg.train.short_len)
    return reference_set(short, prepared)


def sentence_set(cfg: RunConfig, prepared) -> EvalSet | None:
    """Valid instances with the run's objective (fixed seed) for NSP/SOP accuracy; None without a task."""
    if cfg.objective.sentence == "none":
        return None
    try:
        inst = build_instances(
            prepared.split("valid"), cfg.objective, prepared.special, SENTENCE_EVAL_SEED, epoch=0
        )
    except StudyError as exc:
        # e.g. NSP needs two validation documents: the run still trains; sentence_acc is null
        warnings.warn(f"no {cfg.objective.sentence} evaluation: {exc}", RuntimeWarning, stacklevel=2)
        return None
    n = min(cfg.train.eval_sequences, len(inst.input_ids))
    return _masked_set(inst, n, prepared.special, True) if n else None


@torch.no_grad()
def _score(model, es: EvalSet, device: torch.device, autocast, sparse: bool) -> dict:
    loss_sum = 0.0
    correct = count = s_correct = s_count = 0
    by_shown = {k: [0, 0] for k in SHOWN}  # correct, count per what the asked position shows
    h_sum, h_sq = None, 0.0  # the encoder's output at the asked positions: sum, sum of squared norms
    for b in range(0, len(es), EVAL_BATCH):
        sl = slice(b, b + EVAL_BATCH)
        att = es.attention_mask[sl]
        width = int(att.sum(1).max())  # trim padding: masks were drawn on the full rows already
        batch = dict(
            input_ids=es.input_ids[sl, :width],
            attention_mask=att[:, :width],
            token_type_ids=es.token_type_ids[sl, :width],
            labels=es.labels[sl, :width],
        )
        batch = {k: v.to(device) for k, v in batch.items()}
        s_lab = es.sentence_label[sl].to(device) if es.sentence_label is not None else None
        with autocast():
            out = pretraining_loss(model, **batch, sentence_label=s_lab, sparse=sparse, hidden=True)
        n = int(out.mlm_count)
        if n:
            loss_sum += float(out.mlm_loss) * n  # mean over the batch's masked tokens -> sum
            h = out.mlm_hidden.double()
            h_sum = h.sum(0) if h_sum is None else h_sum + h.sum(0)
            h_sq += float(h.square().sum())
        correct += int(out.mlm_correct)
        count += n
        if es.mask_id is not None and n:
            for k, sel in shown_as(batch["input_ids"], batch["labels"], es.mask_id).items():
                by_shown[k][0] += int(out.mlm_hits[sel].sum())
                by_shown[k][1] += int(sel.sum())
        if out.sentence_correct is not None:
            s_correct += int(out.sentence_correct)
            s_count += out.sentence_count
    loss = loss_sum / count if count else float("nan")
    out = {
        "loss": loss,
        "acc": correct / count if count else float("nan"),
        "masked": count,
        "sentence_acc": s_correct / s_count if s_count else None,
        "sentences": s_count,
    }
    for k, (c, m) in by_shown.items():
        out[f"{k}_acc"], out[f"{k}_count"] = (c / m if m else float("nan")), m
    out["spread"] = spread(h_sum, h_sq, count)
    return out


def spread(h_sum: torch.Tensor | None, h_sq: float, n: int) -> float:
    """How much of the encoder's output varies between the asked positions: sqrt(1 - |mean h|^2 / mean |h|^2),
    0 when every position gets the same vector, near 1 when the mean is small beside the vectors."""
    if not n or h_sq <= 0:
        return float("nan")
    return math.sqrt(max(0.0, 1.0 - float(h_sum.square().sum()) / n**2 / (h_sq / n)))


def shown_as(input_ids: torch.Tensor, labels: torch.Tensor, mask_id: int) -> dict[str, torch.Tensor]:
    """What each asked position (labels != IGNORE, row-major, the order of mlm_hits) shows the model:
    [MASK], its own token (kept), or another token (random). A random draw that hit the original token
    counts as kept: that is what the model saw."""
    asked = labels != IGNORE
    inp, lab = input_ids[asked], labels[asked]
    mask = inp == mask_id
    keep = ~mask & (inp == lab)
    return {"mask": mask, "keep": keep, "rnd": ~mask & ~keep}


def mode_accuracy(es: EvalSet, shown: str | None = None) -> float:
    """Accuracy of always predicting the set's most frequent asked token: the floor a run must beat to
    have learned more than that one token. A collapsed model (every position -> the same token)
    scores exactly this; see report.collect.learned_beyond_mode. shown ("mask" or "rnd", see `shown_as`):
    over the asked positions that show [MASK] only (the floor of ref_mask_acc), or another token."""
    if shown is None:
        asked = es.labels[es.labels != IGNORE]
    elif es.mask_id is None:  # a set built without its [MASK] id: no such positions to score
        return float("nan")
    else:
        asked = es.labels[es.labels != IGNORE][shown_as(es.input_ids, es.labels, es.mask_id)[shown]]
    return float(torch.bincount(asked).max()) / asked.numel() if asked.numel() else float("nan")


def evaluate(
    model,
    ref: EvalSet,
    sent: EvalSet | None,
    device: torch.device,
    autocast=contextlib.nullcontext,
    sparse: bool = True,
    short: EvalSet | None = None,
) -> dict:
    """Reference MLM loss/accuracy/perplexity (+ NSP/SOP accuracy, + the short-row reference's when given).
    Leaves the model's mode as it was."""
    was_training = model.training
    model.eval()
    try:
        r = _score(model, ref, device, autocast, sparse)
        s = _score(model, sent, device, autocast, sparse) if sent is not None else None
        q = _score(model, short, device, autocast, sparse) if short is not None else None
    finally:
        model.train(was_training)
    # the short-row reference (short_reference_set): only where the run has a sequence-length warmup
    on_short = (
        {}
        if q is None
        else {
            "short_mlm_acc": q["acc"],
            "short_mask_acc": q["mask_acc"],
            "short_mask_mode_acc": mode_accuracy(short, shown="mask"),
            "short_spread": q["spread"],
        }
    )
    return {
        "ref_mlm_loss": r["loss"],
        "ref_mlm_acc": r["acc"],
        "ref_mode_acc": mode_accuracy(ref),  # the constant-prediction floor of ref_mlm_acc
        # exp of a mean NLL; capped so a diverging early model does not overflow to inf in JSON
        "ref_ppl": math.exp(min(r["loss"], 700.0)) if math.isfinite(r["loss"]) else float("nan"),
        "sentence_acc": s["sentence_acc"] if s is not None else None,
        "ref_sequences": len(ref),
        "ref_masked": r["masked"],
        # the same, over the asked positions that show [MASK] (80% of them): the 10% shown unchanged are
        # copied by any trained model (96% right on the plateau of docs/RESULTS.md), so ref_mlm_acc sits
        # near 0.1 + 0.9 x mode for a model that knows only unigrams; this one does not
        "ref_mask_acc": r["mask_acc"],
        "ref_mask_mode_acc": mode_accuracy(ref, shown="mask"),
        "ref_mask_count": r["mask_count"],
        # and over the other two kinds (10% each): kept tokens (a trained model copies them) and random
        # ones (the shown token is wrong: context only, as at [MASK], for a model that never saw [MASK]
        # in training: masking.mask 0, BERT Table 8's last rows)
        "ref_keep_acc": r["keep_acc"],
        "ref_keep_count": r["keep_count"],
        "ref_rnd_acc": r["rnd_acc"],
        "ref_rnd_mode_acc": mode_accuracy(ref, shown="rnd"),
        "ref_rnd_count": r["rnd_count"],
        # collapsed, or only on the plateau? 0 when the encoder sends one vector to the MLM head at every asked
        # position. Measured at the end of 21 replacement runs at the cpu profile: 0.002 for a run that predicts one
        # token everywhere, 0.33-0.67 for SAME-0 runs near the floor, 0.65-0.88 for runs that left it. The SAME-0
        # runs that stay on the floor fall from ~0.65 to ~0 within 100-300 steps (docs/RESULTS.md)
        "ref_spread": r["spread"],
        **on_short,
    }


def device_sync(dev: torch.device) -> None:
    """Wait for the device's queued work (CUDA and MPS launches return before the kernel is done), so
    that a wall-clock timer around it measures the work."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


@functools.cache
def matmul_peak_flops(
    device: str = "cpu", n: int = 2048, budget_s: float = 0.5, dtype: torch.dtype = torch.float32
) -> float:
    """Best observed FLOP/s of an n x n matmul in `dtype` on `device` (with the current thread count).

    Measured, not looked up: MFU is then "fraction of what this machine did on a dense matmul in the
    run's compute dtype in the same process", comparable across runs on one machine. One warm-up, then timed
    repeats until `budget_s` (at least one, at most 20). Cached per process.
    """
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dev, dtype)
    b = torch.randn(n, n, generator=g).to(dev, dtype)
    torch.mm(a, b)  # warm-up (allocations, kernel selection)
    device_sync(dev)
    best, start = float("inf"), time.perf_counter()
    for _ in range(20):
        t0 = time.perf_counter()
        torch.mm(a, b)
        device_sync(dev)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return 2.0 * n**3 / best
