"""study/io.py: atomic folders under concurrent writers."""

from __future__ import annotations

import os
from pathlib import Path

from study.io import atomic_dir


def test_atomic_dir_succeeds_when_another_writer_replaces_the_folder_in_between(tmp_path: Path, monkeypatch):
    """Two commands rendering one report at once (tests/test_faults.py's concurrent `study run`s): the other
    writer put its folder in place between this one's removal of the old folder and its rename, and the
    rename failed "Directory not empty" (seen in CI). Now it is retried: both succeed, a whole folder stays."""
    final = tmp_path / "figures"
    final.mkdir()
    (final / "old.png").write_text("old")
    real, raced = os.replace, []

    def replace(src, dst):
        if Path(dst) == final and not raced:  # the other writer's folder lands first
            raced.append(1)
            final.mkdir(exist_ok=True)
            (final / "theirs.png").write_text("theirs")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with atomic_dir(final) as tmp:
        (tmp / "ours.png").write_text("ours")
    assert raced and sorted(p.name for p in final.iterdir()) == ["ours.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures"]  # no temp or set-aside folder left
