"""Live acceptance against a reference: counter differences, windows, dispersion.

What this module is: the statistics behind `decodegate watch`, as pure functions over counts
(no HTTP, no clocks). What it is not: a scraper or a server (harness.commands.watch is), or the
detector (analysis.lr_cusum).

Counters. An engine's spec-decode counters (drafted tokens, accepted tokens) only grow while the
process lives. Between two readings the difference is what was drafted meanwhile. A reading
lower than the one before is a new process (an *epoch*): its values are counted from zero, so
nothing drafted since the restart is lost (the tokens drafted between the last scrape and the
crash are never exported: a short --interval keeps them few). Lower values without a restart signature (a scrape
that failed in between, a changed process start time, or every counter of the engine lower at
once, as in a fresh process) are refused: something other than a restart moved them.

The detector itself (a CUSUM on the step's own law, its ARL computed exactly) is analysis.lr_cusum.
φ, the overdispersion of acceptance counts (drafts of one round are rejected together, prompts
differ), is measured on the reference run's requests as Pearson's χ² over its degrees of freedom
(at least 1), and used at its 95% upper bound (`dispersion_upper`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats


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


# --------------------------------------------------------------------------------- run lengths

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
