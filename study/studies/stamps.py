"""The stamps `study sync --stamp STAGE --of HASH` writes as a stage's last command: each run's status and
folder digest, the study's own fine-tune results, a digest of the code or data folder; and the loss-curve CSVs
dvc.yaml declares as plots. Digests are cached by (size, mtime, ctime, inode) so a no-op stays cheap.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import yaml

from study.errors import StudyError
from study.io import atomic_write_json, atomic_write_text, read_json, sha256_file
from study.paths import Layout
from study.rundir import RunDir
from study.studies.pipeline import CODE, MANIFESTS, curve_columns, stage_of, study_entry
from study.studies.spec import load_study


def _files(root: Path) -> list[Path]:
    """The files a digest covers, sorted: no bytecode, no hidden (temporary) files, no `checkpoints/`
    (a run's resume state, removed when it is done)."""
    if root.is_file():
        return [root]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in ("__pycache__", "checkpoints") and not d.startswith(".")
        )
        out += [
            Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".") and not f.endswith(".pyc")
        ]
    return out


class _Digests:
    """sha256 of files, reusing the last stamp's value for a file whose size, mtime, inode and ctime are
    unchanged (a stage that reruns does not read every model again; ctime, which no copy can set back,
    catches a same-size rewrite whose mtime was restored, `cp -p`); the cache lives in results/.cache/stamps/."""

    def __init__(self, cache: Path):
        self.cache, self.new = cache, {}
        try:
            self.old = read_json(cache) if cache.exists() else {}
        except (OSError, ValueError):
            self.old = {}

    def tree(self, root: Path, recipe: str | None = None) -> dict:
        """Digest of the files under root (with `recipe`: only those in <task>/<recipe>/ below it)."""
        h, files = hashlib.sha256(), _files(root)
        if recipe is not None:
            files = [f for f in files if f.relative_to(root).parts[1:2] == (recipe,)]
        for f in files:
            st, key = f.stat(), str(f)
            old = self.old.get(key)
            now = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
            sha = old[-1] if old and old[:-1] == now else sha256_file(f)
            self.new[key] = [*now, sha]
            rel = f.name if f == root else f.relative_to(root).as_posix()
            h.update(f"{rel}\0{sha}\n".encode())
        return {"files": len(files), "digest": h.hexdigest()[:16]}

    def save(self) -> None:
        atomic_write_json(self.cache, self.new)


def _run_status(results: Path, run_hash: str) -> str:
    return RunDir(Layout(root=results), run_hash).status().status  # no file, or an unreadable one: "pending"


def _write_curves(s: dict, results: Path, name: str) -> None:
    """results/plots/study-<s>.csv: step, then each run's training loss (`dvc plots show`, one line per run)."""
    by_step: dict[int, dict[str, float]] = {}
    columns = curve_columns(s)
    for col, h in columns:
        for ev in RunDir(Layout(root=results), h).loss_curve():
            by_step.setdefault(int(ev["step"]), {})[col] = ev["loss"]
    columns = [c for c, _ in columns]
    lines = [",".join(["step", *columns])]
    lines += [
        ",".join([str(step), *(str(row.get(c, "")) for c in columns)])
        for step, row in sorted(by_step.items())
    ]
    atomic_write_text(Layout(root=results).plot_file(f"study-{name}"), "\n".join(lines) + "\n")


def stamp(stage: str, runs_file: Path, results: Path, of: str | None = None) -> str:
    """`study sync --stamp STAGE [--of HASH]`, in a dvc.yaml stage's command: write pipeline/STAGE.json next to
    runs_file (module docstring). STAGE is code-<kind> (digests of the code paths), data-<hash> (of the data
    folder) or study-<name> (status and digest of each run folder, and of the study's own results in each
    fine-tune folder; it also writes the loss plot's file). One line back."""
    kind, _, name = stage.partition("-")
    lay = Layout(root=results)
    digests, note = _Digests(lay.cache_dir("stamps") / f"{stage}.json"), ""
    if kind == "code" and name in CODE:
        body = {"paths": {p: digests.tree(Path(p)) for p in CODE[name]}}
        what = f"{len(CODE[name])} code paths"
    elif kind == "data" and re.fullmatch(r"[0-9a-f]+", name):
        body = {"data": digests.tree(lay.data_dir(name))}
        what = f"{body['data']['files']} data files"
    elif kind == "study":
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML has it
        studies = (yaml.load(runs_file.read_text(), Loader=loader) if runs_file.exists() else None) or {}
        studies = studies.get("studies", {})
        if name not in studies:
            raise StudyError(
                f"no selected study {name!r} in {runs_file}",
                field="--stamp",
                source=str(runs_file),
                allowed=", ".join(sorted(studies)) or "none (run `study sync`)",
            )
        listed = studies[name]
        # the spec as it is now (what the stage's commands just ran), not as sync saw it
        root = runs_file.parent
        s = study_entry(
            listed["spec"], load_study(root / listed["spec"], profile=listed.get("profile")), root
        )
        if of is not None and of != stage_of(
            s
        ):  # e.g. `dvc exp run -S SPEC:...`: fine, but dvc.yaml lags behind
            note = (
                f"\nnote: {listed['spec']} now has other runs or another recipe than dvc.yaml was generated "
                "for: `study sync` brings dvc.yaml and study_runs.yaml up to date"
            )
        runs = {h: {"status": _run_status(results, h), **digests.tree(lay.run_dir(h))} for h in s["runs"]}
        # the study's own results in each fine-tune folder (<task>/<finetune hash>/), not other recipes'
        finetune = {
            k: digests.tree(lay.finetune_dir(k), recipe=v["finetune"])
            for k, v in [*s["runs"].items(), *s["baselines"].items()]
        }
        body = {"runs": runs, "finetune": finetune}
        _write_curves(s, results, name)
        done = sum(r["status"] == "done" for r in runs.values())
        what = (
            f"{len(runs)} runs ({done} done), {sum(f['files'] for f in finetune.values())} fine-tune results "
            f"in {len(finetune)} folders"
        )
    else:
        raise StudyError(
            f"not a stage that stamps: {stage!r}",
            field="--stamp",
            allowed=", ".join([*(f"code-{k}" for k in CODE), "data-HASH", "study-NAME"]),
        )
    out = runs_file.parent / MANIFESTS / f"{stage}.json"
    atomic_write_json(out, {"stage": stage, "of": of, **body})
    digests.save()
    return f"{out}: {what}{note}"
