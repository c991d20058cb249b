"""Every benchmark runs: each bench module in its --dry mode (tiny shapes, a synthetic corpus, seconds of
training) in a subprocess, as a user runs it (`python -m bench.X --dry` from the repository root), and
its machine-readable last line is checked. Numbers are not: they are the benches' business, not a test's.
A bench that no longer runs (a renamed function, a spec that stopped validating, as bench/search.py's
did) fails here. bench/gpu_check.sh runs dry too (DRY=1: its tests and speed parts on the CPU)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUTENBERG = REPO.parent / "shared" / "data" / "gutenberg"
NUM = r"[0-9.e+-]+|nan"
needs_accelerate = pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None, reason="transformers.Trainer needs accelerate"
)


def _env() -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_bench(name: str, *args: str, timeout: int = 600) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--dry", *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"bench.{name} --dry exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout.strip().splitlines()[-1]


def test_data():
    last = run_bench("data")
    assert re.fullmatch(rf"data tokenize_tokens_per_s=({NUM}) instances_tokens_per_s=({NUM})", last), last


@pytest.mark.skipif(not GUTENBERG.is_dir(), reason="needs ../shared/data/gutenberg")
def test_instances():
    last = run_bench("instances")
    assert re.fullmatch(rf"instances doc_sentences=({NUM}) full_sentences=({NUM}) segment_pair=({NUM})", last)


def test_mlm_loss():
    assert re.fullmatch(rf"mlm_loss ratio_0\.15=({NUM})", run_bench("mlm_loss"))


@pytest.mark.slow
def test_impl_speed():
    last = run_bench("impl_speed")
    assert re.fullmatch(
        rf"impl_speed workers1=({NUM}) sdpa=({NUM}) workers1_sdpa=({NUM}) plan_step_ratio=({NUM})", last
    ), last


@pytest.mark.slow
@needs_accelerate
def test_throughput(tmp_path):
    last = run_bench("throughput", "--out", str(tmp_path))
    assert re.fullmatch(rf"throughput same_precision ratio_a=({NUM}) ratio_b=({NUM}) mfu_b=({NUM})", last), (
        last
    )


@pytest.mark.slow
@needs_accelerate
def test_gpu_dry_on_the_cpu(tmp_path):
    last = run_bench("gpu", "--out", str(tmp_path))
    assert re.fullmatch(
        rf"gpu ratio_base=({NUM}) ratio_gpu=({NUM}) mfu_base=({NUM}) mfu_gpu=({NUM})", last
    ), last
    assert (tmp_path / "gpu.json").is_file()


@pytest.mark.slow
def test_search():
    """bench/search.py stopped at validation once (finetune.max_length 128 > the model's 64 positions)."""
    last = run_bench("search")
    assert re.fullmatch(rf"search tokens_ratio=({NUM}) best_bucket_match=(yes|no)", last), last


@pytest.mark.slow
def test_dvc_scale():
    last = run_bench("dvc_scale")
    assert re.fullmatch(
        rf"dvc_noop specs=2 selected=2 runs=4 repro_s=({NUM}) status_s=({NUM}) repro_cpu_s=({NUM}) "
        rf"status_cpu_s=({NUM})",
        last,
    ), last


@pytest.mark.slow
def test_contention():
    last = run_bench("contention")
    assert re.fullmatch(rf"contention busy_ratio=({NUM}) idle_ratio=({NUM})", last), last


@pytest.mark.slow
@needs_accelerate
def test_gpu_check_script_dry(tmp_path):
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh", "tests", "speed"],
        cwd=REPO,
        env={**_env(), "DRY": "1", "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = (tmp_path / "log.txt").read_text()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"^gpu ratio_base=", log, re.M) and "DRY: the compiled run left out" in log, log[-3000:]
    assert "total:" in log  # `study plan --no-time` ran
    bad = subprocess.run(
        ["bash", "bench/gpu_check.sh", "learn"],
        cwd=REPO,
        env={**_env(), "DRY": "1", "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "DRY=1 runs tests and speed only" in bad.stderr


@pytest.mark.slow
def test_blimp(tmp_path):
    last = run_bench("blimp", "--results", str(tmp_path))
    assert re.fullmatch(
        rf"blimp pairs=(\d+) seconds=({NUM}) cpu_s=({NUM}) pairs_per_s=({NUM}) pretrain_s=({NUM}) fraction=({NUM})",
        last,
    ), last


def test_stats_coverage():
    """Its output is Markdown tables (docs/STATISTICS.md); the last row is the power row."""
    assert run_bench("stats_coverage").startswith("| power at b - a = 1.5 SD, equal SDs | 3 |")


def test_every_bench_module_has_a_dry_test():
    """A new bench module gets a --dry test here (or this fails)."""
    modules = {p.stem for p in (REPO / "bench").glob("*.py")} - {"__init__", "common"}
    tested = {n.removeprefix("test_") for n in globals() if n.startswith("test_")}
    tested |= {"gpu"} if "gpu_dry_on_the_cpu" in tested else set()
    assert modules <= tested, modules - tested
