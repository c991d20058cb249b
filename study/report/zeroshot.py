"""The zero-shot evaluations in the tables and the report: BLiMP and cross-sentence context use (study/zeroshot/).

Aggregation (study/report/aggregate.py calls two functions here):
- `rows(layout, run_key, init, base, hashes)`: one tidy row per metric of each zero-shot result file of an
  encoder (BLiMP accuracy overall and per phenomenon `accuracy:<linguistics_term>`, cross-sentence `gain`,
  `gain_se`, `win_rate`, and the number of pairs). The headline metrics (`HEADLINE`) also go to the study's
  tidy table and so to its summary, comparisons and pre-trained-vs-random rows; the per-phenomenon ones stay
  in `zeroshot.csv` (per run) and `zeroshot_summary.csv` (per level, with CIs), out of the Holm family.
- `write(out, detail, summary, layout, plan)`: those two tables and `zeroshot.json`: the methods (pairs,
  metric) read from the result files and the BLiMP paper's models and human agreement read from the
  BLiMP folder (`models_summary.jsonl`, `human_validation_summary.csv`, beside zeroshot.blimp_zip), so the
  report re-renders from the study folder alone.

The report's section is study/report/zeroshot_view.py.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd

from study.io import atomic_write_json, atomic_write_text, read_json
from study.metrics import BLIMP, CROSS_SENTENCE, ZEROSHOT
from study.paths import Layout
from study.rundir import RunDir

HEADLINE = {(BLIMP, "accuracy"), (CROSS_SENTENCE, "gain"), (CROSS_SENTENCE, "win_rate")}
PAPER_MODELS = {"ngram": "5-gram", "lstm": "LSTM", "txl": "Transformer-XL", "gpt2": "GPT-2"}
DEFAULT_BLIMP = "../shared/data/blimp/BLiMP.zip"


# --------------------------------------------------------------------------- aggregation
def rows(layout: Layout, run_key: str, init: str, base: dict, hashes: dict[str, str]) -> list[dict]:
    out = []
    for evaluation, h in sorted((hashes or {}).items()):
        path = layout.zeroshot_file(run_key, evaluation, h)
        try:
            res = read_json(path)
        except (OSError, ValueError):
            continue  # not scored (yet): no rows, as a missing fine-tune result
        for m, v in res.get("metrics", {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append(
                    {
                        **base,
                        "source_key": run_key,
                        "finetune_seed": None,
                        "task": evaluation,
                        "mode": ZEROSHOT,
                        "init": res.get("init", init),
                        "metric": m,
                        "value": float(v),
                        "pll": (res.get("recipe") or {}).get("pll"),
                    }
                )
    return out


def headline(detail: list[dict]) -> list[dict]:
    """The rows that enter the study's tidy table (without the zero-shot-only columns)."""
    return [
        {k: v for k, v in r.items() if k != "pll"} for r in detail if (r["task"], r["metric"]) in HEADLINE
    ]


def _blimp_dir(layout: Layout, plan: dict) -> Path:
    for r in plan.get("runs", []):
        z = RunDir(layout, r["run_hash"]).config().get("zeroshot")
        if isinstance(z, dict) and z.get("blimp_zip"):
            return Path(z["blimp_zip"]).parent
    return Path(DEFAULT_BLIMP).parent


def papers(blimp_dir: Path) -> list[dict]:
    """The BLiMP paper's LMs and human agreement, overall and per phenomenon, as fractions ([] when absent)."""
    out: list[dict] = []
    models, humans = blimp_dir / "models_summary.jsonl", blimp_dir / "human_validation_summary.csv"
    if not models.is_file():
        return out
    lines = [json.loads(x) for x in models.read_text().splitlines() if x.strip()]
    for r in lines:
        if r["UID"] == "overall":
            out += [
                {"source": name, "term": r["linguistics_term"], "value": r[k]}
                for k, name in PAPER_MODELS.items()
            ]
    if humans.is_file():
        term_of = {r["UID"]: r["linguistics_term"] for r in lines if r["UID"] != "overall"}
        with humans.open() as f:
            agree = {r["Condition"]: float(r["total_mean"]) for r in csv.DictReader(f)}
        by: dict[str, list[float]] = {}
        for uid, v in agree.items():
            if uid in term_of:
                by.setdefault(term_of[uid], []).append(v)
                by.setdefault("overall", []).append(v)
        out += [{"source": "human", "term": t, "value": sum(v) / len(v)} for t, v in sorted(by.items())]
    return out


def write(out: Path, detail: list[dict], summary: pd.DataFrame, layout: Layout, plan: dict) -> None:
    cols = ["run_hash", "source_key", "label", "init", "task", "metric", "value", "pll"]
    df = pd.DataFrame(detail)
    atomic_write_text(out / "zeroshot.csv", df.to_csv(index=False) if len(df) else ",".join(cols) + "\n")
    atomic_write_text(out / "zeroshot_summary.csv", summary.to_csv(index=False))
    methods = {}
    for ev in (BLIMP, CROSS_SENTENCE):
        part = df[(df["task"] == ev)] if len(df) else df
        n = sorted({int(v) for v in part[part["metric"] == "pairs"]["value"]}) if len(part) else []
        methods[ev] = {"pairs": n, "pll": sorted({str(p) for p in part["pll"].dropna()}) if len(part) else []}
    atomic_write_json(out / "zeroshot.json", {"methods": methods, "papers": papers(_blimp_dir(layout, plan))})
