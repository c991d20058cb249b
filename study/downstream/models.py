"""The models a run is evaluated from: its pre-trained model (tokenizer and weights checked against each other)
and its seeded random-init baseline. Fine-tuning (finetune.py) keeps their encoder; the zero-shot evaluations
(study/zeroshot/) score the whole pre-training model, MLM head included."""

from __future__ import annotations

from pathlib import Path

import torch

from study.config import RunConfig
from study.data.prepare import prepare_data
from study.data.tokenizer import load_tokenizer
from study.errors import StudyError
from study.io import read_json
from study.model.bert import build_model
from study.model.load import load_pretrained
from study.paths import Layout
from study.rundir import RunDir


def pretrained_model(
    cfg: RunConfig, layout: Layout, quiet: bool = False
) -> tuple[object, torch.nn.Module, str]:
    """(tokenizer, the full pre-training model, where it came from) of a finished run: what fine-tuning and
    the zero-shot evaluations (study/zeroshot/) start from."""
    run = RunDir(layout, cfg.run_hash())
    model_dir = run.model_dir
    if not run.has_model():
        raise StudyError(
            f"no pre-trained model at {model_dir}; run `study pretrain` first",
            field="run",
            source=str(model_dir),
        )
    tok = _load_tokenizer(model_dir)
    vocab = int(read_json(model_dir / "config.json")["vocab_size"])
    _check_vocab(tok, vocab, model_dir)
    return tok, load_pretrained(model_dir, cfg.impl.attention, quiet), str(model_dir)


def random_model(cfg: RunConfig, layout: Layout, quiet: bool = False) -> tuple[object, torch.nn.Module, str]:
    """(tokenizer, a seeded random-init model of the run's architecture, its description): the random-init
    baseline of fine-tuning and of the zero-shot evaluations. The run's own tokenizer where it was trained,
    else the data folder's (the same one)."""
    model_dir = RunDir(layout, cfg.run_hash()).model_dir
    if (model_dir / "tokenizer.json").is_file():
        tok, where = _load_tokenizer(model_dir), str(model_dir)
    else:
        prepared = prepare_data(cfg, layout, progress=not quiet)
        tok, where = prepared.tokenizer, str(prepared.dir)
    model = build_model(cfg.model, len(tok), sentence_head=False, impl=cfg.impl, seed=cfg.seed)
    return tok, model, f"random init (seed {cfg.seed}), tokenizer from {where}"


def _load_tokenizer(model_dir: Path):
    if not (model_dir / "tokenizer.json").is_file():
        raise StudyError(
            f"the checkpoint has no tokenizer (tokenizer.json) in {model_dir}",
            field="run",
            source=str(model_dir),
        )
    return load_tokenizer(model_dir)


def _check_vocab(tok, vocab_size: int, where: Path) -> None:
    if len(tok) != vocab_size:
        raise StudyError(
            f"the tokenizer has {len(tok)} tokens but the model's embedding has {vocab_size} rows",
            field="tokenizer.vocab_size",
            allowed=f"a tokenizer of exactly {vocab_size} tokens",
            source=str(where),
        )
