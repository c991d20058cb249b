"""The project root: the folder every command works from, found as git and DVC find theirs.

A command run in a subfolder (`cd ablations && study plan smoke.yaml`) walks up from the working folder to
the first folder holding `params.yaml`, `dvc.yaml` or `.dvc/` and works there: `results/`, `reports/`,
`ablations/`, `study_runs.yaml` and a spec's relative corpus paths all mean the root's, as they do in the
DVC stages (which DVC runs from the root). Paths typed on the command line keep meaning what they meant
where they were typed. Where no folder up to `/` is a root, a command that would read or write the default
`results/` (or `reports/`, `ablations/`, `study_runs.yaml`) exits 2 naming the folders it looked in,
before anything is written: it never starts a second results folder under a subfolder. Typing the folder
(`--results DIR`) says where, and the command runs there without a root.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from study.errors import StudyError

# a DVC project's own marker (.dvc/, which `dvc init` makes) counts too: `git init; dvc init; study sync`
# is how a new project starts, before params.yaml and dvc.yaml exist
MARKERS = ("params.yaml", "dvc.yaml", ".dvc")

# The flags and positionals that name files or folders, relative to where they were typed (the positional
# `spec` of select/deselect may be a bare study name instead: only a .yaml path is a path).
_PATH_ARGS = ("spec", "specs", "results", "reports", "ablations", "out", "to")
# The default folders each command reads or writes; without a root, each must have been typed.
_USES = {"validate": (), "sync": ("ablations", "out"), "select": ("ablations", "out")}
_USES |= {"deselect": _USES["select"], "report": ("results", "reports"), "run": ("results", "reports")}
_USES |= {"new": ("ablations",)}
_DEFAULT_USES = ("results",)


def find_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds params.yaml, dvc.yaml or .dvc/, else None."""
    start = start.resolve()
    return next((d for d in (start, *start.parents) if any((d / m).exists() for m in MARKERS)), None)


def typed_flags(argv: list[str]) -> set[str]:
    """The long options typed in argv, by any prefix argparse accepts (`--res` is `--results`: an
    ambiguous prefix was refused by argparse already)."""
    out = set()
    for tok in argv:
        if tok.startswith("--") and len(tok) > 2:
            name = tok[2:].split("=", 1)[0].replace("-", "_")
            out |= {f for f in _PATH_ARGS if f.startswith(name)}
    return out


def _rebase(value, cwd: Path, root: Path):
    """A path typed in `cwd`, as seen from `root`: relative where it lies inside the root (so the spec
    path recorded is the one a user at the root types), absolute elsewhere."""
    if isinstance(value, list):
        return [_rebase(v, cwd, root) for v in value]
    if not isinstance(value, str):
        return value
    full = (cwd / value).resolve()
    return str(full.relative_to(root)) if full.is_relative_to(root) else str(full)


@contextlib.contextmanager
def project_root(args, argv: list[str], cwd: Path | None = None):
    """Run the parsed command `args` from the project root (the working folder is restored after, for
    in-process callers); exit 2 (StudyError) without a root unless the folders it uses were typed."""
    cwd = (cwd or Path.cwd()).resolve()
    root, typed = find_root(cwd), typed_flags(argv)
    if root is None:
        uses = _USES.get(getattr(args, "command", None), _DEFAULT_USES)
        if missing := [f for f in uses if f not in typed and getattr(args, f, None) is not None]:
            looked = ", ".join(str(d) for d in (cwd, *cwd.parents))
            raise StudyError(
                f"none of {looked} holds {' or '.join(MARKERS)}, so the default "
                f"{', '.join(f'--{f}' for f in missing)} would make new folders under {cwd}",
                field="project root",
                allowed="run inside a study project (a folder with params.yaml, dvc.yaml or .dvc, or below it), "
                f"or name the folders: {' '.join(f'--{f} DIR' for f in missing)}",
            )
        yield None
        return
    for name in _PATH_ARGS:
        value = getattr(args, name, None)
        typed_here = name in typed or name in ("spec", "specs")
        if value is None or not typed_here:
            continue
        if name == "spec" and args.command in ("select", "deselect") and not value.endswith(".yaml"):
            continue  # a study name, not a path
        setattr(args, name, _rebase(value, cwd, root))
    os.chdir(root)
    try:
        yield root
    finally:
        os.chdir(cwd)
