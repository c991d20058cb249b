"""The `search:` block of a study spec: what an optuna search varies, optimises and how it prunes.

Kept apart from the search stage (study/search/) so that study/studies/spec.py can validate the block without importing
optuna (spec parsing stays light) and without an import cycle (study/search/ imports spec.py).

    search:
      objective: ref_mlm_loss              # a metrics.json key, "TASK/mode/metric", or {metric: weight, ...}
                                           # (names: study/metrics.py)
      direction: minimize                  # default: minimize for *loss / *ppl / wall_s, maximize otherwise
      n_trials: 20                         # finished (complete + pruned) trials the study stops at
      timeout: 3600                        # seconds, per worker
      sampler: {kind: tpe, seed: 0}        # tpe | random | grid
      pruner: {kind: median}               # median | hyperband | wilcoxon (across seeds) | none
      seeds: [0]                           # pre-training seeds per trial (wilcoxon needs >= 2)
      best_seeds: [0, 1, 2]                # seeds of the re-training spec `study search-best` writes
      params:
        masking.rate: {low: 0.05, high: 0.5, step: 0.05}
        train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}
        objective.sentence: [nsp, none]    # a list is a categorical
        masking.split.mask: {low: 0.5, high: 1.0}          # [MASK] share of the selected tokens
        masking.split.random_share: {low: 0.0, high: 1.0}  # random share of the rest; keep = the remainder

Checks that need RunConfig (does the key exist, does every extreme give a valid run, can any run
produce the objective metric) live in study/search/checks.py's `load_search`, before any training.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from study.metrics import lower_is_better
from study.schema import Seed, SeedList, Strict, cross_field_error
from study.studies.specyaml import clip

# mask + random + keep must sum to 1, so the replacement split is searched through two free
# coordinates that can take any value in [0, 1] independently (a sampler can't respect a sum constraint).
SPLIT_KEYS = ("masking.split.mask", "masking.split.random_share")


def _finite(value: Any) -> Any:
    """The base's rule for values it cannot see: a float inside an untyped (Any) field is finite too."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PydanticCustomError("finite_number", "Input should be a finite number")
    return value


class ParamSpec(Strict):
    """One searched dimension. A bare YAML list is shorthand for `{choices: [...]}`."""

    type: Literal["float", "int", "categorical"] | None = None  # inferred when omitted
    low: float | None = None
    high: float | None = None
    step: float | None = Field(default=None, gt=0)
    log: bool = False
    choices: list[Annotated[Any, AfterValidator(_finite)]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, list):
            return {"type": "categorical", "choices": v}
        return v

    @model_validator(mode="after")
    def _check(self) -> ParamSpec:
        if self.type is None:
            if self.choices is not None:
                self.type = "categorical"
            elif all(isinstance(x, int) and not isinstance(x, bool) for x in (self.low, self.high)) and (
                self.step is None or float(self.step).is_integer()
            ):
                self.type = "int"
            else:
                self.type = "float"
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("empty list of choices")
            if len({repr(c) for c in self.choices}) != len(self.choices):
                raise ValueError("duplicate choices")
            for c in self.choices:
                if c is not None and not isinstance(c, (bool, int, float, str)):
                    raise ValueError(f"choice {c!r} is not a scalar (None, bool, int, float or str)")
            if self.low is not None or self.high is not None:
                raise ValueError("give either choices or low/high, not both")
            return self
        if self.choices is not None:
            raise ValueError("give either choices or low/high, not both")
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} range needs both low and high")
        if not self.low < self.high:
            raise ValueError(f"empty range: low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0, got {self.low:g}")
        if self.log and self.step is not None:
            raise ValueError("log scale and step can't be combined")
        if self.type == "int":
            for name in ("low", "high", "step"):
                v = getattr(self, name)
                if v is not None and not float(v).is_integer():
                    raise ValueError(f"an int range needs an integer {name}, got {v!r}")
        if self.step is not None and self.step > self.high - self.low:
            raise ValueError(f"empty range: step ({self.step:g}) is wider than high - low")
        return self


class SamplerSpec(Strict):
    kind: Literal["tpe", "random", "grid"] = "tpe"
    seed: Seed = 0  # one seed rule for the whole spec (study/schema.py)
    n_startup_trials: int = Field(default=5, ge=0)  # tpe: random trials before the model kicks in


class PrunerSpec(Strict):
    """median/hyperband prune on the eval curve the trainer reports (every `impl.eval_every` steps);
    wilcoxon prunes across pre-training seeds (one value per finished seed run)."""

    kind: Literal["median", "hyperband", "wilcoxon", "none"] = "median"
    n_startup_trials: int = Field(default=2, ge=0)  # median: trials before pruning starts
    n_warmup_steps: int = Field(default=0, ge=0)  # median: steps before a trial can be pruned
    reduction_factor: int = Field(default=3, ge=2)  # hyperband
    p_threshold: float = Field(default=0.1, ge=0, le=1)  # wilcoxon
    n_startup_steps: int = Field(default=2, ge=0)  # wilcoxon: seeds before a trial can be pruned


class SearchSpec(Strict):
    params: dict[str, ParamSpec] = Field(min_length=1)
    objective: str | dict[str, float] = "ref_mlm_loss"
    direction: Literal["minimize", "maximize"] | None = None
    n_trials: int | None = Field(default=20, ge=1)
    timeout: float | None = Field(default=None, gt=0)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    pruner: PrunerSpec = Field(default_factory=PrunerSpec)
    seeds: SeedList = Field(default_factory=lambda: [0], min_length=1)
    best_seeds: SeedList = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    # Dead-worker detection: a running trial whose heartbeat is older than grace_period is failed
    # and re-queued (at most max_retry times). grace_period defaults to 3 heartbeats. On journal
    # storage, a lock file left by a killed worker is broken after (grace - interval) / 2 s (study/search/storage.py).
    heartbeat_interval: int = Field(default=10, ge=1)
    grace_period: int | None = Field(default=None, ge=1)
    max_retry: int = Field(default=2, ge=0)

    @field_validator("objective", mode="before")
    @classmethod
    def _finite_weights(cls, v: Any) -> Any:
        # A weight of .nan is caught here, before the union (a metric or {metric: weight}) is tried: there
        # pydantic would report the metric branch's "should be a valid string" first. The error names the
        # weight's own field, as a rule between fields does (this model is the spec's `search:` block).
        if isinstance(v, dict):
            for metric, weight in v.items():
                if isinstance(weight, float) and not math.isfinite(weight):
                    raise cross_field_error(
                        f"search.objective.{clip(str(metric))}", f"got {weight}", "a finite number"
                    )
        return v

    @model_validator(mode="after")
    def _check(self) -> SearchSpec:
        if isinstance(self.objective, dict) and not self.objective:
            raise ValueError("an objective combination needs at least one {metric: weight}")
        if isinstance(self.objective, dict) and self.direction is None:
            raise ValueError("a combined objective needs an explicit direction (minimize or maximize)")
        if len(set(self.seeds)) != len(self.seeds) or len(set(self.best_seeds)) != len(self.best_seeds):
            raise ValueError("duplicate seeds")
        if self.pruner.kind == "wilcoxon" and len(self.seeds) < 2:
            raise ValueError("the wilcoxon pruner compares trials across seeds: give at least 2 `seeds`")
        if self.grace_period is not None and self.grace_period <= self.heartbeat_interval:
            raise ValueError("grace_period must be longer than heartbeat_interval")
        return self

    @property
    def terms(self) -> dict[str, float]:
        """The objective as {metric: weight}; a single metric has weight 1."""
        return dict(self.objective) if isinstance(self.objective, dict) else {self.objective: 1.0}

    @property
    def resolved_direction(self) -> Literal["minimize", "maximize"]:
        if self.direction is not None:
            return self.direction
        return "minimize" if lower_is_better(str(self.objective)) else "maximize"

    @property
    def grace(self) -> int:
        return self.grace_period if self.grace_period is not None else 3 * self.heartbeat_interval
