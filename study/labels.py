"""The label of a position the MLM loss does not score.

-100 is the `ignore_index` default of torch's cross_entropy and Hugging Face's convention for `labels`, so
a saved model's labels mean the same to HF code. The data stage writes it (data/masking.py), the model and
the evaluation read it (model/bert.py, pretrain/step.py, pretrain/evaluate.py); it lives at the root
because the data and model stages import neither each other.
"""

IGNORE = -100
