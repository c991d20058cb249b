"""Does the default thread setting survive a shared machine? Tokens/s of the trainer under three settings,
idle and beside one competing CPU-bound process, in ONE run (issue 46).

Settings, each trained in a fresh process (OpenMP reads its wait policy once, when torch loads it):
  default   what a `study` command does now: OMP_WAIT_POLICY=PASSIVE (study/__init__.py) and torch's
            threads (all cores), as before
  one       impl.threads 1
  today     the default before it: OpenMP's own wait policy (threads spin before they sleep; torch is
            imported before study, so the setting study makes comes too late) and torch's threads (all cores)
Each process trains --steps steps of an L2/H128 BERT (segment_pair + NSP, batch 32 x 128, a synthetic
corpus prepared once) with `study.pretrain.trainer.train_run`, and reports its tokens/s over the training
loop (metrics tokens_per_s). The competitor is `yes > /dev/null`, one core's worth of work, started before
the busy phase and killed at the end (also on an error). The settings alternate within each of --rounds
rounds; the median per setting is kept.

    python -m bench.contention [--steps 20] [--rounds 2]
    python -m bench.contention --dry   # a tiny model, 3 steps, one round: checks the code path

Last line, exactly: `contention busy_ratio=<default/one, busy> idle_ratio=<default/today, idle>`.
The load average is printed before each phase: on a machine others share, "idle" only means no competitor
of ours.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import REPO, synthetic_corpus, train_ours

# the user's own setting, read before anything imports study (which sets PASSIVE when there is none)
USER_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")
SETTINGS = ("default", "one", "today")
MODEL = {"layers": 2, "hidden": 128, "heads": 2, "intermediate": 512}
DRY_MODEL = {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64}


def run_config(corpus: str, steps: int, dry: bool, threads: int | None):
    from study.config import RunConfig
    from study.data.corpus import with_fingerprint

    seq = 32 if dry else 128
    return with_fingerprint(
        RunConfig.model_validate(
            {
                "corpus": {"sources": [corpus]},
                "tokenizer": {"vocab_size": 512 if dry else 4096},
                "objective": {"format": "segment_pair", "sentence": "nsp", "max_seq_len": seq},
                "model": {**(DRY_MODEL if dry else MODEL), "max_positions": seq},
                "finetune": {"max_length": seq},  # never fine-tuned here; valid against max_positions
                "train": {
                    "budget": "steps",
                    "amount": steps,
                    "batch_size": 4 if dry else 32,
                    "eval_sequences": 8,
                },
                "impl": {"threads": threads, "progress": False, "checkpoint_every": 10**6},
            }
        )
    )


def child(args) -> None:
    """One setting in this fresh process: train, print {"tokens_per_s": ...}."""
    if args.child == "today":
        import torch  # noqa: F401 - loads libgomp before study can set its wait policy: OpenMP's own default

    from study.cpu import command_threads
    from study.paths import Layout

    # default and today share a run hash (impl is outside it): train_ours trains from scratch every time
    cfg = run_config(args.corpus, args.steps, args.dry, 1 if args.child == "one" else None)
    with command_threads(None) if args.child == "default" else contextlib.nullcontext():
        m = train_ours(cfg, Layout(root=Path(args.work) / "results"))
    print(json.dumps({"tokens_per_s": m["tokens_per_s"]}))


def measure(setting: str, args, work: Path, corpus: str) -> float:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)  # the child's own import order decides (module doc)
    if USER_WAIT_POLICY is not None and setting == "today":
        env["OMP_WAIT_POLICY"] = USER_WAIT_POLICY
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "bench.contention", "--child", setting, "--work", str(work)]
    cmd += ["--corpus", corpus, "--steps", str(args.steps)] + (["--dry"] if args.dry else [])
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{setting} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["tokens_per_s"]


def phase(name: str, args, work: Path, corpus: str) -> dict[str, float]:
    print(f"{name}: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    got: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        for s in SETTINGS if r % 2 == 0 else reversed(SETTINGS):  # alternate the order: drift cancels
            got[s].append(measure(s, args, work, corpus))
            print(f"  {name:4} round {r + 1} {s:8} {got[s][-1]:>9,.0f} tokens/s", flush=True)
    return {s: statistics.median(v) for s, v in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="training steps per measurement")
    ap.add_argument("--rounds", type=int, default=2, help="measurements per setting and phase (median kept)")
    ap.add_argument("--dry", action="store_true", help="a tiny model, 3 steps, one round")
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    if args.dry:
        args.steps, args.rounds = min(args.steps, 3), 1
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as tmp:
        from study.data.prepare import prepare_data
        from study.paths import Layout

        work = Path(tmp)
        corpus = synthetic_corpus(work / "corpus", 200 if args.dry else 1500)
        prepare_data(
            run_config(corpus, args.steps, args.dry, None), Layout(root=work / "results"), progress=False
        )
        idle = phase("idle", args, work, corpus)
        rival = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)  # one core's worth of competing work
        try:
            busy = phase("busy", args, work, corpus)
        finally:
            rival.kill()
            rival.wait()
    for name, res in (("idle", idle), ("busy", busy)):
        print(f"{name}: " + ", ".join(f"{s} {v:,.0f}" for s, v in res.items()) + " tokens/s (median)")
    print(
        f"contention busy_ratio={busy['default'] / busy['one']:.3f} idle_ratio={idle['default'] / idle['today']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
