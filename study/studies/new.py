"""`study new NAME --factor KEY=L1,L2 --question "..."`: a spec of one's own, valid and with a `report:`
block that concerns its factors, instead of a copy of another study's (whose `kind: nsp` and NSP papers a
whole-word masking study then quoted).

The spec starts from `ablations/base/bert.yaml` (its minutes-long default scale and its `cpu` / `gpu`
profiles), varies the given factors in a grid, and compares the first two levels of the first factor:
baseline the first, treatment the second, so the answer reads "L2 minus L1". The report's kind is the one
about that factor, else `generic`; its references are the paper tables about any of the factors
(study/studies/hints.py: the same rule `validate` warns by). The spec is loaded (every run built and
checked) before it is written; a bad key or level exits 2 and writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from study.errors import StudyError
from study.io import atomic_write_text
from study.paths import SAFE_NAME_ALLOWED, safe_name
from study.report import references
from study.studies.hints import kind_factors
from study.studies.spec import load_study

BASE = "base/bert.yaml"
FACTOR_FORM = "KEY=LEVEL,LEVEL[,...] (e.g. masking.unit=token,whole_word)"


def parse_factor(text: str) -> tuple[str, list[Any]]:
    """`masking.rate=0.15,0.4` -> ("masking.rate", [0.15, 0.4]): each level read as a YAML scalar."""
    key, sep, levels = text.partition("=")
    values = [yaml.safe_load(v.strip()) for v in levels.split(",") if v.strip()] if sep else []
    if not key.strip() or len(values) < 2:
        raise StudyError(
            f"{text!r} needs a key and two levels or more", field="--factor", allowed=FACTOR_FORM
        )
    return key.strip(), values


def report_block(factors: dict[str, list[Any]], primary_metric: str) -> dict[str, Any]:
    """The report hints for these factors: the first factor's first two levels compared, the kind and
    the references about the factors (none about another factor)."""
    first = next(iter(factors))
    keys = set(factors)
    kind = next(
        (k for k in references.KIND_DEFAULTS if k != "generic" and kind_factors(k) & {first}), "generic"
    )
    refs = [r for r in references.available() if set(references.load_reference(r).factors) & keys]
    return {
        "kind": kind,
        "primary_metric": primary_metric,
        "x": first,
        "compare": {"factor": first, "baseline": factors[first][0], "treatment": factors[first][1]},
        "references": refs,
    }


def new_spec(
    ablations: Path,
    name: str,
    factors: list[str],
    question: str,
    seeds: list[int],
    primary_metric: str,
    force: bool = False,
) -> tuple[Path, int]:
    """Write ablations/NAME.yaml; returns (its path, its number of runs). Checked whole before writing."""
    if not safe_name(name):
        raise StudyError(f"{name!r} is not a study name", field="name", allowed=SAFE_NAME_ALLOWED)
    if not question.strip():
        raise StudyError("is empty", field="--question", allowed="the question the study answers, in words")
    out = ablations / f"{name}.yaml"
    if out.exists() and not force:
        raise StudyError(f"{out} exists", field="name", allowed="a new name, or --force to overwrite it")
    if not (ablations / BASE).is_file():
        raise StudyError(
            f"{ablations / BASE} is missing", field="--ablations", allowed="the project's ablations/"
        )
    grid = dict(parse_factor(f) for f in factors)
    if len(grid) < len(factors):
        raise StudyError("names one key twice", field="--factor", allowed="each key once")
    doc = {
        "name": name,
        "question": question.strip(),
        "base": BASE,
        "seeds": seeds,
        "factors": grid,
        "report": report_block(grid, primary_metric),
    }
    text = (
        f"# Made by `study new {name}`. The defaults, profiles and fine-tuning come from {BASE}; override them\n"
        '# under `defaults:` / `profiles:`. The report block: README.md, "The `report:` block".\n'
        + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
    )
    draft = ablations / f".new-{name}.yaml"  # beside the real one, so `base:` resolves the same
    try:
        atomic_write_text(draft, text)
        study = load_study(draft, fingerprint=False)
    except StudyError as exc:  # named as the file it would have been
        raise exc.replace(source=f"{out} (not written)") from None
    finally:
        draft.unlink(missing_ok=True)
    atomic_write_text(out, text)
    return out, len(study.runs)


def seeds_arg(text: str) -> list[int]:
    """`--seeds 3` (seeds 0..2) or `--seeds 0,4,7`."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise StudyError(f"got {text!r}", field="--seeds", allowed="a count (3) or a list (0,1,2)") from None
    return list(range(seeds[0])) if len(seeds) == 1 else seeds
