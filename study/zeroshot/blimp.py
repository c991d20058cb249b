"""BLiMP (Warstadt et al., 2020, TACL 8): 67 paradigms of 1,000 English minimal pairs, CC BY 4.0.

A pair is correct when the MLM pseudo-log-likelihood (study/zeroshot/pll.py) of the good sentence is strictly
higher than the bad one's: a tie is a failure, as for every evaluation here.

Data: `zeroshot.blimp_zip` (../shared/data/blimp/BLiMP.zip, ../shared/data/PROVENANCE.md), one
`data/<UID>.jsonl` per paradigm; the zip also holds macOS metadata (`__MACOSX/`, `data/.DS_Store`), so only
`data/*.jsonl` names are read. `zeroshot.blimp_pairs` pairs per paradigm are scored: the first n of a fixed
permutation of the paradigm's pairs (seeded by the paradigm's name, no global RNG), so every run and
baseline sees the same pairs and a larger sample contains a smaller one. Equal pairs per paradigm make the
overall accuracy the paper's macro average over paradigms.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from study.errors import StudyError

SAMPLE_SEED = 20200  # the sample's seed: fixed, so the sample is part of the evaluation, not of a run
PARADIGMS = 67
PAIRS_PER_PARADIGM = 1000


@dataclass(frozen=True)
class Pair:
    uid: str  # the paradigm
    term: str  # its phenomenon (`linguistics_term`, 13 of them)
    pair_id: int
    good: str
    bad: str


def sample(uid: str, n: int | None, total: int) -> np.ndarray:
    """Indices (sorted) of the `n` pairs of paradigm `uid` scored; None: all of them."""
    if n is None or n >= total:
        return np.arange(total)
    perm = np.random.default_rng([SAMPLE_SEED, zlib.crc32(uid.encode())]).permutation(total)
    return np.sort(perm[:n])


def read_pairs(path: str | Path, n: int | None) -> list[Pair]:
    """The sampled pairs of every paradigm, paradigms in name order. A missing or foreign zip is a StudyError."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(
            f"BLiMP not found at {path} (resolved from {Path.cwd()})",
            field="zeroshot.blimp_zip",
            allowed="the path of BLiMP.zip (../shared/data/blimp/BLiMP.zip), or zeroshot.blimp: false",
        )
    out: list[Pair] = []
    with zipfile.ZipFile(path) as z:
        names = sorted(n for n in z.namelist() if n.startswith("data/") and n.endswith(".jsonl"))
        if len(names) != PARADIGMS:
            raise StudyError(
                f"{path} holds {len(names)} paradigms under data/, not {PARADIGMS}",
                field="zeroshot.blimp_zip",
                allowed="BLiMP.zip as ../shared/data/PROVENANCE.md describes it",
            )
        for name in names:
            rows = [json.loads(line) for line in z.read(name).decode("utf-8").splitlines() if line.strip()]
            for i in sample(Path(name).stem, n, len(rows)):
                r = rows[i]
                out.append(
                    Pair(
                        r["UID"],
                        r["linguistics_term"],
                        int(r["pairID"]),
                        r["sentence_good"],
                        r["sentence_bad"],
                    )
                )
    return out


def pair_results(pairs: list[Pair], scores: np.ndarray) -> list[dict]:
    """Per pair: paradigm, pair id, both PLLs and whether the good sentence won (strictly)."""
    good, bad = scores[0::2], scores[1::2]
    return [
        {
            "uid": p.uid,
            "term": p.term,
            "pair": p.pair_id,
            "good": float(g),
            "bad": float(b),
            "correct": bool(g > b),
        }
        for p, g, b in zip(pairs, good, bad, strict=True)
    ]


def summary(per_pair: list[dict]) -> dict[str, float]:
    """Accuracy overall and per phenomenon (`accuracy:<linguistics_term>`), as fractions; the number of pairs."""
    out = {"accuracy": float(np.mean([r["correct"] for r in per_pair])), "pairs": len(per_pair)}
    terms: dict[str, list[bool]] = {}
    for r in per_pair:
        terms.setdefault(r["term"], []).append(r["correct"])
    out.update({f"accuracy:{t}": float(np.mean(v)) for t, v in sorted(terms.items())})
    return out
