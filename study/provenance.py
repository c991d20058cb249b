"""What produced a result: code version, packages, hardware. Attached to every result file."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "datasets",
    "optuna",
    "pandas",
    "numpy",
    "seaborn",
    "matplotlib",
    "dvc",
    "pydantic",
    "jinja2",
    "gensim",
    "pysbd",
    "scikit-learn",
    "scipy",
)


# the folder the package was imported from; a module attribute, as ARCHIVE_COMMIT below, so a test can
# point either elsewhere
PACKAGE_DIR = Path(__file__).resolve().parent


@functools.cache
def git_info() -> dict:
    def git(*args: str, cwd: Path | None = None) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], capture_output=True, text=True, timeout=10, check=True, cwd=cwd
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    def checkout(pkg: Path) -> dict | None:
        """The checkout the package's files are tracked in (a site-packages copy inside some repository's
        ignored .venv is not), its HEAD, and whether code or specs differ from it: tracked files anywhere
        in it (what the pipeline rewrites excepted), or a file in the package that git does not track."""
        if not git("ls-files", ".", cwd=pkg):
            return None
        commit = git("rev-parse", "HEAD", cwd=pkg)
        if commit is None:
            return None
        status = git(
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ":(top)",
            *(f":(top,exclude){p}" for p in PIPELINE_WRITES),
            cwd=pkg,
        )
        untracked = git("status", "--porcelain", "--untracked-files=all", "--", ".", cwd=pkg)
        dirty = None if status is None or untracked is None else bool(status) or "??" in untracked
        return {"commit": commit, "dirty": dirty, "source": "package checkout"}

    # The code that ran is the package's, wherever the command runs from: a working directory that is
    # another repository (a researcher's own, importing study) says nothing about it.
    if (here := checkout(PACKAGE_DIR)) is not None:
        return here
    if exported := archive_commit():
        # a `git archive` copy (how long studies here run from a frozen tree): the commit it was exported
        # from; whether it was edited since is unknown
        return {"commit": exported, "dirty": None, "source": "git archive"}
    return {"commit": None, "dirty": None}


# `git archive` writes the commit it exports into this file (.gitattributes: export-subst); in a clone it
# holds the unexpanded placeholder, which is not a commit.
ARCHIVE_COMMIT = PACKAGE_DIR / "COMMIT"


def archive_commit() -> str | None:
    try:
        text = ARCHIVE_COMMIT.read_text().strip()
    except OSError:
        return None
    return text if re.fullmatch(r"[0-9a-f]{40}", text) else None


# Tracked files the pipeline itself rewrites (`study sync --stamp` replaces the committed placeholders in
# pipeline/ when a stage runs, DVC writes dvc.lock): a change there is not a change to the code, and
# without this every `dvc repro` in a fresh clone reported its results as made by "dirty" code.
PIPELINE_WRITES = ("pipeline", "dvc.lock", "results", "reports")


@functools.cache
def package_versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def hardware(device: str | None = None) -> dict:
    import torch  # 1.7 s to import: the report and the search import this module for git_info alone

    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "device": device,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
    return info


def provenance(device: str | None = None) -> dict:
    return {"git": git_info(), "packages": package_versions(), "hardware": hardware(device)}
