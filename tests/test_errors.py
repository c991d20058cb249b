"""One error -> exit mapping for every entry point (study/errors.py): a user mistake, a divergence, an
interruption and a machine fault (full disk, read-only or unwritable folder) each end in one line on
stderr and a fixed exit status, never a traceback; after a full disk the same command resumes bitwise."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline import _corpus

from study.errors import (
    EXIT_CTRL_C,
    EXIT_DIVERGED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Diverged,
    Interrupted,
    StudyError,
    exit_code,
    run_main,
)

SPEC = """
name: full
question: does a full disk lose anything?
defaults:
  corpus: {sources: ["text:corpus"], valid_fraction: 0.1, test_fraction: 0.1}
  tokenizer: {vocab_size: 200, min_frequency: 1}
  objective: {format: segment_pair, max_seq_len: 32}
  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64, max_positions: 32}
  train: {amount: 8, batch_size: 8, eval_sequences: 16}
  finetune: {max_length: 32}
  impl: {checkpoint_every: 3, threads: 1}
seeds: [0]
"""


def _study(tmp_path: Path, name: str, fail_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("STUDY_FAIL_AT", None)
    if fail_at:
        env["STUDY_FAIL_AT"] = fail_at
    cmd = [sys.executable, "-m", "study", "--results", name, "pretrain", "spec.yaml", "--quiet"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def _weights(results: Path) -> dict[str, str]:
    return {
        str(f.relative_to(results)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted((results / "runs").glob("*/model/*.safetensors"))
    }


def test_a_full_disk_ends_in_one_line_and_the_same_command_resumes_bitwise(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    _corpus(tmp_path / "corpus")
    ref = _study(tmp_path, "ref")
    assert ref.returncode == 0, ref.stderr
    # the disk fills up at the second checkpoint write (step 6); the step-3 checkpoint is on disk
    full = _study(tmp_path, "res", fail_at="io.replace@checkpoints:2")
    # study/cpu.py's note on a loaded machine ("study: load average ...") may come first: not an error line
    lines = [x for x in full.stderr.splitlines() if x.strip() and not x.startswith("study: load average")]
    assert full.returncode == EXIT_USAGE, full.stderr
    assert "Traceback" not in full.stderr and len(lines) == 1, full.stderr
    (line,) = lines
    assert line.startswith("error: no space left on device (ENOSPC): ")
    assert "checkpoints/step-00000006.pt" in line and "the same command" in line and "kept:" in line
    (run,) = (tmp_path / "res" / "runs").iterdir()
    assert not (run / "status.json").exists()  # not recorded as a failed run: a machine fault, not the run's
    assert [p.name for p in (run / "checkpoints").glob("*.pt")] == ["step-00000003.pt"]
    again = _study(tmp_path, "res")
    assert again.returncode == 0, again.stderr
    assert json.loads((run / "status.json").read_text())["status"] == "done"
    got, want = _weights(tmp_path / "res"), _weights(tmp_path / "ref")
    assert got and got == want


@pytest.mark.parametrize(
    ("code", "name", "fix"),
    [
        (errno.ENOSPC, "ENOSPC", "free some space"),
        (errno.EDQUOT, "EDQUOT", "raise the quota"),
        (errno.EROFS, "EROFS", "make the folder writable"),
        (errno.EACCES, "EACCES", "make the folder writable"),
        (errno.EPERM, "EPERM", "make the folder writable"),
    ],
)
def test_machine_faults_name_the_path_and_what_was_kept(code, name, fix, capsys):
    def body():
        raise OSError(code, os.strerror(code), "results/runs/abc/metrics.json")

    assert run_main(body) == EXIT_USAGE
    (line,) = capsys.readouterr().err.splitlines()
    assert f"({name}): results/runs/abc/metrics.json;" in line and fix in line and "resumes" in line


def test_every_mapped_exception_has_its_code_and_a_bug_keeps_its_traceback():
    assert exit_code(StudyError("x", field="runs")) == EXIT_USAGE
    assert exit_code(Diverged(3, float("nan"))) == EXIT_DIVERGED
    assert exit_code(Interrupted(5)) == EXIT_INTERRUPTED
    assert exit_code(KeyboardInterrupt()) == EXIT_CTRL_C
    assert exit_code(OSError(errno.ENOENT, "No such file")) is None  # not the machine's fault: a bug
    assert exit_code(ValueError("bug")) is None

    def bug():
        raise ValueError("bug")

    with pytest.raises(ValueError):
        run_main(bug)


def test_the_search_and_pretrain_drivers_map_as_the_cli_does(tmp_path, monkeypatch, capsys):
    """`python -m study.search` let Interrupted through as a traceback; `python -m study.pretrain` did
    not know a full disk."""
    import study.pretrain.__main__ as pretrain_main
    import study.search.cli as search_cli
    import study.search.worker as search_worker

    def interrupted(*a, **k):
        raise Interrupted(None)

    monkeypatch.setattr(search_worker, "run_search", interrupted)
    assert search_cli.main(["--results", str(tmp_path), "search", "x.yaml"]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.startswith("interrupted: ")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "runs"))

    (tmp_path / "cfg.json").write_text("{}")
    monkeypatch.setattr(pretrain_main, "read_json", full)
    assert pretrain_main.main([str(tmp_path / "cfg.json"), "--results", str(tmp_path)]) == EXIT_USAGE
    assert "(ENOSPC)" in capsys.readouterr().err
