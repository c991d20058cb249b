"""Benchmarks (not tests), run from the repository root as modules: `python -m bench.throughput` etc.

Run as modules so `study` and `bench.common` import from this checkout without any sys.path edits; every
script has a `--dry` mode (tiny shapes, seconds) that tests/test_bench.py runs, so a bench that stops
running fails CI.
"""
