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
from study.parallel import check_jobs, resolve_jobs, with_threads

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
    docs = [
        " ".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))).capitalize() + "."
            for _ in range(rng.randint(4, 7))
        )
        for _ in range(30)
    ]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "docs.txt").write_text("\n\n".join(docs) + "\n")
    for split, n in (("train", 64), ("dev", 24)):
        rows = ["sentence\tlabel"] + [
            f"{' '.join(rng.choice(WORDS) for _ in range(5))} {'good' if y else 'bad'}\t{y}"
            for y in (rng.randint(0, 1) for _ in range(n))
        ]
        (tmp_path / "glue" / "SST-2").mkdir(parents=True, exist_ok=True)
        (tmp_path / "glue" / "SST-2" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    (tmp_path / "par.yaml").write_text(SPEC)
    (tmp_path / "params.yaml").write_text("studies: []\n")  # a project root (study/root.py)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.fixture(autouse=True)
def _no_child_outlives_a_test():
    """A failed stopping test must fail, not hang the suite: the interpreter joins live children at exit."""
    import multiprocessing

    before = set(multiprocessing.active_children())
    yield
    for p in set(multiprocessing.active_children()) - before:
        p.kill()
        p.join(10)


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


def test_jobs_start_the_longest_runs_first(project: Path, monkeypatch):
    """--jobs N hands the runs to the workers in order of training FLOPs, the largest first (a 2-layer run
    before 1-layer ones, a higher masking rate before a lower; ties in spec order), so that the longest run
    does not start last beside an idle core; --jobs 1 keeps the spec's order."""
    import study.parallel

    (project / "order.yaml").write_text(
        SPEC.replace("name: par", "name: order").replace(
            "factors:\n  objective.sentence: [nsp, none]",
            "runs:\n  - {label: low, set: {masking.rate: 0.1}}\n  - {label: deep, set: {model.layers: 2}}\n"
            "  - {label: high, set: {masking.rate: 0.5}}\n  - {label: base}",
        )
    )
    seen = {}

    def record(fn, items, jobs, stop_timeout=300.0):
        seen[jobs] = [run.label for run, _ in items]
        return iter(())

    monkeypatch.setattr(study.parallel, "run_all", record)
    for jobs in ("2", "1"):
        assert main(["pretrain", "order.yaml", "--quiet", "--jobs", jobs]) == 0
    assert seen == {2: ["deep", "high", "base", "low"], 1: ["low", "deep", "high", "base"]}


def test_jobs_threads_and_bad_values():
    cfg = RunConfig()
    assert with_threads(cfg, 1) is cfg  # one job: nothing changes
    two = with_threads(cfg, 2)
    assert two.impl.threads >= 1 and two.run_hash() == cfg.run_hash()  # speed only: same identity
    cfg.impl.threads = 3
    assert with_threads(cfg, 2).impl.threads == 3  # an explicit setting wins
    for bad in (0, -1):
        with pytest.raises(StudyError) as exc:
            check_jobs(bad)
        assert exc.value.field == "--jobs"


def test_jobs_auto_is_one_per_core_on_the_cpu_and_one_on_an_accelerator(monkeypatch):
    import torch

    import study.runtime

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    cfgs = [RunConfig() for _ in range(6)]
    assert (
        resolve_jobs("auto", cfgs) == 4
        and resolve_jobs("auto", cfgs[:3]) == 3
        and resolve_jobs("AUTO", cfgs[:1]) == 1
    )
    assert resolve_jobs("2", cfgs) == 2 and resolve_jobs(3, cfgs) == 3
    monkeypatch.setattr(study.runtime, "resolve_device", lambda name, dist=None: torch.device("cuda", 0))
    assert resolve_jobs("auto", cfgs) == 1  # runs side by side would share the one device
    for bad in ("two", "0", "1.5", ""):
        with pytest.raises(StudyError) as exc:
            resolve_jobs(bad, cfgs)
        assert exc.value.field == "--jobs" and "auto" in exc.value.allowed


def test_bad_jobs_exits_2_before_any_work(project: Path, capsys):
    for cmd in ("pretrain", "finetune", "run"):
        for bad in ("0", "many"):
            assert main(["--results", "r", cmd, "par.yaml", "--jobs", bad]) == 2
            assert "--jobs" in capsys.readouterr().err
    assert not (project / "r").exists() or not any(p.is_file() for p in (project / "r").rglob("*"))


# --------------------------------------------------------------------------- stopping (study/parallel.py)
def _trainer_like(folder: str, key: int, self_term: bool = False) -> int:
    """Stands in for a run: says it started, then 'trains' until SIGTERM, which (as the trainer does)
    finishes the step, writes a checkpoint and raises Interrupted."""
    import os
    import signal
    import time

    from study.errors import Interrupted

    stop = []
    old = signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        Path(folder, f"started-{key}").write_text(str(os.getpid()))
        if self_term:
            os.kill(os.getpid(), signal.SIGTERM)
        for step in range(6000):  # 60 s at most
            if stop:
                Path(folder, f"checkpoint-{key}").write_text(str(step))
                raise Interrupted(step)
            time.sleep(0.01)
        return key
    finally:
        signal.signal(signal.SIGTERM, old)


def _wait_for(pred, timeout: float = 60.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _items(tmp_path: Path, n: int = 4, self_term_first: bool = False):
    return [(k, (str(tmp_path), k, self_term_first and k == 0)) for k in range(n)]


@pytest.mark.slow
def test_sigterm_to_the_command_checkpoints_every_run_in_flight_and_starts_no_other(tmp_path: Path):
    import multiprocessing
    import os
    import signal
    import threading

    from study.errors import Interrupted
    from study.parallel import run_all

    def term_when_both_started():
        if _wait_for(lambda: len(list(tmp_path.glob("started-*"))) >= 2):
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=term_when_both_started, daemon=True).start()
    old = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted):
        list(run_all(_trainer_like, _items(tmp_path), jobs=2, stop_timeout=60))
    assert signal.getsignal(signal.SIGTERM) is old  # the command's own handler is restored
    started = sorted(p.name for p in tmp_path.glob("started-*"))
    assert started == ["started-0", "started-1"], started  # the queued runs never started
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-0", "checkpoint-1"]
    assert _wait_for(lambda: not multiprocessing.active_children(), 30)  # no orphan keeps training


@pytest.mark.slow
def test_one_interrupted_worker_stops_the_others(tmp_path: Path):
    import multiprocessing

    from study.errors import Interrupted
    from study.parallel import run_all

    with pytest.raises(Interrupted) as err:
        list(run_all(_trainer_like, _items(tmp_path, self_term_first=True), jobs=2, stop_timeout=60))
    assert isinstance(err.value.step, int)  # the worker's Interrupted crossed the process boundary whole
    assert (tmp_path / "checkpoint-0").exists()
    started = {p.name for p in tmp_path.glob("started-*")}
    assert {f"checkpoint-{p[len('started-') :]}" for p in started} == {
        p.name for p in tmp_path.glob("checkpoint-*")
    }
    assert len(started) <= 2  # at most the two first runs ever started
    # a worker could outlive this (CI): its run spent the one SIGTERM, then it waited on the call queue
    # for good; _stop now repeats SIGTERM (test_stop_ends_a_worker_that_spent_its_sigterm...)
    assert _wait_for(lambda: not multiprocessing.active_children(), 60), multiprocessing.active_children()


@pytest.mark.slow
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_checkpoint_and_exit_when_the_command_is_killed(tmp_path: Path):
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import sys; sys.path[:0] = [%r, %r]\n"
        "from test_parallel import _trainer_like, _items\n"
        "from pathlib import Path\n"
        "from study.parallel import run_all\n"
        "list(run_all(_trainer_like, _items(Path(%r)), jobs=2))\n"
        % (str(Path(__file__).parent), str(Path(__file__).parents[1]), str(tmp_path))
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert _wait_for(lambda: len(list(tmp_path.glob("started-*"))) >= 2)
        proc.send_signal(signal.SIGKILL)  # no handler can run: the workers must notice by themselves
        proc.wait(10)
        assert _wait_for(lambda: len(list(tmp_path.glob("checkpoint-*"))) == 2, 30)
        pids = [int(p.read_text()) for p in tmp_path.glob("started-*")]

        def gone(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # exited, not yet reaped

        assert _wait_for(lambda: all(gone(p) for p in pids), 30)
        assert len(list(tmp_path.glob("started-*"))) == 2
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_ctrl_c_to_the_process_group_checkpoints_every_run_in_flight(tmp_path: Path):
    """Ctrl-C reaches the whole foreground process group: the workers ignore it, the command stops them
    (SIGTERM: each run in flight checkpoints) and raises Interrupted as on SIGTERM (exit 143), no queued
    run starts, and nothing outlives the command.
    Run in a session of its own, so the SIGINT reaches no process of the test runner."""
    import subprocess
    import sys

    script = (
        "import os, signal, sys, threading, time; sys.path[:0] = [%r, %r]\n"
        # a shell's background job (CI under nohup ... &) inherits SIGINT ignored: restore Python's own
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from pathlib import Path\n"
        "from test_parallel import _trainer_like, _items, _wait_for\n"
        "from study.parallel import run_all\n"
        "folder = Path(%r)\n"
        "def ctrl_c():\n"
        "    if _wait_for(lambda: len(list(folder.glob('started-*'))) >= 2):\n"
        "        os.killpg(os.getpgrp(), signal.SIGINT)\n"
        "threading.Thread(target=ctrl_c, daemon=True).start()\n"
        "try:\n"
        "    list(run_all(_trainer_like, _items(folder), jobs=2, stop_timeout=60))\n"
        "except KeyboardInterrupt as exc:\n"
        "    import multiprocessing\n"
        "    from study.errors import Interrupted\n"
        "    sys.exit(1 if multiprocessing.active_children() else 143 if isinstance(exc, Interrupted) else 130)\n"
        "sys.exit(2)\n" % (str(Path(__file__).parent), str(Path(__file__).parents[1]), str(tmp_path))
    )
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        assert proc.wait(120) == 143  # Interrupted (every run checkpointed: the CLI's 143), no worker left
        assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-0", "started-1"]
        assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-0", "checkpoint-1"]
    finally:
        if proc.poll() is None:
            proc.kill()


def _spends_one_sigterm_then_hangs(folder: str) -> None:
    """A worker whose run took the stop request, then blocks for good (as on a queue lock a killed sibling
    held): only a second SIGTERM, now at its default action, ends it."""
    import signal
    import time

    got = []
    signal.signal(signal.SIGTERM, lambda *_: got.append(1))
    Path(folder, "ready").write_text("")
    while not got:
        time.sleep(0.01)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    Path(folder, "checkpoint").write_text("")
    while True:
        time.sleep(1)


def _ignores_sigterm(folder: str) -> None:
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(folder, "ready").write_text("")
    while True:
        time.sleep(1)


@pytest.mark.parametrize(
    "target, timeout, killed", [(_spends_one_sigterm_then_hangs, 60, False), (_ignores_sigterm, 3, True)]
)
def test_stop_ends_a_worker_that_spent_its_sigterm_and_kills_one_past_the_timeout(
    tmp_path, target, timeout, killed, capsys
):
    import multiprocessing
    import signal

    from study.parallel import _stop

    proc = multiprocessing.get_context("spawn").Process(target=target, args=(str(tmp_path),))
    proc.start()
    try:
        assert _wait_for(lambda: (tmp_path / "ready").exists(), 60)
        _stop([proc], timeout)
        assert not proc.is_alive()
        assert (proc.exitcode == -signal.SIGKILL) is killed, proc.exitcode
        assert ("did not stop within" in capsys.readouterr().err) is killed
        if (
            not killed
        ):  # ended by its second SIGTERM (the exit code), after its checkpoint, not by the timeout
            assert proc.exitcode == -signal.SIGTERM and (tmp_path / "checkpoint").exists()
    finally:
        if proc.is_alive():
            proc.kill()
