"""Teacher-forced acceptance: α̂ from one forward of each model over the baseline's outputs.

Pure functions over per-position quantities (the models are run in `harness.commands.estimate`):

- Greedy: the speculative decoder's rounds are replayed on the baseline's greedy output. A round
  at output index i proposes k = min(K, budget - i - 1) tokens (as `decoders.speculative` does;
  the first token comes from the prefill and is never drafted) and accepts while the draft token
  equals the target's argmax. For a draft model (or self-draft) the draft token at each position
  depends only on the prefix, so `agree[i]` (argmax q == argmax p, teacher forced) decides it;
  prompt lookup proposes a block from the context at the round's start (`propose(i, k)`). With
  greedy verification and an exact decoder this is what the decoder would count, except past an
  EOS (the decoder also tests drafts beyond the last output token; here a round stops there).
  α̂ = accepted / tested, the estimator of ``analysis.acceptance`` (tested = accepted +
  rejected rounds). The replay also gives each round's draft length (0 for a plain step: prompt
  lookup without a match), from which the speedup is Leviathan's per round
  (``analysis.acceptance.round_speedup``), not the formula at K that assumes every round drafts K.
- Sampling: α̂ = mean over the drafted positions of β_i = Σ_v min(p_i(v), q_i(v)) (Leviathan et
  al.'s expected acceptance of one draft token), teacher forced on the same outputs; a point-mass
  draft (prompt lookup) gives β_i = p_i(d_i).

Intervals resample prompts (ratio of sums, percentile bootstrap); groups are categories.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ._common import as_rng, check_level
from .acceptance import round_costs, round_speedup, theoretical_speedup


@dataclass(frozen=True)
class PromptEstimate:
    item_id: str
    categories: tuple[str, ...]
    accepted: float      # accepted drafts (greedy), or Σ β (sampling)
    tested: float        # tested drafts (greedy), or drafted positions (sampling)
    rounds: int
    agreement: float     # share of drafted positions where draft and target agree (argmax)
    proposals: tuple[int, ...] = ()  # greedy: draft tokens per replayed round, 0 for a plain step
    tokens: int = 0                  # output tokens (greedy replay)
    prefill_steps: float = float("nan")  # the prompt's prefill, in target steps


def replay_greedy_rounds(n: int, budget: int, k: int, propose: Callable[[int, int], Sequence[int]],
                         target_argmax: Sequence[int]) -> tuple[int, int, int, tuple[int, ...]]:
    """(accepted, tested, rounds, proposals) of greedy speculation over an output of n tokens;
    proposals: the draft length of every round, 0 where the draft proposed nothing (a plain step).

    ``propose(i, k)``: the draft tokens for output indices i.. (at most k); ``target_argmax[i]``:
    the target's choice at output index i (teacher forced)."""
    accepted = tested = rounds = 0
    proposals: list[int] = []
    i = 1  # the prefill emits index 0
    while i < n:
        room = min(k, budget - i - 1, n - i)  # no target logits past the output: stop the round there
        draft = list(propose(i, room))[:room] if room > 0 else []
        proposals.append(len(draft))
        if not draft:
            i += 1  # a plain target step
            continue
        j = 0
        while j < len(draft) and draft[j] == target_argmax[i + j]:
            j += 1
        rounds += 1
        accepted += j
        tested += j + (j < len(draft))
        i += j + 1
    return accepted, tested, rounds, tuple(proposals)


def replayed_speedup(prompts: Sequence[PromptEstimate], *, k: int, c: float, verify_cost: float,
                     confidence_level: float = 0.95, n_resamples: int = 2000,
                     rng: np.random.Generator | int | None = None) -> tuple[float, float, float]:
    """The speedup `regress` would measure (wall time per token, prefill included), predicted from
    the replayed greedy rounds, with a percentile interval over prompts: Σ (P + n - 1) / Σ (P +
    rounds' steps), P a prompt's prefill and n its output tokens, in target steps. The rounds are
    the decoder's own (teacher forcing replays them exactly, tests/test_estimate_acceptance.py);
    only their costs are modelled. NaN where a prompt lacks its prefill time or its rounds."""
    nan = (float("nan"),) * 3
    if not prompts or any(not np.isfinite(p.prefill_steps) or p.tokens < 1 for p in prompts):
        return nan
    num = np.array([p.prefill_steps + p.tokens - 1 for p in prompts], dtype=float)
    den = np.array([p.prefill_steps + round_costs(p.proposals, k=k, c=c, verify_cost=verify_cost)
                    for p in prompts], dtype=float)
    low, high = _ratio_ci(num, den, check_level(confidence_level), n_resamples, as_rng(rng))
    return float(num.sum() / den.sum()), low, high


@dataclass(frozen=True)
class GroupEstimate:
    n_prompts: int
    rounds: int
    alpha: float
    ci_low: float
    ci_high: float
    agreement: float
    theoretical_speedup: float | None


def _ratio_ci(num: np.ndarray, den: np.ndarray, level: float, n_resamples: int, gen) -> tuple[float, float]:
    if num.size < 2:
        return float("nan"), float("nan")
    idx = gen.integers(0, num.size, size=(n_resamples, num.size))
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = num[idx].sum(1) / den[idx].sum(1)
    boot = boot[np.isfinite(boot)]
    if not boot.size:
        return float("nan"), float("nan")
    tail = (1 - level) / 2
    return tuple(float(x) for x in np.quantile(boot, [tail, 1 - tail]))


def summarize_estimates(prompts: Sequence[PromptEstimate], *, k: int, c: float | None,
                        confidence_level: float = 0.95, n_resamples: int = 2000,
                        rng: np.random.Generator | int | None = None) -> dict[str, GroupEstimate]:
    """α̂ with its interval, overall ("all") and per category, and Leviathan's speedup at cost c:
    over the replayed rounds where the prompts have them (greedy), else at K."""
    level = check_level(confidence_level)
    gen = as_rng(rng)
    groups: dict[str, list[PromptEstimate]] = {"all": list(prompts)}
    for p in prompts:
        for cat in p.categories:
            groups.setdefault(f"category:{cat}", []).append(p)
    out = {}
    for name, ps in groups.items():
        num = np.array([p.accepted for p in ps], dtype=float)
        den = np.array([p.tested for p in ps], dtype=float)
        alpha = float(num.sum() / den.sum()) if den.sum() > 0 else float("nan")
        low, high = _ratio_ci(num, den, level, n_resamples, gen)
        weights = den if den.sum() > 0 else np.ones_like(den)
        agreement = float(np.average([p.agreement for p in ps], weights=weights)) if ps else float("nan")
        speed = None
        if c is not None and np.isfinite(alpha):
            ks = [j for p in ps for j in p.proposals]
            speed = (round_speedup(alpha, ks, c, k=k) if ks
                     else float(theoretical_speedup(min(max(alpha, 0.0), 1.0), k, c)))
        out[name] = GroupEstimate(n_prompts=len(ps), rounds=sum(p.rounds for p in ps), alpha=alpha, ci_low=low,
                                  ci_high=high, agreement=agreement, theoretical_speedup=speed)
    return out
