"""`python -m study.search search|search-best ...` (what the multi-worker tests spawn)."""

import sys

from study.search.cli import main

sys.exit(main())
