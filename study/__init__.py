"""study: a reproducible BERT pre-training ablation harness."""

__version__ = "0.1.0"
