"""The one place that decides where and how tensors are computed (nanochat's compute_init idea).

Pre-training, fine-tuning, rescoring and `study plan`'s cost estimate all take their process group,
device, autocast precision, thread count, AdamW parameter groups and quiet transformers loading from
here, so a plan times what a run will do and a fine-tune runs where its pre-training ran.

- Dist / dist_env(): world size, rank and local rank from torchrun's environment (WORLD_SIZE, RANK,
  LOCAL_RANK); a plain process is rank 0 of 1.
- resolve_device(): auto is cuda > mps > cpu; an explicit device this machine lacks is a StudyError
  naming impl.device. Under DDP on CUDA each rank takes the GPU of its local rank.
- resolve_precision() / autocast_factory(): auto is bf16 autocast on CUDA when the GPU supports it,
  plain fp32 elsewhere (CPU bf16 autocast is slower than fp32 on most CPUs; MPS bf16 is unproven).
- resolve_mlm_loss(): impl.mlm_loss; auto is the chunked MLM loss on a CPU in fp32 (study/model/xent.py).
- threads(n): torch's intra-op thread count for the duration of a block (impl.threads, or the command's
  --threads above it, or without either the command's free cores: study/cpu.py), restored after.
- compute_init(impl): all of the above for one job, and the process group under torchrun.
- param_groups(): AdamW groups with one rule, no weight decay on any parameter with fewer than two
  dimensions (biases, LayerNorm gains and shifts), as BERT's recipe. The trainer used to pick them by
  name (endswith "bias" or "LayerNorm" in name) and fine-tuning by ndim (ndim < 2 or "LayerNorm");
  on every model this code builds (BertForPreTraining with and without the sentence task, and the
  fine-tuning classifier on its encoder) the three rules give the same partition in the same order
  (tests/test_model.py), so results are bitwise those of either old rule. The ndim rule is the one
  kept because it does not depend on transformers' parameter names.
- transformers_quiet(): transformers' own progress bars ("Loading weights",
  "Writing model shards") off for a block and the caller's setting restored after.
"""

from __future__ import annotations

import contextlib
import os
import platform
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass

import torch
from transformers.utils import logging as hf_logging

from study.config import ImplConfig
from study.cpu import threads_default, threads_override, warn_if_busy
from study.errors import StudyError


# --------------------------------------------------------------------------- process group
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


def dist_env() -> Dist:
    """This process's place in a torchrun job (rank 0 of 1 outside torchrun)."""
    return Dist(
        rank=int(os.environ.get("RANK", "0")),
        world=int(os.environ.get("WORLD_SIZE", "1")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )


def all_reduce_sum(values: list[float], dist: Dist, device: torch.device) -> list[float]:
    """Sum of `values` over all ranks, in float64 (nccl needs CUDA tensors, gloo CPU ones)."""
    if not dist.on:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    torch.distributed.all_reduce(t)
    return t.tolist()


def broadcast(obj, dist: Dist):
    """Rank 0's `obj` on every rank."""
    if not dist.on:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def barrier(dist: Dist) -> None:
    if dist.on:
        torch.distributed.barrier()


# --------------------------------------------------------------------------- device and precision
def resolve_device(name: str, dist: Dist | None = None) -> torch.device:
    """auto: cuda > mps > cpu. An explicit device that is not there is a user mistake."""
    dist = dist or Dist()
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else ("mps" if has_mps else "cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise StudyError(
                "CUDA is not available on this machine", field="impl.device", allowed="auto, cpu"
            )
        return torch.device("cuda", dist.local_rank if dist.on else torch.cuda.current_device())
    if name == "mps" and not has_mps:
        raise StudyError("MPS is not available on this machine", field="impl.device", allowed="auto, cpu")
    return torch.device(name)


def cpu_has_bf16() -> bool | None:
    """Whether this x86 CPU multiplies bf16 in hardware (avx512_bf16 or AMX tiles); None off x86."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32. auto: bf16 on CUDA (when supported), fp32 elsewhere.

    An explicit bf16 on a CPU without bf16 hardware is kept (it is the user's choice and loss-neutral) but
    warned about: there torch emulates every bf16 matmul, measured 45x slower than fp32 (512^3, one
    thread, an AVX2-only EPYC), where an avx512_bf16 EPYC ran the cpu model's step 2.4x faster."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    if precision == "bf16" and device.type == "cpu" and cpu_has_bf16() is False and not _WARNED:
        _WARNED.append(True)
        warnings.warn(
            "impl.precision: bf16 on a CPU without bf16 hardware (neither avx512_bf16 "
            "nor AMX): bf16 matmuls are emulated, many times slower than fp32; "
            "use impl.precision: fp32 (or auto) here",
            RuntimeWarning,
            stacklevel=2,
        )
    return torch.bfloat16 if precision == "bf16" else None


_WARNED: list[bool] = []  # once per process


def autocast_factory(device: torch.device, dtype: torch.dtype | None) -> Callable[[], ContextManager]:
    """A zero-argument factory of the autocast context (a fresh one per use: contexts are single-use)."""
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


@dataclass(frozen=True)
class Runtime:
    """Where one job computes: its place in the process group, its device and its autocast dtype."""

    dist: Dist
    device: torch.device
    dtype: torch.dtype | None  # None: plain fp32
    chunked_mlm: bool = (
        False  # the training step's MLM loss in row chunks (impl.mlm_loss, study/model/xent.py)
    )

    @property
    def autocast(self) -> Callable[[], ContextManager]:
        return autocast_factory(self.device, self.dtype)

    @property
    def precision(self) -> str:
        return "bf16" if self.dtype == torch.bfloat16 else "fp32"


def resolve(impl: ImplConfig, dist: Dist | None = None) -> Runtime:
    """Device and precision of `impl` on this machine, without touching any process-wide state."""
    dist = dist or Dist()
    device = resolve_device(impl.device, dist)
    dtype = resolve_precision(impl.precision, device)
    return Runtime(dist, device, dtype, resolve_mlm_loss(impl.mlm_loss, device, dtype))


def resolve_mlm_loss(choice: str, device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether the training step computes the MLM loss in row chunks. auto: on a CPU in fp32, where the
    whole logits' passes through memory cost more than the projection (study/model/xent.py); not elsewhere:
    on a GPU the fused kernels were not measured against it, and under autocast it would compute in fp32."""
    if choice == "auto":
        return device.type == "cpu" and dtype is None
    return choice == "chunked"


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `n` for the block (None: leave it), the caller's restored. The
    command's --threads (study/cpu.py) wins over `n`; `--threads auto` gives the cores found free where
    `n` is None (else torch's own count): every job computes through here."""
    warn_if_busy()
    old = torch.get_num_threads()
    n = threads_override() or n or threads_default()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def compute_init(impl: ImplConfig, dist: Dist | None = None) -> Iterator[Runtime]:
    """The runtime of one job: device and precision resolved, the process group up under torchrun
    (nccl on CUDA, gloo elsewhere; torn down on exit if this call created it), impl.threads set."""
    dist = dist or dist_env()
    rt = resolve(impl, dist)
    if dist.on and not torch.distributed.is_initialized():
        if rt.device.type == "cuda":
            torch.cuda.set_device(rt.device)
        torch.distributed.init_process_group(backend="nccl" if rt.device.type == "cuda" else "gloo")
        dist.owns_group = True
    try:
        with threads(impl.threads):
            yield rt
    finally:
        if dist.owns_group:
            torch.distributed.destroy_process_group()
            dist.owns_group = False


# --------------------------------------------------------------------------- optimizer
def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices (and embeddings), none on vectors (biases, LayerNorm).

    Both groups keep named_parameters() order, so an optimizer state saved by the old rules loads."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# --------------------------------------------------------------------------- transformers
@contextlib.contextmanager
def transformers_quiet(quiet: bool = True) -> Iterator[None]:
    """transformers' progress bars off for the block when `quiet`; the caller's setting restored."""
    was = hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet and was:
            hf_logging.enable_progress_bar()
