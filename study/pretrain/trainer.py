"""The pre-training loop: one run -> one folder `results/runs/<run_hash>/`, trained once, resumable.

    train_run(cfg, layout, quiet=False, on_eval=None) -> metrics dict

What it guarantees (each one tested in tests/test_train.py):
- Skip if done: a folder whose status (RunDir.status()) is "done" returns its metrics without training;
  one whose status is "diverged" raises Diverged again.
- Bitwise resume on CPU: a run killed (SIGKILL) at any point and started again ends with the same
  weights and metrics as an uninterrupted one. Everything random is a pure function of cfg.seed:
  model init (build_model's forked generator), data order and masks (study/data/batches.py), dropout
  (torch's default generator, seeded from cfg.seed and saved/restored in every checkpoint). No
  numpy/python global RNG is used. A `seconds` budget cannot resume bitwise: its LR schedule follows
  wall-clock time.
- Checkpoints (study/pretrain/checkpoint.py): impl.checkpoint_every steps and/or impl.checkpoint_minutes,
  the end, and SIGTERM (the step finishes and is saved, then `Interrupted`: no status, exit 143). A damaged
  file is reported (warning + events.jsonl) and the previous one is used.
- One host sync per log window (impl.log_every) or eval/checkpoint: steps leave losses and grad norms on
  the device (study/pretrain/step.py), `_sync` reads them in one transfer and finds a non-finite one before
  anything of it is written: status "diverged" with the first bad step and its loss, then `Diverged`.
  Test hook: env STUDY_INJECT_NAN_AT_STEP=k makes the loss of step k (1-based) NaN.
- DDP: under torchrun (WORLD_SIZE > 1) the global batch is split across ranks (gloo on CPU, nccl on
  CUDA; study/runtime.py sets the group up); masks are keyed by global instance index, and losses are
  weighted by the GLOBAL number of masked tokens (study/pretrain/step.py), so grad accumulation and DDP
  give the gradient of the one big batch. Only rank 0 writes.
- Sequence-length warmup (train.short_len / short_fraction, semantic): while the budget's progress is
  below short_fraction the batches come from a second Batches over the short rows of
  RunConfig.short_phase (as many token slots per step as a full batch), with their own epochs and data
  order (a pure function of the config like the others); then data restarts at epoch 0 of the
  max_seq_len rows. The phase is in the checkpoint's state, so a resume on either side of the switch is
  bitwise. The reference eval is always at max_seq_len.
- `impl` settings are speed-only (proven loss-neutral by tests), which is why they are not hashed.
  impl.pad_to="max" pads batches to max_seq_len (static shapes, which impl.compile needs). One of them,
  impl.dropout_masks, changes which random stream picks the dropout masks (not their distribution or
  arithmetic), so its test is statistical: the curve moves no further than another dropout stream moves it.
- Files (through study/rundir.py's RunDir) besides the contract's: events.jsonl (one line per session
  start, resume, rejected checkpoint, divergence; never truncated) so history.jsonl of a resumed run
  equals an uninterrupted run's.
- Driver: study/pretrain/__main__.py (`python -m study.pretrain CONFIG.json --results DIR`, also under
  torchrun).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from study import faults
from study.config import RunConfig
from study.data.batches import Batches
from study.data.instances import build_instances
from study.data.prepare import prepare_data
from study.errors import Diverged, Interrupted, StudyError
from study.lease import lease, train_lease_path
from study.paths import Layout
from study.pretrain.checkpoint import (
    CKPT_FORMAT,
    CheckpointClock,
    TrainState,
    load_latest_checkpoint,
    rng_states,
    set_rng_state,
    write_checkpoint,
)
from study.pretrain.checks import check_config, check_data
from study.pretrain.evaluate import (
    evaluate,
    reference_set,
    sentence_set,
    short_reference_set,
)
from study.pretrain.live import open_live
from study.pretrain.loop import Loop, progress_of
from study.pretrain.results import run_metrics, write_results
from study.pretrain.schedule import Schedule
from study.pretrain.step import (
    LossModule,
    StepResult,
    build_training_model,
    make_optimizer,
)
from study.rundir import RunDir
from study.runtime import Runtime, barrier, broadcast, compute_init, dist_env

DROPOUT_TAG = 0xD20  # the dropout stream, one per DDP rank

OnEval = Callable[[int, int, dict], None]


# --------------------------------------------------------------------------- state
def _seed_dropout(seed: int, rank: int) -> None:
    s = np.random.SeedSequence([seed, DROPOUT_TAG, rank]).generate_state(1, dtype=np.uint64)[0]
    torch.manual_seed(int(s) & ((1 << 63) - 1))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- the run
def finished_metrics(rd: RunDir) -> dict | None:
    """Metrics of a finished run, or raise Diverged for a diverged one; None when it is to be trained.

    "failed" (recorded by the CLI) and "pending" train again, from the last checkpoint. So does a "done"
    folder without metrics (damaged from outside): training is deterministic, so that is always safe."""
    st = rd.status()
    if st.status == "diverged":
        raise Diverged(int(st.step or 0), float(st.loss) if st.loss is not None else float("nan"))
    return (rd.metrics() or None) if st.done else None


def train_run(cfg: RunConfig, layout: Layout, quiet: bool = False, on_eval: OnEval | None = None) -> dict:
    """Train one run into layout.run_dir(cfg.run_hash()) and return its metrics (see module doc)."""
    dist = dist_env()
    check_config(cfg, dist.world)
    run_hash = cfg.run_hash()
    rd = RunDir(layout, run_hash)
    found = finished_metrics(rd)
    if found is not None:
        return found
    with compute_init(cfg.impl, dist) as rt:
        # one trainer per run across processes (a second `study run` waits here, then finds the run done)
        lock = (
            lease(train_lease_path(layout, run_hash))  # holds across hosts (study/lease.py), flock may not
            if dist.main
            else contextlib.nullcontext(True)
        )
        with lock, torch.random.fork_rng(devices=[rt.device] if rt.device.type == "cuda" else []):
            if dist.main:  # another process may have finished it while we waited for the lock
                found = finished_metrics(rd)
            found = broadcast(found, dist)
            if found is not None:
                return found
            if dist.main:  # the concurrency test counts these: one per run, whatever races to train it
                faults.point("train.start", run_hash)
            return Trainer(cfg, layout, rt, quiet, on_eval).run()


class Trainer(Loop):
    """One session of one run: set up (or resume), loop, finish. Only rank 0 writes files."""

    def __init__(
        self, cfg: RunConfig, layout: Layout, rt: Runtime, quiet: bool = False, on_eval: OnEval | None = None
    ):
        self.cfg, self.layout, self.rt = cfg, layout, rt
        self.device, self.dist = rt.device, rt.dist
        self.quiet, self.on_eval = quiet, on_eval
        self.live = None  # set once the run is resumed (run); _log writes to it
        self.rd = RunDir(layout, cfg.run_hash())
        self.session_start = time.perf_counter()
        self.last_ckpt_step: int | None = None
        self.last_beat = self.session_start  # the heartbeat's clock (_heartbeat)
        self.clock = CheckpointClock(cfg.impl.checkpoint_every, cfg.impl.checkpoint_minutes)
        self.pending: list[tuple[int, StepResult]] = []  # (step, result) not read back from the device yet
        self.grad_norm = float("nan")  # of the last step read back

    # ---- small helpers
    def _report(self, msg: str) -> None:
        """A problem that changes what happens (e.g. a rejected checkpoint): loud, and in events.jsonl."""
        if self.dist.main:
            warnings.warn(f"run {self.cfg.run_hash()}: {msg}", RuntimeWarning, stacklevel=2)
            print(f"warning: run {self.cfg.run_hash()}: {msg}", file=sys.stderr)
        self._event({"event": "warning", "message": msg})

    def _event(self, obj: dict) -> None:
        """Session events (resume, rejected checkpoint, divergence) go to events.jsonl, never truncated;
        history.jsonl holds only what an uninterrupted run would also log, so the two compare equal."""
        if self.dist.main:
            self.rd.append_event(
                {"time": _now(), "step": self.state.step if hasattr(self, "state") else 0, **obj}
            )

    def _log(self, obj: dict) -> None:
        if self.dist.main:
            self.rd.append_history(obj)
            if self.live is not None:
                self.live.log(obj)

    # ---- setup
    def _prepare(self):
        if self.dist.main:
            prepared = prepare_data(self.cfg, self.layout, progress=not self.quiet)
        barrier(self.dist)
        if not self.dist.main:
            prepared = prepare_data(self.cfg, self.layout, progress=False)
        return prepared

    def run(self) -> dict:
        cfg, dist, device, rd = self.cfg, self.dist, self.device, self.rd
        prepared = self._prepare()
        inst0 = build_instances(prepared.split("train"), cfg.objective, prepared.special, cfg.seed, epoch=0)
        vocab = check_data(cfg, prepared, inst0)
        # On CUDA the epoch's rows live on the GPU and are masked there (bitwise the CPU's masks, tests/test_cuda.py)
        self.batches = Batches(
            cfg, prepared, dist.rank, dist.world, inst0, device=device if device.type == "cuda" else None
        )
        self.batches.make(0, 0)  # masking errors (e.g. unsupported masking.unit) surface before the model
        self.short_batches = None
        if (short := cfg.short_phase()) is not None:  # sequence-length warmup: its own rows, epochs, order
            self.short_batches = Batches(
                short, prepared, dist.rank, dist.world, device=device if device.type == "cuda" else None
            )
            self.short_batches.make(0, 0)
        self.ref, self.sent = reference_set(cfg, prepared), sentence_set(cfg, prepared)
        self.short_ref = short_reference_set(cfg, prepared)
        self.prepared, self.vocab = prepared, vocab
        if dist.main:
            rd.path.mkdir(parents=True, exist_ok=True)
            rd.write_config(cfg.model_dump(mode="json"))
            for d in (rd.path, rd.ckpt_dir):  # leftovers of writes killed mid-way (temp files/dirs)
                for tmp in d.glob(".*.tmp") if d.exists() else []:
                    shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)

        self.model, self.dropout_masks = build_training_model(cfg, vocab, device)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.opt, self.fused = make_optimizer(cfg, self.model, device)
        self.schedule = Schedule(cfg.train.schedule, cfg.train.warmup)
        _seed_dropout(cfg.seed, dist.rank)
        self.state = TrainState(started=_now(), phase=0 if self.short_batches is not None else 1)
        self._resume()
        # live curves (impl.live) restart from the history the resume kept: no step twice (pretrain/live.py)
        self.live = open_live(cfg.impl.live and dist.main, rd.path, rd.history() if dist.main else [])
        self.state.sessions += 1
        # one "start" line per session: where it began (search.py counts the tokens a session trained)
        self._event(
            {
                "event": "start",
                "session": self.state.sessions,
                "tokens": self.state.tokens,
                "resumed": self.state.step > 0,
                "world_size": dist.world,
                "device": str(device),
            }
        )
        self.step_module = LossModule(
            self.model, cfg.impl.sparse_head, compile=cfg.impl.compile, chunked=self.rt.chunked_mlm
        )
        if dist.on:
            self.step_module = DDP(
                self.step_module,
                device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=cfg.objective.sentence == "none",
            )
        try:
            with self.clock.sigterm():  # SIGTERM: the loop checkpoints after the step and raises Interrupted
                result = self._loop()
        finally:
            self.batches.close()
            if self.short_batches is not None:
                self.short_batches.close()
        if self.clock.stop_requested:  # SIGTERM during the final checkpoint, eval or publish: the run is
            raise Interrupted(None)  # done, but the command must stop rather than start the next one
        return result

    def _resume(self) -> None:
        rd = self.rd
        ck = load_latest_checkpoint(rd.ckpt_dir, self.cfg.run_hash(), self._report)
        if self.dist.main and rd.history_path.exists():
            size = ck["state"]["history_bytes"] if ck else 0
            have = rd.history_path.stat().st_size
            if have < size:  # cut from outside: keep its whole lines, never pad it with NULs
                self._report(f"history.jsonl is shorter than its checkpoint says ({size} bytes)")
                size = rd.history_path.read_bytes().rfind(b"\n") + 1
            with open(rd.history_path, "r+b") as f:  # drop what the interrupted session logged later
                f.truncate(size)
        if ck is None:
            return
        name = f"step-{ck['step']:08d}.pt"
        try:
            self.state = TrainState(**ck["state"])
            self.model.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["optimizer"])
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:  # intact, but written by other code
            raise StudyError(
                f"checkpoint {name} is intact but does not load into this code "
                f"({type(exc).__name__}: {str(exc)[:300]})",
                source=str(rd.ckpt_dir),
                allowed="the code that wrote it, or delete the folder to train from scratch",
            ) from exc
        if not set_rng_state(ck["rng"], self.dist.rank, self.device):
            self._report(f"checkpoint has no RNG state for rank {self.dist.rank}; dropout reseeded")
        self._event({"event": "resume", "tokens": self.state.tokens, "from": name})
        if self.dist.main:
            print(f"run {self.cfg.run_hash()}: resumed from step {self.state.step} ({name})", file=sys.stderr)

    def _checkpoint(self) -> None:
        self._sync()  # a non-finite step is never saved
        st, rd = self.state, self.rd
        st.wall_s += time.perf_counter() - self.session_start
        self.session_start = time.perf_counter()
        rng = rng_states(self.device, self.dist)
        if self.dist.main:
            st.history_bytes = rd.history_path.stat().st_size if rd.history_path.exists() else 0
            rd.ckpt_dir.mkdir(parents=True, exist_ok=True)
            write_checkpoint(
                rd.ckpt_dir,
                st.step,
                {
                    "format": CKPT_FORMAT,
                    "run_hash": self.cfg.run_hash(),
                    "step": st.step,
                    "model": self.model.state_dict(),
                    "optimizer": self.opt.state_dict(),
                    "scheduler": {
                        "kind": self.cfg.train.schedule,
                        "warmup": self.cfg.train.warmup,
                        "budget": self.cfg.train.budget,
                        "progress": progress_of(self.cfg, st),
                    },
                    "state": dataclasses.asdict(st),
                    "rng": [{k: v.cpu() for k, v in r.items()} for r in rng],
                },
            )
        self.last_ckpt_step = st.step
        self.clock.written()

    # ---- evaluation (on rank 0, shared with the others)
    def _eval_event(self) -> dict:
        self._sync()
        st = self.state
        res = (
            evaluate(
                self.model,
                self.ref,
                self.sent,
                self.device,
                self.rt.autocast,
                self.cfg.impl.sparse_head,
                self.short_ref,
            )
            if self.dist.main
            else None
        )
        res = broadcast(res, self.dist)
        st.last_eval = {**res, "step": st.step}
        self._log({"step": st.step, "tokens": st.tokens, "eval": res})
        stop = None
        if self.dist.main and self.on_eval is not None:
            try:
                self.on_eval(st.step, st.tokens, res)
            except BaseException as exc:  # noqa: BLE001 - re-raised after the checkpoint below
                stop = exc
        if broadcast(stop is not None, self.dist):
            # pruned/interrupted by the caller: keep the run resumable, write no status
            if self.last_ckpt_step != st.step:
                self._checkpoint()
            if stop is not None:
                raise stop
            raise RuntimeError("stopped by rank 0's on_eval")
        return res

    # ---- results (study/pretrain/results.py)
    def _finish(self) -> dict:  # every step is read back: the end's checkpoint or eval synced
        wall = self.state.wall_s + (time.perf_counter() - self.session_start)
        metrics = run_metrics(self, wall)
        if self.dist.main:
            write_results(self, metrics, wall, _now())
        barrier(self.dist)
        return metrics
