"""Where every artifact lives. Folders are named by content hashes, never by hand or by time.

results/
  data/<data_hash>/        corpus splits, stats, tokenizer, tokenized splits (per corpus+tokenizer config)
  runs/<run_hash>/         one pre-training run: config.json, meta.json, status.json,
                           history.jsonl, metrics.json, model/ (save_pretrained + tokenizer), checkpoints/
  finetune/<run_hash>/     downstream results: <task>/<finetune_hash>/<mode>-seed<k>.json
  finetune/random-<hash>/  the random-init baseline for one architecture + tokenizer
  finetune/<key>/zeroshot/ zero-shot results: <evaluation>/<zeroshot_hash>.json (BLiMP, cross-sentence)
  studies/<name>/          aggregate tables of one study
  search/<name>/           optuna storage and exported best spec
  metrics/, plots/         copies of runs' and studies' metrics and loss curves for `dvc metrics/plots`
  curves/<run_hash>.*      `study curve`'s learning curves
  .locks/                  one trainer per run across processes
  .cache/<kind>/           derived and disposable: tokenized GLUE splits and fine-tuning locks
                           (finetune), dvc stamp digests (stamps); kept out of every DVC dependency
reports/<name>/index.html  one self-contained report per study; reports/index.html lists them
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from study.errors import StudyError

# A study's name (spec `name`, profile keys) becomes a folder under results/ and reports/ and a word in
# dvc.yaml's shell commands: one path component, no quoting, never `.` or `..`.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
SAFE_NAME_ALLOWED = (
    "letters, digits, '_', '-' and '.', not only dots: it names folders and goes into commands"
)


def safe_name(name) -> bool:
    return isinstance(name, str) and bool(_SAFE_NAME.fullmatch(name)) and name.strip(".") != ""


def _folder(name: str) -> str:
    """Guard of the folders named by a study: a name that is not one safe component would leave the root."""
    if not safe_name(name):
        raise StudyError(f"{name!r} is not a folder name", field="name", allowed=SAFE_NAME_ALLOWED)
    return name


def check_folders(flags: dict[str, str | None]) -> None:
    """Each path ({flag: path}, e.g. --results) is a folder or not there yet: a file there (or above) was a
    traceback."""
    for flag, value in flags.items():
        path = Path(value or ".")
        there = next((q for q in (path, *path.parents) if q.exists()), None)
        if there is not None and not there.is_dir():
            raise StudyError(
                f"{there} is not a folder", field=flag, allowed="a folder, or a path to make one"
            )


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

    def zeroshot_file(self, run_key: str, evaluation: str, eval_hash: str) -> Path:
        """A zero-shot evaluation's per-pair scores (study/zeroshot/), beside the encoder's fine-tune results."""
        return self.finetune_dir(run_key) / "zeroshot" / evaluation / f"{eval_hash}.json"

    def study_dir(self, name: str) -> Path:
        return self.root / "studies" / _folder(name)

    def search_dir(self, name: str) -> Path:
        return self.root / "search" / _folder(name)

    def search_trials(self, name: str) -> Path:  # the search stage writes it, the report reads it
        return self.search_dir(name) / "trials.csv"

    def slurm_dir(self, kind: str) -> Path:
        """results/slurm/<kind>: the Slurm executor's logs (submitit's, per job), submissions (what was
        submitted) and configs (a torchrun task's run config)."""
        return self.root / "slurm" / kind

    def cache_dir(self, kind: str) -> Path:
        # Outside results/finetune and the run folders on purpose: those are DVC dependencies, and a cache
        # changing must not make the study re-aggregate.
        return self.root / ".cache" / kind

    def report_dir(self, name: str) -> Path:
        return self.reports / _folder(name)

    def metrics_file(self, name: str) -> Path:
        """results/metrics/<name>.json: a run's (its hash) or a study's (study-<name>) metrics for `dvc
        metrics show`; DVC forbids a metrics file inside another output, so not in the run folder."""
        return self.root / "metrics" / f"{name}.json"

    def plot_file(self, name: str) -> Path:
        """results/plots/<name>.csv: a run's or a study's loss curve for `dvc plots show` (as metrics_file)."""
        return self.root / "plots" / f"{name}.csv"

    def curves_dir(self) -> Path:
        """results/curves/: `study curve`'s CSV and PNG per run hash; not inside the run folder, whose files
        RunDir owns and the study stage's stamp digests."""
        return self.root / "curves"

    def lock_file(self, name: str) -> Path:
        """results/.locks/<name>.lock: one process at a time trains a run (train-<hash>) or runs a trial's
        check-then-train (run-<hash>)."""
        return self.root / ".locks" / f"{name}.lock"

    def lease_file(self, name: str) -> Path:
        """results/.locks/<name>.lease: the lease (study/lease.py) that holds across hosts, where flock may
        not: a run's training (train-<hash>) and a trial's check-then-train (run-<hash>)."""
        return self.root / ".locks" / f"{name}.lease"

    @classmethod
    def of_study_dir(cls, study_dir: Path) -> Layout:
        """The results layout a study folder (results/studies/<name>) belongs to."""
        return cls(root=Path(study_dir).parent.parent)
