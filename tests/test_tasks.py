"""GLUE readers and metrics: metrics agree with scikit-learn/scipy, every GLUE file quirk is read, bad
files raise StudyError naming file and line, and the real GLUE folder loads with its documented counts."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from study.downstream.tasks import SPLITS, TASKS, compute_metrics, get_task, load_task
from study.errors import StudyError


# --------------------------------------------------------------------------- metrics
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binary_metrics_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, 300)
    pred = np.where(rng.random(300) < 0.7, gold, 1 - gold)
    m = compute_metrics("MRPC", pred, gold)
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(gold, pred))
    assert m["f1"] == pytest.approx(skm.f1_score(gold, pred))
    c = compute_metrics("CoLA", pred, gold)
    assert c["matthews_corr"] == pytest.approx(skm.matthews_corrcoef(gold, pred))
    assert compute_metrics("SST-2", pred, gold) == {"accuracy": pytest.approx(skm.accuracy_score(gold, pred))}


def test_multiclass_and_logits():
    rng = np.random.default_rng(5)
    gold = rng.integers(0, 3, 200)
    logits = rng.normal(size=(200, 3))
    logits[np.arange(200), gold] += 1.0
    m = compute_metrics("MNLI", logits, gold)
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(gold, logits.argmax(1)))
    from study.downstream.tasks import _mcc

    assert _mcc(logits.argmax(1), gold, 3) == pytest.approx(skm.matthews_corrcoef(gold, logits.argmax(1)))


@pytest.mark.parametrize("seed", [0, 1])
def test_regression_metrics_match_scipy(seed):
    rng = np.random.default_rng(seed)
    gold = np.round(rng.uniform(0, 5, 250) * 4) / 4  # many ties, as in STS-B
    pred = gold + rng.normal(0, 1.2, 250)
    pred[:40] = np.round(pred[:40])  # ties in the predictions too
    m = compute_metrics("STS-B", pred, gold)
    assert m["pearson"] == pytest.approx(stats.pearsonr(pred, gold)[0], abs=1e-10)
    assert m["spearman"] == pytest.approx(stats.spearmanr(pred, gold)[0], abs=1e-10)
    assert set(m) == {"pearson", "spearman"}


def test_degenerate_predictions_have_defined_scores():
    gold = np.array([0, 1, 1, 0, 1])
    const = np.ones(5, dtype=int)
    # sklearn's convention for MCC; we use the same 0 for the correlations (scipy: nan, not JSON)
    assert compute_metrics("CoLA", const, gold)["matthews_corr"] == skm.matthews_corrcoef(gold, const) == 0.0
    zeros = np.zeros(5, dtype=int)
    assert compute_metrics("MRPC", zeros, gold)["f1"] == skm.f1_score(gold, zeros, zero_division=0) == 0.0
    s = compute_metrics("STS-B", np.full(5, 2.5), np.array([0.0, 1, 2, 3, 4]))
    assert s == {"pearson": 0.0, "spearman": 0.0}


def test_metric_input_errors():
    with pytest.raises(StudyError, match="5 predictions for 4 labels"):
        compute_metrics("SST-2", np.zeros(5, int), np.zeros(4, int))
    with pytest.raises(StudyError, match="outside"):
        compute_metrics("SST-2", np.array([0, 2]), np.array([0, 1]))


def test_config_task_names_match_the_registry():
    # config.py validates spec task names against GLUE_TASKS; a task added here must be added there
    from study.config import GLUE_TASKS

    assert tuple(GLUE_TASKS) == tuple(TASKS)


def test_unknown_task_lists_allowed_names(tmp_path):
    with pytest.raises(StudyError) as e:
        load_task("SST2", tmp_path, "train")
    assert "SST2" in str(e.value) and "SST-2" in e.value.allowed and "STS-B" in e.value.allowed
    assert e.value.field == "finetune.tasks"
    with pytest.raises(StudyError, match="split"):
        load_task("SST-2", tmp_path, "validation")


# --------------------------------------------------------------------------- readers (fixtures)
def write(path, text: str, bom: bool = False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


def test_readers_handle_glue_quirks(tmp_path):
    g = tmp_path / "glue"
    write(g / "SST-2/train.tsv", 'sentence\tlabel\nit \'s " fine " .\t1\nbad movie \t0\n')
    write(g / "SST-2/test.tsv", "index\tsentence\n0\tsome text\n")
    # CoLA: train/dev without header, test with one; dev without final newline as shipped
    write(g / "CoLA/dev.tsv", "gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tRode sailors the.")
    write(g / "CoLA/test.tsv", "index\tsentence\n0\tBill whistled.\n")
    write(
        g / "MRPC/train.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA .\tB .\r\n", bom=True
    )
    cols = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    write(g / "STS-B/dev.tsv", f"{cols}\tscore\n0\tg\tf\t2012\t0\tnone\tnone\tA man.\tA person.\t3.800\n")
    write(
        g / "MNLI/dev_matched.tsv",
        "index\tsentence1\tsentence2\tlabel1\tgold_label\n0\tP .\tH .\tneutral\tcontradiction\n",
    )
    sst = load_task("SST-2", g, "train")
    assert sst.text_a == ['it \'s " fine " .', "bad movie "] and sst.text_b is None
    assert sst.labels.tolist() == [1, 0] and sst.labels.dtype == np.int64
    assert load_task("SST-2", g, "test").labels is None
    cola = load_task("CoLA", g, "dev")
    assert cola.text_a == ["The sailors rode.", "Rode sailors the."] and cola.labels.tolist() == [1, 0]
    assert load_task("CoLA", g, "test").text_a == ["Bill whistled."]
    mrpc = load_task("MRPC", g, "train")  # BOM stripped, so "Quality" is found; CRLF tolerated
    assert (mrpc.text_a, mrpc.text_b, mrpc.labels.tolist()) == (["A ."], ["B ."], [1])
    sts = load_task("STS-B", g, "dev")
    assert sts.labels.dtype == np.float32 and sts.labels.tolist() == [pytest.approx(3.8)]
    assert (sts.text_a, sts.text_b) == (["A man."], ["A person."])
    mnli = load_task("MNLI", g, "dev")  # dev = dev_matched.tsv; label = gold_label, not label1
    assert mnli.labels.tolist() == [2] and get_task("MNLI").labels[2] == "contradiction"


@pytest.mark.parametrize(
    "content,line,needle",
    [
        ("sentence\tlabel\ngood\t1\nbad\t0\textra\n", 3, "extra columns"),
        ("sentence\tlabel\ngood\t1\nno label here\n", 3, "missing columns"),
        ("sentence\tlabel\ngood\t1\nbad\t2\n", 3, "label '2'"),
        ("sentence\tlabel\ngood\tpositive\n", 2, "label 'positive'"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, content, line, needle):
    p = write(tmp_path / "SST-2/train.tsv", content)
    with pytest.raises(StudyError) as e:
        load_task("SST-2", tmp_path, "train")
    assert f"{p}:{line}" in str(e.value) and needle in str(e.value)


def test_bad_headers_and_scores(tmp_path):
    write(tmp_path / "RTE/train.tsv", "index\tsentence1\ttext\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(StudyError, match="missing column 'sentence2'") as e:
        load_task("RTE", tmp_path, "train")
    assert e.value.field == "sentence2" and str(tmp_path / "RTE/train.tsv") in str(e.value)
    write(tmp_path / "RTE/dev.tsv", "index\tsentence1\tsentence2\n0\ta\tb\n")
    with pytest.raises(StudyError, match="missing label column 'label'"):
        load_task("RTE", tmp_path, "dev")
    write(tmp_path / "RTE/test.tsv", "")
    with pytest.raises(StudyError, match="empty file"):
        load_task("RTE", tmp_path, "test")
    hdr = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tg\tf\t2012\t0\tnone\tnone\ta\tb\t"
    for score, msg in (("5.5", "outside"), ("high", "not a number")):
        p = write(tmp_path / "STS-B/train.tsv", hdr + row + "1.0\n" + row + score + "\n")
        with pytest.raises(StudyError, match=msg) as e:
            load_task("STS-B", tmp_path, "train")
        assert f"{p}:3" in str(e.value)
    write(tmp_path / "CoLA/train.tsv", "gj04\t1\t\tok\n", bom=False)
    (tmp_path / "CoLA/train.tsv").write_bytes(b"gj04\t1\t\t\xff\xfe\n")
    with pytest.raises(StudyError, match="UTF-8"):
        load_task("CoLA", tmp_path, "train")
    with pytest.raises(StudyError, match="has no train split") as e:
        load_task("QNLI", tmp_path, "train")
    assert e.value.field == "finetune.glue_dir"


def test_hub_path_maps_columns_and_labels(monkeypatch):
    """The hub code path, with `datasets.load_dataset` replaced (no internet here)."""
    import datasets

    calls = []

    def fake(name, config, split):
        calls.append((name, config, split))
        return {"premise": ["p1", "p2"], "hypothesis": ["h1", "h2"], "label": [2, 0]}

    monkeypatch.setattr(datasets, "load_dataset", fake)
    d = load_task("MNLI", "hub", "dev")
    assert calls == [("nyu-mll/glue", "mnli", "validation_matched")]
    assert (d.text_a, d.text_b, d.labels.tolist()) == (["p1", "p2"], ["h1", "h2"], [2, 0])
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: {"sentence": ["x"], "label": [-1]})
    assert load_task("SST-2", "hub", "test").labels is None
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: {"sentence": ["x"], "label": [3]})
    with pytest.raises(StudyError, match="labels outside"):
        load_task("SST-2", "hub", "train")

    def offline(*a, **k):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(StudyError, match="cannot load hf:nyu-mll/glue@cola:train"):
        load_task("CoLA", "hub", "train")


# --------------------------------------------------------------------------- the real GLUE folder
# rows and label counts from ../shared/data/PROVENANCE.md (label counts in TaskSpec.labels order)
REAL = {
    ("SST-2", "train"): (67349, [29780, 37569]),
    ("SST-2", "dev"): (872, [428, 444]),
    ("SST-2", "test"): (1821, None),
    ("CoLA", "train"): (8551, [2528, 6023]),
    ("CoLA", "dev"): (1043, [322, 721]),
    ("CoLA", "test"): (1063, None),
    ("MRPC", "train"): (3668, [1194, 2474]),
    ("MRPC", "dev"): (408, [129, 279]),
    ("MRPC", "test"): (1725, None),
    ("QNLI", "dev"): (5463, [2702, 2761]),
    ("QNLI", "test"): (5463, None),
    ("RTE", "train"): (2490, [1249, 1241]),
    ("RTE", "dev"): (277, [146, 131]),
    ("RTE", "test"): (3000, None),
    ("STS-B", "train"): (5749, "0-5"),
    ("STS-B", "dev"): (1500, "0-5"),
    ("STS-B", "test"): (1379, None),
    ("WNLI", "train"): (635, [323, 312]),
    ("WNLI", "dev"): (71, [40, 31]),
    ("WNLI", "test"): (146, None),
}


def test_real_glue_loads_with_documented_counts(shared_data):
    glue = shared_data / "glue"
    for (task, split), (rows, labels) in REAL.items():
        d = load_task(task, glue, split)
        assert len(d) == rows, (task, split)
        assert all(isinstance(t, str) for t in d.text_a)
        assert (d.text_b is not None) == TASKS[task].pair
        if labels is None:
            assert d.labels is None
        elif labels == "0-5":
            assert d.labels.min() == 0.0 and d.labels.max() == 5.0 and len(np.unique(d.labels)) > 50
        else:
            assert np.bincount(d.labels).tolist() == labels, (task, split)
    # not shipped: QNLI train and all of MNLI -> the error names the missing file
    for task, split in (("QNLI", "train"), ("MNLI", "train"), ("MNLI", "dev")):
        with pytest.raises(StudyError, match="does not exist"):
            load_task(task, glue, split)
    assert set(SPLITS) == {"train", "dev", "test"}


def test_compute_metrics_refuses_non_finite_input():
    """NaN logits argmax to class 0 and NaN scores rank arbitrarily: a normal-looking score (before)."""
    with pytest.raises(StudyError, match="non-finite predictions"):
        compute_metrics("SST-2", np.array([[np.nan, np.nan], [0.1, 0.9]]), [0, 1])
    with pytest.raises(StudyError, match="non-finite predictions"):
        compute_metrics("STS-B", np.array([np.nan, 1.0, 2.0]), [0.0, 1.0, 2.0])
    with pytest.raises(StudyError, match="non-finite labels"):
        compute_metrics("STS-B", np.array([0.0, 1.0, 2.0]), [0.0, np.inf, 2.0])
