"""When two factor levels are the same level: the one rule the spec checks, the aggregate, the figures,
the report and the paper references all use.

A level travels YAML -> RunConfig -> plan JSON -> results CSV/parquet -> report, and each hop may change
its type: a float64 column reads the plan's 4 back as 4.0, a column with a missing value reads 0.4 back
as an object, a hand-written spec says '0.4' where pydantic resolves it to 0.4. So levels are compared
through `level_key`, and two levels are the same exactly when their keys are equal:

- numbers compare as numbers: 4 == 4.0 == '4' and 0.4 == '0.4' == 0.40 == '4e-1'. Two numbers are one
  level when they agree to 15 significant digits (every decimal of 15 digits survives a double), so a CSV
  parser's last-bit difference does not split a level, and 0.1 + 0.2 is the level 0.3;
- bools are not numbers (True != 1), but the text a CSV or JSON writes for them is the bool:
  True == 'True' == 'true';
- a missing value (None, NaN, pandas' NA, the text 'None' pandas reads as missing) is one level;
- any other string is compared as it is (case and spaces count: 'nsp' != 'NSP'); any other value (a
  list, a dict) as its str().

Importable without torch, pandas or matplotlib: the spec checks use it before any work.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np

MISSING = "None"  # the key of a missing level; also the text pandas reads back as missing


def _number_key(x: float) -> str:
    # 15 significant digits: the nearest double of every 15-digit decimal maps back to that decimal
    return MISSING if math.isnan(x) else repr(float(f"{x:.15g}"))


def level_key(v: Any) -> str:
    """A level as text that every spelling of the same level shares (see the module docstring): usable as
    a dict key, a groupby key or a join of several levels."""
    if v is None:
        return MISSING
    pandas = sys.modules.get("pandas")  # pandas' NA exists only once pandas is imported: no import here
    if pandas is not None and v is pandas.NA:
        return MISSING
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, numbers.Real):
        return _number_key(float(v))
    if isinstance(v, str):
        if v.lower() in ("true", "false"):
            return v.capitalize()
        try:
            return _number_key(float(v))
        except ValueError:
            return v
    return str(v)


def same_level(a: Any, b: Any) -> bool:
    """Whether `a` and `b` are one level (the module docstring's rule)."""
    return level_key(a) == level_key(b)
