"""The data stage: `prepare_data` (corpus -> WordPiece tokenizer -> tokenized splits, cached by data
hash) and `describe` (`study data`: corpus statistics and decoded instances with their masks).

    readers.py    readers (embedded, text, WikiText, Gutenberg, hf), sentence splitting, the files a source reads
    corpus.py     the document split and the source fingerprint that enters the data identity
    tokenizer.py  WordPiece training/loading (a HF BertTokenizerFast), batch tokenization
    tokens.py     a tokenized split in memory, special ids
    prepare.py    the cached data folder: build, verify, load
    instances.py  pre-training rows per objective format (segment/sentence pairs, full/doc sentences)
    pairs.py      the pair formats' A/B cuts and BERT's pair truncation
    masking.py    the masking engine and the fixed-reference masks
    units.py      which positions each masking unit selects (tokens, whole words, spans)
    counter.py    counter-based random numbers (masking.generator "counter"): the same masks on CPU and CUDA
    batches.py    global batch b of epoch e, a pure function of (config, e, b)

Entry points load on first use (study/lazy.py).
"""

from study.lazy import exports

__all__ = ["describe", "prepare_data"]
__getattr__ = exports(__name__, {name: "study.data.prepare" for name in __all__})
