"""Several fine-tuning seeds of one encoder in one step (`impl.finetune_batched_seeds`).

The K seeds' classifiers (encoder copy + head) are stacked parameter by parameter
(`torch.func.stack_module_state`) and one step runs `vmap(functional_call)` over them: one forward and
one backward of K x batch rows instead of K small ones, so a GPU sees matmuls K times as large. Each seed
keeps everything the sequential loop (`finetune._finetune_one`) gives it:

- its head init: the same `Classifier(..., generator seeded by the seed)`, built before stacking;
- its data: the batches of seed k are exactly `encode.epoch_batches(train, ft, k, epoch)`, the ones the
  sequential loop feeds it; a step pads the K batches to their common longest row (padding is masked out
  of attention, so a row's [CLS] sees the same tokens; only float rounding can differ);
- its optimizer: AdamW is elementwise, so one AdamW over the stacked tensors is K AdamWs (groups by the
  unstacked tensor's ndim, as runtime.param_groups); gradient clipping to GRAD_CLIP is per seed (each
  seed's own global norm); one LR schedule (all seeds take the same number of steps);
- its loss: the per-seed mean over its own rows; the step back-propagates their sum (the seeds share no
  parameter, so each seed's gradient is its own loss's).

Dropout: with dropout 0 (model.dropout and model.attention_dropout; the cpu profiles) this is the
sequential fine-tune within float tolerance (tests/test_finetune_batched.py). With dropout > 0 the masks
cannot be the sequential loop's: that loop draws them from torch's global generator, one seed after the
other, and inside vmap a draw is either the same for every seed or one stream shared by the group. So
here each seed draws its own masks from its own generator, reseeded every step from (seed, step), at its
own batch's width (then padded to the step's: padded positions are masked out of attention, so their mask
is never read). Seed k's masks (and so its result) then depend on seed k alone, not on the seeds it runs
beside or the step's padded width; the keep probability and the arithmetic are torch's dropout's (mask in the input's dtype, divided by 1 - p). Same
distribution, another random stream: the kind of difference `impl.dropout_masks` already makes. Every
nn.Dropout becomes a SeedDropout and attention-probability dropout goes through the `seed-<kernel>`
attention function (eager math when its dropout is > 0); any other dropout call inside the step raises
instead of silently sharing one mask across seeds.

Under vmap, autocast casts a linear's matmul to bf16 but adds the fp32 bias after it, so activations
between matmuls are fp32 (sequential autocast keeps them bf16): the same bf16 matmuls, a little more
precision and memory traffic.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap
from torch.overrides import TorchFunctionMode
from tqdm import tqdm

from study.config import RunConfig
from study.downstream.classifier import ADAM_BETAS, ADAM_EPS, GRAD_CLIP, Classifier, lr_lambda, task_loss
from study.downstream.encode import Encoded, collate, epoch_batches, eval_batches
from study.downstream.tasks import TaskSpec, compute_metrics
from study.model.attention import register_dropout_attention
from study.runtime import Runtime

DROPOUT_TAG = 0x5EED_D209  # separates the per-step dropout seeds from any other use of a fine-tuning seed


# --------------------------------------------------------------------------- per-seed dropout
class _Draws:
    """Where SeedDropout gets its masks during one batched forward: the K seeds' generators, their own
    batch widths, and the seed index (a tensor batched by vmap, so indexing [K, ...] masks with it gives
    each seed its own)."""

    def __init__(self):
        self.gens: list[torch.Generator] = []
        self.widths: list[int] = []
        self.index: torch.Tensor | None = None

    def noise(
        self, shape: torch.Size, seq_dims: tuple[int, ...], p: float, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """Per-seed keep-mask / (1 - p) of `shape`: seed k's drawn at its own width along `seq_dims`, padded
        (dropped) to the step's width."""
        draws = []
        for g, w in zip(self.gens, self.widths, strict=True):
            own = [w if d in seq_dims else n for d, n in enumerate(shape)]
            pad = [x for d in reversed(range(len(shape))) for x in (0, shape[d] - own[d])]
            draws.append(F.pad(torch.rand(own, generator=g, device=device), pad, value=1.0))
        noise = (
            (torch.stack(draws) < 1.0 - p).to(dtype).div_(1.0 - p)
        )  # ATen's dropout: mask in x's dtype / (1-p)
        return noise[self.index]


_DRAWS = _Draws()


class SeedDropout(torch.nn.Dropout):
    """nn.Dropout whose masks come from each seed's own generator (_DRAWS). Hidden states are
    [batch, width, hidden], the pooled [CLS] [batch, hidden]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.dim() not in (2, 3):
            raise RuntimeError(
                f"SeedDropout expects [batch, hidden] or [batch, width, hidden], got {tuple(x.shape)}"
            )
        return x * _DRAWS.noise(x.shape, (1,) if x.dim() == 3 else (), self.p, x.dtype, x.device)


def _seed_drop(probs: torch.Tensor, p: float) -> torch.Tensor:
    """SeedDropout's masks on the attention probabilities [batch, heads, width, width]."""
    return probs * _DRAWS.noise(probs.shape, (2, 3), p, probs.dtype, probs.device)


register_dropout_attention("seed", _seed_drop)  # `seed-eager` / `seed-sdpa`, once, at import

_DROPOUT_FUNCS = {
    F.dropout,
    torch.dropout,
    F.dropout1d,
    F.dropout2d,
    F.dropout3d,
    F.alpha_dropout,
    torch.bernoulli,
    torch.Tensor.bernoulli_,
}


class _NoStrayDropout(TorchFunctionMode):
    """Inside the vmapped training forward (randomness="same"), a dropout that is not SeedDropout would
    give every seed the same mask: refuse it. Checked on the first training forward only (a Python call per
    torch op costs milliseconds per step; the dropout sites are the same at every step)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUT_FUNCS:
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.get("training", args[2] if len(args) > 2 else True)
            if func in (torch.bernoulli, torch.Tensor.bernoulli_) or (training and p > 0):
                raise RuntimeError(
                    f"{getattr(func, '__name__', func)} inside a batched-seeds step: its mask would "
                    "be shared by all seeds (impl.finetune_batched_seeds handles nn.Dropout "
                    "modules and HF attention dropout only)"
                )
        if func is F.scaled_dot_product_attention and kwargs.get("dropout_p", 0.0) > 0:
            raise RuntimeError(
                "SDPA with dropout inside a batched-seeds step: its mask would be shared by all seeds"
            )
        return func(*args, **kwargs)


def _prepare_base(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The module functional_call runs: a structural copy (on the meta device: the stacked tensors are
    passed in) with SeedDropout for every nn.Dropout and the seed-<kernel> attention function. SDPA
    becomes eager on CPU, where torch has no vmap rule for its kernel (it would loop over the seeds);
    the two kernels are loss-neutral (tests/test_model.py)."""
    base = copy.deepcopy(model).to("meta")
    for module in list(base.modules()):
        for name, child in module.named_children():
            if isinstance(child, torch.nn.Dropout) and not isinstance(child, SeedDropout):
                setattr(module, name, SeedDropout(child.p))
    conf = base.bert.config  # every layer reads this one config object (deepcopy keeps the sharing)
    kernel = conf._attn_implementation.removeprefix("bits-")
    kernel = "eager" if kernel == "sdpa" and device.type == "cpu" else kernel
    if not kernel.startswith("seed-"):
        conf._attn_implementation = f"seed-{kernel}"
    return base


def _mask_4d(mask: torch.Tensor, kernel: str) -> torch.Tensor:
    """[..., batch, width] 0/1 -> the prepared [..., batch, 1, 1, width] mask HF passes through as is:
    bool (True = attend) for SDPA, additive fp32 (0 / finfo.min) for eager, as HF's own mask functions."""
    keep = mask.bool()[..., :, None, None, :]
    if kernel.endswith("sdpa"):
        return keep
    return torch.zeros(keep.shape, dtype=torch.float32, device=mask.device).masked_fill_(
        ~keep, torch.finfo(torch.float32).min
    )


def dropout_seed(seed: int, step: int) -> int:
    """The seed of one seed's dropout generator at one step: a function of (seed, step) only."""
    s = np.random.SeedSequence([seed, step, DROPOUT_TAG]).generate_state(2, dtype=np.uint32)
    return int(s[0]) << 31 | int(s[1]) >> 1  # 62 bits: every generator type takes it


# --------------------------------------------------------------------------- the stacked classifiers
class SeedBatch:
    """K fine-tuning seeds of one encoder, trained as one stacked model (what `study plan` can time too).

    `step(...)` is one optimizer step of all K seeds on their own [K, batch, width] batches; `predict`
    scores a split with every seed's model at once."""

    def __init__(
        self,
        cfg: RunConfig,
        bert: torch.nn.Module,
        num_labels: int,
        seeds: list[int],
        rt: Runtime,
        total_steps: int,
        warmup: int,
    ):
        ft = cfg.finetune
        self.seeds, self.k, self.rt = list(seeds), len(seeds), rt
        devices = [rt.device.index or 0] if rt.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # Linear's own init draws: leave the caller's RNG alone
            models = []
            for seed in self.seeds:
                torch.manual_seed(seed)
                # the encoder is shared, not copied: stack_module_state copies its tensors K times
                models.append(
                    Classifier(
                        bert,
                        num_labels,
                        cfg.model.dropout,
                        cfg.model.init_range,
                        torch.Generator().manual_seed(seed),
                        ft.pooling,
                    )
                )
        params, _ = stack_module_state(models)
        self.params = {n: p.detach().to(rt.device).requires_grad_() for n, p in params.items()}
        self.buffers = {n: b.to(rt.device) for n, b in models[0].named_buffers()}  # the same for every seed
        self.base = _prepare_base(models[0], rt.device)
        self.kernel = self.base.bert.config._attn_implementation
        self.dropout = cfg.model.dropout > 0 or cfg.model.attention_dropout > 0
        self.gens = [torch.Generator(device=rt.device) for _ in self.seeds]
        ndim = {n: p.ndim for n, p in models[0].named_parameters()}
        decay = [p for n, p in self.params.items() if ndim[n] >= 2]  # runtime.param_groups' rule, unstacked
        no_decay = [p for n, p in self.params.items() if ndim[n] < 2]
        fused = {"fused": True} if cfg.impl.fused_optimizer and rt.device.type in ("cpu", "cuda") else {}
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": ft.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=ft.lr,
            betas=ADAM_BETAS,
            eps=ADAM_EPS,
            **fused,
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(total_steps, warmup))
        self._seed_ix = torch.arange(self.k, device=rt.device)
        self._checked = (
            False  # the first training forward runs under _NoStrayDropout (the same code every step)
        )

    # ---- forward
    def _forward(self, params, seed_ix, ids, types, mask, pool):
        _DRAWS.index = seed_ix
        return functional_call(
            self.base,
            (params, self.buffers),
            (),
            {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "pool_mask": pool},
        )

    def forward(self, batch: dict[str, torch.Tensor], train: bool) -> torch.Tensor:
        """Logits [K, batch, labels]; `batch` tensors are [K, batch, width] (train) or [batch, width]
        (the same rows for every seed: prediction)."""
        self.base.train(train)
        dims = 0 if train else None
        mask = _mask_4d(batch["attention_mask"], self.kernel)
        fn = vmap(self._forward, in_dims=(0, 0, dims, dims, dims, dims), randomness="same")
        check = train and self.dropout and not self._checked
        with self.rt.autocast(), _NoStrayDropout() if check else contextlib.nullcontext():
            logits = fn(
                self.params,
                self._seed_ix,
                batch["input_ids"],
                batch["token_type_ids"],
                mask,
                batch["attention_mask"],
            ).float()
        self._checked = self._checked or check
        return logits

    # ---- one optimizer step
    def step(
        self,
        step: int,
        batch: dict[str, torch.Tensor],
        y: torch.Tensor,
        regression: bool,
        widths: list[int] | None = None,
    ) -> list[float]:
        """One AdamW step of every seed on `batch` ([K, batch, width]); `widths`: each seed's own longest row
        (from the mask when not given). Returns the K losses (one device sync per step, as the sequential
        loop's loss.item()). A non-finite loss raises FloatingPointError before any update."""
        if self.dropout:
            for g, seed in zip(self.gens, self.seeds, strict=True):
                g.manual_seed(dropout_seed(seed, step))
            _DRAWS.gens = self.gens
            _DRAWS.widths = widths or batch["attention_mask"].sum(-1).amax(-1).tolist()
        try:
            logits = self.forward(batch, train=True)
        finally:
            _DRAWS.gens, _DRAWS.widths, _DRAWS.index = [], [], None
        losses = vmap(lambda lg, t: task_loss(regression, lg, t))(logits, y)
        values = losses.tolist()
        bad = [s for s, v in zip(self.seeds, values, strict=True) if not math.isfinite(v)]
        if bad:
            raise FloatingPointError(
                f"non-finite fine-tuning loss {[values[self.seeds.index(s)] for s in bad]} "
                f"(seed {', '.join(map(str, bad))})"
            )
        self.opt.zero_grad(set_to_none=True)
        losses.sum().backward()  # the seeds share no parameter: each gets its own loss's gradient
        self._clip()
        self.opt.step()
        self.sched.step()
        return values

    def _clip(self) -> None:
        """clip_grad_norm_(GRAD_CLIP) per seed: each seed's global norm over its own gradients."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        norms = torch.stack([torch.linalg.vector_norm(g.reshape(self.k, -1), dim=1) for g in grads])  # [P, K]
        total = torch.linalg.vector_norm(norms, dim=0)
        coef = (GRAD_CLIP / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))

    # ---- prediction
    @torch.no_grad()
    def predict(self, e: Encoded) -> np.ndarray:
        """Logits [K, rows, labels] of every seed's model, rows in split order."""
        out = []
        for idx in eval_batches(e):
            out.append((idx, self.forward(collate(e, idx, self.rt.device), train=False).cpu().numpy()))
        preds = np.zeros((self.k, len(e), out[0][1].shape[-1]), dtype=np.float32)
        for idx, logits in out:
            preds[:, idx] = logits
        return preds


def collate_seeds(e: Encoded, idxs: list[np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """K batches padded to their common longest row: tensors [K, batch, width]."""
    width = max(len(e.ids[i]) for idx in idxs for i in idx)
    parts = [collate(e, idx, torch.device("cpu"), width=width) for idx in idxs]
    return {k: torch.stack([p[k] for p in parts]).to(device) for k in parts[0]}


def finetune_seeds(
    cfg: RunConfig,
    spec: TaskSpec,
    bert: torch.nn.Module,
    train: Encoded,
    dev: Encoded,
    seeds: list[int],
    rt: Runtime,
    desc: str,
    quiet: bool,
) -> dict[int, dict]:
    """`finetune._finetune_one` for several seeds at once: seed -> the same result record fields
    (metrics, steps, train_loss, wall_s: the group's wall time / K, plus the seeds batched together). A seed
    whose dev predictions are not all finite is left out (the caller trains it alone)."""
    ft = cfg.finetune
    t0 = time.time()
    steps_per_epoch = math.ceil(len(train) / ft.batch_size)
    total = max(1, math.ceil(ft.epochs * steps_per_epoch))
    warmup = int(round(ft.warmup * total))
    sb = SeedBatch(cfg, bert, spec.num_labels, seeds, rt, total, warmup)
    labels = torch.from_numpy(train.labels)
    losses: list[list[float]] = []
    step = 0
    bar = tqdm(total=total, desc=desc, unit="step", disable=quiet, leave=False)
    for epoch in range(math.ceil(ft.epochs)):
        per_seed = [epoch_batches(train, ft, seed, epoch) for seed in seeds]
        for b in range(len(per_seed[0])):
            if step >= total:
                break
            idxs = [batches[b] for batches in per_seed]
            y = torch.stack([labels[torch.from_numpy(idx)] for idx in idxs]).to(rt.device)
            widths = [max(len(train.ids[i]) for i in idx) for idx in idxs]
            try:
                losses.append(
                    sb.step(step, collate_seeds(train, idxs, rt.device), y, spec.is_regression, widths)
                )
            except FloatingPointError as exc:
                raise FloatingPointError(f"{exc} at step {step} ({spec.name})") from None
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses[-1]):.3f}", refresh=False)
    bar.close()
    preds = sb.predict(dev)
    wall = round((time.time() - t0) / len(seeds), 3)
    tail = np.asarray(losses[-max(1, steps_per_epoch // 4) :])  # [steps, K]: the last quarter epoch
    out = {}
    for k, seed in enumerate(seeds):
        p = preds[k] if not spec.is_regression else preds[k, :, 0]
        if not np.isfinite(p).all():
            # left out, so finetune.py trains it alone (as after a stacked step's non-finite loss) and records it
            # diverged there: whether a seed scores never depends on this speed setting
            print(
                f"batched fine-tuning: {spec.name} seed {seed} has non-finite dev predictions; trained again "
                f"alone",
                file=sys.stderr,
            )
            continue
        out[seed] = {
            "metrics": compute_metrics(spec, p, dev.labels),
            "steps": step,
            "train_loss": float(np.mean(tail[:, k])),
            "wall_s": wall,
            "batched_seeds": list(seeds),
        }
    return out
