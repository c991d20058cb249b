"""Re-score finished runs with today's evaluation code (`study rescore`).

Why: the evaluation grows fields. `ref_mode_acc` (the constant-prediction floor that flags a
collapsed run) came after some runs were trained, and their reports cannot flag them without it.
Retraining for a number that depends only on the saved weights and the fixed reference would waste
hours, so the saved model is scored again on the same reference set.

Nothing is trusted blindly: the stored numbers must come back first (same data, same reference
masks, same weights). A run whose stored loss/accuracy do not reproduce is reported and left
untouched, because its folder does not match what this code would have written. Fields the run
already has are never overwritten; only missing ones are added, and meta.json records the rescore
(when, what was added, how far the stored numbers moved, the code version).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

import torch

from study.config import RunConfig
from study.data.prepare import prepare_data
from study.errors import StudyError
from study.model.load import load_pretrained
from study.paths import Layout
from study.pretrain.evaluate import evaluate, reference_set, sentence_set, short_reference_set
from study.provenance import provenance
from study.rundir import RunDir
from study.runtime import compute_init

# Scoring the same weights on another thread count or device reorders float sums: the loss moves in
# its last digits and an argmax whose top two logits tie within rounding may flip. Beyond that, the
# run was scored on something else (other data, other masks, other weights).
LOSS_RTOL = 1e-3
ACC_FLIPS = 2  # predictions allowed to flip, per accuracy


@dataclass
class Rescored:
    run_hash: str
    added: list[str] = field(default_factory=list)
    deviation: dict[str, float] = field(default_factory=dict)  # |stored - now| per compared field
    mismatch: list[str] = field(default_factory=list)  # fields that did not reproduce
    trained_on: str = "?"  # meta.json's device: scoring elsewhere (GPU bf16 vs CPU fp32) can move the
    scored_on: str = "?"  # loss past LOSS_RTOL, and then nothing is written (rescore where it trained)

    @property
    def ok(self) -> bool:
        return not self.mismatch


def _compare(stored: dict, now: dict, sentences: int) -> tuple[dict[str, float], list[str]]:
    dev, bad = {}, []
    for key in ("ref_sequences", "ref_masked"):  # which questions were asked: must be identical
        if key in stored:
            dev[key] = abs(float(stored[key]) - float(now[key]))
            if dev[key] != 0:
                bad.append(key)
    if "ref_mlm_loss" in stored:
        a, b = float(stored["ref_mlm_loss"]), float(now["ref_mlm_loss"])
        dev["ref_mlm_loss"] = abs(a - b)
        if not (math.isclose(a, b, rel_tol=LOSS_RTOL) or (math.isnan(a) and math.isnan(b))):
            bad.append("ref_mlm_loss")
    for key, n in (("ref_mlm_acc", now["ref_masked"]), ("sentence_acc", sentences)):
        if stored.get(key) is None and now.get(key) is None:
            continue
        if (stored.get(key) is None) != (now.get(key) is None):
            bad.append(key)
            continue
        dev[key] = abs(float(stored[key]) - float(now[key]))
        if dev[key] > ACC_FLIPS / max(n, 1) + 1e-12:
            bad.append(key)
    return dev, bad


def rescore_run(cfg: RunConfig, layout: Layout, quiet: bool = True) -> Rescored:
    """Score the finished run of `cfg` on the fixed reference again; add the metrics fields it lacks."""
    run_hash = cfg.run_hash()
    rd = RunDir(layout, run_hash)
    status = rd.status().status
    if status != "done" or not rd.has_model():
        raise StudyError(
            f"run {run_hash} is {status}: only a finished run has a model to score",
            field="--run",
            source=str(rd.path),
        )
    stored = rd.metrics()
    # the one runtime, impl.threads included: the thread count moves the loss (LOSS_RTOL above)
    with compute_init(cfg.impl) as rt:
        prepared = prepare_data(cfg, layout, progress=not quiet)
        ref, sent = reference_set(cfg, prepared), sentence_set(cfg, prepared)
        model = load_pretrained(rd.model_dir, cfg.impl.attention, quiet).to(rt.device)
        with torch.random.fork_rng(devices=[]):  # scoring draws nothing, but leave the caller's RNG alone
            now = evaluate(
                model,
                ref,
                sent,
                rt.device,
                rt.autocast,
                cfg.impl.sparse_head,
                short_reference_set(cfg, prepared),
            )
    dev, bad = _compare(stored, now, len(sent) if sent is not None else 0)
    meta = rd.meta()
    out = Rescored(
        run_hash,
        added=[k for k in now if k not in stored],
        deviation=dev,
        mismatch=bad,
        trained_on=str(meta.get("device", "?")),
        scored_on=str(rt.device),
    )
    if out.ok and out.added:
        rd.write_metrics({**stored, **{k: now[k] for k in out.added}})
        meta.setdefault("rescores", []).append(
            {
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
                "added": out.added,
                "deviation": dev,
                "device": str(rt.device),
                "git": provenance(str(rt.device))["git"],
            }
        )
        rd.write_meta(meta)
    return out
