"""Instance-building throughput per objective format on real text (not a test: no thresholds).

Moved here from tests/test_instances.py::test_speed, which asserted CPU-time rates (packed formats
>= 1M tokens/s, segment pairs >= 300k) and so depended on the machine. The corpus is the one that
test module uses: ~1M WordPiece tokens of 14 Gutenberg books from ../shared/data (a WordPiece vocab of
8192 trained on the first 200 "documents", sentences cut by a regex, "documents" = runs of 40
paragraphs). For each format, build_instances over the whole split (epoch 0) is timed --repeat times;
the best run's tokens per second of CPU time (the machine may be shared) and of wall time are printed,
with the ratio against doc_sentences measured in the same run.

    python -m bench.instances [--repeat 3] [--max-seq-len 128]
    python -m bench.instances --dry   # two books, one repeat

Last line, exactly: `instances doc_sentences=<tok/s> full_sentences=<tok/s> segment_pair=<tok/s>` (CPU time).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

from bench.common import SHARED, repeat_args, single_threaded, timed

single_threaded()
GUTENBERG = SHARED / "gutenberg"
BOOKS = [
    "pg11.txt",
    "pg35.txt",
    "pg55.txt",
    "pg219.txt",
    "pg2500.txt",
    "pg23.txt",
    "pg863.txt",
    "pg36.txt",
    "pg2852.txt",
    "pg308.txt",
    "pg120.txt",
    "pg74.txt",
    "pg408.txt",
    "pg174.txt",
]
_SENT = re.compile(r"(?<=[.!?])[\"'’”)]*\s+(?=[\"'“‘(]?[A-Z])")
FORMATS = [("doc_sentences", "none"), ("full_sentences", "none"), ("segment_pair", "nsp")]


def corpus(work: Path, books: list[str]):
    """(split, special ids, continuation mask): tests/conftest.py's `real` fixture, built the same way."""
    from study.config import TokenizerConfig
    from study.data.readers import read_utf8, strip_gutenberg
    from study.data.tokenizer import continuation_mask, special_ids, tokenize_docs, train_tokenizer

    docs = []
    for b in books:
        body = strip_gutenberg(read_utf8(GUTENBERG / b))
        paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", body) if p.strip()]
        for k in range(0, len(paras), 40):
            sents = [s for p in paras[k : k + 40] for s in _SENT.split(p) if s.strip()]
            if sents:
                docs.append(sents)
    tok = train_tokenizer(docs[:200], TokenizerConfig(vocab_size=8192), work / "tok")
    return tokenize_docs(tok, docs, progress=False), special_ids(tok), continuation_mask(tok)


def masking_ms(split, special, cont, repeat: int) -> None:
    """CPU ms to mask one training batch (32 doc_sentences rows of 128, mask_rows with the default counter
    generator) per masking unit, and the ratio against token units in the same run. Moved here from
    tests/test_masking.py::test_speed_32x128, which asserted < 100 ms."""
    import torch

    from study.config import MaskingConfig, ObjectiveConfig
    from study.data.instances import build_instances
    from study.data.masking import mask_rows

    inst = build_instances(split, ObjectiveConfig(format="doc_sentences", sentence="none"), special, seed=0)
    batch, cont = torch.as_tensor(inst.input_ids[:32]).long(), torch.as_tensor(cont)
    keys = [(0, i, 0) for i in range(32)]
    ms = {}
    for unit in ("token", "whole_word", "span"):
        cfg = MaskingConfig(unit=unit)
        mask_rows(batch, cfg, special, cont, keys)  # warm-up
        best = float("inf")
        for _ in range(max(repeat, 1)):
            c0 = time.process_time()
            for _ in range(5):
                mask_rows(batch, cfg, special, cont, keys)
            best = min(best, (time.process_time() - c0) / 5 * 1e3)
        ms[unit] = best
    print(
        "\nmasking one 32 x 128 batch (CPU ms): "
        + ", ".join(f"{u} {v:.1f} ({v / ms['token']:.2f}x token)" for u, v in ms.items())
    )


def main() -> int:
    args = repeat_args(__doc__, "two books, one repeat")
    if not GUTENBERG.exists():
        print(
            f"Gutenberg texts not found at {GUTENBERG} (see ../shared/data/PROVENANCE.md): nothing measured"
        )
        return 2

    from study.config import ObjectiveConfig
    from study.data.instances import build_instances

    print(f"cpus available: {len(os.sched_getaffinity(0))}, load average: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        split, special, cont = corpus(Path(tmp), BOOKS[:2] if args.dry else BOOKS)
        print(
            f"corpus: {split.n_tokens:,} tokens, tokenizer trained and text tokenized in {time.perf_counter() - t0:.1f}s"
        )

    print(
        f"\n{'format':15} {'sentence':8} {'rows':>8} {'tokens/CPU-s':>13} {'tokens/s':>12} {'vs doc_sentences':>17}"
    )
    rates = {}
    for fmt, sent in FORMATS:
        obj = ObjectiveConfig(format=fmt, sentence=sent, max_seq_len=args.max_seq_len)
        inst, wall, cpu = timed(
            lambda obj=obj: build_instances(split, obj, special, seed=0, epoch=0), args.repeat, best="cpu"
        )
        rows = len(inst)
        rates[fmt] = split.n_tokens / max(cpu, 1e-9)
        ratio = rates[fmt] / rates["doc_sentences"]
        print(
            f"{fmt:15} {sent:8} {rows:>8,} {rates[fmt]:>13,.0f} {split.n_tokens / max(wall, 1e-9):>12,.0f} "
            f"{ratio:>16.2f}x"
        )
    masking_ms(split, special, cont, args.repeat)
    print(f"\nload average now {os.getloadavg()[0]:.2f}")
    print("instances " + " ".join(f"{fmt}={rates[fmt]:.0f}" for fmt, _ in FORMATS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
