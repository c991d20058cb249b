"""Metric names, "TASK/MODE/METRIC" specs, and the columns of the search trials table.

The one place these names are defined: spec validation (search objectives), the search stage, the
aggregate's tidy table and the report all import them from here, so a metric added or renamed in one
place cannot silently mean nothing in another. Nothing heavy is imported (no torch, no optuna, no
GLUE metadata): the report must be able to read these names on a machine without the training stack.

A metric is named either by a bare pre-training key of metrics.json (`ref_mlm_loss`) or by
`TASK/MODE/METRIC` for a downstream result (`SST-2/finetune/accuracy`, `RTE/probe/accuracy`). In the
tidy table a pre-training metric has task = mode = "pretrain".
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from study.errors import StudyError

PRETRAIN = "pretrain"  # the task and the mode of a pre-training metric in the tidy table

# Quality metrics a finished pre-training run writes to metrics.json (docs/ARCHITECTURE.md).
# ref_rnd_acc / ref_keep_acc: the asked positions shown as another token / unchanged (evaluation only, beside
# ref_mask_acc at [MASK]): BERT Table 8's splits train them differently, so the report compares them too.
PRETRAIN_METRICS = (
    "ref_mlm_loss",
    "ref_mlm_acc",
    "ref_mask_acc",
    "ref_rnd_acc",
    "ref_keep_acc",
    "ref_ppl",
    "sentence_acc",
)
# Cost metrics (metrics.json / meta.json) carried as tidy rows too, so cost figures get seed CIs.
COST_METRICS = ("tokens_per_s", "params", "tokens_seen", "mfu", "wall_s")
# The zero-shot evaluations (study/zeroshot/): their task names, their mode in the tidy table and the metrics
# there, so `report.primary_metric: BLiMP/zeroshot/accuracy` validates (the per-phenomenon ones stay apart).
BLIMP, CROSS_SENTENCE, ZEROSHOT = "BLiMP", "cross-sentence", "zeroshot"
ZEROSHOT_METRICS = {BLIMP: ("accuracy",), CROSS_SENTENCE: ("gain", "win_rate")}
# How a downstream result was obtained: full fine-tuning, a linear probe on the frozen encoder, or zero-shot.
MODES = ("finetune", "probe", ZEROSHOT)
DEFAULT_METRIC = "ref_ppl"  # a report's primary metric when the spec names none

EXAMPLE = "SST-2/finetune/accuracy"

# --------------------------------------------------------------------------- metric kinds
# What a metric's number means, by its name (the last part of TASK/MODE/METRIC): the report's formatting
# (scores in percent, differences in pp), `study plan --detect`'s unit and widest difference, and which
# way is better (the report's best level, a search's default direction) all ask here.
CORRELATIONS = ("matthews_corr", "pearson", "spearman")  # scores in [-1, 1]
# Scores stored as fractions, written in percent; every other bounded score is in [0, 1].
BOUNDED = frozenset(
    {
        "accuracy",
        "f1",
        *CORRELATIONS,
        "ref_mlm_acc",
        "ref_mask_acc",
        "ref_rnd_acc",
        "ref_keep_acc",
        "sentence_acc",
        "mfu",
    }
)
LOWER_IS_BETTER_SUFFIXES = ("loss", "ppl")  # losses and perplexities; wall_s is named below
LOWER_IS_BETTER = frozenset({"wall_s"})


def finite(*xs: object) -> bool:
    """Every x is a real, finite number: a value to show, test or train on. None, NaN, inf and bools are not
    (numbers.Real covers numpy scalars too: np.int64 is not an int)."""
    return all(isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) for x in xs)


def metric_name(metric: str) -> str:
    """The name part of a metric spec: 'SST-2/finetune/accuracy' -> 'accuracy', 'ref_ppl' -> 'ref_ppl'."""
    return str(metric).rsplit("/", 1)[-1]


def is_bounded(metric: str) -> bool:
    """A score stored as a fraction of a bounded range ([0, 1], or [-1, 1] for a correlation)."""
    return metric_name(metric) in BOUNDED


def metric_range(metric: str) -> tuple[float, float] | None:
    """The range a bounded score lies in; None for an unbounded one (a loss, a perplexity, a count)."""
    name = metric_name(metric)
    if name not in BOUNDED:
        return None
    return (-1.0, 1.0) if name in CORRELATIONS else (0.0, 1.0)


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value is the better one: losses, perplexities and wall time."""
    name = metric_name(metric)
    return name.endswith(LOWER_IS_BETTER_SUFFIXES) or name in LOWER_IS_BETTER


class Metric(NamedTuple):
    """A parsed metric spec; unpacks as `task, mode, name = parse_metric(...)`."""

    task: str
    mode: str
    name: str

    @property
    def is_pretrain(self) -> bool:
        return self.task == PRETRAIN

    def __str__(self) -> str:
        return format_metric(*self)


def format_metric(task: str, mode: str, name: str) -> str:
    """The spec text of a metric: the bare name for a pre-training metric, else TASK/MODE/METRIC."""
    return name if task == PRETRAIN else f"{task}/{mode}/{name}"


def parse_metric(
    spec: str | None,
    *,
    field: str = "metric",
    source: str | None = None,
    pretrain: Sequence[str] = PRETRAIN_METRICS + COST_METRICS,
    tasks: Mapping[str, Sequence[str]] | None = None,
) -> Metric:
    """'SST-2/finetune/accuracy' -> Metric('SST-2', 'finetune', 'accuracy'); 'ref_ppl' -> a pre-training one.

    `pretrain` are the bare names accepted; `tasks` ({task: its metric names}), when given, also checks
    the task and the metric against what the task reports (the caller passes the GLUE metadata, so this
    module does not import it). A StudyError names `field` and the allowed values.
    """
    spec = DEFAULT_METRIC if spec is None else spec
    parts = str(spec).split("/")
    if len(parts) == 1 and spec in pretrain:
        return Metric(PRETRAIN, PRETRAIN, spec)
    if len(parts) != 3 or not all(parts):
        raise StudyError(
            f"unknown metric '{spec}'",
            field=field,
            source=source,
            allowed=", ".join(pretrain) + f", or TASK/{'|'.join(MODES)}/METRIC e.g. {EXAMPLE}",
        )
    task, mode, name = parts
    if tasks is not None and task not in tasks:
        raise StudyError(
            f"unknown task '{task}' in '{spec}'", field=field, source=source, allowed=", ".join(tasks)
        )
    if mode not in MODES:
        raise StudyError(
            f"unknown mode '{mode}' in '{spec}'", field=field, source=source, allowed=", ".join(MODES)
        )
    if tasks is not None and name not in tasks[task]:
        raise StudyError(
            f"{task} does not report '{name}'", field=field, source=source, allowed=", ".join(tasks[task])
        )
    return Metric(task, mode, name)


# --------------------------------------------------------------------------- the search trials table
# results/search/<name>/trials.csv is written by the search stage (study/search/trials.py) and read by
# the report (study/report/render.py, figures.py), which must not import the search stage: both use
# these names. Parameter columns are spelled like optuna's `Study.trials_dataframe()` (`params_<key>`),
# so that table fits the report as it is too.
# run_hashes: every seed's run of the trial (JSON list; run_hash names the first); commit: the worker's code
TRIAL_COLUMNS = (
    "number",
    "state",
    "value",
    "params",
    "run_hash",
    "tokens",
    "tokens_total",
    "reused",
    "retry_of",
    "duplicate_of",
    "worker",
    "datetime_start",
    "datetime_complete",
    "run_hashes",
    "commit",
)
PARAM_PREFIX = "params_"


def param_column(key: str) -> str:
    """The trials-table column of a searched key: 'masking.rate' -> 'params_masking.rate'."""
    return PARAM_PREFIX + key


def param_columns(columns: Iterable[str]) -> dict[str, str]:
    """{searched key: its column} of a trials table's columns (the JSON `params` column is not one)."""
    return {str(c)[len(PARAM_PREFIX) :]: str(c) for c in columns if str(c).startswith(PARAM_PREFIX)}
