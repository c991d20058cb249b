"""`study export RUN --to DIR [--push REPO]`: a finished run as a Hugging Face hub folder.

DIR holds the run's `model/` files as saved (config.json, the weights, the tokenizer: `AutoModelForMaskedLM`
and `AutoTokenizer.from_pretrained(DIR)` load it), `study_run.json` (the run's config, metrics and meta as
the harness wrote them) and a README.md model card: the recipe, the corpus and the tokens seen, the
reference MLM scores with their most-frequent-token floor, the downstream scores beside the random-init
baseline, the provenance (commit, packages, hardware) and the training data's licences. The folder is
built under a temporary name and renamed into place whole. `--push REPO` uploads it with huggingface_hub's
own `HfApi.upload_folder` (the hub's API, nothing re-implemented), after creating the repository if needed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from statistics import mean, stdev

from huggingface_hub import HfApi

from study.config import RunConfig
from study.errors import StudyError
from study.io import atomic_dir, atomic_write_text, read_json
from study.paths import Layout
from study.rundir import RunDir

# The terms of each corpus kind's text, as PROVENANCE.md of ../shared/data and the sources state them.
# A kind whose terms the harness cannot know (local text, a hub dataset) says so: the publisher must check.
LICENCES = {
    "embedded": "English Wikipedia sample shipped in the gensim wheel's test data: Wikipedia text, CC BY-SA "
    "3.0 (and GFDL)",
    "wikitext": "WikiText (Merity et al., 2016, Salesforce): Wikipedia text, CC BY-SA 3.0",
    "gutenberg": "Project Gutenberg eBooks: public domain in the USA under the Project Gutenberg License "
    "(its trademark terms are in each book's footer); check your own country's copyright law",
    "text": "local text files: their licence is not known to the harness; state it before publishing",
    "hf": "a Hugging Face dataset: see its dataset card for the licence",
}
SEMANTIC = ("tokenizer", "objective", "masking", "model", "train")  # the recipe's sections, as hashed


def find_run(layout: Layout, key: str) -> RunDir:
    """A run by its hash or a unique prefix of it."""
    runs = sorted(p.name for p in (layout.root / "runs").glob(f"{key}*") if p.is_dir()) if key else []
    if len(runs) != 1:
        raise StudyError(
            f"{'no run' if not runs else f'{len(runs)} runs'} under {layout.root / 'runs'} match {key!r}",
            field="RUN",
            allowed="a run hash (or a unique prefix), e.g. from `study plan SPEC`",
        )
    return RunDir(layout, runs[0])


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def downstream(layout: Layout, run_key: str) -> list[dict]:
    """Mean primary score per task, mode and fine-tune recipe of one encoder's result files."""
    by: dict[tuple, list[float]] = {}
    for f in sorted(layout.finetune_dir(run_key).glob("*/*/*-seed*.json")):
        r = read_json(f)
        if isinstance(r.get("primary"), (int, float)):
            key = (r["task"], r["mode"], r.get("primary_metric"), r.get("finetune_hash"))
            by.setdefault(key, []).append(float(r["primary"]))
    return [
        {
            "task": t,
            "mode": m,
            "metric": pm,
            "finetune_hash": fh,
            "mean": mean(v),
            "sd": stdev(v) if len(v) > 1 else None,
            "n": len(v),
        }
        for (t, m, pm, fh), v in sorted(by.items(), key=lambda kv: tuple(map(str, kv[0])))
    ]


def _baseline_key(config: dict) -> str | None:
    try:  # a config of an older harness may no longer validate: the card then has no baseline column
        return RunConfig.model_validate({k: v for k, v in config.items() if k != "run_hash"}).baseline_key()
    except Exception:  # noqa: BLE001 - any validation problem means the same: no baseline to look up
        return None


def _pct(v) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, (int, float)) else "-"


def model_card(run: RunDir, layout: Layout) -> str:
    """The README.md of an exported run."""
    cfg, m, meta = run.config(), run.metrics(), run.meta()
    h = cfg.get("run_hash", run.path.name)
    sources = (cfg.get("corpus") or {}).get("sources") or []
    kinds = sorted({s.get("kind") for s in sources if isinstance(s, dict)})
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        "language: [en]",
        "tags: [bert, masked-lm, study-harness]",
        "---",
        f"# BERT pre-trained by `study`, run {h}",
        "",
        f"A {cfg.get('model', {}).get('layers')}-layer, {cfg.get('model', {}).get('hidden')}-wide BERT "
        f"({m.get('params', '?'):,} parameters) trained for {m.get('steps', '?')} steps on "
        f"{m.get('tokens_seen', 0):,} tokens."
        if isinstance(m.get("params"), int)
        else f"BERT run {h}.",
        "Loads with `AutoModelForMaskedLM.from_pretrained` and `AutoTokenizer.from_pretrained` on this folder.",
        "",
        "## Recipe",
        "Every setting that enters the run hash (`study_run.json` holds the whole config):",
        "",
        "| setting | value |",
        "| --- | --- |",
        *(
            f"| `{k}` | {json.dumps(v)} |"
            for s in SEMANTIC
            for k, v in _flat(cfg.get(s) or {}, f"{s}.").items()
        ),
        f"| `seed` | {cfg.get('seed')} |",
        "",
        "## Training data",
        *(
            f"- `{s.get('kind')}` {s.get('path') or s.get('name') or ''}".rstrip()
            for s in sources
            if isinstance(s, dict)
        ),
        f"- tokens seen: {m.get('tokens_seen', '?'):,}"
        if isinstance(m.get("tokens_seen"), int)
        else "- tokens seen: ?",
        f"- sequences seen: {m.get('sequences_seen', '?')}, epochs: {m.get('epochs', '?')}",
        "",
        "### Licences of the training text",
        *(f"- {LICENCES.get(k, k)}" for k in kinds),
        "",
        "## Reference scores (held-out split, fixed 15% masks)",
        f"- MLM accuracy {_pct(m.get('ref_mlm_acc'))} (always predicting the most frequent token: "
        f"{_pct(m.get('ref_mode_acc'))}); at [MASK] {_pct(m.get('ref_mask_acc'))} (floor "
        f"{_pct(m.get('ref_mask_mode_acc'))})",
        f"- MLM loss {m.get('ref_mlm_loss')}, perplexity {m.get('ref_ppl')}",
        "",
        *_downstream_lines(layout, h, _baseline_key(cfg)),
        "## Provenance",
        *_provenance_lines(meta),
    ]
    return "\n".join(lines) + "\n"


def _downstream_lines(layout: Layout, run_hash: str, base_key: str | None) -> list[str]:
    ours = downstream(layout, run_hash)
    if not ours:
        return [
            "## Downstream scores",
            "Not fine-tuned (no results under results/finetune/ for this run).",
            "",
        ]
    base = {
        (r["task"], r["mode"], r["finetune_hash"]): r
        for r in (downstream(layout, base_key) if base_key else [])
    }

    def cell(r):
        sd = f" ± {100 * r['sd']:.1f}" if r.get("sd") is not None else ""
        return f"{100 * r['mean']:.1f}{sd} (n={r['n']})"

    rows = [
        f"| {r['task']} | {r['mode']} | {r['metric']} | {cell(r)} | "
        f"{cell(base[k]) if (k := (r['task'], r['mode'], r['finetune_hash'])) in base else '-'} | `{r['finetune_hash']}` |"
        for r in ours
    ]
    return [
        "## Downstream scores",
        "Dev sets (GLUE, each task under its own terms: see the GLUE paper and each task's source); mean ± SD "
        "over fine-tune seeds, x100.",
        "",
        "| task | mode | metric | this model | random init | fine-tune recipe |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ]


def _provenance_lines(meta: dict) -> list[str]:
    prov = meta.get("provenance") or {}
    git = prov.get("git") or {}
    pk = prov.get("packages") or {}
    hw = prov.get("hardware") or {}
    return [
        f"- code: commit {git.get('commit')}{' (dirty)' if git.get('dirty') else ''}",
        "- packages: " + ", ".join(f"{k} {v}" for k, v in sorted(pk.items())),
        "- hardware: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(hw.items()) if not isinstance(v, (dict, list))),
        f"- device {meta.get('device')}, wall time {meta.get('wall_s')} s",
        "",
    ]


def export_run(layout: Layout, key: str, to: Path) -> Path:
    """Write the hub folder for run `key` at `to` (refusing a folder that is not an earlier export)."""
    run = find_run(layout, key)
    if run.status().status != "done" or not run.has_model():
        raise StudyError(
            f"run {run.path.name} is {run.status().status}" + ("" if run.has_model() else ", with no model/"),
            field="RUN",
            allowed="a finished run (status done, with its model/ folder)",
        )
    if to.exists() and any(to.iterdir()) and not (to / "study_run.json").exists():
        raise StudyError(
            f"{to} is not empty", field="--to", allowed="a new or empty folder, or an earlier export"
        )
    card = model_card(run, layout)
    with atomic_dir(to) as tmp:
        for f in sorted((run.path / "model").iterdir()):
            (shutil.copytree if f.is_dir() else shutil.copy2)(f, tmp / f.name)
        atomic_write_text(
            tmp / "study_run.json",
            json.dumps(
                {"config": run.config(), "metrics": run.metrics(), "meta": run.meta()}, indent=2, default=str
            ),
        )
        atomic_write_text(tmp / "README.md", card)
    return to


def push(folder: Path, repo: str, private: bool = False) -> str:
    """Upload an exported folder to the hub repository `repo` (created if missing); returns its URL."""
    api = HfApi()
    api.create_repo(repo, repo_type="model", exist_ok=True, private=private)
    info = api.upload_folder(
        folder_path=str(folder), repo_id=repo, repo_type="model", commit_message="study export"
    )
    return str(getattr(info, "commit_url", None) or f"https://huggingface.co/{repo}")
