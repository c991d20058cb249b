"""The downstream stage: `finetune_run` (GLUE fine-tuning and probe of a pre-trained run),
`finetune_baseline` (the same recipe on a random-init encoder) and `baseline_key` (that baseline's key).

The entry points are loaded on first use (PEP 562 module __getattr__): importing this package, or a
light module of it such as tasks.py, must not import torch, so `study --help` and spec parsing stay fast.
"""
from __future__ import annotations

import importlib

_EXPORTS = {"finetune_run": "study.downstream.finetune", "finetune_baseline": "study.downstream.finetune",
            "baseline_key": "study.downstream.finetune"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
