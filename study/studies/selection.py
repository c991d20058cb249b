"""The selection: which studies are active, as `params.yaml`'s `studies:` list says (`smoke`, `nsp@cpu`,
or `{spec: nsp, profile: cpu}`), read, checked and written. `study select` / `study deselect` edit it
(studies/sync.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from study.errors import StudyError
from study.io import atomic_write_text
from study.paths import SAFE_NAME_ALLOWED, safe_name
from study.studies.spec import Study, load_study
from study.studies.specyaml import clip

SELECTION_FILE = "params.yaml"


def selection_entry(spec: str, profile: str | None) -> str:
    """How a study is written in params.yaml: `nsp@cpu`, or `smoke` at the spec's default scale."""
    return f"{spec}@{profile}" if profile else spec


def parse_entry(entry, index: int, source: str) -> tuple[str, str | None]:
    """(spec name, profile) of one params.yaml `studies` entry."""
    field = f"studies[{index}]"
    if isinstance(entry, dict):
        unknown = set(entry) - {"spec", "profile"}
        if unknown or not isinstance(entry.get("spec"), str):
            raise StudyError(
                f"not a study entry: {entry!r}",
                field=field,
                source=source,
                allowed="'NAME', 'NAME@PROFILE' or {spec: NAME, profile: PROFILE}",
            )
        spec, profile = entry["spec"], entry.get("profile")
    elif isinstance(entry, str) and entry:
        spec, _, profile = entry.partition("@")
        profile = profile or None
    else:
        raise StudyError(
            f"not a study entry: {entry!r}",
            field=field,
            source=source,
            allowed="'NAME', 'NAME@PROFILE' or {spec: NAME, profile: PROFILE}",
        )
    if spec.endswith(".yaml"):  # `ablations/nsp.yaml` means `nsp`
        spec = Path(spec).stem
    return spec, profile


def read_selection(path: Path) -> list[tuple[str, str | None]] | None:
    """The selected (spec, profile) pairs in order; None when the file or its `studies` key is absent."""
    if not path.exists():
        return None
    where = {
        "field": "studies",
        "source": str(path),
        "allowed": "a YAML mapping with a `studies:` list, e.g. studies: [smoke, nsp@cpu]",
    }
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (
        OSError,
        UnicodeDecodeError,
        yaml.YAMLError,
    ) as exc:  # a traceback before; now exit 2, nothing written
        mark = getattr(exc, "problem_mark", None)
        why = (
            "not UTF-8 text"
            if isinstance(exc, UnicodeDecodeError)
            else f"{getattr(exc, 'problem', None) or exc}{f' at line {mark.line + 1}' if mark else ''}"
        )
        raise StudyError(f"cannot read it: {clip(why, 200)}", **where) from None
    if not isinstance(doc, dict):  # a list here fell back to "every spec selected" without a word
        raise StudyError(f"is a {type(doc).__name__}, not a mapping", **where)
    if "studies" not in doc:
        return None
    studies = doc["studies"] or []
    if not isinstance(studies, list):
        raise StudyError(
            "must be a list of studies", field="studies", source=str(path), allowed="e.g. [smoke, nsp@cpu]"
        )
    out = [parse_entry(e, i, str(path)) for i, e in enumerate(studies)]
    dup = {x for x in out if out.count(x) > 1}
    if dup:
        raise StudyError(
            f"selected twice: {', '.join(selection_entry(*d) for d in sorted(dup, key=str))}",
            field="studies",
            source=str(path),
            allowed="each study once",
        )
    return out


def write_selection(path: Path, selection: list[tuple[str, str | None]]) -> None:
    """Rewrite params.yaml's `studies` list, keeping every other key of the file."""
    doc = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    doc["studies"] = [selection_entry(s, p) for s, p in selection]
    text = (
        "# The active studies: a bare `dvc repro` reproduces exactly these (stages come from `study sync`).\n"
        "# Entries: NAME (ablations/NAME.yaml at its default scale) or NAME@PROFILE. Edit with\n"
        "# `study select NAME [--profile P]` / `study deselect NAME [--profile P]`, then commit.\n"
    )
    atomic_write_text(path, text + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))


def _spec_path(ablations: Path, spec: str, field: str, source: str) -> Path:
    path = ablations / f"{spec}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in ablations.glob("*.yaml"))
        raise StudyError(f"no spec {path}", field=field, source=source, allowed=", ".join(names) or "none")
    if not safe_name(path.name):  # DVC runs stage commands through a shell: names that need no quoting
        raise StudyError(
            "a spec file name goes into shell commands of dvc.yaml",
            field="file name",
            source=str(path),
            allowed=SAFE_NAME_ALLOWED,
        )
    return path


def load_selected(
    ablations: Path, selection: list[tuple[str, str | None]], source: str
) -> list[tuple[str, Study]]:
    """(spec path relative to the repository, Study) for each selected entry, checked."""
    return [
        check_entry(ablations, spec, profile, f"studies[{i}]", f"studies[{i}]", source)
        for i, (spec, profile) in enumerate(selection)
    ]


def check_entry(
    ablations: Path, spec: str, profile: str | None, spec_field: str, profile_field: str, source: str
) -> tuple[str, Study]:
    """(spec path relative to the repository, Study) of one selection entry; StudyError naming the field."""
    path = _spec_path(ablations, spec, spec_field, source)
    if profile is not None:
        profiles = load_study(path).spec.profiles
        if profile not in profiles:
            raise StudyError(
                f"{spec} has no profile {profile!r}",
                field=profile_field,
                source=source,
                allowed=", ".join(sorted(profiles)) or "no profiles",
            )
    rel = (Path(ablations.name) / path.name).as_posix()  # relative: the files are committed
    return rel, load_study(path, profile=profile)


def default_selection(ablations: Path) -> list[tuple[str, str | None]]:
    """No params.yaml yet: every spec at its default scale (profiles are opt-in: they are hours)."""
    return [(p.stem, None) for p in sorted(ablations.glob("*.yaml"))]
