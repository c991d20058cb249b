"""`--jobs N`: runs trained and fine-tuned side by side (study/parallel.py) give the runs trained one by one.

Only impl.threads changes between the two ways (one thread per job here), and that reorders float sums:
the check is equality to float rounding, plus the same run folders, statuses and fine-tune files.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from study.cli import main
from study.config import RunConfig
from study.errors import StudyError
from study.parallel import check_jobs, with_threads

SPEC = """
name: par
question: two runs side by side
defaults:
  corpus: {sources: ["text:corpus"], valid_fraction: 0.1, test_fraction: 0.1}
  tokenizer: {vocab_size: 200, min_frequency: 1}
  objective: {format: segment_pair, max_seq_len: 32}
  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64, max_positions: 32, dropout: 0.0,
          attention_dropout: 0.0}
  train: {amount: 8, batch_size: 8, eval_sequences: 16}
  finetune: {tasks: [SST-2], glue_dir: glue, seeds: [0], epochs: 1, batch_size: 16, max_length: 32,
             probe: false, baseline: true}
factors:
  objective.sentence: [nsp, none]
seeds: [0]
"""
WORDS = "the cat dog sat on mat a bird flew over tree river ran fast slow red blue house man saw big".split()


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    rng = random.Random(0)
    docs = [" ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))).capitalize() + "."
                     for _ in range(rng.randint(4, 7))) for _ in range(30)]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "docs.txt").write_text("\n\n".join(docs) + "\n")
    for split, n in (("train", 64), ("dev", 24)):
        rows = ["sentence\tlabel"] + [f"{' '.join(rng.choice(WORDS) for _ in range(5))} {'good' if y else 'bad'}\t{y}"
                                      for y in (rng.randint(0, 1) for _ in range(n))]
        (tmp_path / "glue" / "SST-2").mkdir(parents=True, exist_ok=True)
        (tmp_path / "glue" / "SST-2" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    (tmp_path / "par.yaml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def _scores(results: Path) -> dict:
    out = {}
    for run in sorted((results / "runs").iterdir()):
        assert json.loads((run / "status.json").read_text())["status"] == "done"
        out[run.name] = json.loads((run / "metrics.json").read_text())["ref_mlm_loss"]
    for f in sorted((results / "finetune").rglob("*.json")):
        data = json.loads(f.read_text())
        if isinstance(data, dict) and "primary" in data:
            out[str(f.relative_to(results))] = data["primary"]
    return out


@pytest.mark.slow
def test_jobs_two_gives_the_runs_of_jobs_one(project: Path, capsys):
    for results, jobs in (("one", "1"), ("two", "2")):
        assert main(["--results", results, "prepare", "par.yaml", "--quiet"]) == 0
        assert main(["--results", results, "pretrain", "par.yaml", "--quiet", "--jobs", jobs]) == 0
        assert main(["--results", results, "finetune", "par.yaml", "--quiet", "--jobs", jobs]) == 0
    err = capsys.readouterr().err
    assert "2 jobs" in err and err.count("pretrain 2/2") == 2, err  # one progress line per finished run
    one, two = _scores(project / "one"), _scores(project / "two")
    assert one.keys() == two.keys() and len(one) >= 2 + 3, one  # 2 runs, 2 fine-tunes + their baseline
    for key in one:
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-4), key


def test_jobs_threads_and_bad_values():
    cfg = RunConfig()
    assert with_threads(cfg, 1) is cfg                          # one job: nothing changes
    two = with_threads(cfg, 2)
    assert two.impl.threads >= 1 and two.run_hash() == cfg.run_hash()  # speed only: same identity
    cfg.impl.threads = 3
    assert with_threads(cfg, 2).impl.threads == 3               # an explicit setting wins
    for bad in (0, -1):
        with pytest.raises(StudyError) as exc:
            check_jobs(bad)
        assert exc.value.field == "--jobs"


def test_bad_jobs_exits_2_before_any_work(project: Path, capsys):
    assert main(["--results", "r", "pretrain", "par.yaml", "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err
    assert not (project / "r" / "runs").exists()
