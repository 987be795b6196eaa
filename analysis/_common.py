"""Small shared pieces of the analysis package: the confidence-interval tuple, input coercion,
the bootstrap wrapper, prompt clusters, and grouping of pairs by suite or category.

Not part of the public API; modules import from here so that each stays short.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import stats


class ConfidenceInterval(NamedTuple):
    """(low, high), as returned by every result's ``confidence_interval()``."""

    low: float
    high: float


def as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A numpy Generator from a Generator, a seed, or None (fresh entropy)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, (int, np.integer)):
        return np.random.default_rng(rng)
    raise TypeError(f"rng must be a numpy Generator, an int seed or None, not {type(rng).__name__}")


def check_level(confidence_level: float, name: str = "confidence_level") -> float:
    level = float(confidence_level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"{name} must lie in (0, 1), got {confidence_level!r}")
    return level


def binary_array(values: Iterable[Any], name: str) -> np.ndarray:
    """A 1-D int array of 0/1 from bools or 0/1 numbers; anything else is a ValueError."""
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype == object:
        if any(v is None for v in arr):
            raise ValueError(f"{name} holds None: a pass/fail test needs every outcome")
        arr = arr.astype(float)
    if arr.size and not np.all((arr == 0) | (arr == 1)):
        raise ValueError(f"{name} must hold only pass/fail values (bool or 0/1)")
    return arr.astype(np.int64)


def float_array(values: Iterable[Any], name: str) -> np.ndarray:
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds NaN or infinite values")
    return arr


def paired_arrays(baseline: Any, candidate: Any, convert: Callable[[Any, str], np.ndarray]):
    base = convert(baseline, "baseline")
    cand = convert(candidate, "candidate")
    if base.shape != cand.shape:
        raise ValueError(
            f"baseline and candidate must be paired (same length); got {base.size} and {cand.size}"
        )
    if base.size == 0:
        raise ValueError("no pairs: baseline and candidate are empty")
    return base, cand


def bootstrap_ci(
    data: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    *,
    confidence_level: float,
    n_resamples: int,
    rng: np.random.Generator,
    method: str = "BCa",
) -> ConfidenceInterval:
    """Paired bootstrap interval through ``scipy.stats.bootstrap`` (resampling whole rows).

    ``statistic`` must be vectorised (take ``axis``). Constant data give the degenerate
    interval (value, value); where BCa cannot be computed (its jackknife degenerates) the
    percentile interval is used instead. Rows must be independent: where one prompt gives
    several rows (seeds, temperatures), pass per-prompt sums (:func:`cluster_sums`).
    """
    return bootstrap_bounds(data, statistic, confidence_level=confidence_level, n_resamples=n_resamples,
                            rng=rng, method=method)[0]


def bootstrap_bounds(
    data: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    *,
    confidence_level: float,
    n_resamples: int,
    rng: np.random.Generator,
    method: str = "BCa",
    bound_level: float | None = None,
) -> tuple[ConfidenceInterval, float]:
    """:func:`bootstrap_ci`, plus the one-sided lower bound at ``bound_level`` computed from the
    same bootstrap distribution (NaN when ``bound_level`` is None)."""
    if method not in ("BCa", "percentile", "basic"):
        raise ValueError(f"method must be 'BCa', 'percentile' or 'basic', not {method!r}")
    observed = float(statistic(*data, axis=-1))
    if all(np.all(d == d[0]) for d in data):
        return ConfidenceInterval(observed, observed), (observed if bound_level is not None else float("nan"))
    for m in (method, "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = stats.bootstrap(
                tuple(data), statistic, n_resamples=n_resamples, vectorized=True, paired=True,
                confidence_level=confidence_level, method=m, rng=rng,
            )
            bound = float("nan")
            if bound_level is not None:
                one = stats.bootstrap(
                    tuple(data), statistic, n_resamples=0, vectorized=True, paired=True,
                    confidence_level=bound_level, alternative="greater", method=m, bootstrap_result=res,
                    rng=rng,
                )
                bound = float(one.confidence_interval.low)
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if np.isfinite(low) and np.isfinite(high) and (bound_level is None or np.isfinite(bound)):
            return ConfidenceInterval(low, high), bound
    return ConfidenceInterval(observed, observed), (observed if bound_level is not None else float("nan"))


def cluster_index(keys: Sequence[Any]) -> np.ndarray:
    """Integer cluster ids (0..m-1, in first-seen order) for a sequence of hashable keys."""
    ids: dict[Any, int] = {}
    return np.fromiter((ids.setdefault(k, len(ids)) for k in keys), dtype=np.int64, count=len(keys))


def prompt_clusters(pairs: Sequence[Any]) -> np.ndarray:
    """The independent unit of paired records: one prompt (suite, item), whatever its seeds and
    temperatures. Pairs of one prompt share its difficulty and length, so they are correlated;
    intervals resample prompts, not pairs."""
    return cluster_index([(p.key.suite, p.key.item_id) for p in pairs])


def cluster_sums(ids: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-cluster sums of each array (clusters in id order)."""
    m = int(ids.max()) + 1 if ids.size else 0
    return tuple(np.bincount(ids, weights=np.asarray(a, dtype=float), minlength=m) for a in arrays)


def group_keys(record: Mapping[str, Any], by: str | None) -> list[str]:
    """The group names a record falls in: its suite, each of its categories, or "all"."""
    if by is None:
        return ["all"]
    if by == "suite":
        return [str(record["suite"])]
    if by == "category":
        cats = record.get("categories") or []
        return [str(c) for c in cats] or ["(none)"]
    raise ValueError(f"by must be 'suite', 'category' or None, not {by!r}")


def group_pairs(pairs: Sequence[Any], by: str | None) -> dict[str, list[Any]]:
    """Pairs grouped by the baseline record's suite or categories (an item may be in several)."""
    groups: dict[str, list[Any]] = {}
    for pair in pairs:
        for key in group_keys(pair.baseline, by):
            groups.setdefault(key, []).append(pair)
    return dict(sorted(groups.items()))
