"""study/metrics.py (metric names, "TASK/MODE/METRIC" specs, the trials table's columns) and the one
error policy every reader of a run folder applies (study/rundir.py), seen from each reader."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from study.errors import StudyError
from study.metrics import (
    COST_METRICS,
    MODES,
    PRETRAIN,
    PRETRAIN_METRICS,
    Metric,
    format_metric,
    is_bounded,
    lower_is_better,
    metric_range,
    param_column,
    param_columns,
    parse_metric,
)
from study.paths import Layout

TASKS = {"SST-2": ("accuracy",), "MRPC": ("accuracy", "f1")}


def test_parse_and_format_round_trip():
    assert parse_metric("SST-2/finetune/accuracy") == Metric("SST-2", "finetune", "accuracy")
    assert (
        parse_metric("ref_ppl") == Metric(PRETRAIN, PRETRAIN, "ref_ppl")
        and parse_metric("ref_ppl").is_pretrain
    )
    assert parse_metric(None) == Metric(PRETRAIN, PRETRAIN, "ref_ppl")  # a report without a primary metric
    assert parse_metric("tokens_per_s").name == "tokens_per_s"  # cost metrics are tidy rows too
    for spec in ("ref_mlm_loss", "MRPC/probe/f1"):
        assert format_metric(*parse_metric(spec)) == str(parse_metric(spec)) == spec
    assert set(MODES) == {"finetune", "probe", "zeroshot"} and not set(PRETRAIN_METRICS) & set(COST_METRICS)


@pytest.mark.parametrize(
    "spec, words, allowed",
    [
        ("ref_mlm_los", "unknown metric 'ref_mlm_los'", "ref_mlm_loss"),
        ("SST-2/accuracy", "unknown metric", "TASK/finetune|probe|zeroshot/METRIC"),
        ("SST-2//accuracy", "unknown metric", "TASK/finetune|probe|zeroshot/METRIC"),
        ("SST-2/train/accuracy", "unknown mode 'train'", "finetune, probe"),
        ("XYZ/finetune/accuracy", "unknown task 'XYZ'", "SST-2, MRPC"),
        ("SST-2/finetune/f1", "SST-2 does not report 'f1'", "accuracy"),
    ],
)
def test_bad_specs_name_the_field_and_what_is_allowed(spec, words, allowed):
    with pytest.raises(StudyError) as ei:
        parse_metric(spec, field="search.objective", source="s.yaml", tasks=TASKS)
    e = ei.value
    assert words in str(e) and e.field == "search.objective" and e.source == "s.yaml" and allowed in e.allowed


def test_a_search_objective_may_not_be_a_cost_metric():
    with pytest.raises(StudyError, match="unknown metric 'wall_s'"):
        parse_metric("wall_s", pretrain=PRETRAIN_METRICS)


def test_metric_kinds():
    """One owner for what a metric's number means: the report's percent and pp, `plan --detect`'s widest
    difference, and which way is better (the report's best level, a search's default direction)."""
    assert is_bounded("accuracy") and is_bounded("SST-2/finetune/accuracy") and is_bounded("mfu")
    assert not is_bounded("ref_ppl") and not is_bounded("tokens_per_s")
    assert metric_range("CoLA/finetune/matthews_corr") == (-1.0, 1.0) and metric_range("f1") == (0.0, 1.0)
    assert metric_range("ref_mlm_loss") is None
    # the report used to rank only ref_ppl among perplexities lower-is-better, the search every *ppl
    for m in ("ref_ppl", "ref_mlm_loss", "final_loss", "SST-2/finetune/loss", "wall_s"):
        assert lower_is_better(m), m
    for m in ("accuracy", "ref_mlm_acc", "tokens_per_s", "mfu", "SST-2/probe/f1"):
        assert not lower_is_better(m), m


def test_a_search_defaults_to_the_metric_direction():
    from study.studies.searchspec import SearchSpec

    def direction(objective):
        spec = {"objective": objective, "params": {"masking.rate": {"low": 0.1, "high": 0.2}}}
        return SearchSpec.model_validate(spec).resolved_direction

    assert direction("ref_ppl") == direction("ref_mlm_loss") == "minimize"
    assert direction("SST-2/finetune/accuracy") == direction("ref_mlm_acc") == "maximize"


def test_formatting_a_number_imports_no_plotting_library():
    """fmt.py used to import BOUNDED from figures.py, so formatting a number loaded matplotlib and seaborn."""
    code = (
        "import sys; from study.report.fmt import fmt_value, fmt_diff; "
        "assert fmt_value(0.5, 'accuracy') == '50.0' and fmt_diff(0.02, 'f1') == '+2.0 pp'; "
        "print(sorted(m for m in ('matplotlib', 'seaborn', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_trials_table_parameter_columns():
    """One spelling for the writer (search) and the reader (report), as optuna's trials_dataframe() has it."""
    assert param_column("masking.rate") == "params_masking.rate"
    cols = ["number", "params", "value", "params_masking.rate", "params_train.lr"]
    assert param_columns(cols) == {"masking.rate": "params_masking.rate", "train.lr": "params_train.lr"}


def test_every_reader_sees_a_damaged_run_folder_the_same_way(tmp_path):
    """A status.json damaged from outside reads as pending everywhere (it trains again, which is safe);
    a history line cut by a kill is skipped, not fatal: aggregation, `study plan`'s status, the DVC copies."""
    from study.report.collect import collect
    from study.rundir import RunDir
    from study.studies.spec import load_study

    layout = Layout(root=tmp_path / "results")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: t\ndefaults:\n  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64}\n")
    run = load_study(spec).runs[0]
    rd = RunDir(layout, run.run_hash)
    rd.path.mkdir(parents=True)
    rd.status_path.write_text('{"status": "do')  # damaged
    rd.history_path.write_text(
        json.dumps({"step": 1, "tokens": 8, "loss": 5.0, "lr": 1e-3}) + "\n" + '{"step": 2, "los'
    )  # cut by a kill
    assert run.status(layout) == "pending"
    plan = {
        "name": "t",
        "finetune_hash": "ft",
        "runs": [{"run_hash": run.run_hash, "label": "base", "seed": 0}],
    }
    c = collect(plan, layout)
    assert list(c["runs"]["status"]) == ["pending"] and c["tidy"].empty
    assert c["curves"][["step", "loss"]].to_dict("records") == [{"step": 1, "loss": 5.0}]
    rd.publish()
    assert json.loads((layout.root / "metrics" / f"{run.run_hash}.json").read_text()) == {"status": "pending"}
    curve = pd.read_csv(layout.root / "plots" / f"{run.run_hash}.csv")
    assert list(curve["step"]) == [1]
    # a done run whose metrics.json (or meta.json) was cut: read as empty by every reader, with a warning,
    # so the aggregate goes on (before: a JSONDecodeError stopped it), and the trainer would train it again
    from study.pretrain.trainer import finished_metrics

    rd.write_status("done", None, 10)
    rd.metrics_path.write_text('{"ref_mlm_acc": 0.2')
    rd.meta_path.write_bytes(b"\xff\xfe not json")
    assert rd.metrics() == {} and rd.meta() == {} and finished_metrics(rd) is None
    c = collect(plan, layout)
    assert list(c["runs"]["status"]) == ["done"] and c["tidy"].empty
