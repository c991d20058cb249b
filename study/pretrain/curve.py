"""Learning curves of one run: reference MLM accuracy and loss against tokens and training seconds.

`study curve SPEC --run LABEL_OR_HASH --every K` answers "how long must this recipe train before it
learns more than word frequencies?". It trains the run with `impl.eval_every = K`: a speed-only setting
outside the run hash, so the run is the study's own run and lands in the study's own folder
(results/runs/<run_hash>/); a later `study run` reuses it, and a curve of a finished run costs nothing.

Everything is read back from the run folder's history.jsonl (through RunDir), never from the process
that trained it, so a curve of a run trained yesterday and one trained now are computed the same way:

- one row per eval line: step, tokens, ref_mlm_acc, ref_mode_acc (the most-frequent-token floor),
  ref_mlm_loss, ref_ppl, sentence_acc, and ref_mask_acc / ref_mask_mode_acc (the same on the positions
  that show [MASK]), ref_spread (0 when the encoder sends one vector to every asked position), and for a run
  with a sequence-length warmup short_mask_acc / short_mask_mode_acc / short_spread, the same on rows of its
  short length (while the rows are short, the full-length reference asks about untrained positions); empty
  for evals made before they existed or runs without the warmup;
- `train_s`, seconds inside training steps up to that eval (evals and checkpoints excluded, like the
  run's metrics `time_s`): the log lines record each window's tokens/s, so the seconds of a window are
  its tokens over that rate; an eval between two log lines is interpolated in tokens. The final row
  takes the run's own `time_s` when the run is done.

A run that finished without intermediate evals has one eval line: there is no curve in it, and this
module says so (StudyError) instead of drawing one point or retraining behind the caller's back.
"""

from __future__ import annotations

import bisect
import csv
import io
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from study.config import RunConfig
from study.errors import Diverged, StudyError
from study.io import atomic_write_text
from study.paths import Layout
from study.pretrain.trainer import train_run
from study.rundir import RunDir

COLUMNS = (
    "step",
    "tokens",
    "train_s",
    "ref_mlm_acc",
    "ref_mode_acc",
    "ref_mlm_loss",
    "ref_ppl",
    "sentence_acc",
    "ref_mask_acc",
    "ref_mask_mode_acc",  # [MASK] positions only (evaluate.py)
    "ref_spread",  # how much the encoder's output varies between asked positions (0: collapsed)
    "short_mask_acc",
    "short_mask_mode_acc",
    "short_spread",
)  # on the warmup's short rows (evaluate.py)


@dataclass
class Curve:
    run_hash: str
    rows: list[dict]
    trained: bool  # False: read from a run that was already finished
    status: str  # the run's status after this call: done or diverged
    every: int | None  # the eval interval found in the history (None with fewer than 2 evals)


def curves_dir(layout: Layout) -> Path:
    """results/curves/ (Layout.curves_dir)."""
    return layout.curves_dir()


def with_evals(cfg: RunConfig, every: int) -> RunConfig:
    """The same run (same hash) with an eval every `every` steps."""
    if every < 1:
        raise StudyError(
            f"eval interval must be a positive number of steps, got {every}",
            field="--every",
            allowed="an integer >= 1",
        )
    out = cfg.model_copy(deep=True)
    out.impl.eval_every = every
    assert out.run_hash() == cfg.run_hash(), "impl.eval_every must stay outside the run hash"
    return out


def train_seconds(history: list[dict]) -> tuple[list[int], list[float]]:
    """(tokens, cumulative training seconds) at each log line, starting at (0, 0).

    A window whose rate is missing (a zero-length window) adds no seconds; that only loses precision,
    it never invents time."""
    toks, secs = [0], [0.0]
    for ev in history:
        if "loss" not in ev or "eval" in ev or ev.get("tokens") is None:
            continue
        d_tok = ev["tokens"] - toks[-1]
        rate = ev.get("tokens_per_s")
        secs.append(secs[-1] + (d_tok / rate if rate else 0.0))
        toks.append(ev["tokens"])
    return toks, secs


def seconds_at(tokens: int, toks: list[int], secs: list[float]) -> float | None:
    """Training seconds at `tokens`, linear between log lines; None past the last log line."""
    i = bisect.bisect_left(toks, tokens)
    if i < len(toks) and toks[i] == tokens:
        return secs[i]
    if i == 0 or i == len(toks):
        return None
    frac = (tokens - toks[i - 1]) / (toks[i] - toks[i - 1])
    return secs[i - 1] + frac * (secs[i] - secs[i - 1])


def curve_rows(run: RunDir) -> list[dict]:
    """One row per eval line of the run's history (see module doc)."""
    history = run.history()
    toks, secs = train_seconds(history)
    metrics = run.metrics() if run.status().done else {}
    rows = []
    for ev in history:
        if "eval" not in ev:
            continue
        res = ev["eval"]
        t = seconds_at(ev["tokens"], toks, secs)
        if ev["step"] == metrics.get("steps"):
            t = metrics.get("time_s", t)  # the run's own total: exact where the last window was not logged
        rows.append(
            {"step": ev["step"], "tokens": ev["tokens"], "train_s": t, **{k: res.get(k) for k in COLUMNS[3:]}}
        )
    return rows


def eval_interval(rows: list[dict]) -> int | None:
    """The step interval of the intermediate evals (the last eval falls at the end, whatever K was)."""
    steps = [r["step"] for r in rows]
    gaps = sorted({b - a for a, b in pairwise(steps)})
    return gaps[0] if gaps else None


def learning_curve(cfg: RunConfig, layout: Layout, every: int, quiet: bool = False) -> Curve:
    """The curve of `cfg`'s run: read from its folder when finished, else trained (or resumed) with evals
    every `every` steps. A run that diverges keeps the curve up to its last eval (status 'diverged')."""
    out = with_evals(cfg, every)  # checks `every` even when the run is finished and it goes unused
    run = RunDir(layout, cfg.run_hash())
    trained, status = False, run.status().status
    if status != "done":
        trained = True
        try:
            train_run(out, layout, quiet=quiet)
            status = "done"
        except Diverged:
            status = "diverged"
    rows = curve_rows(run)
    if status == "done" and len(rows) < 2:
        raise StudyError(
            f"run {run.run_hash} finished without intermediate evals (trained with impl.eval_every=0): its "
            f"history holds only the final eval, so there is no curve to read. Train it again with evals in "
            f"another results folder (`study --results OTHER_DIR curve ...`) or remove {run.path}",
            field="--run",
            allowed="a run not yet trained, or one trained with impl.eval_every > 0",
        )
    return Curve(run.run_hash, rows, trained, status, eval_interval(rows))


def first_reaching(rows: list[dict], ratio: float) -> dict | None:
    """The first eval whose reference accuracy is at least `ratio` x the most-frequent-token floor."""
    for r in rows:
        acc, floor = r.get("ref_mlm_acc"), r.get("ref_mode_acc")
        if acc is not None and floor and acc >= ratio * floor:
            return r
    return None


def write_csv(rows: list[dict], path: Path) -> None:
    buf = io.StringIO()  # written whole and atomically: a kill never leaves half a curve
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in COLUMNS})
    atomic_write_text(path, buf.getvalue())


def read_csv(path: Path) -> list[dict]:
    """A curve CSV back as rows of floats (step and tokens as ints, empty cells as None)."""
    with open(path, newline="", encoding="utf-8") as f:
        out = []
        for r in csv.DictReader(f):
            row = {k: (None if v == "" else float(v)) for k, v in r.items()}
            row["step"], row["tokens"] = int(row["step"]), int(row["tokens"])
            out.append(row)
        return out


def select_run(study, which: str | None):
    """A planned run of `study` by hash or label (None: the first run). A label shared by several seeds
    means its first seed; the printed summary names the seed."""
    return study.select([which] if which is not None else None)[0]  # "" is a bad --run, not "the first"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def summary(curve: Curve, label: str, seed: int, ratio: float = 2.0) -> str:
    """The table `study curve` prints: one line per eval, then when the run first reached ratio x floor."""
    how = "trained now" if curve.trained else "read from the finished run"
    every = f"every {curve.every} steps" if curve.every else "one eval"
    lines = [
        f"run {curve.run_hash} ({label}, seed {seed}): {curve.status}, {how}; {len(curve.rows)} evals, {every}",
        f"{'step':>7} {'tokens':>11} {'train_s':>8} {'acc%':>6} {'floor%':>6} {'acc/floor':>9} {'loss':>7} "
        f"{'[MASK]acc%':>10} {'floor%':>6}",
    ]
    for r in curve.rows:
        secs = f"{r['train_s']:.1f}" if r["train_s"] is not None else "-"
        ratio_r = r["ref_mlm_acc"] / r["ref_mode_acc"] if r.get("ref_mode_acc") else float("nan")
        lines.append(
            f"{r['step']:>7} {r['tokens']:>11,} {secs:>8} {100 * r['ref_mlm_acc']:>6.2f} "
            f"{100 * (r['ref_mode_acc'] or float('nan')):>6.2f} {ratio_r:>9.2f} {r['ref_mlm_loss']:>7.3f} "
            f"{_pct(r.get('ref_mask_acc')):>10} {_pct(r.get('ref_mask_mode_acc')):>6}"
        )
    hit = first_reaching(curve.rows, ratio)
    if hit is None:
        last = curve.rows[-1] if curve.rows else None
        lines.append(
            f"never reached {ratio:g}x the most-frequent-token floor"
            + (f" within {last['tokens']:,} tokens" if last else "")
        )
    else:
        secs = f"{hit['train_s']:.1f} s" if hit["train_s"] is not None else "unknown seconds"
        lines.append(
            f"first eval at >= {ratio:g}x the floor: step {hit['step']}, {hit['tokens']:,} tokens, {secs}"
        )
    return "\n".join(lines)
