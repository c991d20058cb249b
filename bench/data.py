"""Data-stage throughput: tokenization and pre-training instance building.

Corpora: the embedded Wikipedia sample (gensim wheel) and WikiText-2 raw valid+test
(../shared/data, skipped with a note when absent). One WordPiece tokenizer (vocab 8192) is
trained on all of it, then each corpus is tokenized

  plain   `encode_batch` over whole sentences (the Rust reference path)
  cache   study.data.tokenizer's word cache: Rust once per distinct word, numpy gather (the default)

with TOKENIZERS_PARALLELISM false and true (best of --repeat), and the ids are checked identical.
Instances: build_instances on the tokenized corpus for every objective format, epoch 0.
Throughputs are tokens of the corpus per second of wall time (CPU time in brackets);
ratios are against `plain` measured in the same run. No thresholds.

    python -m bench.data [--repeat 3] [--max-seq-len 128]
    python -m bench.data --dry   # 12 documents of the embedded corpus, a 1,000-word vocab, one repeat

Last line, exactly: `data tokenize_tokens_per_s=<cache, best setting> instances_tokens_per_s=<segment_pair+nsp>`.
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import SHARED, repeat_args, single_threaded, timed

single_threaded()
WIKI = SHARED / "wikitext-2-raw"


def main() -> int:
    args = repeat_args(__doc__, "12 embedded documents, small vocab, one repeat")

    import numpy as np

    from study.config import ObjectiveConfig, TokenizerConfig
    from study.data.instances import build_instances
    from study.data.readers import read_embedded, read_wikitext
    from study.data.tokenizer import special_ids, tokenize_docs, train_tokenizer

    print(f"cpus available: {len(os.sched_getaffinity(0))}, load average: {os.getloadavg()[0]:.2f}")
    corpora: dict[str, list[list[str]]] = {}
    t0 = time.perf_counter()
    corpora["embedded"] = list(itertools.islice(read_embedded(), 12 if args.dry else None))
    print(f"read embedded: {len(corpora['embedded'])} docs in {time.perf_counter() - t0:.1f}s")
    if WIKI.exists() and not args.dry:
        t0 = time.perf_counter()
        corpora["wikitext2-valid+test"] = [
            d for s in ("valid", "test") for d in read_wikitext(str(WIKI / f"wiki.{s}.raw"))
        ]
        print(
            f"read wikitext-2 valid+test: {len(corpora['wikitext2-valid+test'])} docs in "
            f"{time.perf_counter() - t0:.1f}s"
        )
    else:
        print(f"wikitext-2 not found at {WIKI}: embedded corpus only")

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        tok = train_tokenizer(
            [d for docs in corpora.values() for d in docs],
            TokenizerConfig(vocab_size=1000 if args.dry else 8192),
            Path(tmp) / "tok",
        )
        print(f"trained WordPiece vocab {len(tok)} in {time.perf_counter() - t0:.1f}s")
    special = special_ids(tok)

    best_cache, best_cache_cpu, splits = {}, {}, {}
    print(
        f"\n{'corpus':22} {'method':6} {'parallel':8} {'tokens':>10} {'tokens/s':>12} {'(cpu)':>12} {'vs plain':>9}"
    )
    for name, docs in corpora.items():
        plain_rate = None
        for par in ("false", "true"):
            os.environ["TOKENIZERS_PARALLELISM"] = par
            for method in ("plain", "cache"):
                sp, wall, cpu = timed(
                    lambda docs=docs, method=method: tokenize_docs(
                        tok, docs, progress=False, word_cache=method == "cache"
                    ),
                    args.repeat,
                )
                rate = sp.n_tokens / wall
                if method == "plain" and par == "false":
                    plain_rate, ref = rate, sp
                same = all(
                    np.array_equal(getattr(sp, k), getattr(ref, k))
                    for k in ("ids", "sent_starts", "doc_starts")
                )
                if not same:
                    print(f"!! {name} {method} parallel={par}: ids differ from plain")
                    return 1
                if method == "cache":
                    best_cache[name] = max(best_cache.get(name, 0.0), rate)
                    best_cache_cpu[name] = max(best_cache_cpu.get(name, 0.0), sp.n_tokens / cpu)
                splits[name] = sp
                print(
                    f"{name:22} {method:6} {par:8} {sp.n_tokens:>10,} {rate:>12,.0f} {sp.n_tokens / cpu:>12,.0f} "
                    f"{rate / plain_rate:>8.2f}x"
                )
        os.environ["TOKENIZERS_PARALLELISM"] = "false"

    print(f"\ninstances (max_seq_len {args.max_seq_len}, epoch 0, dupe_factor 1)")
    print(f"{'corpus':22} {'format':15} {'sentence':8} {'rows':>8} {'tokens/s':>12} {'fill':>6}")
    objectives = [
        ("segment_pair", "nsp"),
        ("segment_pair", "sop"),
        ("sentence_pair", "nsp"),
        ("full_sentences", "none"),
        ("doc_sentences", "none"),
    ]
    inst_rates = {}
    for name, sp in splits.items():
        for fmt, sent in objectives:
            obj = ObjectiveConfig(format=fmt, sentence=sent, max_seq_len=args.max_seq_len)
            inst, wall, cpu = timed(
                lambda sp=sp, obj=obj: build_instances(sp, obj, special, seed=0, epoch=0), args.repeat
            )
            rate = sp.n_tokens / wall
            fill = float(inst.lengths.sum()) / inst.input_ids.size
            inst_rates[(name, fmt, sent)] = rate
            print(f"{name:22} {fmt:15} {sent:8} {len(inst):>8,} {rate:>12,.0f} {fill:>6.1%}")

    total_tokens = sum(sp.n_tokens for sp in splits.values())
    # overall = all corpora's tokens over the summed best times
    tok_rate = total_tokens / sum(splits[n].n_tokens / best_cache[n] for n in splits)
    inst_rate = total_tokens / sum(
        splits[n].n_tokens / inst_rates[(n, "segment_pair", "nsp")] for n in splits
    )
    tok_cpu = total_tokens / sum(splits[n].n_tokens / best_cache_cpu[n] for n in splits)
    # on a shared machine wall time includes waiting for a core; tokens per CPU-second does not
    print(
        f"tokenize (cache) per CPU-second: {tok_cpu:,.0f} tokens; load average now {os.getloadavg()[0]:.2f}"
    )
    print(f"data tokenize_tokens_per_s={tok_rate:.0f} instances_tokens_per_s={inst_rate:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
