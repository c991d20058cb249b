"""The report stage: `aggregate_study` (run folders -> tidy tables with seed statistics) and
`render_report` / `render_index` (tables -> one self-contained HTML report per study).

    aggregate.py     `aggregate_study`: writes the study's tables from result files only
    collect.py       run folders and fine-tune results -> tidy/runs/curves rows; the plateau rule
    units.py         the units the statistics count; summary.csv
    comparisons.py   paired comparisons (the answer) and pre-trained vs random init
    stats.py         intervals and tests valid at the number of seeds that ran; Holm; minimum detectable effect
    pooled.py        a comparison's pooled level + seed model; sees.py: which metrics see pre-training
    studyfiles.py    an aggregate read back (`load_study_dir`)
    levelnames.py    how levels, metrics and design points are named
    plotting.py, levelfigures.py, figures.py   seaborn figures from the tables
    curves.py        the learning-curve figure (`study curve`)
    prose.py         the answer, methods and recipe sentences
    problems.py      failed, pending and plateaued runs
    render.py        the HTML report (templates/) from the aggregate files only
    references/      published ablation tables as data, matched against a study's levels

Entry points load on first use (study/lazy.py): the report must not import torch.
"""

from study.lazy import exports

__all__ = ["aggregate_study", "render_index", "render_report"]
__getattr__ = exports(
    __name__,
    {
        "aggregate_study": "study.report.aggregate",
        **dict.fromkeys(["render_report", "render_index"], "study.report.render"),
    },
)
