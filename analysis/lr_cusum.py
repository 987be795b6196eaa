"""The acceptance detector of `decodegate watch`: a CUSUM on the step's own law, whose in-control
average run length (ARL) is computed exactly, not approximated.

What this module is: pure functions and one small state object over counts (no HTTP, no clock).
What it is not: the counter arithmetic, windows and dispersion (analysis.drift_detector).

The law of a step. A step is `a` accepted of `n` drafted tokens. In control, acceptance is at the
boundary p0 and `a` is beta-binomial BB(n, p0, ρ) with ρ = (φ − 1)/(n − 1), so that its variance
is φ·n·p0(1 − p0): φ = 1 is binomial, φ > 1 the measured overdispersion (drafts of one round are
rejected together, prompts differ). Out of control it is the same law at p1 = p0·(1 − drop).

The CUSUM. Each step adds the log-likelihood ratio W(a) = log f(a; p1) − log f(a; p0) of its own
count, rounded to a lattice of width δ nats: w(a) = round(W(a)/δ). S = max(0, S + w(a)) is an
integer, and the detector alarms when S ≥ H (h = H·δ nats). Because S lives on {0, ..., H − 1},
its run length is that of a finite Markov chain, and ARL = [(I − Q)⁻¹ 1]₀ is the detector's own
ARL, exactly (Brook and Evans 1972; Reynolds and Stoumbos' Bernoulli/binomial CUSUM), not an
approximation of it. H is the smallest integer whose ARL reaches the target; δ = log(target)/400
(Lorden: the LR CUSUM's ARL is about e^h), so the ARL lands within a few per cent above it.
Where one step decides alone (its LR so steep that S never carries evidence to the next step: p0
0.95, steps of 512), the ARLs on offer are 1/P(a ≤ k), far apart; a tuning to a smaller drop is
taken there, no slower on the drop asked for, and the ARL lands within 5% (`_tuned`).

The collapse path. A Shewhart limit on the same step: `a ≤ c` alarms at once, c the largest count
whose in-control probability is at most SHEWHART_SHARE/target. It enters the chain as one more
absorbing transition from every state, so the ARL of both together is the one computed, and H is
solved with it in place (the total false-alarm rate is the target's). Where the counts are too
dispersed for a limit (φ 5, p0 0.3: no count is that rare), the collapse's weight in the
alternative rises from 0.05 to 0.1 if that brings the collapse within COLLAPSE_STEPS steps on
average (exact); the best CUSUM for the collapse alone takes 6.2 steps there, so 10 is in reach.

Steps of other sizes. Steps are at least `min_drafted` tokens; a scrape that drafted more makes a
bigger step (a busy engine: every step is a scrape's worth). A step of N tokens is scored by the
LR of its own size (ρ_N keeps its variance φ·N·p0(1 − p0)) and judged by a design at N itself
(`Design.at`): the tuning of the design solved for the nearest size on a grid of ratio 2^(1/4),
its threshold solved again at N (a few ms; judged at the grid size's threshold, steps of 106
tokens at p0 0.99 had a quarter of the ARL), so traffic whose steps keep one size, any size,
gets an exact ARL at or above the target; steps that vary are checked by simulation
(`simulate_run_lengths` with `sizes`). One threshold for all sizes would not do: bigger steps end excursions of S sooner,
and more excursions per step mean more false alarms per step. Within one excursion (S > 0) the
threshold is the largest h of the sizes it met (`h_at`): h grows with the step size, and judging S
built on big steps against a small step's h gave up to 3× the false alarms promised (steps of
64 tokens with bursts of 128-1,024: 0.69-0.89 of the ARL; 1-64: 0.33). At one size it is that
size's h, so the exact ARL stands; at mixed sizes it errs towards fewer false alarms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import stats

STATES = 400            # lattice points per log(target) nats: the ARL lands within ~e^(1/400·log T) of T
MAX_H = 8 * STATES      # the largest chain solved: (I − Q) is MAX_H² floats (41 MB); 64·STATES took 5 GB and the machine
SHEWHART_SHARE = 0.1    # the share of the false-alarm budget the collapse limit may spend
COLLAPSE = 1 / 3        # the collapse the alternative also carries: acceptance at a third of p0
COLLAPSE_WEIGHT = 0.05  # its weight: costs log(1/0.95) = 0.05 nats a step on a slow drift
COLLAPSE_WEIGHTS = (COLLAPSE_WEIGHT, 0.1)  # 0.1 where it catches the collapse in time (0.2: 2-3x on a drift)
COLLAPSE_STEPS = 10     # ... within this many steps on average (exact): the 10 steps of 64 tokens
FINER = 8               # finer tunings tried where every nudge overshoots: drop × 2^(−1/2), ..., × 1/16
ARL_SLACK = 0.05        # how far above the target the ARL may land before the tuning is nudged
NUDGES = (1.0, 1.02, 0.98, 1.04, 0.96, 1.06, 0.94, 1.08, 0.92, 1.1, 0.9, 1.15, 0.85, 1.2, 0.8)


def step_pmf(n: int, p: float, phi: float) -> np.ndarray:
    """P(a = 0..n) of a step of n drafted tokens at acceptance p with variance inflation φ."""
    a = np.arange(n + 1)
    if phi <= 1.0 or n < 2 or p <= 0 or p >= 1:  # (at p 0 or 1 every law is a point mass)
        return stats.binom.pmf(a, n, min(max(p, 0.0), 1.0))
    rho = min((phi - 1.0) / (n - 1.0), 1 - 1e-9)
    m = 1.0 / rho - 1.0
    return stats.betabinom.pmf(a, n, p * m, (1 - p) * m)


def _logpmf(n: int, p: float, phi: float) -> np.ndarray:
    a = np.arange(n + 1)
    if phi <= 1.0 or n < 2:
        return stats.binom.logpmf(a, n, p)
    rho = min((phi - 1.0) / (n - 1.0), 1 - 1e-9)
    m = 1.0 / rho - 1.0
    return stats.betabinom.logpmf(a, n, p * m, (1 - p) * m)


@lru_cache(maxsize=256)
def _scores(n: int, p0: float, p1: float, phi: float, delta: float, share_per_step: float,
            weight: float = 0.0):
    """(w, c): the lattice increments w(a) for a = 0..n and the Shewhart limit c (−1: none).
    `weight` > 0: the alternative is the mixture (1 − weight)·f(p1) + weight·f(p0·COLLAPSE)."""
    alt = _logpmf(n, p1, phi)
    if weight > 0:
        alt = np.logaddexp(np.log1p(-weight) + alt, math.log(weight) + _logpmf(n, p0 * COLLAPSE, phi))
    llr = alt - _logpmf(n, p0, phi)
    w = np.rint(llr / delta).astype(np.int64)
    cdf = np.cumsum(step_pmf(n, p0, phi))
    below = np.flatnonzero(cdf <= share_per_step)
    return w, int(below[-1]) if below.size else -1


def arl(w: np.ndarray, c: int, H: int, pmf: np.ndarray) -> float:
    """Zero-state ARL of S = max(0, S + w(a)), alarm at S ≥ H or a ≤ c, for a ~ pmf: the Markov
    chain on {0, ..., H − 1} (Brook and Evans), solved exactly."""
    if H < 1:
        return 1.0
    keep = np.arange(w.size) > c                        # a ≤ c: the Shewhart alarm, absorbing
    w, pmf = w[keep], pmf[keep]
    to = np.arange(H)[:, None] + w[None, :]            # (H, a): the next state
    inside = to < H
    rows = np.broadcast_to(np.arange(H)[:, None], to.shape)[inside]
    cols = np.maximum(to, 0)[inside]
    q = np.zeros((H, H))
    np.add.at(q, (rows, cols), np.broadcast_to(pmf[None, :], to.shape)[inside])
    lengths = np.linalg.solve(np.eye(H) - q, np.ones(H))
    return float(lengths[0])


@dataclass(frozen=True)
class Design:
    """A detector's constants: the laws, the lattice, the threshold and the ARL it was solved for."""
    p0: float
    p1: float
    phi: float
    n: int                  # the step size the ARL is exact for (--min-drafted)
    target: float           # the in-control ARL asked for, in steps
    delta: float            # lattice width, nats
    H: int                  # threshold in lattice units
    arl: float              # the exact in-control ARL at steps of n (≥ target, close to it)
    shewhart: int           # the collapse limit at steps of n: a ≤ shewhart alarms (−1: none)
    weight: float = 0.0     # the collapse's weight in the alternative (0: p1 alone)

    @property
    def h(self) -> float:
        return self.H * self.delta

    @property
    def share_per_step(self) -> float:
        return SHEWHART_SHARE / self.target

    def at(self, n: int) -> "Design":
        """The design for steps of exactly n drafted tokens (cached): this one at its own size;
        else the tuning (p1, collapse weight) of the one solved for the nearest size on a grid of
        ratio 2^(1/4), with its threshold solved again at n itself, so that its exact ARL at
        steps of n is at or above the target. (Judged by the grid size's threshold, a step a few
        tokens off it gave up to 4x the false alarms: p0 0.99, steps of 106 judged at 108.)"""
        n = int(n)
        return self if n == self.n else _design_at(self, n)

    def scores(self, n: int) -> tuple[np.ndarray, int]:
        return _scores(int(n), self.p0, self.p1, self.phi, self.delta, self.share_per_step, self.weight)

    def run_length(self, p: float, n: int | None = None) -> float:
        """Exact zero-state ARL, in steps of n (default the design's), at true acceptance p."""
        n = self.n if n is None else int(n)
        w, c = self.scores(n)
        return arl(w, c, self.H, step_pmf(n, p, self.phi))


def _bucket(n: int, base: int) -> int:
    """The nearest size to n on the grid base·2^(j/4), j ≥ 0."""
    j = max(0, round(4 * math.log2(max(n, base) / base)))
    return int(round(base * 2 ** (j / 4)))


@lru_cache(maxsize=1024)
def _design_at(d: Design, size: int) -> Design:
    """d's design at steps of exactly `size`: the grid size's tuning, the threshold solved at size."""
    grid = _bucket(size, d.n)
    tuned = d if grid == d.n else _grid_design(d, grid)
    return tuned if tuned.n == size else _refined(d.p0, tuned.p1, size, d.phi, d.target, tuned.weight)


@lru_cache(maxsize=64)
def _grid_design(d: Design, size: int) -> Design:
    return design(d.p0, 1 - d.p1 / d.p0, size, d.phi, d.target, weight=d.weight)


def design(p0: float, drop: float, n: int, phi: float, target: float, *, weight: float | None = None) -> Design:
    """The detector for steps of n drafted tokens at boundary p0, tuned to a relative `drop` and to
    a collapse to p0·COLLAPSE carried at `weight`, whose exact in-control ARL (steps) is the
    smallest the lattice offers at or above `target`.

    `weight` None: the smallest of COLLAPSE_WEIGHTS whose detector catches the collapse within
    COLLAPSE_STEPS steps on average (exact); where none does, the first (the drift keeps its
    delay). Counts are discrete, so the ARL moves in jumps as h grows: see `_tuned`."""
    if not 0 < p0 < 1 or not 0 < drop < 1 or n < 1 or not phi >= 1 or not target > 1 or \
            not (weight is None or 0 <= weight < 1):
        raise ValueError(f"need 0 < p0 < 1, 0 < drop < 1, n ≥ 1, φ ≥ 1, target > 1 and 0 ≤ weight < 1; got "
                         f"p0={p0!r}, drop={drop!r}, n={n!r}, φ={phi!r}, target={target!r}, weight={weight!r}")
    if weight is not None:
        return _tuned(p0, drop, int(n), float(phi), float(target), float(weight))
    first = None
    for w in COLLAPSE_WEIGHTS:
        d = _tuned(p0, drop, int(n), float(phi), float(target), w)
        first = first or d
        if d.run_length(p0 * COLLAPSE) <= COLLAPSE_STEPS:
            return d
    return first


def _tuned(p0: float, drop: float, n: int, phi: float, target: float, weight: float) -> Design:
    """The design at `drop` whose exact ARL lands within ARL_SLACK above the target.

    Where the jump at `drop` overshoots, the tuning is nudged (drop × 1 ± 2%, ..., ± 20%: p1 is
    recorded). Where every nudge overshoots, one step is so informative that it decides alone (p0
    0.95, steps of 512: the LR moves 1.2 nats a count and sits 24 nats below 0 at p0, so S never
    carries evidence to the next step and the ARLs on offer are 1/P(a ≤ k), 1.8-2.2× apart): a
    finer tuning (drop × 2^(−j/2)) makes a step's LR gentle enough that evidence adds up over
    steps, and the ARLs on offer are dense. It is taken where it lands within the slack and is
    no slower on the drop asked for (exact delay within ARL_SLACK); else the closest above stays."""
    best = None
    for nudge in NUDGES:
        d = _refined(p0, p0 * (1 - min(drop * nudge, 0.999)), n, phi, target, weight)
        best = d if best is None or d.arl < best.arl else best
        if best.arl <= (1 + ARL_SLACK) * target:
            return best
    slowest = (1 + ARL_SLACK) * best.run_length(p0 * (1 - drop))
    for j in range(1, FINER + 1):
        d = _refined(p0, p0 * (1 - drop * 2 ** (-j / 2)), n, phi, target, weight)
        if d.arl <= (1 + ARL_SLACK) * target and d.run_length(p0 * (1 - drop)) <= slowest:
            return d
    return best


def _refined(p0: float, p1: float, n: int, phi: float, target: float, weight: float) -> Design:
    delta = math.log(target) / STATES
    for _ in range(4):  # a threshold of few lattice units is coarse: refine the lattice around it
        d = _solve(p0, p1, n, phi, target, delta, weight)
        if d.H >= STATES // 2:
            break
        delta = delta * max(d.H, 1) / STATES
    return d


def _solve(p0: float, p1: float, n: int, phi: float, target: float, delta: float, weight: float) -> Design:
    w, c = _scores(n, p0, p1, phi, delta, SHEWHART_SHARE / target, weight)
    pmf = step_pmf(n, p0, phi)
    lo, hi = 0, STATES
    while arl(w, c, hi, pmf) < target:
        lo, hi = hi, 2 * hi
        if hi > MAX_H:
            raise ValueError(f"no threshold up to {MAX_H} lattice units reaches an in-control ARL of {target:g} steps "
                             f"(p0={p0:.4g}, n={n}, φ={phi:.4g}): a step of {n} drafted tokens carries too little "
                             f"evidence at this acceptance; a larger --min-drafted gives it more")
    while hi - lo > 1:  # the ARL grows with H: the smallest H at or above the target
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if arl(w, c, mid, pmf) < target else (lo, mid)
    return Design(p0=p0, p1=p1, phi=phi, n=n, target=target, delta=delta, H=hi, arl=arl(w, c, hi, pmf), shewhart=c,
                  weight=weight)


@dataclass
class AcceptanceCusum:
    """The detector's state; `update(accepted, drafted)` after each scrape's difference.

    A step of N drafted tokens is scored by the LR of its own size and judged against the design
    at N (`Design.at`): traffic whose steps keep one size gets an exact ARL at that size.
    S is kept in nats and put on that design's lattice each step (exact while the size holds)."""
    design: Design
    S: float = 0.0
    steps: int = 0
    shewhart_fired: bool = False
    crossed: bool = False
    current: Design | None = None     # the design the last step was judged by
    pending_accepted: float = 0.0
    pending_drafted: float = 0.0
    drafted_since_reset: float = 0.0   # drafted tokens the statistic grew on since it was last 0
    h_seen: float = 0.0                # the largest h of the designs met since the statistic was last 0
    last_step: tuple = field(default=())

    @property
    def p0(self) -> float:
        return self.design.p0

    @property
    def phi(self) -> float:
        return self.design.phi

    @property
    def h(self) -> float:
        """The threshold the next step of the current size meets (nats)."""
        return max(self.h_seen, (self.current or self.design).h)

    @property
    def statistic(self) -> float:
        """S in nats (the log-likelihood ratio of a drop against the boundary, CUSUM-ed)."""
        return self.S

    @property
    def alarm(self) -> bool:
        return self.crossed or self.shewhart_fired

    def reset(self) -> None:
        self.S, self.shewhart_fired, self.crossed = 0.0, False, False
        self.pending_accepted = self.pending_drafted = self.drafted_since_reset = self.h_seen = 0.0

    def update(self, accepted: float, drafted: float) -> bool:
        """Add one scrape's difference; True when it completed a step (at least design.n drafted)."""
        self.pending_accepted += accepted
        self.pending_drafted += drafted
        if self.pending_drafted < self.design.n:
            return False
        a, n = int(round(self.pending_accepted)), int(round(self.pending_drafted))
        d = self.current = self.design.at(n)
        w, c = d.scores(n)
        units = max(0, int(round(self.S / d.delta)) + int(w[a]))
        self.S = units * d.delta
        top = max(self.h_seen, d.h)
        self.crossed = self.crossed or units >= h_units(top, d)
        self.h_seen = top if units > 0 else 0.0
        self.shewhart_fired = self.shewhart_fired or a <= c
        self.drafted_since_reset = self.drafted_since_reset + n if units > 0 else 0.0
        self.steps, self.last_step = self.steps + 1, (a, n)
        self.pending_accepted = self.pending_drafted = 0.0
        return True


def h_units(h: float, d: Design) -> int:
    """The threshold h (nats) on the lattice of d: d.H where h is d's own."""
    return d.H if h <= d.h else math.ceil(h / d.delta - 1e-9)


def simulate_run_lengths(d: Design, p: float, *, runs: int, max_steps: int, sizes=None,
                         rng: np.random.Generator | int | None = None) -> np.ndarray:
    """Run lengths (steps) of the detector `d` on simulated steps at acceptance p: counts drawn
    from the step's law (beta-binomial at the design's φ), scored by the detector's own increments
    and limit (`Design.scores`, what `AcceptanceCusum.update` applies). `sizes`: step sizes drawn
    uniformly from it (default: every step of d.n). Runs without an alarm return max_steps + 1."""
    rng = np.random.default_rng(rng)
    if sizes is None:
        return _run_lengths_one_size(d, p, runs, max_steps, rng)
    sizes = np.array(sizes, dtype=int)
    tables = [(d.at(m), d.at(m).scores(m), np.cumsum(step_pmf(int(m), p, d.phi))) for m in sizes]
    s = np.zeros(runs)   # nats, put on each step's lattice as AcceptanceCusum.update does
    seen = np.zeros(runs)  # the largest h met since S was last 0, as AcceptanceCusum.h_seen
    first = np.full(runs, max_steps + 1)
    live = np.arange(runs)
    for t in range(max_steps):
        dm, (w, c), cdf = tables[rng.integers(0, len(sizes)) if len(sizes) > 1 else 0]
        a = np.minimum(np.searchsorted(cdf, rng.random(live.size)), cdf.size - 1)
        units = np.maximum(0, np.rint(s[live] / dm.delta).astype(np.int64) + w[a])
        s[live] = units * dm.delta
        top = np.maximum(seen[live], dm.h)
        limit = np.where(top <= dm.h, dm.H, np.ceil(top / dm.delta - 1e-9)).astype(np.int64)
        seen[live] = np.where(units > 0, top, 0.0)
        hit = (units >= limit) | (a <= c)
        first[live[hit]] = t + 1
        live = live[~hit]
        if live.size == 0:
            break
    return first


def _run_lengths_one_size(d: Design, p: float, runs: int, max_steps: int, rng, block: int | None = None) -> np.ndarray:
    """simulate_run_lengths for steps of d.n, a block of steps at a time: within a block S follows
    Lindley's form of the recursion, S_t = max(S_0 + W_t, W_t − min_{s ≤ t} W_s) with W the
    running sum of the increments (W_0 = 0), the same S as max(0, S + w) step by step."""
    (w, c), cdf = d.scores(d.n), np.cumsum(step_pmf(d.n, p, d.phi))
    s0 = np.zeros(runs, dtype=np.int64)
    first = np.full(runs, max_steps + 1)
    live, done = np.arange(runs), 0
    while live.size and done < max_steps:
        b = min(block or int(np.clip(d.arl / 8, 32, 4096)), max_steps - done)
        a = np.minimum(np.searchsorted(cdf, rng.random((live.size, b))), cdf.size - 1)
        walk = np.cumsum(w[a], axis=1)                                       # (runs, b): W_1..W_b
        low = np.minimum(np.minimum.accumulate(walk, axis=1), 0)             # min over s of W_s, W_0 = 0
        s = np.maximum(s0[live, None] + walk, walk - low)
        hit = (s >= d.H) | (a <= c)
        any_hit = hit.any(axis=1)
        first[live[any_hit]] = done + np.argmax(hit[any_hit], axis=1) + 1
        s0[live] = s[:, -1]
        live, done = live[~any_hit], done + b
    return first


def replay_scrapes(accepted, drafted, d: Design, *, runs: int, max_steps: int,
                   rng: np.random.Generator | int | None = None) -> np.ndarray:
    """Run lengths, in detector steps, of `AcceptanceCusum(d)` itself fed recorded scrape
    differences (accepted, drafted per scrape) resampled with replacement: a long, time-compressed
    replay of counters recorded from an engine. Runs without an alarm return max_steps + 1."""
    a, n = np.asarray(accepted, float), np.asarray(drafted, float)
    if a.size == 0 or n.sum() <= 0:
        raise ValueError("no drafted tokens recorded: nothing to replay")
    rng = np.random.default_rng(rng)
    out = np.full(runs, max_steps + 1)
    for r in range(runs):
        det = AcceptanceCusum(d)
        while det.steps < max_steps:
            for i in rng.integers(0, a.size, size=64):
                if det.update(a[i], n[i]) and det.alarm:
                    break
            if det.alarm:
                out[r] = det.steps
                break
    return out
