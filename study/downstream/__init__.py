"""The downstream stage: `finetune_run` (GLUE fine-tuning and probe of a pre-trained run) and
`finetune_baseline` (the same recipe on a random-init encoder).

    tasks.py       GLUE tasks on disk: readers, label spaces, metrics
    encode.py      a split as token ids (cached), the rows a cap keeps, training and eval batches
    classifier.py  the encoder + BERT's classification head ([CLS] or mean pooling), AdamW, the step
    probe.py       the feature-based probe on the frozen encoder
    finetune.py    the entry points: fine-tuning loop, probe and random-init baseline
    results.py     the result files (one per task/mode/seed): paths, records, reuse digests, skipped tasks
    batched.py     several fine-tuning seeds in one vmapped step (impl.finetune_batched_seeds)

Entry points load on first use (study/lazy.py): importing this package, or a light module of it such as
tasks.py, must not import torch, so `study --help` and spec parsing stay fast.
"""

from study.lazy import exports

__all__ = ["finetune_baseline", "finetune_run"]
__getattr__ = exports(__name__, {name: "study.downstream.finetune" for name in __all__})
