"""Live acceptance against a reference: counter differences, windows and a one-sided CUSUM.

What this module is: the statistics behind `decodegate watch`, as pure functions over counts
(no HTTP, no clocks). What it is not: a scraper or a server (harness.commands.watch is).

Counters. An engine's spec-decode counters (drafted tokens, accepted tokens) only grow while the
process lives. Between two readings the difference is what was drafted meanwhile. A reading
lower than the one before is a new process (an *epoch*): its values are counted from zero, so
nothing drafted since the restart is lost (the tokens drafted between the last scrape and the
crash are never exported: a short --interval keeps them few). Lower values without a restart signature (a scrape
that failed in between, a changed process start time, or every counter of the engine lower at
once, as in a fresh process) are refused: something other than a restart moved them.

The detector. Drafted tokens are grouped into *steps* of at least `min_drafted` tokens (a scrape
interval with fewer is carried into the next). For a step with `a` accepted of `n` drafted,

    z = (p0·n − a) / sqrt(φ · p0 · (1 − p0) · n)

is the standardized deficit of accepted drafts below p0, the in-control boundary (the
reference's lower bound less the tolerance). φ is the overdispersion of acceptance counts
(drafts of one round are rejected together, prompts differ), measured on the reference run's
requests as Pearson's χ² over its degrees of freedom (at least 1), and used at its 95% upper
bound (`dispersion_upper`). At p = p0, z is about N(0, 1)
whatever the traffic; at p > p0 it drifts down. The one-sided CUSUM S = max(0, S + z − k) alarms at
S ≥ h. Its in-control average run length (ARL, steps until a false alarm) is set by h through
Siegmund's approximation for a Gaussian CUSUM,

    ARL(Δ) ≈ (exp(−2Δb) + 2Δb − 1) / (2Δ²),   b = h + 1.166,   Δ = E[z] − k,

solved for h at Δ = −k (`cusum_threshold`); `simulate_run_lengths` checks it by simulation.
A step can come at most once a scrape interval, so an ARL of H hours is H·3600/interval steps:
a quieter engine takes longer per step and alarms falsely less often in wall time, not more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

SIEGMUND_SHIFT = 1.166  # b = h + 1.166: the overshoot correction for Gaussian increments


class CounterError(ValueError):
    """Counters that cannot be read as spec-decode counters of one engine (refused, exit 2)."""


# ------------------------------------------------------------------------------------ counters

@dataclass(frozen=True)
class Reading:
    """One scrape: the spec-decode counters and every other `_total` counter of the engine."""
    drafted: float
    accepted: float
    drafts: float | None = None
    others: dict = field(default_factory=dict)   # other counters: a fresh process resets them too
    start_time: float | None = None              # process_start_time_seconds, where exported
    generated: float | None = None               # the engine's generated-token counter, where exported
    spec: bool = True                            # False: the spec-decode series are gone (drafted, accepted 0)


@dataclass(frozen=True)
class Delta:
    drafted: float
    accepted: float
    drafts: float | None
    restarted: bool
    why: str = ""


def counter_delta(before: Reading, after: Reading, *, failed_scrape_between: bool = False) -> Delta:
    """What was drafted and accepted between two readings, a restart counted as a new epoch."""
    went_down = [name for name, b, a in (("drafted", before.drafted, after.drafted),
                                         ("accepted", before.accepted, after.accepted),
                                         ("drafts", before.drafts, after.drafts))
                 if b is not None and a is not None and a < b]
    if not went_down and _new_process(before, after, failed_scrape_between):
        # A fresh process whose spec counters already passed the old ones: still a new epoch.
        return Delta(after.drafted, after.accepted, after.drafts, True, "the engine restarted (start time or counters)")
    if went_down:
        why = _restart_signature(before, after, failed_scrape_between)
        if why is None:
            raise CounterError(f"spec-decode counters went backwards ({', '.join(went_down)}: "
                               f"{_pairs(before, after, went_down)}) with no sign of a restart (the engine "
                               f"answered every scrape, its start time and other counters did not reset): "
                               f"is more than one engine behind this URL?")
        return Delta(after.drafted, after.accepted, after.drafts, True, why)
    delta = Delta(after.drafted - before.drafted, after.accepted - before.accepted,
                  None if before.drafts is None or after.drafts is None else after.drafts - before.drafts, False)
    if delta.accepted > delta.drafted:
        raise CounterError(f"accepted tokens grew by {delta.accepted:g} while drafted grew by {delta.drafted:g}: "
                           "these are not one engine's spec-decode counters")
    return delta


def _pairs(before: Reading, after: Reading, names) -> str:
    return ", ".join(f"{n} {getattr(before, n):g} -> {getattr(after, n):g}" for n in names)


def _new_process(before: Reading, after: Reading, failed_scrape_between: bool) -> bool:
    if before.start_time is not None and after.start_time is not None and after.start_time != before.start_time:
        return True
    return failed_scrape_between and any(after.others.get(k, v) < v for k, v in before.others.items())


def _restart_signature(before: Reading, after: Reading, failed_scrape_between: bool) -> str | None:
    if before.start_time is not None and after.start_time is not None and after.start_time != before.start_time:
        return "process start time changed"
    if failed_scrape_between:
        return "the engine stopped answering in between"
    shared = [k for k, v in before.others.items() if v > 0 and k in after.others]
    if shared and all(after.others[k] < before.others[k] for k in shared):
        return "every counter of the engine reset"
    return None


# ------------------------------------------------------------------------------------- windows

def wilson_interval(accepted: float, drafted: float, *, dispersion: float = 1.0,
                    level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of accepted/drafted at the effective size drafted/φ (nan, nan if none)."""
    if drafted <= 0:
        return float("nan"), float("nan")
    n = drafted / max(dispersion, 1.0)
    p = accepted / drafted
    z = stats.norm.ppf(0.5 + level / 2)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def dispersion(accepted, drafted) -> float:
    """Overdispersion φ of per-request acceptance counts: Pearson χ² / (R − 1), at least 1."""
    a, n = np.asarray(accepted, float), np.asarray(drafted, float)
    keep = n > 0
    a, n = a[keep], n[keep]
    if a.size < 2:
        return 1.0
    p = a.sum() / n.sum()
    if p <= 0 or p >= 1:
        return 1.0
    chi2 = float((((a - p * n) ** 2) / (p * (1 - p) * n)).sum())
    return max(1.0, chi2 / (a.size - 1))


def dispersion_upper(accepted, drafted, level: float = 0.95) -> float:
    """A one-sided upper confidence bound on φ (χ² with R − 1 degrees of freedom): a dispersion
    measured on few requests is taken at its bound, so the detector's ARL holds rather than
    falling short (12 requests: 2.4 φ; 200: 1.18 φ)."""
    n = np.asarray(drafted, float)
    df = int((n > 0).sum()) - 1
    if df < 1:
        return float("inf")
    return max(1.0, dispersion(accepted, drafted) * df / float(stats.chi2.ppf(1 - level, df)))


# ------------------------------------------------------------------------------------ the CUSUM

def siegmund_arl(h: float, k: float, mean: float = 0.0) -> float:
    """Siegmund's ARL of S = max(0, S + z − k), alarm at S ≥ h, for z ~ N(mean, 1)."""
    delta, b = mean - k, h + SIEGMUND_SHIFT
    if abs(delta) < 1e-12:
        return b * b
    return (math.exp(-2 * delta * b) + 2 * delta * b - 1) / (2 * delta * delta)


def cusum_threshold(arl_steps: float, k: float) -> float:
    """The h whose in-control ARL (Siegmund) is `arl_steps` steps."""
    if arl_steps <= 1 or k <= 0:
        raise ValueError(f"need an ARL above 1 step and k > 0; got arl_steps={arl_steps!r}, k={k!r}")
    return float(optimize.brentq(lambda h: siegmund_arl(h, k) - arl_steps, 1e-9, 200.0))


def standardized_deficit(accepted, drafted, p0: float, phi: float):
    """z = (p0·n − a) / sqrt(φ p0 (1 − p0) n): positive when fewer drafts are accepted than p0 says."""
    a, n = np.asarray(accepted, float), np.asarray(drafted, float)
    return (p0 * n - a) / np.sqrt(phi * p0 * (1 - p0) * n)


def reference_value(p0: float, drop: float, phi: float, min_drafted: int) -> float:
    """k: half the shift in z per step that a relative drop `drop` of acceptance below p0 makes at
    `min_drafted` tokens a step (the CUSUM is quickest for the shift 2k), kept in [0.1, 1.0]
    (past k = 1 Siegmund's approximation runs more than 6% short of the simulated ARL)."""
    shift = p0 * drop * math.sqrt(min_drafted) / math.sqrt(phi * p0 * (1 - p0))
    return min(1.0, max(0.1, shift / 2))


@dataclass
class Cusum:
    """The detector's state; `update(accepted, drafted)` after each scrape's difference."""
    p0: float
    k: float
    h: float
    phi: float = 1.0
    min_drafted: int = 64
    statistic: float = 0.0
    steps: int = 0
    pending_accepted: float = 0.0
    pending_drafted: float = 0.0
    drafted_since_reset: float = 0.0   # drafted tokens the statistic has grown on since it was last 0
    last_z: float = float("nan")

    def __post_init__(self):
        if not 0 < self.p0 < 1:
            raise ValueError(f"the in-control acceptance p0 must lie in (0, 1), got {self.p0!r}")

    @property
    def alarm(self) -> bool:
        return self.statistic >= self.h

    def reset(self) -> None:
        """Back to the start (an acknowledged alarm): statistic 0, nothing pending."""
        self.statistic = self.pending_accepted = self.pending_drafted = self.drafted_since_reset = 0.0

    def update(self, accepted: float, drafted: float) -> bool:
        """Add one scrape's difference; True when it completed a step."""
        self.pending_accepted += accepted
        self.pending_drafted += drafted
        if self.pending_drafted < self.min_drafted:
            return False
        z = float(standardized_deficit(self.pending_accepted, self.pending_drafted, self.p0, self.phi))
        self.statistic = max(0.0, self.statistic + z - self.k)
        self.drafted_since_reset = self.drafted_since_reset + self.pending_drafted if self.statistic > 0 else 0.0
        self.last_z, self.steps = z, self.steps + 1
        self.pending_accepted = self.pending_drafted = 0.0
        return True


def cusum_run_lengths(z: np.ndarray, k: float, h: float) -> np.ndarray:
    """Steps to the first alarm of each row of z (runs, steps); steps + 1 where none came
    (the same recursion as `Cusum.update`, vectorised over runs)."""
    runs, steps = z.shape
    s = np.zeros(runs)
    first = np.full(runs, steps + 1)
    for t in range(steps):
        s = np.maximum(0.0, s + z[:, t] - k)
        hit = (s >= h) & (first > steps)
        first[hit] = t + 1
    return first


def simulate_run_lengths(h: float, k: float, *, runs: int, max_steps: int, mean: float = 0.0,
                         rng: np.random.Generator | int | None = None) -> np.ndarray:
    """Run lengths of the CUSUM on z ~ N(mean, 1) (the check of `cusum_threshold`)."""
    rng = np.random.default_rng(rng)
    return cusum_run_lengths(rng.normal(mean, 1.0, size=(runs, max_steps)), k, h)


def replay_scrapes(accepted, drafted, detector: Cusum, *, runs: int, max_steps: int,
                   rng: np.random.Generator | int | None = None) -> np.ndarray:
    """Run lengths, in detector steps, of `detector` on recorded scrape differences (accepted,
    drafted per scrape) resampled with replacement: a long, time-compressed replay of counters
    recorded from an engine. Scrapes are grouped into steps as `Cusum.update` groups them (at least
    `min_drafted` tokens; fewer carried over). Runs without an alarm are censored at `max_steps`
    (returned as max_steps + 1)."""
    a, n = np.asarray(accepted, float), np.asarray(drafted, float)
    if a.size == 0 or n.sum() <= 0:
        raise ValueError("no drafted tokens recorded: nothing to replay")
    rng = np.random.default_rng(rng)
    s, pa, pn = np.zeros(runs), np.zeros(runs), np.zeros(runs)
    steps = np.zeros(runs, dtype=int)
    first = np.full(runs, max_steps + 1)
    while np.any((steps < max_steps) & (first > max_steps)):
        idx = rng.integers(0, a.size, size=runs)
        pa, pn = pa + a[idx], pn + n[idx]
        step = (pn >= detector.min_drafted) & (steps < max_steps) & (first > max_steps)
        z = standardized_deficit(pa[step], pn[step], detector.p0, detector.phi)
        s[step] = np.maximum(0.0, s[step] + z - detector.k)
        steps[step] += 1
        hit = step & (s >= detector.h)
        first[hit] = steps[hit]
        pa[step] = pn[step] = 0.0
    return first


def mean_run_length(lengths: np.ndarray, max_steps: int) -> float:
    """ARL from run lengths with runs censored at max_steps (exponential MLE: total steps watched
    over alarms seen; the CUSUM's run length is close to geometric in control)."""
    alarms = int((lengths <= max_steps).sum())
    watched = float(np.minimum(lengths, max_steps).sum())
    return float("inf") if alarms == 0 else watched / alarms


def group_steps(accepted, drafted, min_drafted: int) -> tuple[np.ndarray, np.ndarray]:
    """Scrape differences grouped into steps of at least `min_drafted` drafted tokens, as
    `Cusum.update` groups them (a trailing remainder is dropped)."""
    out_a, out_n, pa, pn = [], [], 0.0, 0.0
    for a, n in zip(accepted, drafted):
        pa, pn = pa + a, pn + n
        if pn >= min_drafted:
            out_a.append(pa)
            out_n.append(pn)
            pa = pn = 0.0
    return np.asarray(out_a), np.asarray(out_n)
