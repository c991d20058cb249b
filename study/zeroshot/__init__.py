"""The zero-shot stage: `zeroshot_run` (a finished run's encoder and MLM head) and `zeroshot_baseline` (the
run's random-init baseline), scored without any training, after pre-training, beside fine-tuning.

    pll.py        MLM pseudo-log-likelihood (Salazar et al. 2020; within_word_l2r: Kauf & Ivanova 2023),
                  every masked copy of every sentence batched
    blimp.py      BLiMP minimal pairs: the zip, the fixed sample per paradigm, accuracy per phenomenon
    crosssent.py  cross-sentence context use: B's PLL after its true neighbour A vs after a sentence from
                  another document, in the run's own row layout
    run.py        the entry points: which results exist, one result file per evaluation

Entry points load on first use (study/lazy.py): importing this package must not import torch.
"""

from study.lazy import exports

__all__ = ["zeroshot_baseline", "zeroshot_run"]
__getattr__ = exports(__name__, {name: "study.zeroshot.run" for name in __all__})
