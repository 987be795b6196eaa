"""The figures of docs/monitoring.md for `watch`'s detector (analysis.lr_cusum), printed as
Markdown: the in-control ARL at the grid p0 × step size × φ × target, exact (the Markov chain) and
simulated through the detector's own scores; the delay, in steps and drafted tokens, of drops of
10%, 30%, 2/3 (a third of p0) and 90% at the default false-alarm rate (--arl-hours 720,
--interval 15: 172,800 steps). tests/test_lr_cusum.py runs a small version.

    PYTHONPATH=. python scripts/watch_detector_grid.py [--quick]
"""
from __future__ import annotations

import sys
import time

import numpy as np

from analysis.lr_cusum import design, simulate_run_lengths

P0S, SIZES, PHIS = (0.3, 0.6, 0.8, 0.95), (16, 64, 512), (1.0, 5.0)
DEFAULT_STEPS = 720 * 3600 / 15


def arl_grid(targets, quick: bool) -> None:
    """Complete run lengths (every run to its alarm), so their mean is the ARL without censoring."""
    print("| target | p0 | drafted a step | φ | tuned to p1 / p0 | collapse weight | h (nats) | collapse limit | "
          "exact ARL / target | simulated / target | runs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(2026)
    for target in targets:
        for phi in PHIS:
            for p0 in P0S:
                for n in SIZES:
                    d = design(p0, 0.10, n, phi, target)
                    runs = (2000 if target <= 1e3 else 500) if not quick else 200
                    lengths = simulate_run_lengths(d, p0, runs=runs, max_steps=int(60 * target), rng=rng)
                    assert np.all(lengths <= 60 * target)
                    sim, count = lengths.mean(), lengths.size
                    print(f"| {target:.0e} | {p0} | {n} | {phi:g} | {d.p1 / p0:.4f} | {d.weight:g} | {d.h:.2f} | "
                          f"{d.shewhart} | {d.arl / target:.3f} | {sim / target:.3f} | {count} |", flush=True)


def delay_table() -> None:
    """Exact delays (the chain's zero-state ARL at the lower acceptance); the collapse's also
    simulated through the detector's own scores (2,000 runs)."""
    print("\n| φ | p0 | collapse weight | 10% drop | 30% drop | to a third | to a third, simulated | 90% drop | "
          " (steps of 64 drafted tokens; drafted tokens) |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(2027)
    for phi in PHIS:
        for p0 in P0S:
            d = design(p0, 0.10, 64, phi, DEFAULT_STEPS)
            cells = [d.run_length(p0 * f) for f in (0.9, 0.7, 1 / 3)]
            cells.append(simulate_run_lengths(d, p0 / 3, runs=2000, max_steps=10_000, rng=rng).mean())
            cells.append(d.run_length(p0 * 0.1))
            print(f"| {phi:g} | {p0} | {d.weight:g} | " + " | ".join(f"{x:.1f} ({64 * x:,.0f})" for x in cells) +
                  f" | in-control ARL {d.arl:,.0f} steps |", flush=True)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    t0 = time.time()
    delay_table()
    print()
    arl_grid([float(t) for t in next((a.split("=")[1].split(",") for a in sys.argv if a.startswith("--targets=")),
                                     ["1e3", "1e5"])], quick)
    print(f"\n{time.time() - t0:.0f} s", flush=True)
