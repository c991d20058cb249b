"""What every pydantic schema of the project shares: the one strict base model (unknown keys are errors, no
float is .inf or .nan, values validated on assignment too), the seed rule and the error type of a rule
between fields. study/config.py (the run), study/studies/spec.py (the spec file) and
study/studies/searchspec.py (its `search:` block) all build on it, so the three cannot disagree."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError


class Strict(BaseModel):
    """Unknown keys are errors, values are validated on assignment too. No float is .inf or .nan: none means
    anything in a config or a spec, and `train.amount: .inf` validated, then crashed `study plan` (int(inf))."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


# The error type of a rule between fields (possibly of two sections). Its context names the dotted field
# and what is allowed, so study/studies/spec.py's pydantic_error can name them like any other error.
CROSS_FIELD = "cross_field"


def cross_field_error(field: str, message: str, allowed: str) -> PydanticCustomError:
    # Braces in the message would be read as placeholders of the template: escape them.
    template = message.replace("{", "{{").replace("}", "}}")
    return PydanticCustomError(CROSS_FIELD, template, {"field": field, "allowed": allowed})


# --------------------------------------------------------------------------- seeds
# One rule for every seed a spec or config names (run, corpus split, fine-tuning, search sampler): an
# integer in [0, 2**32). numpy's SeedSequence (masking) refuses negatives and its legacy RandomState
# (optuna's samplers) anything from 2**32 on, so a seed outside this range would pass validation and
# crash hours later. Strict: `seed: true` or `seed: 1.5` is a typo, not 1.
SEED_LIMIT = 2**32
Seed = Annotated[int, Field(strict=True, ge=0, lt=SEED_LIMIT)]
SEEDS_ALLOWED = f"distinct integers 0 .. {SEED_LIMIT - 1}"


def distinct_seeds(seeds: list[int]) -> list[int]:
    """A list of seeds is a list of replicates: a repeated seed is the same run listed twice."""
    dupes = sorted({s for s in seeds if seeds.count(s) > 1})
    if dupes:
        raise ValueError(
            f"seed(s) {dupes} listed twice: a repeated seed is the same run again, not a replicate"
        )
    return seeds


SeedList = Annotated[list[Seed], AfterValidator(distinct_seeds)]
