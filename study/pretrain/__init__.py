"""The pre-training stage: `train_run` (one run into results/runs/<run_hash>/, resumable) and
`rescore_run` (score a finished run's saved model again with today's evaluation).

The entry points are loaded on first use (PEP 562 module __getattr__): importing this package, or a
light module of it, must not import torch and transformers, so `study --help` stays fast.
"""
from __future__ import annotations

import importlib

_EXPORTS = {"train_run": "study.pretrain.trainer", "rescore_run": "study.pretrain.rescore"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
