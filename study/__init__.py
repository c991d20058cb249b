"""study: a reproducible BERT pre-training ablation harness."""

import os

__version__ = "0.1.0"

# OpenMP threads that wait by sleeping, not spinning: a spinning torch thread holds its core, and with
# another CPU-bound process on the machine training fell below one thread's speed (study/cpu.py, measured
# by bench/contention.py). Here because this is the first module every entry point loads (the CLI, the
# --jobs workers, the DVC stages, the benches), before any torch import: libgomp reads the variable once,
# when torch loads it. setdefault: a user's own OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
