"""The pre-training stage: `train_run` (one run into results/runs/<run_hash>/, resumable) and
`rescore_run` (score a finished run's saved model again with today's evaluation).

    trainer.py     train_run and one session of a run: setup, resume, checkpoints, evaluation
    loop.py        the loop (a mixin of the Trainer): budget progress, LR, steps, log-window syncs, logging
    results.py     a finished run's metrics.json, model folder, meta.json and status
    checks.py      what a config and its prepared data must satisfy before training (no torch)
    step.py        one optimizer step (also what `study plan` times), the model and optimizer it runs on
    schedule.py    the LR schedule over budget progress
    checkpoint.py  checkpoint files (digest-verified) and RNG state
    evaluate.py    the fixed-reference evaluation every run is compared on; the matmul peak MFU divides by
    rescore.py     score a finished run again; add the metrics fields it lacks
    curve.py       learning curves of one run (`study curve`)
    __main__.py    `python -m study.pretrain CONFIG.json` (also the torchrun entry point)

Entry points load on first use (study/lazy.py): importing this package must not import torch.
"""

from study.lazy import exports

__all__ = ["rescore_run", "train_run"]
__getattr__ = exports(
    __name__, {"train_run": "study.pretrain.trainer", "rescore_run": "study.pretrain.rescore"}
)
