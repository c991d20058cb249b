"""Keep the DVC pipeline in step with the specs and the selection: `study sync` writes `dvc.yaml`
and `study_runs.yaml` for the ACTIVE studies only.

The selection is `params.yaml`'s `studies:` list, committed: `smoke` (a spec at its default scale),
`nsp@cpu` (at a profile) or `{spec: nsp, profile: cpu}`. `study select` / `study deselect` edit it and
sync. A bare `dvc repro` reproduces exactly the selected studies; deselecting a study removes its
stages, never its results (results/ is only ever written by stages, never deleted by `sync`).

The pipeline's shape is set by what a no-op costs (docs/RESULTS.md "DVC no-op at scale",
bench/dvc_scale.py). On every `dvc status` / `dvc repro`, DVC parses dvc.yaml and dvc.lock in pure Python
(`repro` twice), re-hashes every dependency and output from its state database, and rewrites
.dvc/tmp/rwlock per stage (`repro`: 8 times). With a stage per study step and every run and fine-tune
folder declared as an output, 50 studies x 20 runs took 39 s for `dvc status`. So:

- Run and fine-tune folders are not DVC outputs but the harness's own content-addressed cache (a finished
  run is never retrained, a fine-tune result never redone). DVC tracks pipeline/study-<s>.json, written by
  `study sync --stamp study-<s>`: each run's status and folder digest, and a digest of the study's own
  results in each fine-tune folder. A no-op reads a few entries per study, whatever its size.
- One stage per study, `study-<s>`: pretrain, finetune, aggregate, report, stamp. Each command reuses what
  is done, so a rerun costs what changed (a new factor level trains one run, a new recipe fine-tunes).
- `code-study` (`code-search`): one digest of the code the study stages run, so a study stage depends on
  one file, not on twenty code paths hashed again per study (a module added inside a folder counts).
- `data-<data_hash>`: results/data/<data_hash> (a DVC output) and its digest pipeline/data-<hash>.json; it
  depends on the local corpus files and folders the spec names (study stages do not depend on the GLUE
  folders: a machine without them runs the study and reports those tasks as skipped; see pipeline_document).
- The stamps in pipeline/ are `cache: false` outputs that git carries (`study sync` writes placeholders
  until their stages run): every dependency of a study stage exists in a fresh clone, as `dvc repro
  --dry` needs (treeverse/dvc#9021: DVC hashes a missing upstream output and fails).
- The studies' metrics files and loss plots are top-level `metrics:` / `plots:` entries, not outputs.

Each study's stage depends on its own work only: a run (or random-init baseline) two selected studies share
is trained by whichever stage runs first, and fine-tuned by each with its own recipe only.

What DVC does not see: a run folder changed outside a stage (`study rescore`, a deleted folder); then
`dvc repro -f -s study-<s>`, which retrains nothing that is finished. `dvc push` / `dvc pull` carry the
data folders, aggregates and reports, git the stamps; run folders (models) are copied as files.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from study.errors import StudyError
from study.io import atomic_write_text, canonical_json
from study.studies.pipeline import (
    DVC,
    MANIFESTS,
    manifest,
    pipeline_document,
    pipeline_text,
    plot_file,
    render,
    runs_document,
)
from study.studies.selection import (
    SELECTION_FILE,
    check_entry,
    default_selection,
    parse_entry,
    read_selection,
    selection_entry,
    write_selection,
)

# --------------------------------------------------------------------------- the generated files


def _generated(ablations: Path, out: Path) -> tuple[dict, list[tuple[Path, str]], list[Path]]:
    """The document, the generated files with their text, and the stamps the study stages depend on."""
    sel_path = out.parent / SELECTION_FILE
    selection = read_selection(sel_path)
    if selection is None:
        selection = default_selection(ablations)
    doc = runs_document(ablations, selection, str(sel_path))
    pipe = pipeline_document(doc)
    stamps = sorted(
        {
            out.parent / d
            for n, st in pipe["stages"].items()
            if not n.startswith(("code-", "data-"))
            for d in st.get("deps", [])
            if d.startswith(MANIFESTS + "/")
        }
    )
    return doc, [(out, render(doc)), (out.parent / "dvc.yaml", pipeline_text(doc))], stamps


def _placeholder(path: Path) -> str:
    """A stamp before its stage first ran. It is committed, so that in a fresh clone every dependency of a
    study stage exists and `dvc repro --dry study-<s>` answers (treeverse/dvc#9021); the stage replaces it."""
    pending = "written by `study sync`; replaced when the stage runs"
    return canonical_json({"stage": path.stem, "pending": pending}) + "\n"


def write_runs_file(ablations: Path, out: Path) -> bool:
    """Write study_runs.yaml and dvc.yaml next to it (and params.yaml's selection when it has none, and a
    placeholder for each missing stamp a study stage depends on); True when anything changed."""
    sel_path = out.parent / SELECTION_FILE
    _, files, stamps = _generated(ablations, out)  # a StudyError here leaves every file as it was
    if read_selection(sel_path) is None:  # explicit from now on: the selection is a committed file
        write_selection(sel_path, default_selection(ablations))
    changed = False
    for path, text in [*files, *((p, _placeholder(p)) for p in stamps if not p.exists())]:
        if not (path.exists() and path.read_text() == text):
            atomic_write_text(path, text)
            changed = True
    return changed


def is_stale(ablations: Path, out: Path) -> bool:
    _, files, stamps = _generated(ablations, out)
    return any(not p.exists() or p.read_text() != t for p, t in files) or not all(p.exists() for p in stamps)


def change_selection(ablations: Path, out: Path, spec: str, profile: str | None, add: bool) -> str:
    """`study select` / `study deselect`: edit params.yaml, then sync. Returns a one-line summary."""
    sel_path = out.parent / SELECTION_FILE
    selection = read_selection(sel_path)
    if selection is None:
        selection = default_selection(ablations)
    named = Path(spec)
    if named.suffix == ".yaml" and named.resolve().parent != ablations.resolve():
        # the selection names specs of the ablations folder: a file elsewhere with the same name is not it
        raise StudyError(
            f"{spec} is not in {ablations}",
            field="study",
            allowed=f"a spec name (e.g. nsp) or a .yaml file in {ablations}",
        )
    spec, at = parse_entry(spec, 0, "command line")
    if at is not None and profile is not None and at != profile:
        raise StudyError(
            f"names profile {at!r} and --profile {profile!r}",
            field="--profile",
            allowed="one of the two, or the same profile in both",
        )
    profile = profile if profile is not None else at
    entry = (spec, profile)
    if add:
        if entry in selection and sel_path.exists():  # a no-op: rewriting would drop the file's comments
            return f"{selection_entry(*entry)} is already selected; {SELECTION_FILE} unchanged"
        if entry not in selection:
            check_entry(ablations, spec, profile, "spec", "--profile", "command line")  # fails before writing
            selection.append(entry)
    elif entry in selection:
        selection.remove(entry)
    else:
        raise StudyError(
            f"{selection_entry(*entry)} is not selected",
            field="study",
            source=str(sel_path),
            allowed=", ".join(selection_entry(*e) for e in selection) or "nothing is selected",
        )
    runs_document(
        ablations, selection, str(sel_path)
    )  # every remaining study checked (e.g. two specs with one
    write_selection(sel_path, selection)  # name) before params.yaml is written
    write_runs_file(ablations, out)
    return f"selected: {', '.join(selection_entry(*e) for e in selection) or 'none'}"


def study_stages(folder: Path) -> set[str]:
    """The study names with a `study-<s>` stage in folder/dvc.yaml (none: no file, or unreadable)."""
    try:
        stages = yaml.safe_load((folder / "dvc.yaml").read_text()).get("stages") or {}
    except (OSError, AttributeError, yaml.YAMLError):
        return set()
    return {k.removeprefix("study-") for k in stages if k.startswith("study-")}


def forget_studies(folder: Path, names: set[str]) -> list[Path]:
    """After a deselect: the files a removed study's stages left in folder (their stamps in pipeline/, the
    metrics and plot copies git carries), removed; its results and reports stay. Returns what was removed."""
    files = [
        folder / p
        for n in sorted(names)
        for p in (
            manifest(f"study-{n}"),
            manifest(f"search-{n}"),
            DVC.metrics_file(f"study-{n}").as_posix(),
            plot_file(n),
        )
    ]
    gone = [p for p in files if p.is_file()]
    for p in gone:
        p.unlink()
    return gone
