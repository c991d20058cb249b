import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED.exists():
        pytest.skip(f"real data not present at {SHARED} (see ../shared/data/PROVENANCE.md)")
    return SHARED


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


@pytest.fixture(scope="session")
def real(tmp_path_factory):
    """(split, special, continuation) for ~1M tokens of 14 Gutenberg books; built once per session.

    Sentences by regex, not pysbd (too slow for a test fixture): masking never looks at sentence
    boundaries, and the instance tests only need sentence-like units.
    """
    if not SHARED.exists():
        pytest.skip(f"real data not present at {SHARED} (see ../shared/data/PROVENANCE.md)")
    from study.config import TokenizerConfig
    from study.data.readers import read_utf8, strip_gutenberg
    from study.data.tokenizer import (
        continuation_mask,
        load_tokenizer,
        special_ids,
        tokenize_docs,
        train_tokenizer,
    )
    from study.data.tokens import TokenizedSplit

    cache = tmp_path_factory.getbasetemp() / "realtext-1m"
    if not (cache / "split.npz").exists():
        docs = []
        for b in BOOKS:
            body = strip_gutenberg(read_utf8(SHARED / "gutenberg" / b))
            paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", body) if p.strip()]
            for k in range(0, len(paras), 40):
                sents = [s for p in paras[k : k + 40] for s in _SENT.split(p) if s.strip()]
                if sents:
                    docs.append(sents)
        tok = train_tokenizer(docs[:200], TokenizerConfig(vocab_size=8192), cache / "tok")
        tokenize_docs(tok, docs, progress=False).save(cache / "split.npz")
    tok = load_tokenizer(cache / "tok")
    return TokenizedSplit.load(cache / "split.npz"), special_ids(tok), continuation_mask(tok)
