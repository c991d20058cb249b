"""One rule for "the same factor level" (study/levels.py), used by the spec checks, the aggregate, the
figures, the report and the paper references. The cases below are those on which the three copies it
replaced disagreed (checks.same_level, references._same, aggregate.canon)."""

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from study.levels import level_key, same_level
from study.studies.spec import load_study

SAME = [
    ("0.4", 0.4),  # checks: different; references, aggregate: same
    (0.4, 0.40),
    ("4e-1", 0.4),
    (4, 4.0),
    ("4", 4.0),
    (np.int64(4), 4.0),  # checks: different (not an int); the others: same
    (np.float64(0.15), "0.15"),
    (0.1 + 0.2, 0.3),  # references (isclose): same; checks, aggregate (exact): different
    (True, "True"),  # checks: different; references, aggregate: same
    (True, "true"),  # aggregate: different ('true' is not float-able, so str); references: same
    (np.bool_(False), False),  # checks: different (np.bool_ is not bool)
    (None, float("nan")),  # aggregate: same; checks, references: different
    (None, pd.NA),
    (None, "None"),  # pandas reads the text None as missing
    ("nsp", "nsp"),
    ([1, 2], [1, 2]),
]
DIFFERENT = [
    (True, 1),  # a bool is not a number
    (False, 0),
    (False, None),
    (0.15, 0.1500001),
    (0.15, 0.150000000000001),  # the 15th significant digit still counts
    ("nsp", "NSP"),
    ("nsp", "none"),
    (0, None),
    ("", None),
]


@pytest.mark.parametrize(("a", "b"), SAME, ids=repr)
def test_same_level(a, b):
    assert same_level(a, b) and same_level(b, a)
    assert level_key(a) == level_key(b)


@pytest.mark.parametrize(("a", "b"), DIFFERENT, ids=repr)
def test_different_levels(a, b):
    assert not same_level(a, b) and not same_level(b, a)


def test_a_level_survives_the_csv_round_trip():
    """What the aggregate writes and the report reads back: a float64 column with a missing value, an
    object column of bools and NaN."""
    df = pd.DataFrame({"L": [4, None, 6], "r": [0.4, 0.5, None], "b": [True, None, False]})
    back = pd.read_csv(pd.io.common.StringIO(df.to_csv(index=False)))
    for col in df:
        assert [level_key(v) for v in back[col]] == [level_key(v) for v in df[col]], col


def test_keys_are_text_that_joins():
    assert level_key(4) == "4.0" and level_key(math.inf) == "inf" and level_key(float("nan")) == "None"
    assert "|".join(level_key(v) for v in (0.15, "nsp", True)) == "0.15|nsp|True"


def test_the_spec_check_accepts_a_quoted_level(tmp_path):
    """compare a: '0.15' names the level 0.15: the spec check accepts it (it refused it before), as the
    aggregate pairs it (tests/test_aggregate.py, test_compare_pairs_a_quoted_level)."""
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: t\ndefaults:\n  model: {layers: 1, hidden: 32, heads: 2, intermediate: 64}\n"
        "factors:\n  masking.rate: [0.15, 0.3]\nseeds: [0, 1]\n"
        "report:\n  compare: {factor: masking.rate, a: '0.15', b: '0.3'}\n"
    )
    assert len(load_study(spec).runs) == 4


def test_duplicate_levels_in_a_spec_are_refused_however_spelled(tmp_path):
    """[0.15, '0.15'] used to pass the level check and fail later as duplicate run labels."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: t\nfactors:\n  masking.rate: [0.15, '0.15']\nseeds: [0]\n")
    out = subprocess.run(
        [sys.executable, "-m", "study", "validate", str(spec)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and "factors.masking.rate: levels 0.15 and '0.15' are equal" in out.stderr


def test_importing_the_rule_loads_no_heavy_package():
    code = "import sys, study.levels; print(sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
