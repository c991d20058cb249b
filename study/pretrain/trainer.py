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
- Driver: `python -m study.pretrain CONFIG.json --results DIR` (also under torchrun; `python -m
  study.pretrain.trainer` too); exit 2 / 3 as the CLI, 143 when interrupted by SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from study import faults
from study.config import RunConfig
from study.data.batches import Batches
from study.data.corpus import with_fingerprint
from study.data.instances import build_instances
from study.data.prepare import prepare_data
from study.data.tokenizer import save_beside_model
from study.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_USAGE, Diverged, Interrupted, StudyError
from study.io import atomic_dir, read_json
from study.lease import lease, train_lease_path
from study.metrics import finite
from study.model.bert import model_flops_per_token
from study.paths import Layout
from study.pretrain.checkpoint import (
    CKPT_FORMAT,
    CheckpointClock,
    TrainState,
    load_latest_checkpoint,
    remove_checkpoints,
    rng_states,
    set_rng_state,
    write_checkpoint,
)
from study.pretrain.evaluate import (
    evaluate,
    matmul_peak_flops,
    reference_set,
    sentence_set,
    short_reference_set,
)
from study.pretrain.live import open_live
from study.pretrain.schedule import Schedule, budget_progress
from study.pretrain.step import (
    LossModule,
    StepResult,
    build_training_model,
    make_optimizer,
    pad_parts,
    pretrain_step,
    read_steps,
)
from study.provenance import provenance
from study.rundir import RunDir
from study.runtime import Runtime, barrier, broadcast, compute_init, dist_env, transformers_quiet

NAN_ENV = (
    "STUDY_INJECT_NAN_AT_STEP"  # test hook: the loss of step k (1-based) becomes NaN; "<hash>:k" for one run
)
DROPOUT_TAG = 0xD20  # the dropout stream, one per DDP rank
HEARTBEAT_S = 300.0  # without a progress bar, a line on stderr at most this often (Trainer._heartbeat)

OnEval = Callable[[int, int, dict], None]


# --------------------------------------------------------------------------- checks
def check_config(cfg: RunConfig, world: int = 1) -> None:
    """What the model/loop cannot take, found before any data or compute (StudyError names the field).

    RunConfig validates these at construction, but `validate_assignment` does not re-run the
    cross-section check, so a config mutated after construction is checked again here.
    """
    t = cfg.train
    if cfg.objective.max_seq_len > cfg.model.max_positions:
        raise StudyError(
            f"max_seq_len {cfg.objective.max_seq_len} exceeds model.max_positions {cfg.model.max_positions}",
            field="objective.max_seq_len",
            allowed=f"<= model.max_positions ({cfg.model.max_positions})",
        )
    if t.batch_size < 1:
        raise StudyError(f"batch size {t.batch_size}", field="train.batch_size", allowed=">= 1")
    if t.grad_accum < 1:
        raise StudyError(f"grad_accum {t.grad_accum}", field="train.grad_accum", allowed=">= 1")
    split = t.grad_accum * world
    if t.batch_size % split:
        raise StudyError(
            f"batch size {t.batch_size} does not split into grad_accum ({t.grad_accum}) x "
            f"processes ({world}) equal micro-batches",
            field="train.batch_size",
            allowed=f"a positive multiple of {split}",
        )
    if cfg.model.hidden % cfg.model.heads:
        raise StudyError(
            f"hidden {cfg.model.hidden} not divisible by heads {cfg.model.heads}",
            field="model.heads",
            allowed=f"a divisor of {cfg.model.hidden}",
        )
    if cfg.impl.compile and cfg.impl.pad_to != "max":  # ImplConfig refuses it too, unless set unvalidated
        raise StudyError(
            "torch.compile needs static shapes: set impl.pad_to to max",
            field="impl.compile",
            allowed="false, or true with impl.pad_to=max",
        )


def _check_data(cfg: RunConfig, prepared, instances) -> int:
    """The tokenizer, the cached token ids and the instances must fit the model. Returns the vocab size."""
    vocab = len(prepared.tokenizer)
    if prepared.special.vocab_size != vocab:
        raise StudyError(
            f"special ids say vocab {prepared.special.vocab_size}, tokenizer has {vocab}",
            field="tokenizer.vocab_size",
            allowed="a data folder prepared by this version",
        )
    ids = np.asarray(instances.input_ids)
    if ids.size and int(ids.max()) >= vocab:
        raise StudyError(
            f"token id {int(ids.max())} outside the tokenizer's vocabulary of {vocab} "
            f"(stale data folder {prepared.dir}?)",
            field="tokenizer.vocab_size",
            allowed=f"ids < {vocab}; delete the data folder to rebuild it",
        )
    if ids.ndim != 2 or ids.shape[1] > cfg.model.max_positions:
        raise StudyError(
            f"instances of length {ids.shape[-1]} exceed model.max_positions {cfg.model.max_positions}",
            field="objective.max_seq_len",
            allowed=f"<= {cfg.model.max_positions}",
        )
    if len(ids) < cfg.train.batch_size:
        raise StudyError(
            f"the training split yields only {len(ids)} instances, fewer than one batch",
            field="train.batch_size",
            allowed=f"<= {len(ids)} (or a larger corpus)",
        )
    return vocab


# --------------------------------------------------------------------------- state
def _progress(cfg: RunConfig, st: TrainState) -> float:
    return budget_progress(cfg, st.step, st.tokens, st.train_s)


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


class Trainer:
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
        vocab = _check_data(cfg, prepared, inst0)
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
                        "progress": _progress(self.cfg, st),
                    },
                    "state": dataclasses.asdict(st),
                    "rng": [{k: v.cpu() for k, v in r.items()} for r in rng],
                },
            )
        self.last_ckpt_step = st.step
        self.clock.written()

    # ---- one optimizer step
    def _train_step(self, batch: dict, lr: float):
        inject = os.environ.get(NAN_ENV)  # "k" (every run) or "<run_hash>:k" (one run of a study)
        target, _, at = (inject or "").rpartition(":")
        run_hash, step = self.cfg.run_hash(), self.state.step + 1
        poison = bool(inject) and target in ("", run_hash) and int(at) == step
        parts = (
            batch["parts"]
            if self.cfg.impl.pad_to == "batch"
            else pad_parts(batch["parts"], self.cfg.objective.max_seq_len, self.prepared.special.pad)
        )  # static shapes
        return pretrain_step(
            self.step_module,
            self.model,
            self.opt,
            parts,
            lr,
            clip=self.cfg.train.clip,
            rt=self.rt,
            fused=self.fused,
            poison=poison,
            mid_step=lambda: faults.point("train.step", f"{run_hash} step {step}"),
        )

    def _sync(self) -> None:
        """Read the steps run since the last sync back from the device (one transfer) and, in step order,
        stop at the first non-finite one or add them to the log window and the counters."""
        st, win, clip = self.state, self.state.window, self.cfg.train.clip
        pending, self.pending = self.pending, []
        for (step, _), v in zip(pending, read_steps([r for _, r in pending]), strict=True):
            if not finite(v.loss) or (clip > 0 and not finite(v.grad_norm)):
                self._diverged(v.loss, v.grad_norm, step)
            st.positions, st.masked, st.last_loss, self.grad_norm = (
                st.positions + v.positions,
                st.masked + v.masked,
                v.loss,
                v.grad_norm,
            )
            for k, x in (("loss", v.loss), ("mlm", v.mlm), ("sent", v.sentence)):
                win[k] += x

    def _diverged(self, loss: float, gnorm: float, step: int) -> None:
        what = f"non-finite loss {loss}" if not finite(loss) else f"non-finite gradient norm {gnorm}"
        if self.dist.main:
            self._event({"event": "diverged", "step": step, "loss": str(loss), "grad_norm": str(gnorm)})
            self.rd.write_status("diverged", f"{what} at step {step}", step, loss=str(loss))
        raise Diverged(step, loss if not finite(loss) else gnorm)

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

    # ---- the loop
    def _heartbeat(self, bar, loss: float, tps: float | None) -> None:
        """Without a progress bar (--quiet, as in dvc.yaml's stages), one line on stderr every HEARTBEAT_S
        of wall time at a log step, so a long stage shows where it is between its runs' end lines."""
        now = time.perf_counter()
        if not bar.disable or not self.dist.main or now - self.last_beat < HEARTBEAT_S:
            return
        self.last_beat = now
        cfg, st = self.cfg, self.state
        print(
            f"pretrain {cfg.run_hash()} step {st.step:,} ({100 * min(_progress(cfg, st), 1.0):.0f}% of "
            f"{cfg.train.amount:,.0f} {cfg.train.budget}), loss {loss:.3f}, "
            f"{f'{tps:,.0f}' if tps else '-'} tok/s",
            file=sys.stderr,
            flush=True,
        )

    def _loop(self) -> dict:
        cfg, st, t = self.cfg, self.state, self.cfg.train
        unit_total = {"steps": math.ceil(t.amount), "tokens": t.amount, "seconds": t.amount}[t.budget]
        bar = tqdm(
            total=unit_total,
            initial=min(_progress(cfg, st), 1.0) * unit_total,
            desc=f"pretrain {cfg.run_hash()}",
            unit={"steps": "step", "tokens": "tok", "seconds": "s"}[t.budget],
            unit_scale=t.budget == "tokens",
            dynamic_ncols=True,
            mininterval=0.5,
            disable=self.quiet or not cfg.impl.progress or not self.dist.main,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
        )
        empty = {"n": 0, "loss": 0.0, "mlm": 0.0, "sent": 0.0, "tokens": 0, "s": 0.0}
        st.window = st.window or dict(empty)
        last_dt = 0.0
        self.last_ckpt_step = st.step if st.step else None
        try:
            while _progress(cfg, st) < 1.0:
                t0 = time.perf_counter()
                source = self.short_batches if st.phase == 0 else self.batches
                batch = source.get(st.epoch, st.batch)
                p_before = _progress(cfg, st)
                if t.budget == "steps":
                    p_after = (st.step + 1) / math.ceil(t.amount)
                elif t.budget == "tokens":
                    p_after = (st.tokens + batch["tokens"]) / t.amount
                else:
                    p_after = (st.train_s + last_dt) / t.amount  # this step's length is not known yet
                lr = t.lr * self.schedule.factor(p_before, p_after)
                self.pending.append((st.step + 1, self._train_step(batch, lr)))
                st.step, st.tokens, st.sequences = (
                    st.step + 1,
                    st.tokens + batch["tokens"],
                    st.sequences + t.batch_size,
                )
                st.epoch, st.batch = source.next_position(st.epoch, st.batch)
                if st.phase == 0 and _progress(cfg, st) >= t.short_fraction:  # short rows done: full length
                    st.phase, st.epoch, st.batch = 1, 0, 0
                log_now = st.step % cfg.impl.log_every == 0
                eval_now = bool(cfg.impl.eval_every) and st.step % cfg.impl.eval_every == 0
                ckpt_now, stop = self.clock.decide(st.step, log_now, self.dist, self.device)
                if log_now or eval_now or ckpt_now or stop or _progress(cfg, st) >= 1.0:
                    self._sync()  # inside the step's time: waiting for the device's queue is training time
                dt = last_dt = time.perf_counter() - t0
                st.train_s += dt
                win = st.window
                for k, v in (("n", 1), ("tokens", batch["tokens"]), ("s", dt)):
                    win[k] += v
                bar.update(1 if t.budget == "steps" else batch["tokens"] if t.budget == "tokens" else dt)
                if log_now:
                    tps = win["tokens"] / win["s"] if win["s"] else None
                    self._log(
                        {
                            "step": st.step,
                            "tokens": st.tokens,
                            "loss": win["loss"] / win["n"],
                            "mlm_loss": win["mlm"] / win["n"],
                            "sentence_loss": win["sent"] / win["n"]
                            if cfg.objective.sentence != "none"
                            else None,
                            "lr": lr,
                            "grad_norm": self.grad_norm if finite(self.grad_norm) else None,
                            "tokens_per_s": tps,
                            "epoch": st.epoch,
                        }
                    )
                    bar.set_postfix(
                        loss=f"{win['loss'] / win['n']:.3f}",
                        tok_s=f"{tps:,.0f}" if tps else "-",
                        refresh=False,
                    )
                    self._heartbeat(bar, win["loss"] / win["n"], tps)
                    st.window = dict(empty)
                if eval_now and _progress(cfg, st) < 1.0:
                    self._eval_event()
                if ckpt_now and _progress(cfg, st) < 1.0:
                    self._checkpoint()
                if stop:  # SIGTERM: this step is done; save it and leave the run pending (resumable)
                    if self.last_ckpt_step != st.step:
                        self._checkpoint()
                    self._event({"event": "interrupted", "signal": "SIGTERM", "tokens": st.tokens})
                    raise Interrupted(st.step)
        finally:
            bar.close()
        if self.last_ckpt_step != st.step:
            self._checkpoint()  # a kill during finishing must not retrain
        if st.last_eval.get("step") != st.step:
            self._eval_event()
        return self._finish()

    # ---- results
    def _finish(self) -> dict:  # every step is read back: the end's checkpoint or eval synced
        cfg, st, rd = self.cfg, self.state, self.rd
        wall = st.wall_s + (time.perf_counter() - self.session_start)
        ev = {k: v for k, v in st.last_eval.items() if k != "step"}
        seq = cfg.objective.max_seq_len
        masked_per_seq = st.masked / st.sequences if st.sequences else 0.0
        # MFU counts the useful FLOPs (MLM head on predicted positions only, whatever impl.sparse_head
        # does), at the sequence length actually computed after trimming padding.
        mean_len = st.positions / st.sequences if st.sequences else float(seq)
        fpt = model_flops_per_token(
            cfg.model,
            max(1, round(mean_len)),
            self.vocab,
            masked_per_seq * seq / max(mean_len, 1.0),
            sparse=True,
        )
        tps = st.tokens / st.train_s if st.train_s else None
        pps = st.positions / st.train_s if st.train_s else None
        # The peak in the dtype the matmuls run in (bf16 under autocast): against an fp32 peak a bf16 run
        # reads above 1 (1.2 on an H200). 2048^3 is launch-bound on a large GPU, so CUDA times 8192^3.
        dtype = self.rt.dtype or torch.float32
        n = 8192 if self.device.type == "cuda" else 2048
        peak = (
            matmul_peak_flops(
                self.device.type if self.device.type != "cuda" else str(self.device), n=n, dtype=dtype
            )
            if self.dist.main
            else None
        )
        metrics = {
            **ev,
            "tokens_seen": st.tokens,
            "steps": st.step,
            "sequences_seen": st.sequences,
            "positions_computed": st.positions,
            "masked_seen": st.masked,
            "epochs": st.epoch + (st.batch / self.batches.batches_per_epoch(st.epoch) if st.batch else 0.0),
            "tokens_per_s": tps,
            # world-size processes share the work; the peak is one device's, so divide by world
            "mfu": (fpt * pps / (peak * self.dist.world)) if (pps and peak) else None,
            "flops_per_token": fpt,
            "peak_flops": peak,
            "peak_kind": f"{self.rt.precision} matmul {n}^3, measured",
            "params": self.params,
            "vocab_size": self.vocab,
            "wall_s": wall,
            "time_s": st.train_s,  # time_s: seconds inside training steps
            "final_loss": st.last_loss,
            "device": str(self.device),
            "precision": self.rt.precision,
            "world_size": self.dist.world,
            "budget": f"{cfg.train.amount:g} {cfg.train.budget}",
        }
        if self.dist.main:
            rd.write_metrics(metrics)
            with (
                atomic_dir(rd.model_dir) as tmp,
                transformers_quiet(self.quiet),
            ):  # its "Writing model shards" bar
                self.model.save_pretrained(tmp)
                save_beside_model(self.prepared.tokenizer, tmp, cfg.model.max_positions)
            rd.write_meta(
                {
                    "run_hash": cfg.run_hash(),
                    "data_hash": cfg.data_hash(),
                    "provenance": provenance(str(self.device)),
                    "wall_s": wall,
                    "device": str(self.device),
                    "params": self.params,
                    "started": st.started,
                    "finished": _now(),
                    "sessions": st.sessions,
                    "world_size": self.dist.world,
                    "precision": self.rt.precision,  # the one name metrics.json uses too (fp32, bf16)
                    "impl": cfg.impl.model_dump(mode="json"),
                    "dropout_masks": self.dropout_masks,
                    "mlm_loss": "chunked"
                    if self.rt.chunked_mlm
                    else "torch",  # what impl.mlm_loss resolved to
                    "bitwise_resume": cfg.train.budget != "seconds" and self.device.type == "cpu",
                }
            )
            rd.write_status("done", None, st.step)
            remove_checkpoints(rd.ckpt_dir)
        barrier(self.dist)
        return metrics


# --------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None, prog: str = "python -m study.pretrain") -> int:
    """`python -m study.pretrain CONFIG.json [--results DIR]`: one run from a resolved config.

    Also the torchrun entry point: `torchrun --nproc_per_node 2 -m study.pretrain cfg.json`.
    """
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("config", help="a RunConfig as JSON (e.g. a run folder's config.json)")
    ap.add_argument("--results", default="results")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        raw = read_json(args.config)
        raw.pop("run_hash", None)
        # a bare config gets its corpus fingerprint here (part of the run hash); one that has it is checked
        cfg = with_fingerprint(RunConfig.model_validate(raw), source=args.config)
        metrics = train_run(cfg, Layout(root=Path(args.results)), quiet=args.quiet)
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Diverged as exc:
        print(f"diverged: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    except Interrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if dist_env().main:
        print(json.dumps({k: metrics[k] for k in ("ref_mlm_loss", "ref_mlm_acc", "steps", "tokens_seen")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m study.pretrain.trainer"))
