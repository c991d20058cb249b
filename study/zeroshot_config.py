"""The `zeroshot` section of a run's config (study/zeroshot/ runs it): which zero-shot evaluations score the
encoder, on how many pairs, with which PLL metric; and the identity of their results. Semantic for those
results only, never for the run hash (RunConfig.semantic() leaves the section out): adding or changing an
evaluation re-scores and retrains nothing. Its own module so study/config.py stays within its size budget;
RunConfig holds the section and exposes `zeroshot_hashes()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from study.io import hash_obj
from study.metrics import BLIMP, CROSS_SENTENCE
from study.schema import Strict

if TYPE_CHECKING:  # annotation only: config.py imports this module
    from study.config import RunConfig

PAIR_FORMATS = ("segment_pair", "sentence_pair")  # rows [CLS] A [SEP] B [SEP] with token types


class ZeroshotConfig(Strict):
    """BLiMP minimal pairs and cross-sentence context use, scored by MLM pseudo-log-likelihood."""

    blimp: bool = True
    blimp_pairs: int | None = Field(default=100, ge=1, le=1000)  # per paradigm (fixed sample); None: all
    blimp_zip: str = "../shared/data/blimp/BLiMP.zip"
    crosssent: bool = True
    crosssent_pairs: int = Field(default=600, ge=2)  # (A, B) pairs of the run's held-out test documents
    pll: Literal["original", "within_word_l2r"] = "original"  # Salazar et al. 2020 | Kauf & Ivanova 2023


def zeroshot_hashes(cfg: RunConfig) -> dict[str, str]:
    """{evaluation: the identity of its results} for the evaluations `cfg` turns on: the sample size and the
    metric, and for cross-sentence the row layout the run trained with (a random-init baseline shared by a
    pair and a packed format is scored in each). Not where the data lies: its digest is kept in the result,
    as fine-tuning keeps task_data."""
    z = cfg.zeroshot
    segments = cfg.objective.format in PAIR_FORMATS
    out = {}
    if z.blimp:
        out[BLIMP] = hash_obj({"evaluation": BLIMP, "pairs": z.blimp_pairs, "pll": z.pll})
    if z.crosssent:
        key = {"evaluation": CROSS_SENTENCE, "pairs": z.crosssent_pairs, "pll": z.pll, "segments": segments}
        out[CROSS_SENTENCE] = hash_obj(key)
    return out
