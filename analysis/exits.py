"""Early-exit statistics: where tokens left the network, and what that should save.

Convention (the early-exit decoder's stats): ``exit_layers[i]`` is the number of decoder layers
run for token ``i`` (1 to ``num_layers``; ``num_layers`` means no early exit);
``lm_head_evals`` is every LM-head evaluation in the request (confidence checks and the heads that
produce tokens); ``lm_head_checks`` the confidence checks only. The cost model uses
``lm_head_evals``; without it, ``lm_head_checks`` plus one producing head per token; without
either, one head per token (``lm_head_evals_known`` is then False).

Theoretical speedup per token, counting the LM-head evaluations that deciding to exit costs:

    (L * layer_cost + lm_head_cost) / (mean_layers * layer_cost + heads_per_token * lm_head_cost)

with costs relative to one decoder layer. The head is not cheap on small models (on SmolLM2-135M
on the development CPU it is ~11 ms of a ~64 ms step, about six layers), so checking it at every
layer can cost more than the skipped layers save; pass ``lm_head_cost`` measured, not zero.
Skipped layers' KV entries, if the backend fills them later, are not counted here, and the
first token (produced after the full-depth prompt pass) is counted like the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._common import group_keys


def exit_theoretical_speedup(
    mean_layers: float, num_layers: int, *, lm_head_evals_per_token: float = 1.0,
    layer_cost: float = 1.0, lm_head_cost: float = 0.0,
) -> float:
    """Full-depth cost per token over early-exit cost per token (costs in layer units).

    The full-depth decoder runs ``num_layers`` layers and one LM head per token; the early-exit
    one ``mean_layers`` layers and ``lm_head_evals_per_token`` heads (checks included).
    """
    if num_layers <= 0 or not 0 < mean_layers <= num_layers:
        raise ValueError(f"need 0 < mean_layers <= num_layers; got {mean_layers!r}, {num_layers!r}")
    if layer_cost <= 0 or lm_head_cost < 0 or lm_head_evals_per_token < 0:
        raise ValueError("need layer_cost > 0, lm_head_cost >= 0, lm_head_evals_per_token >= 0")
    full = num_layers * layer_cost + lm_head_cost
    early = mean_layers * layer_cost + lm_head_evals_per_token * lm_head_cost
    return float(full / early)


@dataclass(frozen=True)
class ExitSummary:
    """Exit-layer statistics over a set of early-exit records.

    ``histogram[j]`` counts tokens that ran ``j + 1`` layers. ``statistic`` is the mean number
    of layers; ``lm_head_evals_known`` is False when records carry neither ``lm_head_evals`` nor
    ``lm_head_checks`` and one head per token was assumed.
    """

    n: int
    tokens: int
    num_layers: int
    histogram: tuple[int, ...]
    mean_layers: float
    early_exit_fraction: float
    lm_head_evals_per_token: float
    lm_head_evals_known: bool
    layer_cost: float
    lm_head_cost: float
    theoretical_speedup: float

    @property
    def statistic(self) -> float:
        return self.mean_layers


def exit_summary(
    records: Sequence[Mapping[str, Any]], *, layer_cost: float = 1.0, lm_head_cost: float = 0.0,
) -> ExitSummary:
    """Histogram of exit layers, mean layers and theoretical speedup of early-exit records."""
    if not records:
        raise ValueError("exit_summary needs at least one record")
    layers, heads, known, depths = [], 0, True, set()
    for rec in records:
        s = rec.get("stats") or {}
        if "exit_layers" not in s or "num_layers" not in s:
            raise ValueError(f"record {rec.get('item_id')!r} has no stats.exit_layers / stats.num_layers")
        depths.add(int(s["num_layers"]))
        layers.append(np.asarray(s["exit_layers"], dtype=int))
        n_tokens = len(s["exit_layers"])
        if "lm_head_evals" in s:
            heads += int(s["lm_head_evals"])
        elif "lm_head_checks" in s:
            heads += int(s["lm_head_checks"]) + n_tokens
        else:
            known = False
            heads += n_tokens
    if len(depths) != 1:
        raise ValueError(f"records disagree on num_layers: {sorted(depths)}")
    num_layers = depths.pop()
    all_layers = np.concatenate(layers) if layers else np.empty(0, int)
    if all_layers.size == 0:
        raise ValueError("no exit layers recorded (no tokens)")
    if all_layers.min() < 1 or all_layers.max() > num_layers:
        raise ValueError(
            f"exit_layers must count layers run, 1..{num_layers}; got {all_layers.min()}..{all_layers.max()}"
        )
    mean_layers = float(all_layers.mean())
    per_token = heads / all_layers.size
    return ExitSummary(
        n=len(records), tokens=int(all_layers.size), num_layers=num_layers,
        histogram=tuple(int(x) for x in np.bincount(all_layers - 1, minlength=num_layers)),
        mean_layers=mean_layers, early_exit_fraction=float(np.mean(all_layers < num_layers)),
        lm_head_evals_per_token=per_token, lm_head_evals_known=known,
        layer_cost=float(layer_cost), lm_head_cost=float(lm_head_cost),
        theoretical_speedup=exit_theoretical_speedup(
            mean_layers, num_layers, lm_head_evals_per_token=per_token,
            layer_cost=layer_cost, lm_head_cost=lm_head_cost),
    )


def exit_by_group(
    records: Sequence[Mapping[str, Any]], *, by: str = "suite", layer_cost: float = 1.0,
    lm_head_cost: float = 0.0,
) -> dict[str, ExitSummary]:
    """:func:`exit_summary` per suite or per category."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for rec in records:
        for key in group_keys(rec, by):
            groups.setdefault(key, []).append(rec)
    return {k: exit_summary(v, layer_cost=layer_cost, lm_head_cost=lm_head_cost)
            for k, v in sorted(groups.items())}
