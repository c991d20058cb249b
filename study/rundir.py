"""One pre-training run's folder, `results/runs/<run_hash>/`, and the files in it.

This is the only code that knows the files' names and how to read them, so every reader (the trainer
deciding whether to skip, `study plan`, search, aggregation, rescoring, the DVC metrics copies) sees a
run the same way. One error policy for all of them:

- status.json absent -> "pending" (a folder without it is not complete, whatever else it holds);
  status.json unreadable (not JSON, no "status") -> "pending" too: it is written atomically, so this
  only happens to a file damaged from outside, and "pending" makes the run train again (from its
  checkpoints, or from scratch), which is always safe because training is deterministic;
- metrics.json / meta.json / config.json absent -> {}; unreadable (damaged from outside: a cut copy) -> {}
  too, with a warning on stderr, so one bad file cannot stop a study's aggregate; a "done" run without
  metrics trains again (study/pretrain/trainer.py), as an unreadable status does;
- history.jsonl / events.jsonl: a line cut by a kill (not JSON) is skipped, never fatal.

    config.json    the resolved RunConfig (+ run_hash)
    status.json    {"status": pending|done|diverged|failed, "error", "step", ...}
    metrics.json   final metrics (reference MLM loss/accuracy, cost, MFU, ...)
    meta.json      provenance, wall time, device, resolved impl settings
    history.jsonl  one line per log/eval step (what an uninterrupted run also logs)
    events.jsonl   session starts, resumes, rejected checkpoints, divergence (never truncated)
    model/         save_pretrained + tokenizer (loads with AutoModelForMaskedLM)
    checkpoints/   resumable state while training
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from study.io import atomic_write_json, atomic_write_text, read_json
from study.paths import Layout

STATUSES = ("pending", "done", "diverged", "failed")


@dataclass(frozen=True)
class Status:
    status: str = "pending"
    error: str | None = None
    step: int | None = None
    loss: str | None = None  # a diverged run's non-finite loss, as text ("nan", "inf")

    @property
    def done(self) -> bool:
        return self.status == "done"


class RunDir:
    """The files of one run. Paths are attributes; readers apply the policy in the module docstring."""

    def __init__(self, layout: Layout, run_hash: str):
        self.layout, self.run_hash = layout, run_hash
        self.path = layout.run_dir(run_hash)
        self.config_path = self.path / "config.json"
        self.status_path = self.path / "status.json"
        self.metrics_path = self.path / "metrics.json"
        self.meta_path = self.path / "meta.json"
        self.history_path = self.path / "history.jsonl"
        self.events_path = self.path / "events.jsonl"
        self.model_dir = self.path / "model"
        self.ckpt_dir = self.path / "checkpoints"

    # ---- readers
    def status(self) -> Status:
        try:
            s = read_json(self.status_path)
            return Status(str(s["status"]), s.get("error"), s.get("step"), s.get("loss"))
        except (OSError, ValueError, KeyError, TypeError):
            return Status()

    def config(self) -> dict:
        return _read_dict(self.config_path)

    def metrics(self) -> dict:
        return _read_dict(self.metrics_path)

    def meta(self) -> dict:
        return _read_dict(self.meta_path)

    def history(self) -> list[dict]:
        return _read_lines(self.history_path)

    def events(self) -> list[dict]:
        return _read_lines(self.events_path)

    def loss_curve(self) -> list[dict]:
        """The training-loss lines of history.jsonl (not the eval lines)."""
        return [ev for ev in self.history() if "loss" in ev and "eval" not in ev]

    def has_model(self) -> bool:
        return (self.model_dir / "config.json").is_file()

    # ---- writers
    def write_status(self, status: str, error: str | None = None, step: int | None = None, **extra) -> None:
        assert status in STATUSES, status
        atomic_write_json(self.status_path, {"status": status, "error": error, "step": step, **extra})

    def write_metrics(self, metrics: dict) -> None:
        atomic_write_json(self.metrics_path, metrics)

    def write_meta(self, meta: dict) -> None:
        atomic_write_json(self.meta_path, meta)

    def write_config(self, config: dict) -> None:
        atomic_write_json(self.config_path, {**config, "run_hash": self.run_hash})

    def append_history(self, line: dict) -> None:
        """One line of history.jsonl (the trainer truncates it to a checkpoint's size on resume)."""
        _append_line(self.history_path, line)

    def append_event(self, line: dict) -> None:
        """One line of events.jsonl (never truncated)."""
        _append_line(self.events_path, line)

    def publish(self) -> None:
        """Copies of the run's metrics and loss curve outside its folder, for `dvc metrics/plots show`.

        DVC forbids a metrics or plots file inside another output, so the run folder can't declare its own.
        """
        atomic_write_json(
            self.layout.metrics_file(self.run_hash), {"status": self.status().status, **self.metrics()}
        )
        lines = ["step,tokens,loss,lr"]
        for ev in self.loss_curve():
            lines.append(f"{ev['step']},{ev.get('tokens', '')},{ev['loss']},{ev.get('lr', '')}")
        atomic_write_text(self.layout.plot_file(self.run_hash), "\n".join(lines) + "\n")


def _read_dict(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        found = read_json(path)
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        print(f"warning: {path} is unreadable ({type(exc).__name__}); read as empty", file=sys.stderr)
        return {}
    return found if isinstance(found, dict) else {}


def _append_line(path: Path, line: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def _read_lines(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill
    return out
