"""The MLM loss's vocabulary projection and cross-entropy, computed a few rows at a time (`impl.mlm_loss`).

Why: on a CPU the cross-entropy over the asked positions' logits, not the projection, was the largest cost
of a cpu-profile step at high masking rates. At 60% masking (2,458 asked rows x 8,192 words, fp32, one
thread) a profile of the step had `log_softmax` and its backward at 37% of the time and the three
projection matmuls at 28%: the [rows, vocab] logits (80 MB) pass through memory six times, and each pass
runs at memory speed. Here the logits of `CHUNK` rows at a time (2 MB) are made, turned into the loss and
their gradient, and used for the backward matmuls while they are still in the cache; the full logits never
exist. Measured here on those shapes: projection + loss + backward 184 ms instead of 347 (docs/RESULTS.md).

What it changes: nothing but float rounding. The loss is the same mean over the rows of logsumexp minus the
target's logit, and the gradients the same softmax-minus-one-hot; only the order of the sums differs (the
weight's and bias's gradients are summed chunk by chunk). tests/test_model.py compares loss and gradients with
`F.cross_entropy(F.linear(...))`; tests/test_train.py a training curve. The gradients are computed in the
forward pass and handed out in the backward pass, scaled by the incoming gradient (as Liger's fused linear
cross-entropy does): one pass over the chunks instead of two.

Every row must be an asked position (no ignore index): the sparse MLM head passes only those.
"""

from __future__ import annotations

import torch

CHUNK = 64  # rows per chunk: 64 x 8,192 fp32 logits = 2 MB (the fastest of 32-512 here: 184-218 ms)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        h: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        target: torch.Tensor,
        chunk: int,
    ) -> torch.Tensor:
        n = h.shape[0]
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros_like(weight)
        grad_b = torch.zeros_like(bias) if bias is not None else None
        total = h.new_zeros((), dtype=torch.float64)
        for s in range(0, n, chunk):
            hc, tc = h[s : s + chunk], target[s : s + chunk]
            z = torch.addmm(bias, hc, weight.t()) if bias is not None else hc @ weight.t()  # [c, vocab]
            z.sub_(z.amax(1, keepdim=True))
            picked = z.gather(1, tc[:, None]).squeeze(1)  # target logit minus the row max
            z.exp_()
            norm = z.sum(1, keepdim=True)
            total += (norm.squeeze(1).log() - picked).sum(dtype=torch.float64)
            z.div_(norm)  # softmax
            z[torch.arange(z.shape[0], device=z.device), tc] -= 1.0  # minus the one-hot target
            z.mul_(1.0 / n)  # d(mean loss) / d(logits)
            torch.mm(z, weight, out=grad_h[s : s + chunk])
            grad_w.addmm_(z.t(), hc)
            if grad_b is not None:
                grad_b.add_(z.sum(0))
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.has_bias = bias is not None
        # no rows: the mean over nothing is NaN, as F.cross_entropy's (the training step skips such parts)
        return (total / n).to(h.dtype) if n else h.new_full((), float("nan"))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        return grad_h * grad, grad_w * grad, (grad_b * grad if ctx.has_bias else None), None, None


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of `h @ weight.T + bias` against `target` ([rows, hidden], [vocab, hidden], [vocab],
    [rows]), as `F.cross_entropy(F.linear(h, weight, bias), target)` within float rounding, in fp32 (outside
    any autocast: the loss of bf16 logits would round its sums), `chunk` rows at a time (default CHUNK)."""
    with torch.autocast(h.device.type, enabled=False):
        return _LinearCrossEntropy.apply(
            h.float(), weight.float(), None if bias is None else bias.float(), target, chunk or CHUNK
        )
