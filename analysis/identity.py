"""Token identity between a baseline and an exact candidate, and divergence forensics.

For decoders that must not change outputs (speculative decoding with any verifier, greedy or
coupled sampling; early exit whose threshold never fires) this says how many paired generations
are token-identical, how far identical prefixes run, where first divergences fall, and why each
happened: at a numerical near-tie of the baseline, or for real.

Margin convention: ``record["margins"][i]`` is the top-2 logit margin (largest minus second
largest logit) of the step that produced ``record["tokens"][i]``. Forensics use the baseline's
margin at the first divergent position.

Why ``eps = 1e-3`` by default. Logits are fp32. Two correct computations of the same step by
different kernels (a K+1-token verify forward against a one-token decode step, a cached against
an uncached attention, another reduction order or batch size) differ by accumulated rounding:
fp32 has a relative epsilon of 1.2e-7, logits are O(10), and the differences measured across
hidden sizes of a few hundred to a few thousand and tens of layers are ~1e-6 to 1e-4. A margin
below 1e-3 sits an order of magnitude above that noise, so such a divergence is explainable by
numerics. It is also rare by chance: typical top-2 margins are O(1) logits, so fewer than ~1e-3
of steps fall below it, and a genuine bug (a wrong token accepted) shows up at ordinary margins,
which this classifies as "real". Reduced precision needs more. Measured on an NVIDIA H200 with
smollm2-135m (docs/performance.md, "NVIDIA H200"): the top-2 margin of a batched forward and of
the one-token steps differed by at most 5.3e-5 in fp32 and 0.5 in bf16, so bf16's default is
2 x 0.5 = 1.0, as the "auto" rule would set it; fp16's 0.125 is not measured.

Sampled pairs (temperature > 0, coupled by keyed Gumbel noise) are never excused by the margin.
The recorded margin is the raw greedy top-2 gap; the token a coupled sampler picks is the argmax
of the perturbed scores (log p + Gumbel noise), whose top two are other tokens at another gap.
Rounding flips the tie between the perturbed scores, so a small raw margin says nothing about
whether a sampled divergence was a tie, and a large one excuses nothing either: a wrong-noise
sampler in bf16 had about half its divergences excused by the raw margin (issue 49). The records
hold no logits to rebuild the perturbed gap from, so a sampled divergence is "real".

Scope: no statistics beyond the identity-rate interval (``scipy.stats.binomtest``); no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ._common import ConfidenceInterval, check_level
from .pairing import Pair, PairKey

DEFAULT_EPS = 1e-3
DTYPE_EPS = {"float32": 1e-3, "float64": 1e-3, "bfloat16": 1.0, "float16": 0.125}
# The measured noise widens eps up to this many times the dtype's default, no further: batched and
# one-token forwards that disagree by more are not rounding apart (a wrong mask or position in
# the batched path, one outlier record), and an eps that wide would excuse real divergences.
MAX_WIDENING = 10.0


def near_tie_epsilon(dtype: str | None, measured_max: float | None = None) -> tuple[float, str]:
    """(eps, how it was chosen) for logits computed in ``dtype`` ("float32", "torch.bfloat16",
    ...), given the largest measured margin noise between batched and one-token forwards. Noise
    beyond ``MAX_WIDENING`` times the dtype's default is named and not used: eps stays the default."""
    name = str(dtype or "float32").replace("torch.", "")
    eps = DTYPE_EPS.get(name)
    source = f"dtype {name}" if eps is not None else f"dtype {name} unknown, fp32 default"
    eps = DEFAULT_EPS if eps is None else eps
    if measured_max is not None and np.isfinite(measured_max):
        if 2.0 * measured_max > MAX_WIDENING * eps:
            return float(eps), (f"{source}; the measured margin noise {measured_max:.3g} is more than rounding "
                                f"in {name} (2 x noise > {MAX_WIDENING:g} x {eps:g}): not used, so divergences "
                                f"above {eps:g} count as real")
        if 2.0 * measured_max > eps:
            return float(2.0 * measured_max), f"measured: 2 x max margin noise {measured_max:.3g} (above the {source} default {eps:g})"
        source += f", measured margin noise max {measured_max:.3g}"
    return float(eps), source

NEAR_TIE, REAL, UNKNOWN = "near-tie", "real", "unknown"


@dataclass(frozen=True)
class Divergence:
    """The first position where a candidate's tokens leave the baseline's.

    ``baseline_token`` / ``candidate_token`` are None where that side already ended;
    ``margin`` is the baseline's top-2 logit margin at ``position`` (None when the baseline has
    no margin there); ``margin_quantile`` is the fraction of all baseline step margins in the
    analysed pairs at or below it (how unusual a step it was); ``kind`` is ``"near-tie"``
    (margin < eps), ``"real"`` (margin >= eps) or ``"unknown"`` (no margin: not excused).
    """

    key: PairKey
    position: int
    baseline_token: int | None
    candidate_token: int | None
    margin: float | None
    margin_quantile: float | None
    kind: str


@dataclass(frozen=True)
class IdentityResult:
    """Token identity over paired generations.

    ``statistic`` is the identity rate (identical pairs / pairs); ``pvalue`` is None (a rate,
    not a test). ``confidence_interval()`` gives its interval (``method``: Wilson score or
    Clopper-Pearson). ``divergences`` holds one :class:`Divergence` per non-identical pair.
    """

    statistic: float
    n: int
    identical: int
    ci_low: float
    ci_high: float
    confidence_level: float
    method: str
    mean_common_prefix: float
    eps: float
    divergences: tuple[Divergence, ...]
    pvalue: float | None = None

    def confidence_interval(self) -> ConfidenceInterval:
        return ConfidenceInterval(self.ci_low, self.ci_high)

    def _keys(self, kind: str) -> tuple[PairKey, ...]:
        return tuple(d.key for d in self.divergences if d.kind == kind)

    @property
    def near_ties(self) -> tuple[PairKey, ...]:
        """Items whose first divergence is at a baseline near-tie (margin < eps)."""
        return self._keys(NEAR_TIE)

    @property
    def real_divergences(self) -> tuple[PairKey, ...]:
        """Items whose first divergence is at a clear baseline margin (>= eps)."""
        return self._keys(REAL)

    @property
    def unknown(self) -> tuple[PairKey, ...]:
        """Items whose divergence has no baseline margin to judge it by."""
        return self._keys(UNKNOWN)

    @property
    def first_divergence_histogram(self) -> dict[int, int]:
        """Position of first divergence -> number of pairs, ascending by position."""
        return dict(sorted(Counter(d.position for d in self.divergences).items()))

    def binned_histogram(self, bins: int | Sequence[float] = 10) -> tuple[np.ndarray, np.ndarray]:
        """``numpy.histogram`` of first-divergence positions: (counts, edges)."""
        return np.histogram([d.position for d in self.divergences], bins=bins)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def classify_margin(margin: float | None, eps: float = DEFAULT_EPS) -> str:
    """``"near-tie"`` below eps, ``"real"`` at or above it, ``"unknown"`` without a margin."""
    if margin is None or not np.isfinite(margin):
        return UNKNOWN
    return NEAR_TIE if margin < eps else REAL


def _margin_at(record, position: int) -> float | None:
    margins = record.get("margins")
    if margins is None or position >= len(margins) or margins[position] is None:
        return None
    return float(margins[position])


def token_identity(
    pairs: Sequence[Pair],
    *,
    eps: float = DEFAULT_EPS,
    confidence_level: float = 0.95,
    method: str = "wilson",
) -> IdentityResult:
    """Identity rate, common prefixes and first-divergence forensics over ``pairs``.

    ``method`` is ``"wilson"`` (score interval) or ``"clopper-pearson"`` (exact, conservative),
    both from ``scipy.stats.binomtest``. ``eps`` is the near-tie threshold on the baseline's
    top-2 logit margin (see the module docstring for the default).
    """
    if not pairs:
        raise ValueError("token_identity needs at least one pair")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    level = check_level(confidence_level)
    scipy_method = {"wilson": "wilson", "clopper-pearson": "exact"}.get(method)
    if scipy_method is None:
        raise ValueError(f"method must be 'wilson' or 'clopper-pearson', not {method!r}")

    all_margins = np.concatenate(
        [np.asarray(p.baseline.get("margins") or [], dtype=float) for p in pairs] or [np.empty(0)]
    )
    all_margins = np.sort(all_margins[np.isfinite(all_margins)])  # backends record NaN where unseen
    prefixes, divergences = [], []
    for pair in pairs:
        base, cand = pair.baseline.get("tokens"), pair.candidate.get("tokens")
        if base is None or cand is None:
            raise ValueError(f"{pair.key}: both records need 'tokens'")
        pos = common_prefix_length(base, cand)
        prefixes.append(pos)
        if pos == len(base) == len(cand):
            continue
        margin = _margin_at(pair.baseline, pos)
        quantile = None
        if margin is not None and np.isfinite(margin) and all_margins.size:
            quantile = float(np.searchsorted(all_margins, margin, side="right") / all_margins.size)
        divergences.append(Divergence(
            key=pair.key,
            position=pos,
            baseline_token=int(base[pos]) if pos < len(base) else None,
            candidate_token=int(cand[pos]) if pos < len(cand) else None,
            margin=margin,
            margin_quantile=quantile,
            # A sampled pair's raw margin is not its perturbed scores' gap (module docstring).
            kind=classify_margin(margin, eps) if pair.key.temperature == 0 else REAL,
        ))
    n = len(pairs)
    identical = n - len(divergences)
    ci = stats.binomtest(identical, n).proportion_ci(confidence_level=level, method=scipy_method)
    return IdentityResult(
        statistic=identical / n, n=n, identical=identical,
        ci_low=float(ci.low), ci_high=float(ci.high), confidence_level=level, method=method,
        mean_common_prefix=float(np.mean(prefixes)), eps=float(eps),
        divergences=tuple(divergences),
    )
