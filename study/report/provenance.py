"""The report's Provenance section: which code (pre-training and fine-tuning commits), hardware and
packages produced a study's results, and the per-run table (hashes, finish date, precision, cost).

Read from study.json's `provenance` (each run's meta.json record) and `finetune_provenance` (the git
record of each fine-tune result file); an aggregate written before the latter existed lists
pre-training commits only. No torch import: the report re-renders from the aggregate alone.
"""

from __future__ import annotations

import math

import pandas as pd

from study.provenance import git_info

RUN_FIELDS = (
    "run_hash",
    "label",
    "seed",
    "status",
    "error",
    "step",
    "params",
    "tokens_seen",
    "tokens_per_s",
    "wall_s",
    "device",
    "data_hash",
    "finished",
    "precision",
)


def records(df: pd.DataFrame) -> list[dict]:
    """Rows as dicts with NaN turned into None (the template prints None as a dash); every RUN_FIELDS
    key present, so an aggregate written before a column existed still renders."""
    return [
        {
            **dict.fromkeys(RUN_FIELDS),
            **{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()},
        }
        for r in df.to_dict("records")
    ]


def commit_label(git: dict | None) -> str:
    """A commit as the report writes it. `dirty` None (a `git archive` copy has no work tree to ask)
    is not clean: printed as unknown, with the source that could not tell."""
    g = git or {}
    dirty = g.get("dirty")
    state = (
        " (dirty)"
        if dirty
        else ""
        if dirty is False
        else f" (dirty state unknown: {g.get('source') or 'no source recorded'})"
    )
    return f"{g.get('commit') or 'unknown'}{state}"


def _counts(n_pre: int, n_ft: int) -> str:
    parts = [f"{n_pre} pre-training run(s)" if n_pre else "", f"{n_ft} fine-tune result(s)" if n_ft else ""]
    return ", ".join(p for p in parts if p)


def provenance_section(sf) -> dict:
    """What the template's Provenance section shows, from a studyfiles.StudyFiles."""
    prov = sf.study.get("provenance") or {}
    pre: dict[str, list] = {}
    hardware, packages = {}, {}
    for h, p in prov.items():
        pv = p.get("provenance") or {}
        pre.setdefault(commit_label(pv.get("git")), []).append(h)
        hw = pv.get("hardware") or {}
        hkey = ", ".join(f"{k}={v}" for k, v in hw.items() if v is not None) or f"device={p.get('device')}"
        hardware.setdefault(hkey, []).append(h)
        for name, ver in (pv.get("packages") or {}).items():
            packages.setdefault(name, set()).add(str(ver))
    ft: dict[str, int] = {}  # fine-tuning may have run on other code than its encoder's pre-training
    for git in (sf.study.get("finetune_provenance") or {}).values():
        key = commit_label(git)
        ft[key] = ft.get(key, 0) + 1
    commits = {c: _counts(len(pre.get(c, [])), ft.get(c, 0)) for c in dict.fromkeys([*pre, *ft])}
    runs = records(sf.runs) if not sf.runs.empty else []
    try:  # what rendered this report (git only: no torch)
        rendered = git_info()
    except Exception:  # noqa: BLE001 - provenance of the renderer is nice to have, not required
        rendered = {}
    unknown = len(pre.get("unknown", []))
    uncommitted = (
        f"{unknown} of {len(prov)} runs record no code commit (git could not name one where they "
        f"ran): which code produced them cannot be checked from this report."
        if unknown
        else None
    )
    return {
        "commits": commits,
        "hardware": hardware,
        "uncommitted": uncommitted,
        "packages": {k: ", ".join(sorted(v)) for k, v in sorted(packages.items())},
        "mixed_packages": sorted(k for k, v in packages.items() if len(v) > 1),
        "runs": runs,
        "ci_method": sf.study.get("ci_method"),
        "test": sf.study.get("test"),
        "rendered": {**rendered, "label": commit_label(rendered) if rendered else "unknown"},
        "spec": sf.plan.get("spec"),
        "profile": sf.plan.get("profile"),
        "finetune_hash": sf.plan.get("finetune_hash"),
    }
