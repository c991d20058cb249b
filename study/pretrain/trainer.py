"""The pre-training loop: one run -> one folder `results/runs/<run_hash>/`, trained once, resumable.

    train_run(cfg, layout, quiet=False, on_eval=None) -> metrics dict

What it guarantees (each one tested in tests/test_train.py):
- Skip if done: a folder whose status.json says "done" returns its metrics without training.
- Bitwise resume on CPU: a run killed (SIGKILL) at any point and started again ends with the same
  weights and metrics as an uninterrupted one. Everything random is a pure function of cfg.seed:
  model init (build_model's forked generator), data order per epoch (SeedSequence(seed, epoch)),
  masks per row (mask_rows keys (seed, instance, epoch)), dropout (torch's default generator,
  seeded from cfg.seed and saved/restored in every checkpoint). No numpy/python global RNG is used.
  A `seconds` budget cannot resume bitwise: its LR schedule follows wall-clock time.
- Checkpoints (every impl.checkpoint_every steps and at the end of training) are one file each:
  MAGIC + sha256(payload) + payload (torch.save), written atomically; on load the digest is
  verified and a bad file is reported (warning + events.jsonl) and the previous one is used.
- Non-finite loss or gradient norm: status "diverged" with step and loss, then `Diverged` is raised.
  Test hook: env STUDY_INJECT_NAN_AT_STEP=k makes the loss of step k (1-based) NaN.
- DDP: under torchrun (WORLD_SIZE > 1) the global batch is split across ranks (gloo on CPU, nccl on
  CUDA); masks are keyed by global instance index, and losses are weighted by the GLOBAL number of
  masked tokens, so grad accumulation and DDP give the gradient of the one big batch. Only rank 0 writes.
- `impl` settings are speed-only (proven loss-neutral by tests), which is why they are not hashed.
  impl.compile is refused (StudyError) until a test proves it loss-neutral. One of them,
  impl.dropout_masks, changes which random stream picks the dropout masks (not their distribution or
  arithmetic), so its test is statistical: the curve moves no further than another dropout stream moves it.
- Files besides the contract's: events.jsonl (one line per session start, resume, rejected checkpoint,
  divergence; never truncated) so history.jsonl of a resumed run equals an uninterrupted run's.
- Driver: `python -m study.pretrain.trainer CONFIG.json --results DIR` (also under torchrun); exit 2 / 3 as the CLI.

Loss weighting (why not just mean per micro-batch): a micro-batch's MLM mean is multiplied by
(its masked tokens / the global batch's masked tokens), so summing micro-batches and ranks gives
exactly the mean over the global batch, as if it had been one forward pass.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import shutil
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from study import faults
from study.config import RunConfig
from study.errors import Diverged, StudyError
from study.io import atomic_dir, atomic_write_bytes, atomic_write_json, file_lock, read_json
from study.paths import Layout

NAN_ENV = "STUDY_INJECT_NAN_AT_STEP"  # test hook: the loss of step k (1-based) becomes NaN; "<hash>:k" for one run
CKPT_MAGIC = b"STUDYCKPT1\n"
CKPT_FORMAT = 1
KEEP_CHECKPOINTS = 2   # the newest may be damaged; the one before is the fallback
ORDER_TAG = 0x0DE7     # separates the data-order stream from other streams seeded by (seed, epoch)
DROPOUT_TAG = 0xD20    # the dropout stream, one per DDP rank

OnEval = Callable[[int, int, dict], None]


# --------------------------------------------------------------------------- environment
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False  # we initialised the process group, so we tear it down

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def on(self) -> bool:
        return self.world > 1


def _dist_env() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return Dist(rank=int(os.environ.get("RANK", "0")), world=world,
                local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def resolve_device(name: str, dist: Dist) -> torch.device:
    """auto: cuda > mps > cpu. An explicit device that is not there is a user mistake."""
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else ("mps" if has_mps else "cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise StudyError("CUDA is not available on this machine", field="impl.device", allowed="auto, cpu")
        return torch.device("cuda", dist.local_rank if dist.on else torch.cuda.current_device())
    if name == "mps" and not has_mps:
        raise StudyError("MPS is not available on this machine", field="impl.device", allowed="auto, cpu")
    return torch.device(name)


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32. auto: bf16 on CUDA (when supported), fp32 elsewhere."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if precision == "bf16" else None


def resolve_dropout_masks(name: str, device: torch.device) -> str:
    return ("bits" if device.type == "cpu" else "torch") if name == "auto" else name


def autocast_factory(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


# --------------------------------------------------------------------------- checks
def check_config(cfg: RunConfig, world: int = 1) -> None:
    """What the model/loop cannot take, found before any data or compute (StudyError names the field).

    RunConfig validates these at construction, but `validate_assignment` does not re-run the
    cross-section check, so a config mutated after construction is checked again here.
    """
    t = cfg.train
    if cfg.objective.max_seq_len > cfg.model.max_positions:
        raise StudyError(f"max_seq_len {cfg.objective.max_seq_len} exceeds model.max_positions "
                         f"{cfg.model.max_positions}", field="objective.max_seq_len",
                         allowed=f"<= model.max_positions ({cfg.model.max_positions})")
    if t.batch_size < 1:
        raise StudyError(f"batch size {t.batch_size}", field="train.batch_size", allowed=">= 1")
    if t.grad_accum < 1:
        raise StudyError(f"grad_accum {t.grad_accum}", field="train.grad_accum", allowed=">= 1")
    split = t.grad_accum * world
    if t.batch_size % split:
        raise StudyError(f"batch size {t.batch_size} does not split into grad_accum ({t.grad_accum}) x "
                         f"processes ({world}) equal micro-batches", field="train.batch_size",
                         allowed=f"a positive multiple of {split}")
    if cfg.model.hidden % cfg.model.heads:
        raise StudyError(f"hidden {cfg.model.hidden} not divisible by heads {cfg.model.heads}",
                         field="model.heads", allowed=f"a divisor of {cfg.model.hidden}")
    if cfg.impl.compile:
        # not proven loss-neutral by a test in this build, so it is refused rather than trusted
        raise StudyError("torch.compile is not supported by this trainer build", field="impl.compile",
                         allowed="false")


def _check_data(cfg: RunConfig, prepared, instances) -> int:
    """The tokenizer, the cached token ids and the instances must fit the model. Returns the vocab size."""
    vocab = len(prepared.tokenizer)
    if prepared.special.vocab_size != vocab:
        raise StudyError(f"special ids say vocab {prepared.special.vocab_size}, tokenizer has {vocab}",
                         field="tokenizer.vocab_size", allowed="a data folder prepared by this version")
    ids = np.asarray(instances.input_ids)
    if ids.size and int(ids.max()) >= vocab:
        raise StudyError(f"token id {int(ids.max())} outside the tokenizer's vocabulary of {vocab} "
                         f"(stale data folder {prepared.dir}?)", field="tokenizer.vocab_size",
                         allowed=f"ids < {vocab}; delete the data folder to rebuild it")
    if ids.ndim != 2 or ids.shape[1] > cfg.model.max_positions:
        raise StudyError(f"instances of length {ids.shape[-1]} exceed model.max_positions "
                         f"{cfg.model.max_positions}", field="objective.max_seq_len",
                         allowed=f"<= {cfg.model.max_positions}")
    if len(ids) < cfg.train.batch_size:
        raise StudyError(f"the training split yields only {len(ids)} instances, fewer than one batch",
                         field="train.batch_size", allowed=f"<= {len(ids)} (or a larger corpus)")
    return vocab


# --------------------------------------------------------------------------- schedule
class Schedule:
    """LR factor as a function of budget progress p in [0, 1]: linear warmup, then linear/cosine/constant.

    Progress is steps/amount, tokens/amount or seconds/amount, so the schedule follows the budget.
    Warmup uses the progress after the update (the first step gets a small, non-zero LR); decay
    uses the progress before it.
    """

    def __init__(self, kind: str, warmup: float):
        self.kind, self.warmup = kind, warmup

    def factor(self, p_before: float, p_after: float) -> float:
        w = self.warmup
        if w > 0 and p_before < w:
            return min(1.0, p_after / w)
        q = min(max((p_before - w) / (1.0 - w), 0.0), 1.0)
        if self.kind == "linear":
            return 1.0 - q
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * q))
        return 1.0


def lr_curve(cfg: RunConfig, steps: int | None = None) -> list[float]:
    """The LR of every step of a `steps` budget (for plots and the schedule test)."""
    n = steps or math.ceil(cfg.train.amount)
    s = Schedule(cfg.train.schedule, cfg.train.warmup)
    return [cfg.train.lr * s.factor(i / n, (i + 1) / n) for i in range(n)]


# --------------------------------------------------------------------------- state
@dataclass
class TrainState:
    """Everything the loop needs to continue, besides model/optimizer/RNG. Plain values only."""

    step: int = 0
    tokens: int = 0          # non-pad tokens trained on (all ranks)
    positions: int = 0       # positions actually computed (trimmed padding included)
    masked: int = 0          # MLM predictions trained on
    sequences: int = 0
    epoch: int = 0           # data position: batch `batch` of epoch `epoch` is next
    batch: int = 0
    train_s: float = 0.0     # seconds in training steps (not eval/checkpoint); drives `seconds` budgets
    wall_s: float = 0.0      # wall seconds of all sessions up to the last checkpoint
    history_bytes: int = 0   # history.jsonl is truncated to this on resume
    started: str = ""
    sessions: int = 0
    last_eval: dict = field(default_factory=dict)
    last_loss: float | None = None
    window: dict = field(default_factory=dict)  # running sums since the last history line (resumed too)


def _progress(cfg: RunConfig, st: TrainState) -> float:
    t = cfg.train
    done = {"steps": st.step, "tokens": st.tokens, "seconds": st.train_s}[t.budget]
    return done / (math.ceil(t.amount) if t.budget == "steps" else t.amount)


# --------------------------------------------------------------------------- checkpoints
def _ckpt_path(d: Path, step: int) -> Path:
    return d / f"step-{step:08d}.pt"


def _ckpt_files(d: Path) -> list[tuple[int, Path]]:
    out = []
    for p in d.glob("step-*.pt"):
        m = re.fullmatch(r"step-(\d+)\.pt", p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def write_checkpoint(d: Path, step: int, obj: dict) -> Path:
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    path = _ckpt_path(d, step)
    atomic_write_bytes(path, CKPT_MAGIC + digest + b"\n" + payload)
    for _, old in _ckpt_files(d)[KEEP_CHECKPOINTS:]:
        old.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> dict:
    """Verify magic and sha256, then `torch.load(weights_only=True)`. Raises ValueError when damaged."""
    data = path.read_bytes()
    head = len(CKPT_MAGIC) + 65
    if len(data) < head or not data.startswith(CKPT_MAGIC) or data[head - 1:head] != b"\n":
        raise ValueError("not a checkpoint or truncated header")
    digest, payload = data[len(CKPT_MAGIC):head - 1].decode("ascii", "replace"), data[head:]
    actual = hashlib.sha256(payload).hexdigest()
    if actual != digest:
        raise ValueError(f"sha256 mismatch ({len(payload)} payload bytes; truncated or corrupted)")
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)


def load_latest_checkpoint(d: Path, run_hash: str, report: Callable[[str], None]) -> dict | None:
    """Newest intact checkpoint of this run, or None. Every rejected file is reported, never skipped silently."""
    files = _ckpt_files(d) if d.exists() else []
    for step, path in files:
        try:
            ck = read_checkpoint(path)
            if ck.get("format") != CKPT_FORMAT or ck.get("run_hash") != run_hash or ck.get("step") != step:
                raise ValueError("checkpoint belongs to another run, format or step")
            return ck
        except Exception as exc:  # noqa: BLE001 - any unreadable file is reported and the previous one tried
            report(f"checkpoint {path.name} rejected: {type(exc).__name__}: {exc}")
    if files:
        report("no intact checkpoint left; training starts from scratch")
    return None


# --------------------------------------------------------------------------- data
class Batches:
    """Global batch `b` of epoch `e`: rows perm_e[b*B:(b+1)*B] of that epoch's instances, masked per row.

    Instances are rebuilt per epoch when masking is dynamic (fresh pairs and masks, RoBERTa style),
    and fixed (epoch 0, same masks every epoch; dupe_factor gives copies) when it is static.
    A batch is a pure function of (cfg, epoch, b), so prefetching it on a worker thread
    (impl.workers > 0) cannot change what is trained on.
    """

    def __init__(self, cfg: RunConfig, prepared, dist: Dist, first_instances=None):
        self.cfg, self.prepared, self.dist = cfg, prepared, dist
        self.special = prepared.special
        self.continuation = torch.as_tensor(np.asarray(prepared.continuation))
        self.B = cfg.train.batch_size
        self._cache: dict[int, tuple] = {}
        self._lock = threading.Lock()
        self._first = first_instances  # epoch-0 instances, already built for the data checks
        self.pool = ThreadPoolExecutor(cfg.impl.workers) if cfg.impl.workers > 0 else None
        self._pending: dict = {}

    def _epoch(self, epoch: int) -> tuple:
        """(instances, attention mask, permutation) of one epoch; the last two epochs are cached."""
        with self._lock:
            if epoch not in self._cache:
                ie = epoch if self.cfg.masking.dynamic else 0
                if ie == 0 and self._first is not None:
                    inst = self._first
                else:
                    from study.data.instances import build_instances
                    inst = build_instances(self.prepared.split("train"), self.cfg.objective, self.special,
                                           self.cfg.seed, epoch=ie)
                ss = np.random.SeedSequence([self.cfg.seed, epoch, ORDER_TAG])
                perm = np.random.default_rng(ss).permutation(len(inst.input_ids))
                self._cache[epoch] = (inst, np.asarray(inst.attention_mask()), perm)
                for old in [e for e in self._cache if e < epoch - 1]:
                    del self._cache[old]
            return self._cache[epoch]

    def batches_per_epoch(self, epoch: int) -> int:
        return len(self._epoch(epoch)[2]) // self.B  # the ragged tail is dropped: every step has B sequences

    def next_position(self, epoch: int, b: int) -> tuple[int, int]:
        return (epoch, b + 1) if b + 1 < self.batches_per_epoch(epoch) else (epoch + 1, 0)

    def make(self, epoch: int, b: int) -> dict:
        from study.data.masking import mask_rows
        inst, att_all, perm = self._epoch(epoch)
        B = self.B
        rows = perm[b * B:(b + 1) * B]
        tokens = int(att_all[rows].sum())          # global, without communication
        per_rank = B // self.dist.world
        mine = rows[self.dist.rank * per_rank:(self.dist.rank + 1) * per_rank]
        ids = torch.as_tensor(np.asarray(inst.input_ids[mine]), dtype=torch.long)
        key_epoch = epoch if self.cfg.masking.dynamic else 0
        # masks on full-length rows (keyed by global instance index); padding is trimmed afterwards
        inputs, labels = mask_rows(ids, self.cfg.masking, self.special, self.continuation,
                                   [(self.cfg.seed, int(i), key_epoch) for i in mine])
        att = torch.as_tensor(att_all[mine], dtype=torch.long)
        tt = torch.as_tensor(np.asarray(inst.token_type_ids[mine]), dtype=torch.long)
        sl = torch.as_tensor(np.asarray(inst.sentence_label[mine]), dtype=torch.long)
        micro = per_rank // self.cfg.train.grad_accum
        parts = []
        for m in range(0, per_rank, micro):
            s = slice(m, m + micro)
            width = int(att[s].sum(1).max())
            parts.append({"tensors": dict(input_ids=inputs[s, :width], attention_mask=att[s, :width],
                                          token_type_ids=tt[s, :width], labels=labels[s, :width],
                                          sentence_label=sl[s]),
                          "n_mlm": int((labels[s] != -100).sum()), "n_sent": int((sl[s] >= 0).sum()),
                          "positions": micro * width})
        return {"parts": parts, "tokens": tokens}

    def get(self, epoch: int, b: int) -> dict:
        """The batch at (epoch, b); with workers > 0 the next one is prepared in the background."""
        if self.pool is None:
            return self.make(epoch, b)
        fut = self._pending.pop((epoch, b), None)
        out = fut.result() if fut is not None else self.make(epoch, b)
        nxt = self.next_position(epoch, b)
        self._pending = {nxt: self.pool.submit(self.make, *nxt)}
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------- model step
class _LossModule(nn.Module):
    """Wraps the HF model so DDP sees one forward(); returns the weighted contribution and the parts."""

    def __init__(self, model, sparse: bool):
        super().__init__()
        self.model, self.sparse = model, sparse

    def forward(self, input_ids, attention_mask, token_type_ids, labels, sentence_label, w_mlm, w_sent):
        from study.model.bert import pretraining_loss
        out = pretraining_loss(self.model, input_ids, attention_mask, token_type_ids, labels,
                               sentence_label, sparse=self.sparse, accuracy=False)
        zero = out.mlm_loss.new_zeros(())
        mlm = out.mlm_loss * w_mlm if w_mlm else zero  # w_mlm is 0 exactly when nothing is masked (NaN mean)
        sent = out.sentence_loss * w_sent if out.sentence_loss is not None else zero
        return mlm + sent, mlm.detach(), sent.detach()


def _param_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: no decay on biases and LayerNorm (BERT's recipe)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _rng_state(device: torch.device) -> dict:
    out = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _seed_dropout(seed: int, rank: int, device: torch.device) -> None:
    s = np.random.SeedSequence([seed, DROPOUT_TAG, rank]).generate_state(1, dtype=np.uint64)[0]
    torch.manual_seed(int(s) & ((1 << 63) - 1))


# --------------------------------------------------------------------------- the run
def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _finite(x: float) -> bool:
    return x is not None and math.isfinite(x)


def _done_result(run_dir: Path) -> dict | None:
    """Metrics of a finished run, or raise Diverged for a diverged one; None when not finished."""
    p = run_dir / "status.json"
    if not p.exists():
        return None
    st = read_json(p)
    if st.get("status") == "done":
        return read_json(run_dir / "metrics.json")
    if st.get("status") == "diverged":
        loss = st.get("loss")
        raise Diverged(int(st.get("step") or 0), float(loss) if loss is not None else float("nan"))
    return None  # "failed" (recorded by the CLI): try again, from the last checkpoint


def train_run(cfg: RunConfig, layout: Layout, quiet: bool = False, on_eval: OnEval | None = None) -> dict:
    """Train one run into layout.run_dir(cfg.run_hash()) and return its metrics (see module doc)."""
    dist = _dist_env()
    check_config(cfg, dist.world)
    run_hash = cfg.run_hash()
    run_dir = layout.run_dir(run_hash)
    found = _done_result(run_dir)
    if found is not None:
        return found
    device = resolve_device(cfg.impl.device, dist)
    if dist.on and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group(backend=backend)
        dist.owns_group = True
    old_threads = torch.get_num_threads()
    if cfg.impl.threads:
        torch.set_num_threads(cfg.impl.threads)
    # one trainer per run across processes (a second `study run` waits here, then finds the run done)
    lock = file_lock(layout.root / ".locks" / f"train-{run_hash}.lock") if dist.main else contextlib.nullcontext(True)
    try:
        with lock, torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if dist.main:  # another process may have finished it while we waited for the lock
                found = _done_result(run_dir)
            if dist.on:
                box = [found]
                torch.distributed.broadcast_object_list(box, src=0)
                found = box[0]
            if found is not None:
                return found
            if dist.main:  # the concurrency test counts these: one per run, whatever races to train it
                faults.point("train.start", run_hash)
            return _Trainer(cfg, layout, run_dir, device, dist, quiet, on_eval).run()
    finally:
        torch.set_num_threads(old_threads)
        if dist.owns_group:
            torch.distributed.destroy_process_group()


class _Trainer:
    def __init__(self, cfg, layout, run_dir, device, dist, quiet, on_eval):
        self.cfg, self.layout, self.run_dir, self.device, self.dist = cfg, layout, run_dir, device, dist
        self.quiet, self.on_eval = quiet, on_eval
        self.ckpt_dir = run_dir / "checkpoints"
        self.history_path = run_dir / "history.jsonl"
        self.events_path = run_dir / "events.jsonl"
        self.session_start = time.perf_counter()

    # ---- small helpers
    def _barrier(self):
        if self.dist.on:
            torch.distributed.barrier()

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
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(self.events_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"time": _now(), "step": self.state.step if hasattr(self, "state") else 0,
                                    **obj}, sort_keys=True) + "\n")

    def _log(self, obj: dict) -> None:
        if self.dist.main:
            with open(self.history_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(obj, sort_keys=True) + "\n")

    def _allreduce(self, values: list[float]) -> list[float]:
        if not self.dist.on:
            return values
        t = torch.tensor(values, dtype=torch.float64,
                         device=self.device if self.device.type == "cuda" else "cpu")
        torch.distributed.all_reduce(t)
        return t.tolist()

    # ---- setup
    def _prepare(self):
        from study.data.prepare import prepare_data
        cfg, dist = self.cfg, self.dist
        if dist.main:
            prepared = prepare_data(cfg, self.layout, progress=not self.quiet)
        self._barrier()
        if not dist.main:
            prepared = prepare_data(cfg, self.layout, progress=False)
        return prepared

    def run(self) -> dict:
        from study.pretrain.evaluate import reference_set, sentence_set
        from study.data.instances import build_instances
        from study.model.bert import build_model, use_bits_dropout

        cfg, dist, device = self.cfg, self.dist, self.device
        prepared = self._prepare()
        inst0 = build_instances(prepared.split("train"), cfg.objective, prepared.special, cfg.seed, epoch=0)
        vocab = _check_data(cfg, prepared, inst0)
        self.batches = Batches(cfg, prepared, dist, inst0)
        self.batches.make(0, 0)  # masking errors (e.g. unsupported masking.unit) surface before the model
        self.ref, self.sent = reference_set(cfg, prepared), sentence_set(cfg, prepared)
        self.prepared, self.vocab = prepared, vocab
        if dist.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.run_dir / "config.json", {**cfg.model_dump(mode="json"),
                                                              "run_hash": cfg.run_hash()})
            for d in (self.run_dir, self.ckpt_dir):  # leftovers of writes killed mid-way (temp files/dirs)
                for tmp in d.glob(".*.tmp") if d.exists() else []:
                    shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)

        self.model = build_model(cfg.model, vocab, cfg.objective.sentence != "none", cfg.impl,
                                 seed=cfg.seed).to(device)
        self.dropout_masks = resolve_dropout_masks(cfg.impl.dropout_masks, device)
        if self.dropout_masks == "bits":
            use_bits_dropout(self.model)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.fused = cfg.impl.fused_optimizer and device.type in ("cpu", "cuda")  # where torch has the kernel
        self.opt = torch.optim.AdamW(_param_groups(self.model, cfg.train.weight_decay), lr=cfg.train.lr,
                                     betas=(cfg.train.beta1, cfg.train.beta2), eps=cfg.train.eps,
                                     **({"fused": True} if self.fused else {}))
        self.schedule = Schedule(cfg.train.schedule, cfg.train.warmup)
        self.dtype = resolve_precision(cfg.impl.precision, device)  # None: plain fp32
        self.autocast = autocast_factory(device, self.dtype)
        _seed_dropout(cfg.seed, dist.rank, device)
        self.state = TrainState(started=_now())
        self._resume()
        self.state.sessions += 1
        # one "start" line per session: where it began (search.py counts the tokens a session trained)
        self._event({"event": "start", "session": self.state.sessions, "tokens": self.state.tokens,
                     "resumed": self.state.step > 0, "world_size": dist.world, "device": str(device)})
        self.step_module = _LossModule(self.model, cfg.impl.sparse_head)
        if dist.on:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.step_module = DDP(self.step_module, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=cfg.objective.sentence == "none")
        try:
            return self._loop()
        finally:
            self.batches.close()

    def _resume(self) -> None:
        ck = load_latest_checkpoint(self.ckpt_dir, self.cfg.run_hash(), self._report)
        if self.dist.main and self.history_path.exists():
            size = ck["state"]["history_bytes"] if ck else 0
            if self.history_path.stat().st_size < size:
                self._report(f"history.jsonl is shorter than its checkpoint says ({size} bytes)")
            with open(self.history_path, "r+b") as f:  # drop what the interrupted session logged later
                f.truncate(size)
        if ck is None:
            return
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
        self.state = TrainState(**ck["state"])
        rng = ck["rng"]
        if self.dist.rank < len(rng):
            _set_rng_state(rng[self.dist.rank], self.device)
        else:
            self._report(f"checkpoint has no RNG state for rank {self.dist.rank}; dropout reseeded")
        self._event({"event": "resume", "tokens": self.state.tokens, "from": f"step-{self.state.step:08d}.pt"})

    def _checkpoint(self) -> None:
        st = self.state
        st.wall_s += time.perf_counter() - self.session_start
        self.session_start = time.perf_counter()
        rng = [_rng_state(self.device)]
        if self.dist.on:
            gathered = [None] * self.dist.world
            torch.distributed.all_gather_object(gathered, {k: v.cpu() for k, v in rng[0].items()})
            rng = gathered
        if self.dist.main:
            st.history_bytes = self.history_path.stat().st_size if self.history_path.exists() else 0
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            write_checkpoint(self.ckpt_dir, st.step, {
                "format": CKPT_FORMAT, "run_hash": self.cfg.run_hash(), "step": st.step,
                "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "scheduler": {"kind": self.cfg.train.schedule, "warmup": self.cfg.train.warmup,
                              "budget": self.cfg.train.budget, "progress": _progress(self.cfg, st)},
                "state": dataclasses.asdict(st), "rng": [{k: v.cpu() for k, v in r.items()} for r in rng]})
        self.last_ckpt_step = st.step

    # ---- one optimizer step
    def _train_step(self, batch: dict, lr: float) -> tuple[float, float, float, float, int, int]:
        """Forward/backward over the micro-batches, clip, AdamW step. Returns global (loss, mlm, sentence,
        grad norm, masked tokens, computed positions). The optimizer step is skipped when the loss or
        norm is not finite."""
        cfg, dist = self.cfg, self.dist
        parts = batch["parts"]
        g_mlm, g_sent, positions = self._allreduce([float(sum(p["n_mlm"] for p in parts)),
                                                    float(sum(p["n_sent"] for p in parts)),
                                                    float(sum(p["positions"] for p in parts))])
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        inject = os.environ.get(NAN_ENV)  # "k" (every run) or "<run_hash>:k" (one run of a study)
        target, _, at = (inject or "").rpartition(":")
        nan_now = bool(inject) and target in ("", self.cfg.run_hash()) and int(at) == self.state.step + 1
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        for i, p in enumerate(parts):
            tensors = {k: v.to(self.device, non_blocking=True) for k, v in p["tensors"].items()}
            # DDP averages gradients over ranks; the factor `world` turns that into a sum over the global batch
            w_mlm = dist.world * p["n_mlm"] / g_mlm if g_mlm else 0.0
            w_sent = dist.world * p["n_sent"] / g_sent if g_sent else 0.0
            sync = (not dist.on) or i == len(parts) - 1
            with contextlib.nullcontext() if sync else self.step_module.no_sync():
                with self.autocast():
                    loss, mlm, sent = self.step_module(w_mlm=w_mlm, w_sent=w_sent, **tensors)
                if nan_now and i == 0:
                    loss = loss * float("nan")
                loss.backward()
            sums += torch.stack([loss.detach(), mlm, sent]).double() / dist.world
        faults.point("train.step", f"{self.cfg.run_hash()} step {self.state.step + 1}")  # fault suite: mid-step
        loss_sum, mlm_sum, sent_sum = self._allreduce(sums.tolist())
        gnorm = float("nan")
        if _finite(loss_sum):
            if cfg.train.clip > 0:
                gnorm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.train.clip,
                                                             foreach=self.fused or None))
            if cfg.train.clip == 0 or _finite(gnorm):
                self.opt.step()
        return loss_sum, mlm_sum, sent_sum, gnorm, int(g_mlm), int(positions)

    def _diverged(self, loss: float, gnorm: float) -> None:
        st = self.state
        what = f"non-finite loss {loss}" if not _finite(loss) else f"non-finite gradient norm {gnorm}"
        if self.dist.main:
            self._event({"event": "diverged", "loss": str(loss), "grad_norm": str(gnorm)})
            atomic_write_json(self.run_dir / "status.json", {"status": "diverged", "error": f"{what} at step {st.step}",
                                                             "step": st.step, "loss": str(loss)})
        raise Diverged(st.step, loss if not _finite(loss) else gnorm)

    # ---- evaluation
    def _evaluate(self) -> dict:
        from study.pretrain.evaluate import evaluate
        res = None
        if self.dist.main:
            res = evaluate(self.model, self.ref, self.sent, self.device, self.autocast, self.cfg.impl.sparse_head)
        if self.dist.on:
            box = [res]
            torch.distributed.broadcast_object_list(box, src=0)
            res = box[0]
        return res

    def _eval_event(self) -> dict:
        st = self.state
        res = self._evaluate()
        st.last_eval = {**res, "step": st.step}
        self._log({"step": st.step, "tokens": st.tokens, "eval": res})
        stop = None
        if self.dist.main and self.on_eval is not None:
            try:
                self.on_eval(st.step, st.tokens, res)
            except BaseException as exc:  # noqa: BLE001 - re-raised after the checkpoint below
                stop = exc
        flag = [stop is not None]
        if self.dist.on:
            torch.distributed.broadcast_object_list(flag, src=0)
        if flag[0]:
            # pruned/interrupted by the caller: keep the run resumable, write no status
            if getattr(self, "last_ckpt_step", None) != st.step:
                self._checkpoint()
            if stop is not None:
                raise stop
            raise RuntimeError("stopped by rank 0's on_eval")
        return res

    # ---- the loop
    def _loop(self) -> dict:
        from tqdm import tqdm
        cfg, st, t = self.cfg, self.state, self.cfg.train
        unit_total = {"steps": math.ceil(t.amount), "tokens": t.amount, "seconds": t.amount}[t.budget]
        bar = tqdm(total=unit_total, initial=min(_progress(cfg, st), 1.0) * unit_total,
                   desc=f"pretrain {cfg.run_hash()}", unit={"steps": "step", "tokens": "tok", "seconds": "s"}[t.budget],
                   unit_scale=t.budget == "tokens", dynamic_ncols=True, mininterval=0.5,
                   disable=self.quiet or not cfg.impl.progress or not self.dist.main,
                   bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")
        empty = {"n": 0, "loss": 0.0, "mlm": 0.0, "sent": 0.0, "tokens": 0, "s": 0.0}
        st.window = st.window or dict(empty)
        last_dt = 0.0
        self.last_ckpt_step = st.step if st.step else None
        try:
            while _progress(cfg, st) < 1.0:
                t0 = time.perf_counter()
                batch = self.batches.get(st.epoch, st.batch)
                p_before = _progress(cfg, st)
                if t.budget == "steps":
                    p_after = (st.step + 1) / math.ceil(t.amount)
                elif t.budget == "tokens":
                    p_after = (st.tokens + batch["tokens"]) / t.amount
                else:
                    p_after = (st.train_s + last_dt) / t.amount  # this step's length is not known yet
                lr = t.lr * self.schedule.factor(p_before, p_after)
                loss, mlm, sent, gnorm, n_masked, positions = self._train_step(batch, lr)
                st.step += 1
                if not _finite(loss) or (t.clip > 0 and not _finite(gnorm)):
                    self._diverged(loss, gnorm)
                st.tokens += batch["tokens"]
                st.positions += positions
                st.masked += n_masked
                st.sequences += t.batch_size
                st.epoch, st.batch = self.batches.next_position(st.epoch, st.batch)
                dt = last_dt = time.perf_counter() - t0
                st.train_s += dt
                st.last_loss = loss
                win = st.window
                for k, v in (("n", 1), ("loss", loss), ("mlm", mlm), ("sent", sent), ("tokens", batch["tokens"]),
                             ("s", dt)):
                    win[k] += v
                bar.update((1 if t.budget == "steps" else batch["tokens"] if t.budget == "tokens" else dt))
                if st.step % cfg.impl.log_every == 0:
                    tps = win["tokens"] / win["s"] if win["s"] else None
                    self._log({"step": st.step, "tokens": st.tokens, "loss": win["loss"] / win["n"],
                               "mlm_loss": win["mlm"] / win["n"],
                               "sentence_loss": win["sent"] / win["n"] if cfg.objective.sentence != "none" else None,
                               "lr": lr, "grad_norm": gnorm if _finite(gnorm) else None, "tokens_per_s": tps,
                               "epoch": st.epoch})
                    bar.set_postfix(loss=f"{win['loss'] / win['n']:.3f}", tok_s=f"{tps:,.0f}" if tps else "-",
                                    refresh=False)
                    st.window = dict(empty)
                if cfg.impl.eval_every and st.step % cfg.impl.eval_every == 0 and _progress(cfg, st) < 1.0:
                    self._eval_event()
                if st.step % cfg.impl.checkpoint_every == 0 and _progress(cfg, st) < 1.0:
                    self._checkpoint()
        finally:
            bar.close()
        if self.last_ckpt_step != st.step:
            self._checkpoint()  # a kill during finishing must not retrain
        if st.last_eval.get("step") != st.step:
            self._eval_event()
        return self._finish()

    # ---- results
    def _finish(self) -> dict:
        from study.pretrain.evaluate import matmul_peak_flops
        from study.model.bert import model_flops_per_token
        from study.provenance import provenance

        cfg, st = self.cfg, self.state
        wall = st.wall_s + (time.perf_counter() - self.session_start)
        ev = {k: v for k, v in st.last_eval.items() if k != "step"}
        seq = cfg.objective.max_seq_len
        masked_per_seq = st.masked / st.sequences if st.sequences else 0.0
        # MFU counts the useful FLOPs (MLM head on predicted positions only, whatever impl.sparse_head
        # does), at the sequence length actually computed after trimming padding.
        mean_len = st.positions / st.sequences if st.sequences else float(seq)
        fpt = model_flops_per_token(cfg.model, max(1, round(mean_len)), self.vocab,
                                    masked_per_seq * seq / max(mean_len, 1.0), sparse=True)
        tps = st.tokens / st.train_s if st.train_s else None
        pps = st.positions / st.train_s if st.train_s else None
        # The peak in the dtype the matmuls run in (bf16 under autocast): against an fp32 peak a bf16 run
        # reads above 1 (1.2 on an H200). 2048^3 is launch-bound on a large GPU, so CUDA times 8192^3.
        dtype = self.dtype or torch.float32
        precision = "bf16" if dtype == torch.bfloat16 else "fp32"
        n = 8192 if self.device.type == "cuda" else 2048
        peak = matmul_peak_flops(self.device.type if self.device.type != "cuda" else str(self.device), n=n,
                                 dtype=dtype) if self.dist.main else None
        metrics = {
            **ev,
            "tokens_seen": st.tokens, "steps": st.step, "sequences_seen": st.sequences,
            "positions_computed": st.positions, "masked_seen": st.masked,
            "epochs": st.epoch + (st.batch / self.batches.batches_per_epoch(st.epoch) if st.batch else 0.0),
            "tokens_per_s": tps,
            # world-size processes share the work; the peak is one device's, so divide by world
            "mfu": (fpt * pps / (peak * self.dist.world)) if (pps and peak) else None,
            "flops_per_token": fpt, "peak_flops": peak, "peak_kind": f"{precision} matmul {n}^3, measured",
            "params": self.params, "vocab_size": self.vocab, "wall_s": wall, "time_s": st.train_s,  # time_s: seconds inside training steps
            "final_loss": st.last_loss, "device": str(self.device), "precision": precision,
            "world_size": self.dist.world, "budget": f"{cfg.train.amount:g} {cfg.train.budget}",
        }
        if self.dist.main:
            atomic_write_json(self.run_dir / "metrics.json", metrics)
            with atomic_dir(self.run_dir / "model") as tmp:
                if self.quiet:  # save_pretrained draws its own "Writing model shards" bar
                    from transformers.utils import logging as hf_logging
                    hf_logging.disable_progress_bar()
                self.model.save_pretrained(tmp)
                self.prepared.tokenizer.save_pretrained(str(tmp))
            atomic_write_json(self.run_dir / "meta.json", {
                "run_hash": cfg.run_hash(), "data_hash": cfg.data_hash(), "provenance": provenance(str(self.device)),
                "wall_s": wall, "device": str(self.device), "params": self.params, "started": st.started,
                "finished": _now(), "sessions": st.sessions, "world_size": self.dist.world,
                "precision": str(self.dtype or torch.float32),
                "impl": cfg.impl.model_dump(mode="json"),
                "dropout_masks": self.dropout_masks,
                "bitwise_resume": cfg.train.budget != "seconds" and self.device.type == "cpu",
            })
            atomic_write_json(self.run_dir / "status.json", {"status": "done", "error": None, "step": st.step})
            for _, p in _ckpt_files(self.ckpt_dir):  # resume state is useless once done
                p.unlink(missing_ok=True)
        self._barrier()
        return metrics


# --------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    """`python -m study.pretrain.trainer CONFIG.json [--results DIR]`: one run from a resolved config.

    Also the torchrun entry point: `torchrun --nproc_per_node 2 -m study.pretrain.trainer cfg.json`.
    """
    from study.errors import EXIT_DIVERGED, EXIT_USAGE
    ap = argparse.ArgumentParser(prog="python -m study.pretrain.trainer")
    ap.add_argument("config", help="a RunConfig as JSON (e.g. a run folder's config.json)")
    ap.add_argument("--results", default="results")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        raw = read_json(args.config)
        raw.pop("run_hash", None)
        cfg = RunConfig.model_validate(raw)
        metrics = train_run(cfg, Layout(root=Path(args.results)), quiet=args.quiet)
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Diverged as exc:
        print(f"diverged: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    if _dist_env().main:
        print(json.dumps({k: metrics[k] for k in ("ref_mlm_loss", "ref_mlm_acc", "steps", "tokens_seen")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
