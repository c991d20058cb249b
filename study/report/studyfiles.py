"""A study's aggregate as the report reads it back: `load_study_dir` -> `StudyFiles` (study.json, the
tables, and the search's trials table when the search stage wrote one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from study.errors import StudyError
from study.io import read_json
from study.paths import Layout


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame()
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


@dataclass
class StudyFiles:
    """The aggregate of one study, as the report sees it."""

    dir: Path
    study: dict
    summary: pd.DataFrame
    comparisons: pd.DataFrame
    baseline: pd.DataFrame
    runs: pd.DataFrame
    curves: pd.DataFrame
    trials: pd.DataFrame | None = None
    factor_keys: list[str] = field(default_factory=list)

    @property
    def plan(self) -> dict:
        return self.study["plan"]


def load_study_dir(study_dir: str | Path) -> StudyFiles:
    study_dir = Path(study_dir)
    try:  # missing, truncated or hand-edited (a JSONDecodeError traceback before): exit 2 naming the file
        study = read_json(study_dir / "study.json")
        if not isinstance(study, dict) or not isinstance(study.get("plan"), dict):
            raise ValueError("not an aggregate's study.json")
    except (OSError, ValueError) as exc:
        what = "missing" if isinstance(exc, FileNotFoundError) else f"unreadable: {exc}"
        raise StudyError(
            f"no aggregate at {study_dir} (study.json {what}); run `study aggregate` to write it",
            source=str(study_dir / "study.json"),
        ) from None
    keys = study.get("factor_keys") or sorted(
        {k for r in study["plan"].get("runs", []) for k in r.get("factors", {})}
    )
    tpath = Layout.of_study_dir(study_dir).search_trials(str(study["plan"].get("name")))
    trials = _read_csv(tpath) if tpath.exists() else None
    return StudyFiles(
        dir=study_dir,
        study=study,
        summary=_read_csv(study_dir / "summary.csv"),
        comparisons=_read_csv(study_dir / "comparisons.csv"),
        baseline=_read_csv(study_dir / "baseline.csv"),
        runs=_read_csv(study_dir / "runs.csv"),
        curves=_read_csv(study_dir / "curves.csv"),
        trials=trials,
        factor_keys=list(keys),
    )
