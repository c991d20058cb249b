import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED.exists():
        pytest.skip(f"real data not present at {SHARED} (see ../shared/data/PROVENANCE.md)")
    return SHARED
