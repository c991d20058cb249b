"""Sharing the CPU (study/cpu.py): the passive OpenMP wait set before torch loads, --threads over
impl.threads, the load warning. That --threads leaves results and run hashes unchanged is
tests/test_train.py::test_threads_do_not_change_the_loss_curve; its speed is bench/contention.py's."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

from study import cpu
from study.cli import main
from study.cpu import FREE_ENV, THREADS_ENV, command_threads, load_warning, threads_from_args
from study.runtime import threads

REPO = Path(__file__).resolve().parents[1]


def _omp_policy(env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy:
        env["OMP_WAIT_POLICY"] = env_policy
    code = "import os, study, torch; print(os.environ['OMP_WAIT_POLICY'], torch.get_num_threads() >= 1)"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_passive_wait_policy_is_set_before_torch_and_a_users_own_wins():
    assert _omp_policy(None) == "PASSIVE True"
    assert _omp_policy("ACTIVE") == "ACTIVE True"


def test_threads_option_overrides_impl_threads_for_the_command_only(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    before = torch.get_num_threads()
    with threads_from_args(argparse.Namespace(threads=1)):
        assert os.environ[THREADS_ENV] == "1"
        with threads(2):  # impl.threads 2: --threads wins
            assert torch.get_num_threads() == 1
    assert THREADS_ENV not in os.environ and torch.get_num_threads() == before
    with threads_from_args(argparse.Namespace(threads=None)), threads(1):
        assert torch.get_num_threads() == 1  # no --threads: impl.threads as before


def test_bad_threads_is_exit_2_naming_the_option(tmp_path, capsys):
    spec = REPO / "ablations" / "smoke.yaml"
    assert main(["--results", str(tmp_path), "plan", str(spec), "--no-time", "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_load_warning_says_when_the_cores_are_busy():
    assert load_warning(2, 0.3) is None and load_warning(16, 3.0) is None
    line = load_warning(2, 1.2)
    assert line is not None and "load average 1.2 on 2 cores" in line and "--threads" in line
    assert "\n" not in line


def test_threads_auto_takes_the_free_cores_below_impl_threads_and_is_not_the_default(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.delenv(FREE_ENV, raising=False)
    monkeypatch.setattr(cpu, "free_cores", lambda: 1.2)  # one core busy on 2
    with command_threads(None):  # the default does not follow the load: the same bits every day
        assert FREE_ENV not in os.environ
    with command_threads("auto"):
        assert os.environ[FREE_ENV] == "1"
        with threads(None):  # no impl.threads: the free cores
            assert torch.get_num_threads() == 1
        with threads(2):  # impl.threads wins over the free-core default
            assert torch.get_num_threads() == 2
    assert FREE_ENV not in os.environ
    monkeypatch.setattr(cpu, "free_cores", lambda: 0.1)
    with command_threads("auto"):
        assert os.environ[FREE_ENV] == "1"  # at least one thread


def test_free_cores_reads_the_machine():
    free = cpu.free_cores(0.05)
    assert free is None or 0.0 <= free <= (os.cpu_count() or 1) + 1e-9


def test_load_warning_prints_once_when_the_command_computes(monkeypatch, capsys):
    monkeypatch.setattr(cpu, "load_warning", lambda: "study: load average 9.0 on 2 cores: busy")
    monkeypatch.setattr(cpu, "_WARNED", [])
    with command_threads(1):
        assert capsys.readouterr().err == ""  # nothing yet: an error here would stay one line
        with threads(None), threads(None):
            pass
    assert capsys.readouterr().err.count("load average 9.0") == 1
    with threads(None):  # outside a command: no warning
        pass
    assert capsys.readouterr().err == ""
