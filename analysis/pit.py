"""Exactness of a sampler by the sequential randomized probability integral transform (PIT).

At each emitted token x_t, with the target's shaped distribution p_t at that context
(temperature, top-k, top-p; from a teacher-forced forward) and the vocabulary ordered by p_t
(descending, ties by token id),

    u_t = F_t(x_t-) + V_t * p_t(x_t),     V_t ~ U(0, 1) independent of everything,

where F_t(x-) is the mass of the tokens ordered before x. If every x_t is drawn from p_t given the
past, u_t is U(0, 1) given the past, so u_1, u_2, ... are i.i.d. U(0, 1) whatever the prompts and
positions, and however each sequence stopped (EOS, max tokens and stop strings are decisions on
past tokens). Every token a run sampled, over prompts and seeds, pools into one test (randomized
PIT for discrete forecasts: Brockwell 2007; Czado, Gneiting and Held 2009).

The same holds on any subset of positions chosen from the past alone, such as the positions where
the verifier tested a draft token (whether a draft is tested there depends on the context and on
the draft's own draws, not on the target's choice at that position). It does not hold on
positions chosen by the outcome there: where the verifier rejected a draft, the token follows the
residual normalize(max(p - q, 0)), and there the PIT must be taken under that residual.

Three statistics, combined by Bonferroni (p = 3 min):

- Neyman's smooth test of order 4 on u (normalised Legendre polynomials, chi-square with 4 df):
  sensitive to distortions spread over the distribution (a flatter or a sharper one).
- The same test on the PIT with the vocabulary in token-id order instead (any order fixed before
  the draw gives i.i.d. uniforms). Samplers draw by inverse CDF in id order, so their bugs (a
  uniform reused, a residual not normalised) move mass between tokens by id, unrelated to rank.
- Rank classes: the counts of tokens at the target's rank 1, 2, 3-4 and beyond against their
  predicted counts sum_t pi_t, with the martingale covariance sum_t (diag pi_t - pi_t pi_t^T)
  (chi-square, classes - 1 df; classes expected fewer than 5 times are merged upward). This is a
  PIT histogram whose bins sit at each step's own rank boundaries, where the distortions that
  matter most move mass (between the likeliest tokens); fixed bins of u blur them, because the top
  token's probability varies from step to step.

A token of probability 0 under the distribution it must follow is outright evidence (p = 0).
``detectable_tv`` is the smallest distortion the rank test would detect with 80% power at the
given level, for one concrete shape: TV delta moved between the two likeliest tokens at every
tested position (noncentral chi-square with the sample's own covariance). ``deviation`` is an
effect size that, unlike a p-value, compares samples of different sizes: the total variation at
the rank-class resolution, or the share of impossible tokens (the gate asks whether a candidate
is further from the reference than the baseline control).

Size and power (total variation 0.01-0.1, several distortion shapes, the shipped token counts):
``harness/calibration/CALIBRATION.md``. Pure functions; randomness comes from ``rng``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.polynomial import legendre
from scipy import optimize, stats

from ._common import as_rng

RANK_EDGES = (1, 2, 4)     # classes: rank 1, rank 2, ranks 3-4, ranks 5 and beyond
NEYMAN_ORDER = 4
MIN_TOKENS = 10            # below this no test is run
MIN_EXPECTED = 5.0         # a rank class expected fewer times joins the class above it
POWER = 0.8


@dataclass(frozen=True)
class PitFeatures:
    """Per token, what the tests need: the mass ordered before it, its own probability, the
    probabilities of the rank classes at its step, and the class it fell in."""

    mass_before: np.ndarray     # (T,) in the order by probability
    p_token: np.ndarray         # (T,)
    class_probs: np.ndarray     # (T, C)
    token_class: np.ndarray     # (T,) int
    mass_before_id: np.ndarray  # (T,) in token-id order

    FIELDS = ("mass_before", "p_token", "class_probs", "token_class", "mass_before_id")

    def __len__(self) -> int:
        return int(self.p_token.size)

    def select(self, mask) -> PitFeatures:
        m = np.asarray(mask)
        return PitFeatures(*(getattr(self, f)[m] for f in self.FIELDS))

    @staticmethod
    def concat(parts: Sequence[PitFeatures]) -> PitFeatures:
        parts = [p for p in parts if len(p)]
        if not parts:
            return empty_features()
        return PitFeatures(*(np.concatenate([getattr(p, f) for p in parts]) for f in PitFeatures.FIELDS))


def empty_features() -> PitFeatures:
    c = len(RANK_EDGES) + 1
    return PitFeatures(np.empty(0), np.empty(0), np.empty((0, c)), np.empty(0, dtype=np.int64), np.empty(0))


def features(probs, tokens) -> PitFeatures:
    """Features of tokens (T,) drawn from the rows of probs (T, V); rows need not be normalised
    (a residual max(p - q, 0) is divided by its mass here)."""
    p = np.asarray(probs, dtype=np.float64)
    x = np.asarray(tokens, dtype=np.int64)
    if p.ndim != 2 or x.shape != (p.shape[0],):
        raise ValueError(f"probs must be (T, V) and tokens (T,); got {p.shape} and {x.shape}")
    if x.size == 0:
        return empty_features()
    if np.any((x < 0) | (x >= p.shape[1])):
        raise ValueError("a token id lies outside the distribution's vocabulary")
    total = p.sum(axis=1, keepdims=True)
    if np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(total <= 0):
        raise ValueError("probs must be finite, non-negative, with positive mass in every row")
    p = p / total
    rows = np.arange(x.size)
    px = p[rows, x]
    ids = np.arange(p.shape[1])
    before = (p > px[:, None]) | ((p == px[:, None]) & (ids[None, :] < x[:, None]))  # (T, V)
    mass_before = np.minimum(np.where(before, p, 0.0).sum(axis=1), 1.0)
    rank = before.sum(axis=1)  # 0-based rank of the token in the ordering
    k = min(RANK_EDGES[-1], p.shape[1])
    top = -np.sort(np.partition(-p, k - 1, axis=1)[:, :k], axis=1)  # (T, k) descending
    top = np.pad(top, ((0, 0), (0, RANK_EDGES[-1] - k)))
    edges = (0, *RANK_EDGES)
    cls = [top[:, a:b].sum(axis=1) for a, b in zip(edges[:-1], edges[1:])]
    cls.append(np.maximum(1.0 - np.sum(cls, axis=0), 0.0))
    token_class = np.searchsorted(np.asarray(RANK_EDGES), rank, side="right")
    mass_before_id = np.minimum(np.where(ids[None, :] < x[:, None], p, 0.0).sum(axis=1), 1.0)
    return PitFeatures(mass_before, px, np.stack(cls, axis=1), token_class, mass_before_id)


def pit_values(feat: PitFeatures, *, rng=None, order: str = "probability", v=None) -> np.ndarray:
    """The randomized PIT values of the tokens that are possible (p > 0), with the vocabulary
    ordered by ``"probability"`` (descending) or by token ``"id"``; ``v``: the uniforms to use."""
    if order not in ("probability", "id"):
        raise ValueError(f"order must be 'probability' or 'id', not {order!r}")
    v = as_rng(rng).random(len(feat)) if v is None else np.asarray(v, dtype=float)
    before = feat.mass_before if order == "probability" else feat.mass_before_id
    u = before + v * feat.p_token
    return np.clip(u[feat.p_token > 0], 0.0, 1.0)


def neyman_smooth(u, order: int = NEYMAN_ORDER) -> tuple[float, float]:
    """(statistic, p-value) of Neyman's smooth test of uniformity of u on [0, 1]."""
    u = np.asarray(u, dtype=float)
    n = u.size
    stat = 0.0
    for j in range(1, order + 1):
        coef = np.zeros(j + 1)
        coef[j] = 1.0
        psi = np.sqrt(2 * j + 1) * legendre.legval(2 * u - 1, coef)
        stat += psi.sum() ** 2 / n
    return float(stat), float(stats.chi2.sf(stat, order))


def _merged_classes(expected: np.ndarray) -> list[list[int]]:
    """Rank classes merged so that each is expected at least MIN_EXPECTED times (from the tail up)."""
    groups = [[c] for c in range(expected.size)]
    sums = [float(e) for e in expected]
    i = len(groups) - 1
    while len(groups) > 1 and i >= 1:
        if sums[i] < MIN_EXPECTED:
            groups[i - 1] += groups.pop(i)
            sums[i - 1] += sums.pop(i)
        i -= 1
    if len(groups) > 1 and sums[0] < MIN_EXPECTED:
        groups[1] = groups[0] + groups[1]
        sums[1] += sums[0]
        groups.pop(0)
    return groups


def _rank_parts(feat: PitFeatures):
    """(groups, S, covariance) of the rank-class statistic, classes merged."""
    pi = feat.class_probs
    groups = _merged_classes(pi.sum(axis=0))
    pi_g = np.stack([pi[:, g].sum(axis=1) for g in groups], axis=1)          # (T, G)
    onehot = np.stack([np.isin(feat.token_class, g) for g in groups], axis=1)  # (T, G)
    s = (onehot - pi_g).sum(axis=0)
    cov = np.diag(pi_g.sum(axis=0)) - pi_g.T @ pi_g
    return groups, s, cov


def _quadratic(s: np.ndarray, cov: np.ndarray) -> tuple[float, int]:
    """s^T cov^+ s and the rank of cov (its null direction: the class counts sum to T)."""
    w, vec = np.linalg.eigh(cov)
    keep = w > 1e-9 * max(float(w.max()), 1e-300)
    proj = vec[:, keep].T @ s
    return float(np.sum(proj * proj / w[keep])), int(keep.sum())


def rank_class_test(feat: PitFeatures) -> tuple[float, float, int]:
    """(statistic, p-value, df) of the rank-class test; df 0 (p = 1) when nothing can vary."""
    groups, s, cov = _rank_parts(feat)
    if len(groups) < 2:
        return 0.0, 1.0, 0
    stat, df = _quadratic(s, cov)
    if df == 0:
        return 0.0, 1.0, 0
    return stat, float(stats.chi2.sf(stat, df)), df


def detectable_tv(feat: PitFeatures, *, level: float, power: float = POWER) -> float | None:
    """Smallest TV of a top-two exchange (at every position) the rank test detects with
    ``power`` at ``level``; None when it cannot at any size (too few tokens, classes merged)."""
    if len(feat) < MIN_TOKENS:
        return None
    groups, _, cov = _rank_parts(feat)
    g1 = next(i for i, g in enumerate(groups) if 0 in g)
    g2 = next(i for i, g in enumerate(groups) if 1 in g)
    if g1 == g2:
        return None
    p1 = feat.class_probs[:, 0]
    w, vec = np.linalg.eigh(cov)
    keep = w > 1e-9 * max(float(w.max()), 1e-300)
    df = int(keep.sum())
    if df == 0:
        return None
    crit = stats.chi2.ppf(1 - level, df)

    def power_at(delta: float) -> float:
        shift = np.zeros(len(groups))
        moved = np.minimum(delta, p1).sum()
        shift[g1], shift[g2] = -moved, moved
        proj = vec[:, keep].T @ shift
        lam = float(np.sum(proj * proj / w[keep]))
        return float(stats.ncx2.sf(crit, df, lam)) - power

    if power_at(0.5) < 0:
        return None
    return float(optimize.brentq(power_at, 1e-6, 0.5, xtol=1e-5))


NEEDED_TV = 0.1  # the distortion an inconclusive test says how many tokens would detect


def tokens_needed(feat: PitFeatures, *, level: float, tv: float = NEEDED_TV, power: float = POWER,
                  most: int = 1 << 17) -> int | None:
    """Tokens like these (the same per-position distributions: ``feat`` repeated) that the rank
    test needs to detect a top-two exchange of ``tv`` with ``power``; None beyond ``most`` or
    without tokens. What an inconclusive verdict says would decide."""
    n = len(feat)
    if n == 0:
        return None

    def enough(k: int) -> bool:
        d = detectable_tv(PitFeatures(*(np.concatenate([getattr(feat, f)] * k) for f in PitFeatures.FIELDS)),
                          level=level, power=power)
        return d is not None and d <= tv

    k = 1
    while not enough(k):
        if n * k * 2 > most:
            return None
        k *= 2
    lo, hi = k // 2, k  # enough(hi); not enough(lo), or lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return n * hi


@dataclass(frozen=True)
class PitTestResult:
    """The sequential PIT test over ``n`` tokens. ``pvalue``: Bonferroni of the Neyman smooth
    tests (probability and id order) and the rank-class test (0 with an impossible token; None
    below MIN_TOKENS).
    ``rank_observed`` / ``rank_expected``: token counts at target rank 1, 2, 3-4, 5+."""

    pvalue: float | None
    n: int
    impossible: int
    neyman_statistic: float | None
    neyman_pvalue: float | None
    id_order_pvalue: float | None
    rank_statistic: float | None
    rank_pvalue: float | None
    rank_df: int
    rank_observed: tuple[int, ...]
    rank_expected: tuple[float, ...]
    mean_u: float | None
    detectable_tv: float | None
    level: float
    note: str = ""
    deviation: float | None = None
    tokens_needed: int | None = None  # where no TV up to 0.5 is detectable: tokens to detect NEEDED_TV


def deviation(feat: PitFeatures) -> float | None:
    """How far the tokens are from their distributions, in total variation at the resolution of
    the rank classes: 1/2 sum_c |observed_c - expected_c| / n, or the share of tokens of
    probability 0 when that is larger (each is a draw no exact sampler makes). Comparable across
    samples of different sizes (unlike a p-value), noisy at O(sqrt(classes / n)); None without
    tokens. Used to ask whether a candidate is further from the reference than a control."""
    n = len(feat)
    if n == 0:
        return None
    c = feat.class_probs.shape[1]
    observed = np.bincount(feat.token_class, minlength=c)[:c].astype(float)
    tv = 0.5 * float(np.abs(observed - feat.class_probs.sum(axis=0)).sum()) / n
    return max(tv, float(np.sum(feat.p_token <= 0)) / n)


def pit_test(feat: PitFeatures, *, level: float = 0.01, rng=None) -> PitTestResult:
    """Uniformity of the sequential randomized PIT of ``feat``'s tokens; ``level`` only sets the
    power calculation of ``detectable_tv`` (the caller compares ``pvalue`` with its level)."""
    n = len(feat)
    impossible = int(np.sum(feat.p_token <= 0))
    c = feat.class_probs.shape[1]
    observed = tuple(int(np.sum(feat.token_class == k)) for k in range(c))
    expected = tuple(float(e) for e in feat.class_probs.sum(axis=0)) if n else (0.0,) * c
    v = as_rng(rng).random(n)
    u = pit_values(feat, v=v)
    if impossible:
        return PitTestResult(0.0, n, impossible, None, None, None, None, None, 0, observed, expected,
                             float(u.mean()) if u.size else None, None, level,
                             f"{impossible} token(s) of probability 0", deviation(feat))
    if n < MIN_TOKENS:
        # Inconclusive, and the verdict must say what size would decide, not only that a test needs 10.
        return PitTestResult(None, n, 0, None, None, None, None, None, 0, observed, expected,
                             float(u.mean()) if u.size else None, None, level,
                             f"{n} token(s): too few for a test (at least {MIN_TOKENS})", deviation(feat),
                             tokens_needed=tokens_needed(feat, level=level / 3))
    ney_stat, ney_p = neyman_smooth(u)
    _, id_p = neyman_smooth(pit_values(feat, v=v, order="id"))
    rank_stat, rank_p, df = rank_class_test(feat)
    detect = detectable_tv(feat, level=level / 3)
    return PitTestResult(
        pvalue=min(1.0, 3.0 * min(ney_p, id_p, rank_p)), n=n, impossible=0, neyman_statistic=ney_stat,
        neyman_pvalue=ney_p, id_order_pvalue=id_p, rank_statistic=rank_stat, rank_pvalue=rank_p, rank_df=df,
        rank_observed=observed, rank_expected=expected, mean_u=float(u.mean()),
        detectable_tv=detect, level=level, deviation=deviation(feat),
        tokens_needed=tokens_needed(feat, level=level / 3) if detect is None else None,
    )


# ----------------------------------------------------------------- speculative round structure


def verifier_positions(stats: dict, n_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From a speculative record's stats: masks (n_tokens,) of the positions where the verifier
    tested a draft token, and of those where it rejected one, and the rejected draft token at
    each position (-1 elsewhere). Needs ``round_offsets``, ``proposed_per_round`` and
    ``accepted_per_round``; raises KeyError without them."""
    offsets, proposed, accepted = stats["round_offsets"], stats["proposed_per_round"], stats["accepted_per_round"]
    rejected_tokens = stats.get("rejected_draft_tokens") or [-1] * len(offsets)
    tested = np.zeros(n_tokens, dtype=bool)
    rejected = np.zeros(n_tokens, dtype=bool)
    draft = np.full(n_tokens, -1, dtype=np.int64)
    for off, n, a, d in zip(offsets, proposed, accepted, rejected_tokens):
        if n <= 0:
            continue
        last = off + min(a + 1, n)          # tested: the accepted drafts and the first rejected one
        tested[off:min(last, n_tokens)] = True
        if a < n and off + a < n_tokens:    # the correction after a rejection sits at off + a
            rejected[off + a] = True
            draft[off + a] = d
    return tested, rejected, draft


def verifier_counts(stats: dict) -> tuple[int, int]:
    """(draft tokens proposed, draft tokens rejected) in one record."""
    proposed = stats.get("proposed_per_round")
    accepted = stats.get("accepted_per_round")
    if proposed is None or accepted is None:
        return int(stats.get("proposed") or 0), 0
    return int(sum(proposed)), int(sum(1 for n, a in zip(proposed, accepted) if a < n))
