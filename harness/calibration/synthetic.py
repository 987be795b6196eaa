"""Synthetic generation records for tests and examples (the runner's record contract).

Builds plain dicts with sensible defaults so a test states only what it is about. Nothing here
is used by the analysis itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def token_times(n_tokens: int, *, ttft_s: float, step_s: float | Sequence[float]) -> list[float]:
    """``timing.token_times_s``: the TTFT, then ``step_s`` between successive tokens."""
    steps = np.broadcast_to(np.asarray(step_s, dtype=float), (max(n_tokens - 1, 0),))
    return [float(t) for t in np.concatenate([[ttft_s], steps])][:n_tokens]


def make_record(
    *, candidate: str = "baseline", decoder: str = "standard", suite: str = "factual",
    suite_hash: str = "h1", suite_version: str = "1", item_id: str = "item-000",
    categories: Sequence[str] = ("general",), seed: int = 0, temperature: float = 0.0,
    tokens: Sequence[int] = (1, 2, 3, 4), margins: Sequence[float] | None = None,
    score: float | None = None, passed: bool | None = None, stats: dict[str, Any] | None = None,
    ttft_s: float = 0.1, step_s: float = 0.05, wall_s: float | None = None,
) -> dict[str, Any]:
    """One record; timing is derived from ``ttft_s`` and ``step_s`` unless ``wall_s`` is given."""
    tokens = list(tokens)
    times = token_times(len(tokens), ttft_s=ttft_s, step_s=step_s)
    wall = wall_s if wall_s is not None else (float(np.sum(times)) if times else ttft_s)
    if score is None and passed is not None:
        score = float(passed)
    return {
        "candidate": candidate, "decoder": decoder, "suite": suite, "suite_version": suite_version,
        "suite_hash": suite_hash, "item_id": item_id, "categories": list(categories), "seed": seed,
        "temperature": temperature, "tokens": tokens, "text": " ".join(map(str, tokens)),
        "score": score, "passed": passed,
        "margins": list(margins) if margins is not None else [1.0] * len(tokens),
        "stats": dict(stats or {}),
        "timing": {"wall_s": wall, "ttft_s": ttft_s, "token_times_s": times},
    }


def speculative_stats(accepted_per_round: Sequence[int], *, k: int, draft_time_s: float = 0.0,
                      verify_time_s: float = 0.0) -> dict[str, Any]:
    """``stats`` of a speculative generation with K drafts per round and the given acceptances."""
    acc = [int(a) for a in accepted_per_round]
    prop = [k] * len(acc)
    by_pos = [[sum(a > j for a in acc), sum(p > j for p in prop)] for j in range(k)]
    return {
        "target_forwards": len(acc) + 1, "draft_forwards": k * len(acc), "proposed": sum(prop),
        "accepted": sum(acc), "rounds": len(acc), "accepted_per_round": acc,
        "proposed_per_round": prop, "acceptance_by_position": by_pos,
        "draft_time_s": draft_time_s, "verify_time_s": verify_time_s, "fallbacks": 0,
    }
