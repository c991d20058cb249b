"""The feature-based probe (BERT Table 8's feature column): the frozen encoder's pooled vectors from its
last `probe_layers` layers, concatenated, and a scikit-learn logistic (classification) or ridge
(regression) head on standardised features.

The encoder is frozen and in eval mode and lbfgs is deterministic, so the probe depends on the encoder
alone: it is fitted once per task, and finetune.py writes the same result for every fine-tuning seed.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from tqdm import tqdm

from study.config import RunConfig
from study.downstream.classifier import mean_pool
from study.downstream.encode import Encoded, collate, eval_batches
from study.downstream.tasks import TaskSpec, compute_metrics
from study.runtime import Runtime

PROBE_C = 1.0  # inverse L2 strength of the logistic probe (standardised features)
PROBE_ALPHA = 1.0  # ridge strength of the regression probe
PROBE_MAX_ITER = 2000


def features(
    bert: torch.nn.Module, e: Encoded, layers: int, rt: Runtime, desc: str, quiet: bool, pooling: str = "cls"
) -> np.ndarray:
    """The last `layers` layers' [CLS] vectors (pooling "cls") or token means ("mean", padding excluded),
    concatenated: [n, layers * hidden]."""
    bert = bert.to(rt.device).eval()
    feats = np.zeros((len(e), layers * bert.config.hidden_size), dtype=np.float32)
    with torch.no_grad(), rt.autocast():
        for idx in tqdm(eval_batches(e), desc=desc, unit="batch", disable=quiet, leave=False):
            batch = collate(e, idx, rt.device)
            hs = bert(**batch, output_hidden_states=True).hidden_states
            vecs = [
                h[:, 0].float() if pooling == "cls" else mean_pool(h, batch["attention_mask"])
                for h in hs[-layers:]
            ]
            feats[idx] = torch.cat(vecs, dim=-1).cpu().numpy()
    return feats


def probe(
    cfg: RunConfig,
    spec: TaskSpec,
    bert: torch.nn.Module,
    train: Encoded,
    dev: Encoded,
    rt: Runtime,
    quiet: bool,
) -> dict:
    """Fit the probe on `train`'s features and score it on `dev`: {metrics, features, wall_s}."""
    # scikit-learn (~1 s to import) only when a probe is fitted, not for every fine-tune
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    t0 = time.time()
    k = cfg.finetune.probe_layers
    pool = cfg.finetune.pooling
    x_train = features(bert, train, k, rt, f"{spec.name} probe features (train)", quiet, pool)
    x_dev = features(bert, dev, k, rt, f"{spec.name} probe features (dev)", quiet, pool)
    # lbfgs is deterministic: no random_state needed, the probe depends on the encoder alone
    head = (
        Ridge(alpha=PROBE_ALPHA)
        if spec.is_regression
        else LogisticRegression(C=PROBE_C, max_iter=PROBE_MAX_ITER)
    )
    preds = make_pipeline(StandardScaler(), head).fit(x_train, train.labels).predict(x_dev)
    return {
        "metrics": compute_metrics(spec, preds, dev.labels),
        "features": int(x_train.shape[1]),
        "wall_s": round(time.time() - t0, 3),
    }
