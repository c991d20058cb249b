"""GLUE tasks: what each task looks like on disk, how to read it, and how it is scored.

Two sources, one result:
- a folder in the layout of GLUE's `download_glue_data.py` (`<glue_dir>/<TASK>/{train,dev,test}.tsv`),
  read strictly: every row must have exactly the header's columns and a label from the task's set,
  otherwise `StudyError` names the file, the line and the column. GLUE's own quirks are part of the
  format, not errors: CoLA train/dev have no header (CoLA test has one), MRPC starts with a UTF-8 BOM,
  STS-B's score is the last of 10 columns, MNLI's dev split is `dev_matched.tsv`.
- `glue_dir="hub"`: `datasets.load_dataset("nyu-mll/glue", config)` (needs internet, so it cannot run
  on an offline machine; the code path is kept for machines that have it).

Fields are split on tabs with no quoting at all (as GLUE's reference reader does with
`quotechar=None`): GLUE texts contain bare `"` characters that a CSV reader would treat as quotes.

Labels are stored as indices into `TaskSpec.labels`, in the order the hub uses, so a model trained
from either source means the same thing by class 1. Metrics are written here in numpy (the tests
check them against scikit-learn and scipy) so that their edge-case conventions are explicit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from study.errors import StudyError

SPLITS = ("train", "dev", "test")
HUB = "hub"


@dataclass(frozen=True)
class TaskSpec:
    name: str
    folder: str  # folder under glue_dir
    hub_config: str  # nyu-mll/glue config name
    text_columns: tuple[str, ...]  # header names of the 1 or 2 text columns in the TSV
    hub_text_columns: tuple[str, ...]
    label_column: str | None  # header name of the label; None = the last column (STS-B)
    labels: tuple[str, ...] | None  # label strings as written in the TSV, in hub order; None = regression
    metrics: tuple[str, ...]
    primary: str  # the number BERT's GLUE table reports for this task
    files: tuple[tuple[str, str], ...] = (("train", "train.tsv"), ("dev", "dev.tsv"), ("test", "test.tsv"))
    hub_splits: tuple[tuple[str, str], ...] = (("train", "train"), ("dev", "validation"), ("test", "test"))
    # splits without a header row, with the column names GLUE's docs give them
    headerless: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    @property
    def pair(self) -> bool:
        return len(self.text_columns) == 2

    def file(self, split: str) -> str:
        return dict(self.files)[split]


_BINARY = ("0", "1")
_ENTAIL = ("entailment", "not_entailment")
_COLA_COLUMNS = ("source", "label", "original_label", "sentence")

TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec(
            "SST-2",
            "SST-2",
            "sst2",
            ("sentence",),
            ("sentence",),
            "label",
            _BINARY,
            ("accuracy",),
            "accuracy",
        ),
        TaskSpec(
            "CoLA",
            "CoLA",
            "cola",
            ("sentence",),
            ("sentence",),
            "label",
            _BINARY,
            ("matthews_corr", "accuracy"),
            "matthews_corr",
            headerless=(("train", _COLA_COLUMNS), ("dev", _COLA_COLUMNS)),
        ),
        TaskSpec(
            "MRPC",
            "MRPC",
            "mrpc",
            ("#1 String", "#2 String"),
            ("sentence1", "sentence2"),
            "Quality",
            _BINARY,
            ("f1", "accuracy"),
            "f1",
        ),
        TaskSpec(
            "QNLI",
            "QNLI",
            "qnli",
            ("question", "sentence"),
            ("question", "sentence"),
            "label",
            _ENTAIL,
            ("accuracy",),
            "accuracy",
        ),
        TaskSpec(
            "RTE",
            "RTE",
            "rte",
            ("sentence1", "sentence2"),
            ("sentence1", "sentence2"),
            "label",
            _ENTAIL,
            ("accuracy",),
            "accuracy",
        ),
        TaskSpec(
            "STS-B",
            "STS-B",
            "stsb",
            ("sentence1", "sentence2"),
            ("sentence1", "sentence2"),
            None,
            None,
            ("pearson", "spearman"),
            "spearman",
        ),
        TaskSpec(
            "MNLI",
            "MNLI",
            "mnli",
            ("sentence1", "sentence2"),
            ("premise", "hypothesis"),
            "gold_label",
            ("entailment", "neutral", "contradiction"),
            ("accuracy",),
            "accuracy",
            files=(("train", "train.tsv"), ("dev", "dev_matched.tsv"), ("test", "test_matched.tsv")),
            hub_splits=(("train", "train"), ("dev", "validation_matched"), ("test", "test_matched")),
        ),
        TaskSpec(
            "WNLI",
            "WNLI",
            "wnli",
            ("sentence1", "sentence2"),
            ("sentence1", "sentence2"),
            "label",
            _BINARY,
            ("accuracy",),
            "accuracy",
        ),
    )
}

# Rows of the hub's nyu-mll/glue train and validation splits (MNLI: validation_matched), as GLUE publishes
# them. `study plan` sizes fine-tuning on the hub with these before anything is downloaded
# (study/studies/cost.py); tests/test_cost.py checks them against the local copies that exist.
HUB_ROWS: dict[str, tuple[int, int]] = {
    "CoLA": (8551, 1043),
    "SST-2": (67349, 872),
    "MRPC": (3668, 408),
    "STS-B": (5749, 1500),
    "QNLI": (104743, 5463),
    "RTE": (2490, 277),
    "MNLI": (392702, 9815),
    "WNLI": (635, 71),
}

STSB_RANGE = (0.0, 5.0)


@dataclass
class TaskData:
    task: str
    split: str
    text_a: list[str]
    text_b: list[str] | None
    labels: np.ndarray | None  # int64 class indices, float32 scores, or None (unlabelled test split)
    source: str  # file path or hub id, for messages and provenance

    def __len__(self) -> int:
        return len(self.text_a)

    def subset(self, idx: np.ndarray) -> TaskData:
        idx = np.asarray(idx, dtype=np.int64)
        return TaskData(
            self.task,
            self.split,
            [self.text_a[i] for i in idx],
            None if self.text_b is None else [self.text_b[i] for i in idx],
            None if self.labels is None else self.labels[idx],
            self.source,
        )


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise StudyError(f"unknown task {name!r}", field="finetune.tasks", allowed=", ".join(TASKS))
    return TASKS[name]


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise StudyError(f"unknown split {split!r}", field="split", allowed=", ".join(SPLITS))


def task_path(name: str, glue_dir: str | Path, split: str) -> Path:
    spec = get_task(name)
    _check_split(split)
    return Path(glue_dir) / spec.folder / spec.file(split)


def load_task(name: str, glue_dir: str | Path, split: str) -> TaskData:
    spec = get_task(name)
    _check_split(split)
    if str(glue_dir) == HUB:
        return _load_hub(spec, split)
    path = task_path(name, glue_dir, split)
    if not path.is_file():
        raise StudyError(
            f"{spec.name} has no {split} split: {path} does not exist",
            field="finetune.glue_dir",
            source=str(path),
        )
    return _read_tsv(spec, split, path)


# --------------------------------------------------------------------------- TSV
def _read_tsv(spec: TaskSpec, split: str, path: Path) -> TaskData:
    def bad(msg: str, line: int | None = None, column: str | None = None, allowed: str | None = None):
        where = f"{path}:{line}" if line else str(path)
        return StudyError(msg, field=column, allowed=allowed, source=where)

    try:
        # utf-8-sig drops MRPC's byte-order mark so its first header is "Quality", not "\ufeffQuality"
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise bad(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # final newline; CoLA dev ships without one, both are fine
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    headerless = dict(spec.headerless)
    if split in headerless:
        header, first = list(headerless[split]), 1
    else:
        if not lines:
            raise bad("empty file: expected a header row")
        header, first = lines[0].split("\t"), 2
        lines = lines[1:]
    col = {c: i for i, c in enumerate(header)}
    for c in spec.text_columns:
        if c not in col:
            raise bad(f"missing column {c!r} in the header {header}", 1, c, ", ".join(header))
    labelled = split != "test"
    if labelled:
        if spec.label_column is not None and spec.label_column not in col:
            raise bad(
                f"missing label column {spec.label_column!r} in the header {header}",
                1,
                spec.label_column,
                ", ".join(header),
            )
        label_i = len(header) - 1 if spec.label_column is None else col[spec.label_column]
    label_index = {lab: i for i, lab in enumerate(spec.labels or ())}
    text_i = [col[c] for c in spec.text_columns]
    a: list[str] = []
    b: list[str] = []
    y: list = []
    for n, line in enumerate(lines, start=first):
        fields = line.split("\t")
        if len(fields) != len(header):
            kind = "missing" if len(fields) < len(header) else "extra"
            raise bad(f"{kind} columns: {len(fields)} fields, the header has {len(header)}", n)
        a.append(fields[text_i[0]])
        if spec.pair:
            b.append(fields[text_i[1]])
        if not labelled:
            continue
        raw = fields[label_i].strip()
        lname = header[label_i]
        if spec.is_regression:
            try:
                score = float(raw)
            except ValueError:
                raise bad(
                    f"score {raw!r} is not a number", n, lname, f"{STSB_RANGE[0]:g}..{STSB_RANGE[1]:g}"
                ) from None
            if not (STSB_RANGE[0] <= score <= STSB_RANGE[1]):
                raise bad(
                    f"score {score:g} outside the task's range",
                    n,
                    lname,
                    f"{STSB_RANGE[0]:g}..{STSB_RANGE[1]:g}",
                )
            y.append(score)
        else:
            if raw not in label_index:
                raise bad(f"label {raw!r} is not one of the task's labels", n, lname, ", ".join(spec.labels))
            y.append(label_index[raw])
    if not a:
        raise bad("no rows")
    labels = None
    if labelled:
        labels = np.asarray(y, dtype=np.float32 if spec.is_regression else np.int64)
    return TaskData(spec.name, split, a, b if spec.pair else None, labels, str(path))


# --------------------------------------------------------------------------- hub
def _load_hub(spec: TaskSpec, split: str) -> TaskData:
    """nyu-mll/glue on the Hugging Face hub. Its labels are already indices in `spec.labels` order;
    unlabelled test rows carry -1."""
    import datasets  # 1 s to import: only for the hub; spec checks import this module for TASKS

    hub_split = dict(spec.hub_splits)[split]
    source = f"hf:nyu-mll/glue@{spec.hub_config}:{hub_split}"
    try:
        ds = datasets.load_dataset("nyu-mll/glue", spec.hub_config, split=hub_split)
    except Exception as exc:  # noqa: BLE001 - offline, unknown config, ...: the user's setting to fix
        raise StudyError(
            f"cannot load {source}: {type(exc).__name__}: {exc}",
            field="finetune.glue_dir",
            allowed="a GLUE folder or 'hub' with internet access",
        ) from None
    cols = spec.hub_text_columns
    a = [str(t) for t in ds[cols[0]]]
    b = [str(t) for t in ds[cols[1]]] if spec.pair else None
    raw = np.asarray(ds["label"])
    labels = None
    if split != "test":
        if spec.is_regression:
            labels = raw.astype(np.float32)
        else:
            labels = raw.astype(np.int64)
            if labels.size and (labels.min() < 0 or labels.max() >= spec.num_labels):
                raise StudyError(f"labels outside 0..{spec.num_labels - 1}", field="label", source=source)
    return TaskData(spec.name, split, a, b, labels, source)


# --------------------------------------------------------------------------- metrics
def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x = x - x.mean()
    y = y - y.mean()
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    # A constant prediction carries no information: 0, the convention sklearn uses for MCC.
    # (scipy returns nan here; nan would be an invalid number in the JSON result files.)
    return float((x * y).sum() / denom) if denom > 0 else 0.0


def _rank(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (scipy.stats.rankdata 'average')."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    # start of each run of equal values
    new = np.r_[True, xs[1:] != xs[:-1]]
    run_id = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], len(xs)]
    avg = (starts + ends + 1) / 2.0  # mean of 1-based positions start+1..end
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = avg[run_id]
    return ranks


def _mcc(pred: np.ndarray, gold: np.ndarray, k: int) -> float:
    """Matthews correlation, multiclass form (Gorodkin 2004) as in sklearn; 0 when undefined."""
    c = np.zeros((k, k), dtype=np.float64)
    np.add.at(c, (gold, pred), 1)
    t, p = c.sum(1), c.sum(0)
    n, correct = c.sum(), np.trace(c)
    cov_ytyp = correct * n - (t * p).sum()
    cov_ypyp = n * n - (p * p).sum()
    cov_ytyt = n * n - (t * t).sum()
    denom = np.sqrt(cov_ytyt * cov_ypyp)
    return float(cov_ytyp / denom) if denom > 0 else 0.0


def _f1(pred: np.ndarray, gold: np.ndarray, positive: int = 1) -> float:
    tp = float(((pred == positive) & (gold == positive)).sum())
    fp = float(((pred == positive) & (gold != positive)).sum())
    fn = float(((pred != positive) & (gold == positive)).sum())
    # no positive predicted and none present: F1 undefined; 0, sklearn's zero_division default
    return 2 * tp / (2 * tp + fp + fn) if (2 * tp + fp + fn) > 0 else 0.0


def compute_metrics(task: str | TaskSpec, preds, labels) -> dict[str, float]:
    """Task metrics. `preds`: class indices, or logits [n, k] (argmax taken); scores for STS-B."""
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    preds = np.asarray(preds)
    labels = np.asarray(labels)
    for what, arr in (("predictions", preds), ("labels", labels)):
        # argmax of NaN logits is class 0 and ranks of NaNs are arbitrary: a score would look normal
        if np.issubdtype(arr.dtype, np.number) and not np.isfinite(arr).all():
            raise StudyError(f"non-finite {what}: nothing to score (a diverged model)", field=spec.name)
    if spec.is_regression:
        p = preds.reshape(-1).astype(np.float64)
        g = labels.reshape(-1).astype(np.float64)
    else:
        if preds.ndim == 2:
            preds = preds.argmax(-1)
        p = preds.astype(np.int64)
        g = labels.astype(np.int64)
        for what, arr in (("predictions", p), ("labels", g)):
            if arr.size and (arr.min() < 0 or arr.max() >= spec.num_labels):
                raise StudyError(f"{what} outside 0..{spec.num_labels - 1}", field=spec.name)
    if p.shape != g.shape:
        raise StudyError(f"{len(p)} predictions for {len(g)} labels", field=spec.name)
    if p.size == 0:
        raise StudyError("no examples to score", field=spec.name)
    out: dict[str, float] = {}
    for m in spec.metrics:
        if m == "accuracy":
            out[m] = float((p == g).mean())
        elif m == "f1":
            out[m] = _f1(p, g)
        elif m == "matthews_corr":
            out[m] = _mcc(p, g, spec.num_labels)
        elif m == "pearson":
            out[m] = _pearson(p, g)
        elif m == "spearman":
            out[m] = _pearson(_rank(p), _rank(g))
        else:  # pragma: no cover - TASKS is defined above; a typo there is a bug, not a user error
            raise ValueError(f"unknown metric {m}")
    return out
