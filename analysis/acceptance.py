"""Acceptance statistics of speculative decoding, and theory against measurement.

From the candidate's ``stats`` (see the record contract) and the paired baseline's timings:

- ``acceptance_rate`` = accepted / proposed: the share of drafted tokens that were kept.
- ``alpha``: the per-token acceptance probability of Leviathan et al. (2023), the quantity their
  speedup formula needs. It is *not* accepted / proposed: after the first rejection in a round the
  remaining drafts are never tested, so accepted / proposed is E[accepted per round] / K, which
  underestimates alpha (at alpha = 0.8, K = 4: 0.59). Under the paper's i.i.d. model each round
  tests drafts until the first rejection, so the maximum-likelihood estimate is accepted /
  (accepted + rejected rounds), a round being rejected when it accepted fewer than it proposed.
  It needs ``accepted_per_round`` and ``proposed_per_round``; without them it is estimated from
  ``acceptance_by_position`` (tested at position j = accepted at j - 1), and without that too it
  falls back to accepted / proposed; ``alpha_method`` says which. Its interval resamples prompts
  (the rounds of one prompt, and its seeds and temperatures, share its predictability).
- ``tau``: tokens emitted per target forward.
- ``accepted_length_histogram``: rounds by number of drafts accepted, 0..K.
- acceptance by draft position: accepted / proposed at each position (cumulative) and accepted /
  tested (conditional on reaching that position).
- ``c``: one draft step's cost over one target step, measured as (draft_time_s / draft_forwards)
  over the baseline's decode seconds per token (or given); ``verify_cost``: verify_time_s per
  round over one target step (Leviathan assume 1; the speculative backend's verify_time_s also
  holds kill-switch fallback steps, so with fallbacks this overstates it).
- theoretical speedup (Leviathan): (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)) when every round
  proposes K; from the rounds the decoder ran, each at its own draft length (:func:`round_speedup`:
  rounds without a prompt-lookup match and kill-switch fallbacks are plain steps) when the records
  have ``proposed_per_round``. ``theoretical_speedup_fixed_k`` keeps the formula at K, and
  ``theoretical_speedup_measured_verify`` divides the same expected tokens by the steps the rounds
  took to verify (``verify_time_s``) plus their drafts. Achieved speedup from paired wall times per
  token (``latency.paired_speedup``), and its ratio to the theory.

Per suite and per category through :func:`acceptance_by_group`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._common import ConfidenceInterval, as_rng, check_level, cluster_sums, group_pairs, prompt_clusters
from .latency import SpeedupResult, decode_step_seconds, paired_speedup
from .pairing import Pair


def expected_tokens_per_round(alpha, k):
    """Sum_{i=0..K} alpha^i = (1 - alpha^(K+1)) / (1 - alpha), K + 1 at alpha = 1 (vectorised)."""
    alpha = np.asarray(alpha, dtype=float)
    if np.any((alpha < 0) | (alpha > 1)):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if int(k) != k or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    powers = alpha[..., None] ** np.arange(int(k) + 1)
    return powers.sum(axis=-1)


def theoretical_speedup(alpha, k: int, c: float, *, verify_cost: float = 1.0):
    """Leviathan et al.'s expected walltime improvement, (1 - a^(K+1)) / ((1 - a)(K c + v)).

    ``c``: one draft step relative to one target step; ``verify_cost`` (v): one verify forward
    over K + 1 tokens relative to one target step (1 in the paper). Written as a geometric sum,
    so alpha = 1 gives (K + 1) / (K c + v) without special-casing.
    """
    if c < 0 or verify_cost <= 0:
        raise ValueError(f"need c >= 0 and verify_cost > 0; got c={c!r}, verify_cost={verify_cost!r}")
    return expected_tokens_per_round(alpha, k) / (k * c + verify_cost)


def expected_round_tokens(alpha: float, proposals) -> float:
    """Expected tokens emitted by rounds that proposed `proposals[r]` drafts each: sum over the
    rounds of Σ_{i=0..k_r} α^i (a round that proposed nothing emits the target's one token)."""
    k = np.asarray(proposals, dtype=int).reshape(-1)
    if k.size == 0:
        return 0.0
    if np.any(k < 0):
        raise ValueError("proposals per round must be >= 0")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    cumulative = np.cumsum(float(alpha) ** np.arange(k.max() + 1))  # cumulative[j] = Σ_{i<=j} α^i
    return float(cumulative[k].sum())


def round_costs(proposals: Sequence[int], *, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Target steps that rounds of these draft lengths take: a round of k_r > 0 drafts costs
    1 + (v - 1) k_r / K (its verification, linear from one token to the measured K+1 block) + k_r c;
    a plain one, 1."""
    ks = np.asarray(proposals, dtype=float)
    return float(np.where(ks > 0, 1.0 + (verify_cost - 1.0) * ks / k + c * ks, 1.0).sum())


def round_speedup(alpha: float, proposals, c: float, *, k: int | None = None, verify_cost: float = 1.0) -> float:
    """Leviathan's expected speedup over the rounds a decoder ran, each at its own draft length.

    Leviathan's formula assumes that every round proposes K tokens. Prompt lookup proposes fewer,
    or nothing where the context has no match (then the round is a plain target step): on the
    bench's prompts the formula at K promised 2.56x where the rounds it ran allow 1.61x. Here a
    round proposing k_r > 0 tokens yields Σ_{i<=k_r} α^i tokens and costs k_r c + v_r steps,
    v_r = 1 + (v - 1) k_r / K (linear from one token to the measured K+1 block); a round proposing
    nothing yields one token for one step. With every round at K it is
    `theoretical_speedup(alpha, K, c, verify_cost=v)`."""
    ks = np.asarray(proposals, dtype=int).reshape(-1)
    if ks.size == 0 or not np.isfinite([alpha, c, verify_cost]).all() or verify_cost <= 0 or c < 0:
        return float("nan")
    k = int(k or ks.max())
    if k <= 0:
        return 1.0
    return expected_round_tokens(min(max(float(alpha), 0.0), 1.0), ks) / round_costs(ks, k=k, c=c,
                                                                                     verify_cost=verify_cost)


@dataclass(frozen=True)
class AcceptanceSummary:
    """Acceptance, cost and speedup for one group of paired speculative generations.

    ``confidence_interval()`` is a bootstrap interval for ``alpha`` over records (tokens in one
    generation are not independent, so generations are resampled).
    """

    n: int
    rounds: int
    proposed: int
    accepted: int
    k: int
    acceptance_rate: float
    alpha: float
    alpha_method: str
    alpha_ci_low: float
    alpha_ci_high: float
    confidence_level: float
    tau: float
    accepted_length_histogram: tuple[int, ...]
    by_position: tuple[tuple[int, int, int, float, float], ...]  # (pos, accepted, proposed, acc/prop, acc/tested)
    c: float
    verify_cost: float
    theoretical_speedup: float
    theoretical_speedup_measured_verify: float
    theoretical_speedup_fixed_k: float
    achieved: SpeedupResult
    achieved_over_theoretical: float
    # The decode phase (wall - TTFT, tokens after the first): what the theory above predicts, so
    # `achieved_over_theoretical` divides this one. `achieved` is end to end, prefill included.
    achieved_decode: SpeedupResult

    @property
    def statistic(self) -> float:
        return self.alpha

    def confidence_interval(self) -> ConfidenceInterval:
        return ConfidenceInterval(self.alpha_ci_low, self.alpha_ci_high)


def _stats(record: Mapping[str, Any]) -> Mapping[str, Any]:
    s = record.get("stats") or {}
    if "proposed" not in s or "accepted" not in s:
        # An engine that sent its counts without one of these: not reported, never taken as 0.
        unsaid = f"; the engine did not report {', '.join(s['not_reported'])}" if s.get("not_reported") else ""
        raise ValueError(
            f"record {record.get('item_id')!r} ({record.get('decoder')}) has no speculative stats "
            f"(stats.proposed / stats.accepted){unsaid}"
        )
    prop, acc = s["proposed"], s["accepted"]
    if not (isinstance(prop, (int, float)) and isinstance(acc, (int, float)) and 0 <= acc <= prop):
        # An engine's counts that cannot be (12 accepted of 8 proposed: α 1.5) are no measurement.
        raise ValueError(f"record {record.get('item_id')!r} ({record.get('decoder')}) reports {acc!r} draft "
                         f"token(s) accepted of {prop!r} proposed: impossible counts")
    return s


def per_round_counts(s: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """A record's (accepted, proposed) per round as int arrays, None without them; impossible
    counters (unpaired, accepted > proposed, negative) raise ValueError."""
    acc, prop = s.get("accepted_per_round"), s.get("proposed_per_round")
    if acc is None or prop is None:
        return None
    acc, prop = np.asarray(acc, dtype=int), np.asarray(prop, dtype=int)
    if acc.shape != prop.shape or np.any(acc > prop) or np.any(acc < 0):
        raise ValueError("accepted_per_round and proposed_per_round must be paired, 0 <= accepted <= proposed")
    return acc, prop


def _by_position(stats_list: Sequence[Mapping[str, Any]], k: int):
    """Per position: accepted, proposed, tested (from per-round arrays when all records have them)."""
    acc_pos, prop_pos, tested_pos = np.zeros(k, int), np.zeros(k, int), np.zeros(k, int)
    exact_tested = True
    for s in stats_list:
        rounds = per_round_counts(s)
        if rounds is not None:
            acc, prop = rounds
            j = np.arange(k)[:, None]
            acc_pos += np.sum(acc[None, :] > j, axis=1)
            prop_pos += np.sum(prop[None, :] > j, axis=1)
            tested_pos += np.sum((acc[None, :] >= j) & (prop[None, :] > j), axis=1)
        elif s.get("acceptance_by_position"):
            exact_tested = False
            table = np.asarray(s["acceptance_by_position"], dtype=int).reshape(-1, 2)[:k]
            acc_pos[: len(table)] += table[:, 0]
            prop_pos[: len(table)] += table[:, 1]
        else:
            return None
    if not exact_tested:  # fixed-K assumption: position j is tested when j - 1 was accepted
        tested_pos = np.minimum(prop_pos, np.concatenate([prop_pos[:1], acc_pos[:-1]]))
    return acc_pos, prop_pos, tested_pos, exact_tested


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b > 0 else float("nan")


def _tested_per_record(stats_list, per_round, k: int) -> tuple[np.ndarray, str]:
    """Draft tokens actually tested per record (NaN where a record that drafted holds neither
    per-round nor per-position counts), and the name of the estimator used. Each record uses the
    best it has. One record without them used to switch the whole group to accepted / proposed,
    a different quantity (about half of alpha at K = 4) under the same name; now the group's
    alpha rests on the records that can show it, and the method says how many."""
    tested, methods = [], set()
    for s, r in zip(stats_list, per_round):
        if r is not None:
            tested.append(float(r[0].sum() + np.sum(r[0] < r[1])))
            methods.add("accepted/(accepted+rejected rounds)")
        elif int(s["proposed"]) == 0:
            tested.append(0.0)  # nothing drafted, nothing tested
        elif _by_position([s], k) is not None:
            tested.append(float(_by_position([s], k)[2].sum()))
            methods.add("acceptance_by_position (fixed K)")
        else:
            tested.append(float("nan"))
    out = np.asarray(tested, dtype=float)
    if not methods:
        return np.asarray([int(s["proposed"]) for s in stats_list], dtype=float), "accepted/proposed"
    method = " and ".join(sorted(methods))
    missing = int(np.isnan(out).sum())
    if missing:
        method += (f", over {len(out) - missing} of {len(out)} records ({missing} drafted but recorded no "
                   f"per-round or per-position counts)")
    return out, method


def _draft_length(stats_list, per_round) -> int:
    """K: the largest of the proposals per round, the positions in acceptance_by_position and stats.k."""
    return max([int(r[1].max()) for r in per_round if r is not None and r[1].size]
               + [len(s.get("acceptance_by_position") or []) for s in stats_list]
               + [int(s.get("k") or 0) for s in stats_list])


def drafts_tested(record: Mapping[str, Any]) -> float | None:
    """The draft tokens the verifier tested in one record: alpha's denominator, by
    acceptance_summary's own rule, so that accepted over it, summed over records, is its alpha.
    None where the record holds no per-round or per-position counts (accepted / proposed is then
    all that is known, and that is not alpha); ValueError on impossible counters."""
    s = _stats(record)
    per_round = [per_round_counts(s)]
    k = _draft_length([s], per_round)
    if int(s["proposed"]) == 0 or k <= 0:
        return None
    tested, method = _tested_per_record([s], per_round, k)
    return None if method == "accepted/proposed" or np.isnan(tested[0]) else float(tested[0])


def ratio_ci(num: np.ndarray, den: np.ndarray, level: float, n_resamples: int, rng) -> tuple[float, float]:
    """Percentile bootstrap interval of sum(num) / sum(den), resampling rows (pass per-prompt
    sums: the rows must be independent)."""
    idx = rng.integers(0, num.size, size=(n_resamples, num.size))
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    boot = boot[np.isfinite(boot)]
    if not boot.size:
        return float("nan"), float("nan")
    tail = (1 - level) / 2
    low, high = np.quantile(boot, [tail, 1 - tail])
    return float(low), float(high)


def _costs(stats_list, step_s: float, proposed: int, rounds: int) -> tuple[float, float]:
    """(c, verify_cost): one draft step and one verify forward over one baseline decode step."""
    c = float("nan")
    if any("draft_time_s" in s for s in stats_list):
        draft_t = sum(float(s.get("draft_time_s", 0.0)) for s in stats_list)
        draft_f = sum(int(s.get("draft_forwards", 0)) for s in stats_list)
        # prompt lookup runs no draft forwards: charge its time per proposed token instead
        steps = draft_f if draft_f > 0 else proposed
        c = draft_t / steps / step_s if steps > 0 else 0.0
    verify = float("nan")
    if rounds and all("verify_time_s" in s for s in stats_list):
        verify = sum(float(s["verify_time_s"]) for s in stats_list) / rounds / step_s
    return c, verify


def _theory(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    if not np.isfinite([alpha, c, verify_cost]).all() or verify_cost <= 0:
        return float("nan")
    return float(theoretical_speedup(alpha, k, c, verify_cost=verify_cost))


def _histogram(per_round, k: int) -> np.ndarray:
    """How many rounds accepted 0..K drafts (rounds that proposed nothing left out)."""
    hist = np.zeros(k + 1, dtype=int)
    for r in per_round:
        if r is not None:  # rounds that proposed nothing (no prompt-lookup match) are not rounds of drafts
            drafted = r[0][r[1] > 0]
            hist += np.bincount(np.minimum(drafted, k), minlength=k + 1)[: k + 1]
    return hist


def _positions(stats_list, k: int) -> tuple:
    """Per draft position: (position, accepted, proposed, acceptance, acceptance given tested)."""
    positions = _by_position(stats_list, k)
    if positions is None:
        return ()
    a, p, t, _ = positions
    return tuple((j, int(a[j]), int(p[j]), _ratio(a[j], p[j]), _ratio(a[j], t[j])) for j in range(k))


def _measured(pairs, stats_list, proposed: int, rounds: int, level: float, n_resamples: int, gen):
    """(c, verify cost, achieved speedup, decode-phase speedup), measured against the baselines
    timed beside the candidate; NaN and no speedup where there are none."""
    # Costs and the achieved speedup need a baseline timed beside the candidate: a baseline row
    # reused from another run (``reused``) keeps its tokens, not a comparable clock.
    fresh = [p for p in pairs if not p.baseline.get("reused")]
    if not fresh:
        none = _no_speedup(level)
        return float("nan"), float("nan"), none, none
    measured_c, verify_cost = _costs(stats_list, decode_step_seconds([p.baseline for p in fresh]), proposed, rounds)
    achieved = paired_speedup(fresh, confidence_level=level, n_resamples=n_resamples, rng=gen)
    try:
        decode = paired_speedup(fresh, confidence_level=level, rng=gen, decode_only=True)
    except ValueError:  # no TTFT to split the prefill off: no ratio, rather than a wrong one
        decode = _no_speedup(level)
    return measured_c, verify_cost, achieved, decode


def _theories(alpha: float, k: int, c: float, verify_cost: float, stats_list, per_round, rounds: int,
              proposed: int) -> tuple[float, float, float]:
    """The theoretical speedups: (at a fixed K, over the rounds as run, with the measured verify
    cost). Where the rounds are known the last two count them as run, fallback steps included."""
    fixed_k = _theory(alpha, k, c)
    theory, theory_v = fixed_k, _theory(alpha, k, c, verify_cost)
    if all(r is not None for r in per_round) and np.isfinite([alpha, c]).all():
        # the rounds as run, plus kill-switch fallback steps (one token each, no round recorded)
        ks = np.concatenate([r[1] for r in per_round]
                            + [np.zeros(int(s.get("fallback_tokens", 0)), dtype=int) for s in stats_list])
        theory = round_speedup(alpha, ks, c, k=k)
        verify_steps = verify_cost * rounds  # verify_time_s holds the fallback steps too
        if np.isfinite(verify_steps) and verify_steps + c * proposed > 0:
            theory_v = expected_round_tokens(min(max(alpha, 0.0), 1.0), ks) / (verify_steps + c * proposed)
    return fixed_k, theory, theory_v


def acceptance_summary(
    pairs: Sequence[Pair], *, k: int | None = None, c: float | None = None,
    confidence_level: float = 0.95, n_resamples: int = 2000,
    rng: np.random.Generator | int | None = None,
) -> AcceptanceSummary:
    """Acceptance statistics of the candidates in ``pairs`` and their speedup over the baselines.

    ``k``: the draft length (default: the largest of the proposals per round, the positions in
    ``acceptance_by_position`` and ``stats.k``); ``c``: the draft cost ratio (default: measured).
    """
    if not pairs:
        raise ValueError("acceptance_summary needs at least one pair")
    level = check_level(confidence_level)
    gen = as_rng(rng)
    stats_list = [_stats(p.candidate) for p in pairs]
    per_round = [per_round_counts(s) for s in stats_list]
    if k is None:
        k = _draft_length(stats_list, per_round)
    if k <= 0:
        raise ValueError("cannot tell the draft length K: pass k= or record proposed_per_round")

    proposed = sum(int(s["proposed"]) for s in stats_list)
    accepted_rec = np.array([int(s["accepted"]) for s in stats_list], dtype=float)
    rounds = sum(int(s.get("rounds", len(r[0]) if r is not None else 0))
                 for s, r in zip(stats_list, per_round))
    tested_rec, alpha_method = _tested_per_record(stats_list, per_round, k)
    known = ~np.isnan(tested_rec)
    alpha = _ratio(accepted_rec[known].sum(), tested_rec[known].sum())
    # Resample prompts, not records: one prompt's seeds and temperatures share its acceptance.
    alpha_ci = ratio_ci(*cluster_sums(prompt_clusters([p for p, k_ in zip(pairs, known) if k_]),
                                       accepted_rec[known], tested_rec[known]), level, n_resamples, gen)

    hist, by_pos = _histogram(per_round, k), _positions(stats_list, k)
    measured_c, verify_cost, achieved, decode = _measured(pairs, stats_list, proposed, rounds, level, n_resamples,
                                                          gen)
    c = measured_c if c is None else float(c)
    fixed_k, theory, theory_v = _theories(alpha, k, c, verify_cost, stats_list, per_round, rounds, proposed)
    tokens = sum(len(p.candidate.get("tokens") or []) for p in pairs)
    forwards = sum(int(s.get("target_forwards", 0)) for s in stats_list)
    return AcceptanceSummary(
        n=len(pairs), rounds=rounds, proposed=proposed, accepted=int(accepted_rec.sum()), k=int(k),
        acceptance_rate=_ratio(accepted_rec.sum(), proposed), alpha=alpha, alpha_method=alpha_method,
        alpha_ci_low=alpha_ci[0], alpha_ci_high=alpha_ci[1], confidence_level=level,
        tau=_ratio(tokens, forwards), accepted_length_histogram=tuple(int(x) for x in hist),
        by_position=by_pos, c=c, verify_cost=verify_cost,
        theoretical_speedup=theory, theoretical_speedup_measured_verify=theory_v,
        theoretical_speedup_fixed_k=fixed_k,
        achieved=achieved, achieved_decode=decode,
        achieved_over_theoretical=_ratio(decode.statistic, theory) if np.isfinite(theory) else float("nan"),
    )


def _no_speedup(level: float) -> SpeedupResult:
    nan = float("nan")
    return SpeedupResult(nan, nan, 0, nan, nan, nan, nan, level)


def acceptance_by_group(
    pairs: Sequence[Pair], *, by: str = "suite", k: int | None = None, c: float | None = None,
    confidence_level: float = 0.95, n_resamples: int = 2000,
    rng: np.random.Generator | int | None = None,
) -> dict[str, AcceptanceSummary]:
    """:func:`acceptance_summary` per suite (``by="suite"``) or per category (``"category"``)."""
    gen = as_rng(rng)
    return {
        name: acceptance_summary(group, k=k, c=c, confidence_level=confidence_level,
                                 n_resamples=n_resamples, rng=gen)
        for name, group in group_pairs(pairs, by).items()
    }
