"""Every command works from the project root, found as git and DVC find theirs (study/root.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from study.cli import main
from study.root import find_root

REPO = Path(__file__).resolve().parents[1]


def _project(tmp_path: Path) -> Path:
    """A project: params.yaml at its root, the smoke spec in ablations/, one finished run in results/."""
    root = tmp_path / "proj"
    (root / "ablations").mkdir(parents=True)
    shutil.copy(REPO / "ablations" / "smoke.yaml", root / "ablations" / "smoke.yaml")
    (root / "params.yaml").write_text("studies:\n- smoke\n")
    return root


def _plan(capsys, *argv) -> list[dict]:
    capsys.readouterr()
    assert main(["plan", *argv, "--no-time", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_subfolder_finds_the_root_and_its_finished_runs(tmp_path: Path, monkeypatch, capsys):
    root = _project(tmp_path)
    monkeypatch.chdir(root)
    rows = _plan(capsys, "ablations/smoke.yaml")
    done = root / "results" / "runs" / rows[0]["hash"]
    done.mkdir(parents=True)
    (done / "status.json").write_text(json.dumps({"status": "done", "error": None, "step": 1}))
    monkeypatch.chdir(root / "ablations")
    assert find_root(Path.cwd()) == root.resolve()
    again = _plan(capsys, "smoke.yaml")  # the spec path as typed here, the results of the root
    assert [r["status"] for r in again] == ["done"] + ["pending"] * (len(rows) - 1)
    assert Path.cwd() == (root / "ablations").resolve()  # an in-process caller keeps its folder
    assert not (root / "ablations" / "results").exists()


def test_no_root_exits_2_naming_where_it_looked_and_writes_nothing(tmp_path: Path, monkeypatch, capsys):
    root = _project(tmp_path)
    (root / "params.yaml").unlink()
    monkeypatch.chdir(root / "ablations")
    capsys.readouterr()
    assert main(["plan", "smoke.yaml", "--no-time"]) == 2
    err = capsys.readouterr().err
    assert (
        str((root / "ablations").resolve()) in err and "params.yaml or dvc.yaml" in err and "--results" in err
    )
    assert main(["run", "smoke.yaml", "--quiet"]) == 2
    assert sorted(p.name for p in (root / "ablations").iterdir()) == ["smoke.yaml"]
    assert sorted(p.name for p in root.iterdir()) == ["ablations"]
    # validate writes nothing and needs no root; typed folders say where, so no root is needed either
    assert main(["validate", "smoke.yaml"]) == 0
    assert main(["--results", str(tmp_path / "r"), "plan", "smoke.yaml", "--no-time"]) == 0
