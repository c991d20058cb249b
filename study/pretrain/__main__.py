"""`python -m study.pretrain CONFIG.json [--results DIR] [--quiet]`: train one run from a resolved config.

Also the torchrun entry point: `torchrun --nproc_per_node 2 -m study.pretrain CONFIG.json`.
"""

from study.pretrain.trainer import main

if __name__ == "__main__":
    raise SystemExit(main())
