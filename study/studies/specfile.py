"""What a spec file is (SpecFile: the schema studies/spec.py validates the YAML against) and what loading
one gives (Study: its planned runs and the input of aggregation). Kept apart from spec.py, which builds
them, so that checks.py can name these types without importing spec.py (which imports checks.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from study.config import RunConfig
from study.errors import StudyError
from study.paths import Layout
from study.rundir import RunDir
from study.schema import SeedList, Strict
from study.studies.searchspec import SearchSpec


class ReportHints(Strict):
    kind: Literal["nsp", "mask_rate", "replacement", "depth", "generic"] = "generic"
    primary_metric: str = "ref_ppl"
    # why this metric answers the question at this scale, stated before the runs; the report prints it
    # beside the "sees pre-training" check (study/report/sees.py)
    primary_why: str = ""
    x: str | None = None
    hue: str | None = None
    compare: dict[str, Any] | None = None  # {factor, baseline, treatment}: study/studies/hints.py
    references: list[str] = Field(default_factory=list)


class RunEntry(Strict):
    label: str
    set: dict[str, Any] = Field(default_factory=dict)


class SpecFile(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    question: str = ""
    base: str | None = None
    defaults: dict[str, Any] = Field(default_factory=dict)
    factors: dict[str, list[Any]] = Field(default_factory=dict)
    design: Literal["grid", "one_at_a_time"] = "grid"
    runs: list[RunEntry] = Field(default_factory=list)
    seeds: SeedList = Field(default_factory=lambda: [0], min_length=1)  # distinct, 0 <= seed < 2**32
    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    report: ReportHints = Field(default_factory=ReportHints)
    search: SearchSpec | None = None  # an optuna search over spec keys (study/search/)


@dataclass
class PlannedRun:
    label: str
    seed: int
    factors: dict[str, Any]
    config: RunConfig

    @property
    def run_hash(self) -> str:
        return self.config.run_hash()

    def status(self, layout: Layout) -> str:
        """pending | done | diverged | failed, read as study/rundir.py's policy says."""
        return RunDir(layout, self.run_hash).status().status


@dataclass
class Study:
    path: Path
    spec: SpecFile
    defaults: dict[str, Any]
    profile: str | None = None
    runs: list[PlannedRun] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The study's name; a profile is part of it (results/studies/nsp-cpu, reports/nsp-cpu)."""
        return f"{self.spec.name}-{self.profile}" if self.profile else self.spec.name

    def select(self, which: list[str] | None) -> list[PlannedRun]:
        """The runs the CLI's repeatable `--run` names, in the spec's order (None: every run). Each name is
        a run hash or a label; a label names every seed of it. One place for this rule: pretrain,
        finetune, rescore and curve all select through it."""
        if not which:
            return list(self.runs)
        known = {r.run_hash for r in self.runs} | {r.label for r in self.runs}
        bad = [w for w in which if w not in known]
        if bad:
            choices = [f"{r.run_hash} ({r.label}, seed {r.seed})" for r in self.runs]
            raise StudyError(
                f"no run with hash or label {bad[0]!r} in this spec",
                field="--run",
                allowed=", ".join(choices),
            )
        return [r for r in self.runs if r.run_hash in which or r.label in which]

    def plan_dict(self, layout: Layout) -> dict:
        """The input of aggregation: what was asked and which runs answer it."""
        r = self.spec.report
        # fine-tune seeds and tasks are not in the finetune_hash: the aggregate reads only these
        runs = [
            {
                "run_hash": p.run_hash,
                "label": p.label,
                "seed": p.seed,
                "factors": p.factors,
                "status": p.status(layout),
                "baseline_key": p.config.baseline_key() if p.config.finetune.baseline else None,
                "finetune_seeds": list(p.config.finetune.seeds),
                "finetune_tasks": list(p.config.finetune.tasks),
                "zeroshot": p.config.zeroshot_hashes(),  # {evaluation: its result's hash}
            }
            for p in self.runs
        ]
        return {
            "name": self.name,
            "question": self.spec.question,
            "kind": r.kind,
            "primary_metric": r.primary_metric,
            "primary_why": r.primary_why,
            "x": r.x,
            "hue": r.hue,
            "compare": r.compare,
            "references": r.references,
            "spec": str(self.path),
            "profile": self.profile,
            "finetune_hash": self.runs[0].config.finetune_hash() if self.runs else None,
            "recipe": recipe_values([p.config for p in self.runs]),
            "runs": runs,
        }


# The recipe a report's methods paragraph states (study.report.prose.recipe_sentence): the settings a reader
# needs to know what was pre-trained and how it was fine-tuned, whether or not a factor varies them.
RECIPE_KEYS = (
    "model.arch",
    "model.layers",
    "model.hidden",
    "model.heads",
    "model.intermediate",
    "model.dropout",
    "model.init_range",
    "tokenizer.vocab_size",
    "objective.format",
    "objective.sentence",
    "objective.max_seq_len",
    "masking.rate",
    "masking.split",
    "masking.unit",
    "train.budget",
    "train.amount",
    "train.batch_size",
    "train.short_len",
    "train.short_fraction",
    "train.lr",
    "train.warmup",
    "train.schedule",
    "finetune.pooling",
    "finetune.lr",
    "finetune.epochs",
    "finetune.max_train_examples",
    "finetune.max_eval_examples",
    "finetune.seeds",
    "finetune.probe",
    "finetune.probe_layers",
)


def recipe_values(configs: list[RunConfig]) -> dict[str, list]:
    """{dotted key: its distinct values over the runs, in run order}: one value where every run shares it,
    several where a factor (or a run's `set`) varies it. masking.split is [mask, random, keep], kept together
    because the three only mean something as one split."""
    out: dict[str, list] = {}
    for key in RECIPE_KEYS:
        section, name = key.split(".")
        vals: list = []
        for cfg in configs:
            m = cfg.masking
            v = [m.mask, m.random, m.keep] if key == "masking.split" else getattr(getattr(cfg, section), name)
            if v not in vals:
                vals.append(v)
        out[key] = vals
    return out
