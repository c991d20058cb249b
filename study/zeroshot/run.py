"""The zero-shot evaluations of one encoder: which results exist, loading the model once, one result file each.

`layout.zeroshot_file(run_key, evaluation, cfg.zeroshot_hashes()[evaluation])` holds one evaluation's per-pair
scores and its summary, beside the encoder's fine-tune results (run_key: the run hash, or the random-init
baseline's `random-<hash>`). Written atomically once known; an existing result made from the same data
(`data`: the BLiMP zip's digest, or the run's data hash) and the same weights (`encoder_data`) is returned
and never scored again. Scoring runs where pre-training ran (study.runtime.resolve: device, precision) with
impl.threads, the model in eval mode without gradients; nothing is drawn at random.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from study.config import RunConfig
from study.data.corpus import file_digest
from study.data.prepare import prepare_data
from study.data.tokenizer import continuation_mask, special_ids
from study.downstream.models import pretrained_model, random_model
from study.downstream.results import encoder_digest
from study.io import atomic_write_json, file_lock, read_json
from study.metrics import BLIMP, CROSS_SENTENCE, ZEROSHOT
from study.paths import Layout
from study.provenance import provenance
from study.rundir import RunDir
from study.runtime import resolve, threads
from study.zeroshot import blimp, crosssent
from study.zeroshot.pll import mask_sets, pll, sentence_rows
from study.zeroshot_config import PAIR_FORMATS

CROSS = CROSS_SENTENCE
PRIMARY = {BLIMP: "accuracy", CROSS: "gain"}


def zeroshot_run(cfg: RunConfig, layout: Layout, quiet: bool = False) -> list[dict]:
    """BLiMP and cross-sentence scores of the finished run of `cfg` (init "pretrained")."""
    digest = encoder_digest(RunDir(layout, cfg.run_hash()).model_dir)
    return _run_all(cfg, layout, cfg.run_hash(), "pretrained", pretrained_model, quiet, digest)


def zeroshot_baseline(cfg: RunConfig, layout: Layout, quiet: bool = False) -> list[dict]:
    """The same on the run's random-init baseline (init "random"), the model fine-tuning's baseline uses."""
    return _run_all(cfg, layout, cfg.baseline_key(), "random", random_model, quiet, None)


def _existing(path: Path, want: dict) -> dict | None:
    try:
        res = read_json(path)
    except (OSError, json.JSONDecodeError):
        return None  # absent, or damaged from outside (writes are atomic): score again
    return res if all(res.get(k) == v for k, v in want.items()) else None


def _data(cfg: RunConfig, evaluation: str) -> str | None:
    """What an evaluation's pairs were read from: the BLiMP zip's content, or the run's data folder."""
    if evaluation == CROSS:
        return cfg.data_hash()
    p = Path(cfg.zeroshot.blimp_zip)
    return file_digest(p) if p.is_file() else None


def _run_all(cfg, layout, run_key, init, load: Callable, quiet, encoder_data) -> list[dict]:
    quiet = quiet or not cfg.impl.progress
    out, todo = [], []
    for ev, eval_hash in cfg.zeroshot_hashes().items():
        path = layout.zeroshot_file(run_key, ev, eval_hash)
        want = {"data": _data(cfg, ev), "encoder_data": encoder_data}
        if ev == BLIMP and want["data"] is None:  # as a GLUE task without files: skipped, the rest goes on
            out.append({"run_key": run_key, "task": ev, "skipped": f"no BLiMP at {cfg.zeroshot.blimp_zip}"})
        elif (res := _existing(path, want)) is not None:
            out.append(res)
        else:
            todo.append((ev, path, want))
    if todo:
        rt = resolve(cfg.impl)
        with threads(cfg.impl.threads):
            tok, model, source = load(cfg, layout, quiet)
            model.to(rt.device)
            for ev, path, want in todo:
                lock = (
                    layout.cache_dir("zeroshot") / "locks" / f"{run_key}-{path.parent.name}-{path.stem}.lock"
                )
                with file_lock(lock):
                    res = _existing(path, want)  # another process may have scored it meanwhile
                    if res is None:
                        t0 = time.time()
                        metrics, pairs = _score(
                            ev, cfg, layout, tok, model, rt, f"{run_key[:12]} {ev}", quiet
                        )
                        res = {
                            "run_key": run_key,
                            "task": ev,
                            "mode": ZEROSHOT,
                            "init": init,
                            "metrics": metrics,
                            "primary_metric": PRIMARY[ev],
                            "primary": metrics[PRIMARY[ev]],
                            "zeroshot_hash": path.stem,
                            "recipe": cfg.zeroshot.model_dump(mode="json"),
                            "layout": "segments" if cfg.objective.format in PAIR_FORMATS else "packed",
                            **want,
                            "provenance": provenance(str(rt.device)),
                            "encoder": source,
                            "wall_s": round(time.time() - t0, 3),
                            "pairs": pairs,
                        }
                        atomic_write_json(path, res)
                out.append(res)
    return out


def _score(ev, cfg, layout, tok, model, rt, desc, quiet) -> tuple[dict, list[dict]]:
    z = cfg.zeroshot
    if ev == BLIMP:
        pairs = blimp.read_pairs(z.blimp_zip, z.blimp_pairs)
        rows = sentence_rows(tok, [s for p in pairs for s in (p.good, p.bad)], cfg.model.max_positions)
    else:
        split = prepare_data(cfg, layout, progress=not quiet).split("test")
        ts = crosssent.triples(split, z.crosssent_pairs)
        segments = cfg.objective.format in PAIR_FORMATS
        rows = crosssent.rows(
            split, ts, special_ids(tok), continuation_mask(tok), segments, cfg.objective.max_seq_len
        )
    total = sum(len(mask_sets(r, z.pll)) for r in rows)
    bar = tqdm(total=total, desc=desc, unit="mask", disable=quiet, leave=False)
    scores = pll(
        model,
        rows,
        tok.mask_token_id,
        metric=z.pll,
        device=rt.device,
        autocast=rt.autocast,
        progress=bar.update,
    )
    bar.close()
    if not np.isfinite(scores).all():
        print(f"zero-shot {desc}: {int((~np.isfinite(scores)).sum())} non-finite scores", file=sys.stderr)
    if ev == BLIMP:
        per_pair = blimp.pair_results(pairs, scores)
        return blimp.summary(per_pair), per_pair
    per_pair = crosssent.pair_results(ts, split, scores)
    return crosssent.summary(per_pair), per_pair
