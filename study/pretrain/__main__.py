"""`python -m study.pretrain CONFIG.json [--results DIR] [--quiet]`: train one run from a resolved config.

Also the torchrun entry point: `torchrun --nproc_per_node 2 -m study.pretrain CONFIG.json`. Errors end
as `study`'s do (errors.run_main): 2 for a bad config or a full disk, 3 diverged, 143 interrupted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from study.config import RunConfig
from study.data.corpus import with_fingerprint
from study.errors import run_main
from study.io import read_json
from study.paths import Layout
from study.pretrain.trainer import train_run
from study.runtime import dist_env


def main(argv: list[str] | None = None, prog: str = "python -m study.pretrain") -> int:
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("config", help="a RunConfig as JSON (e.g. a run folder's config.json)")
    ap.add_argument("--results", default="results")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    def body() -> int:
        raw = read_json(args.config)
        raw.pop("run_hash", None)
        # a bare config gets its corpus fingerprint here (part of the run hash); one that has it is checked
        cfg = with_fingerprint(RunConfig.model_validate(raw), source=args.config)
        metrics = train_run(cfg, Layout(root=Path(args.results)), quiet=args.quiet)
        if dist_env().main:
            keys = ("ref_mlm_loss", "ref_mlm_acc", "steps", "tokens_seen")
            print(json.dumps({k: metrics[k] for k in keys}))
        return 0

    return run_main(body)


if __name__ == "__main__":
    raise SystemExit(main())
