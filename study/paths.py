"""Where every artifact lives. Folders are named by content hashes, never by hand or by time.

results/
  data/<data_hash>/        corpus splits, stats, tokenizer, tokenized splits (per corpus+tokenizer config)
  runs/<run_hash>/         one pre-training run: config.json, meta.json, status.json,
                           history.jsonl, metrics.json, model/ (save_pretrained + tokenizer), checkpoints/
  finetune/<run_hash>/     downstream results: <task>/<finetune_hash>/<mode>-seed<k>.json
  finetune/random-<hash>/  the random-init baseline for one architecture + tokenizer
  studies/<name>/          aggregate tables of one study
  search/<name>/           optuna storage and exported best spec
  .cache/<kind>/           derived and disposable: tokenized GLUE splits and fine-tuning locks
                           (finetune), dvc stamp digests (stamps); kept out of every DVC dependency
reports/<name>/index.html  one self-contained report per study; reports/index.html lists them
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    root: Path = Path("results")
    reports: Path = Path("reports")

    def data_dir(self, data_hash: str) -> Path:
        return self.root / "data" / data_hash

    def run_dir(self, run_hash: str) -> Path:
        return self.root / "runs" / run_hash

    def finetune_dir(self, run_key: str) -> Path:
        return self.root / "finetune" / run_key

    def study_dir(self, name: str) -> Path:
        return self.root / "studies" / name

    def search_dir(self, name: str) -> Path:
        return self.root / "search" / name

    def cache_dir(self, kind: str) -> Path:
        # Outside results/finetune and the run folders on purpose: those are DVC dependencies, and a cache
        # changing must not make the study re-aggregate.
        return self.root / ".cache" / kind

    def report_dir(self, name: str) -> Path:
        return self.reports / name
