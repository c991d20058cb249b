"""Coverage and power of the comparison intervals by simulation: the pooled level + seed model alone, and
what the code does (`study.report.pooled`: pooled where its variance check passes, else the paired t).

A study of k levels x n seeds is drawn as y[level, seed] = seed effect (SD 2, shared by every level) +
noise whose SD differs by level (the scenarios), the true difference between the compared levels a (row 0)
and b (row 1) being 0. An interval covers when it holds 0. The seed effect cancels in every estimate here,
so only the noise SDs matter. Power rows: equal SDs, b - a = 1.5 level SDs (the paired differences' SD is
sqrt 2 level SDs), the share of intervals that exclude 0.

    python -m bench.stats_coverage [--reps 20000] [--seed 2026] [--grid]
    python -m bench.stats_coverage --dry   # 200 replicates, k 2 and 3, n 3: checks the code path

Prints Markdown tables (docs/STATISTICS.md, "Pooled level + seed model", holds their output at the default
arguments). --grid also prints, for candidate pass bands of the variance check, the worst coverage over
every scenario, k in {4, 6, 8} and n in {3, 4, 5}, and the power at equal SDs: how POOL_CHECK was chosen.
tests/test_stats.py runs `coverage` with fewer replicates.
"""

from __future__ import annotations

import argparse

import numpy as np

from study.report import pooled as P
from study.report import stats as S

KS, NS = (2, 3, 4, 6), (3, 5)
SEED_SD = 2.0


def scenarios(k: int) -> dict[str, np.ndarray]:
    """Noise SD per level (a = row 0, b = row 1): equal, and SD ratios of 3 placed where they hurt most."""
    one = np.ones(k)
    return {
        "equal SDs": one,
        "b 3x the others": np.r_[1.0, 3.0, np.ones(k - 2)],
        "a and b 3x the others": np.r_[3.0, 3.0, np.ones(k - 2)],
        "SDs 3x down to 1x (a highest)": np.linspace(3.0, 1.0, k),
        "the others 3x a and b": np.r_[1.0, 1.0, np.full(k - 2, 3.0)],
    }


def draw(rng, sds: np.ndarray, n: int, reps: int, effect: float = 0.0) -> np.ndarray:
    y = rng.normal(size=(reps, sds.size, n)) * sds[None, :, None] + rng.normal(size=(reps, 1, n)) * SEED_SD
    y[:, 1] += effect
    return y


def intervals(y: np.ndarray, check: tuple = P.POOL_CHECK) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(low, high) per replicate: 'paired' t, the pooled 'model' alone, and what the 'code' does
    (pooled_interval's dispatch: the paired t below POOL_MIN_LEVELS levels, else pooled_rows)."""
    a, b, rest = y[:, 0], y[:, 1], y[:, 2:]
    k, n = y.shape[1:]
    _, plo, phi, _ = S.t_rows(b - a)
    out = {"paired": (plo, phi)}
    if k == 2:
        return {**out, "model": (plo, phi), "code": (plo, phi)}
    s2, df = P.additive_residual_var(y)
    m, se = (b - a).mean(1), np.sqrt(2 * s2 / n)
    half = S.stats.t.ppf(1 - S.ALPHA / 2, df) * se
    out["model"] = (m - half, m + half)
    if k < P.POOL_MIN_LEVELS:
        return {**out, "code": (plo, phi)}
    _, lo, hi, _, _, _ = P.pooled_rows(b, a, rest, check=check)
    return {**out, "code": (lo, hi)}


def coverage(reps: int, seed: int, ks=KS, ns=NS, check: tuple = P.POOL_CHECK) -> dict:
    """{(scenario, k, n): {'model': coverage, 'code': coverage, 'paired': coverage}} and, under key
    ('power', k, n), the share of intervals excluding 0 at b - a = 1.5 level SDs, equal SDs."""
    rng = np.random.default_rng(seed)
    out = {}
    for k in ks:
        for n in ns:
            for name, sds in scenarios(k).items():
                iv = intervals(draw(rng, sds, n, reps), check)
                out[(name, k, n)] = {m: float(((lo <= 0) & (0 <= hi)).mean()) for m, (lo, hi) in iv.items()}
            iv = intervals(draw(rng, np.ones(k), n, reps, effect=1.5), check)
            out[("power", k, n)] = {m: float(((lo > 0) | (hi < 0)).mean()) for m, (lo, hi) in iv.items()}
    return out


def table(res: dict, ks=KS, ns=NS) -> str:
    head = "| scenario | k | " + " | ".join(f"model n={n} | code n={n}" for n in ns) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(ns))]
    names = [*scenarios(max(ks)), "power"]
    for name in names:
        for k in ks:
            if k == 2 and name in ("the others 3x a and b", "SDs 3x down to 1x (a highest)"):
                continue  # no other level at k = 2; a gradient over two levels is "b 3x" mirrored
            cells = " | ".join(
                f"{res[(name, k, n)]['model']:.3f} | {res[(name, k, n)]['code']:.3f}" for n in ns
            )
            label = "power at b - a = 1.5 SD, equal SDs" if name == "power" else name
            lines.append(f"| {label} | {k} | {cells} |")
    return "\n".join(lines)


def grid(reps: int, seed: int) -> str:
    lines = [
        "| pass band (F quantiles) | worst coverage | power k=6 n=3 | power k=6 n=5 | paired n=3 / n=5 |"
    ]
    lines.append("|---|---|---|---|---|")
    for check in ((0.0, 0.4), (0.0, 0.5), (0.05, 0.4), (0.05, 0.5), (0.05, 0.6), (0.1, 0.5)):
        res = coverage(reps, seed, ks=(4, 6, 8), ns=(3, 4, 5), check=check)
        worst = min(v["code"] for key, v in res.items() if key[0] != "power")
        p3, p5 = res[("power", 6, 3)], res[("power", 6, 5)]
        lines.append(
            f"| {check[0]:g} - {1 - check[1]:g} | {worst:.3f} | {p3['code']:.3f} | {p5['code']:.3f} | "
            f"{p3['paired']:.3f} / {p5['paired']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--dry", action="store_true", help="200 replicates, k 2 and 3, n 3")
    args = ap.parse_args()
    ks, ns = ((2, 3), (3,)) if args.dry else (KS, NS)
    args.reps = min(args.reps, 200) if args.dry else args.reps
    print(
        f"nominal 95%, {args.reps:,} replicates per cell, numpy seed {args.seed}, POOL_CHECK {P.POOL_CHECK}"
    )
    print(table(coverage(args.reps, args.seed, ks, ns), ks, ns))
    if args.grid:
        print()
        print(grid(args.reps, args.seed))


if __name__ == "__main__":
    main()
