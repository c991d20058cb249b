"""What a spec's `report:` block means beyond its schema: the comparison's two sides, and whether the
report's `kind` and paper `references` are about the factors the study varies.

`compare: {factor, baseline, treatment}` asks "what does the treatment change against the baseline?"; the
answer is treatment minus baseline. The first form, `{factor, a, b}` (the answer b minus a), still reads,
as baseline a and treatment b, with a deprecation message: the letters said nothing of which side is
subtracted, and a copied spec answered the opposite of its question. Report hints are not semantic:
neither form changes a run hash.
"""

from __future__ import annotations

import sys
from typing import Any

from study.errors import StudyError
from study.report import references

COMPARE_KEYS = ("factor", "baseline", "treatment")
LEGACY_KEYS = {"a": "baseline", "b": "treatment"}
_warned: set[str] = set()  # one deprecation message per spec file and process (validate loads each profile)


def canonical_compare(compare: dict[str, Any] | None, source: str) -> dict[str, Any] | None:
    """`compare` with the sides named baseline and treatment; the a/b form mapped, with a message."""
    if compare is None or not any(k in compare for k in LEGACY_KEYS):
        return compare
    if any(k in compare for k in LEGACY_KEYS.values()):
        raise StudyError(
            "mixes a/b with baseline/treatment",
            field="report.compare",
            source=source,
            allowed="{factor: KEY, baseline: LEVEL, treatment: LEVEL} (the answer is treatment minus baseline)",
        )
    out = {LEGACY_KEYS.get(k, k): v for k, v in compare.items()}
    if source not in _warned:
        _warned.add(source)
        print(
            f"{source}: report.compare's a/b are deprecated: read as baseline: {out.get('baseline')!s}, "
            f"treatment: {out.get('treatment')!s} (the answer is treatment minus baseline); write "
            "`compare: {factor: ..., baseline: ..., treatment: ...}`",
            file=sys.stderr,
        )
    return out


def kind_factors(kind: str) -> set[str]:
    """The factors a report kind is about: those of the paper tables it quotes by default (one rule: a
    kind is its default references; `generic` has none and concerns any factor)."""
    return {f for ref in references.for_study(kind, []) for f in ref.factors}


def hint_warnings(kind: str, ref_ids: list[str], factors: set[str]) -> list[str]:
    """Warnings for `validate`: a `report.kind` or a reference about none of the study's factors (a spec
    copied from another study's keeps its papers, and its report would quote them as if they bore on it)."""
    out = []
    about = kind_factors(kind)
    if about and not about & factors:
        out.append(
            f"report.kind {kind!r} is about {', '.join(sorted(about))}, which this study does not vary "
            f"(it varies {', '.join(sorted(factors)) or 'nothing'}): its figures and default papers "
            "(" + ", ".join(r.id for r in references.for_study(kind, [])) + ") will not concern the "
            "question; use kind: generic"
        )
    for ref in references.for_study("generic", ref_ids):
        if not set(ref.factors) & factors:
            out.append(
                f"report.references {ref.id!r} is about {', '.join(ref.factors)}, which this study does not "
                "vary: the report would quote it beside results it does not bear on"
            )
    return out


def study_factors(study) -> set[str]:
    """The dotted keys a study varies: its factors, the keys its explicit runs set, its searched keys."""
    keys = set(study.spec.factors)
    keys |= {k for entry in study.spec.runs for k in entry.set}
    if study.spec.search is not None:
        keys |= set(study.spec.search.params)
    return keys
