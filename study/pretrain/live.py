"""Live training curves (`impl.live`): each history line of a run, as it is written, also logged with
DVC's own logger, dvclive, into `results/runs/<run_hash>/live/` (`plots/metrics/train/*.tsv`,
`plots/metrics/eval/*.tsv`, `metrics.json`).

Why dvclive: this project's users already run DVC, and `dvc plots show` and the DVC VS Code extension
read these files as they grow; TensorBoard would be a second tool to install and watch. `impl.live` is
logging only, outside the run hash, like `log_every`.

The files are a function of `history.jsonl`: a session starts them afresh from the history it kept (a
resumed run's history is cut back to its checkpoint, so the steps an interrupted session logged after it
are not repeated), then appends a row per history line. A resumed run's curves continue; a rerun never
duplicates a step. dvclive is told to leave dvc.yaml and DVC experiments alone (`dvcyaml=None`,
`save_dvc_exp=False`): the pipeline is `study sync`'s.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

TRAIN_KEYS = ("loss", "mlm_loss", "sentence_loss", "lr", "grad_norm", "tokens_per_s", "tokens")
LIVE_DIR = "live"


class LiveCurves:
    def __init__(self, run_dir: Path, history: list[dict]):
        from dvclive import Live  # 2 s to import (it loads DVC): only for a run that logs live

        self.live = Live(dir=str(run_dir / LIVE_DIR), resume=False, save_dvc_exp=False, dvcyaml=None)
        for line in history:  # the kept history first: the curves restart where the run does
            self.log(line)

    def log(self, line: dict) -> None:
        """One history line: an eval (`eval: {...}`) under eval/, a log step's values under train/."""
        values = line["eval"] if "eval" in line else {k: line.get(k) for k in TRAIN_KEYS}
        prefix = "eval" if "eval" in line else "train"
        self.live.step = int(line["step"])
        for key, v in values.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                self.live.log_metric(f"{prefix}/{key}", v)
        self.live.make_summary()


def open_live(enabled: bool, run_dir: Path, history: list[dict]) -> LiveCurves | None:
    """The run's live logger, or None when `impl.live` is off or dvclive is missing (a warning: the
    curves are a view, training goes on without them)."""
    if not enabled:
        return None
    try:
        return LiveCurves(run_dir, history)
    except ImportError as exc:
        print(f"warning: impl.live: dvclive is not installed ({exc}); no live curves", file=sys.stderr)
        return None
