"""Pairing of baseline and candidate records, prompt by prompt and seed by seed.

Every paired analysis starts here. A record is one JSON row per generation (see the runner's
record contract); the pairing key is ``(suite, suite_hash, item_id, seed, temperature)``.
Pairing is strict: an item missing on one side, a suite whose hash differs, different seeds or
temperatures, or a key that occurs twice raise :class:`PairingError`, a ``ValueError`` whose
message says what differs. There is no partial join.

This module does not read files, grade, or compute statistics.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

KEY_FIELDS = ("suite", "suite_hash", "item_id", "seed", "temperature")
_SHOW = 5  # how many offending keys a message lists before "and N more"


class PairKey(NamedTuple):
    """The identity of one generation request: what baseline and candidate must share."""

    suite: str
    suite_hash: str
    item_id: str
    seed: int
    temperature: float

    def __str__(self) -> str:
        return f"{self.suite}/{self.item_id} seed={self.seed} T={self.temperature:g}"


@dataclass(frozen=True)
class Pair:
    """One baseline record and the candidate record with the same :class:`PairKey`."""

    key: PairKey
    baseline: Mapping[str, Any] = field(repr=False)
    candidate: Mapping[str, Any] = field(repr=False)


class PairingError(ValueError):
    """Baseline and candidate records cannot be paired one to one; the message says why.

    ``only_baseline`` / ``only_candidate`` hold the keys found on one side only, ``reasons``
    the individual findings (one line each).
    """

    def __init__(self, reasons: Sequence[str], only_baseline=(), only_candidate=()):
        self.reasons = tuple(reasons)
        self.only_baseline = tuple(only_baseline)
        self.only_candidate = tuple(only_candidate)
        super().__init__("cannot pair baseline and candidate records:\n  - " + "\n  - ".join(reasons))


def _listing(items: Sequence[Any]) -> str:
    shown = ", ".join(str(i) for i in items[:_SHOW])
    more = len(items) - _SHOW
    return shown + (f", and {more} more" if more > 0 else "")


def record_key(record: Mapping[str, Any], *, side: str = "record", index: int | None = None) -> PairKey:
    """The :class:`PairKey` of one record; a missing or mistyped field is a :class:`PairingError`."""
    where = f"{side} record {index}" if index is not None else side
    if not isinstance(record, Mapping):
        raise PairingError([f"{where} is a {type(record).__name__}, not a mapping"])
    missing = [f for f in KEY_FIELDS if record.get(f) is None]
    if missing:
        raise PairingError([f"{where} lacks the pairing field(s) {', '.join(missing)}"])
    seed, temp = record["seed"], record["temperature"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise PairingError([f"{where}: seed must be an int, got {seed!r}"])
    if isinstance(temp, bool) or not isinstance(temp, (int, float)):
        raise PairingError([f"{where}: temperature must be a number, got {temp!r}"])
    return PairKey(str(record["suite"]), str(record["suite_hash"]), str(record["item_id"]), seed, float(temp))


def split_by_candidate(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Records grouped by their ``candidate`` (config name), in first-seen order."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for i, rec in enumerate(records):
        name = rec.get("candidate") if isinstance(rec, Mapping) else None
        if name is None:
            raise PairingError([f"record {i} has no 'candidate' name"])
        out.setdefault(str(name), []).append(rec)
    return out


def _index(records: Sequence[Mapping[str, Any]], side: str) -> dict[PairKey, Mapping[str, Any]]:
    names = {str(r.get("candidate")) for r in records if isinstance(r, Mapping) and "candidate" in r}
    if len(names) > 1:
        raise PairingError(
            [f"{side} records mix several candidates ({', '.join(sorted(names))}); "
             "select one with split_by_candidate()"]
        )
    keys = [record_key(r, side=side, index=i) for i, r in enumerate(records)]
    dups = sorted((k for k, n in Counter(keys).items() if n > 1), key=_sort_key)
    if dups:
        raise PairingError([f"{side} has {len(dups)} duplicated key(s): {_listing(dups)}"])
    return dict(zip(keys, records))


def _sort_key(k: PairKey):
    return (k.suite, k.suite_hash, k.item_id, k.seed, k.temperature)


def _diagnose(base: set[PairKey], cand: set[PairKey]) -> list[str]:
    """Human-readable reasons why two key sets differ, most specific first."""
    reasons: list[str] = []
    hashes_b, hashes_c = defaultdict(set), defaultdict(set)
    for k in base:
        hashes_b[k.suite].add(k.suite_hash)
    for k in cand:
        hashes_c[k.suite].add(k.suite_hash)
    for suite in sorted(hashes_b.keys() | hashes_c.keys()):
        hb, hc = hashes_b.get(suite), hashes_c.get(suite)
        if hb is None:
            reasons.append(f"suite {suite!r} is only in the candidate records")
        elif hc is None:
            reasons.append(f"suite {suite!r} is only in the baseline records")
        elif hb != hc:
            reasons.append(
                f"suite {suite!r}: suite_hash differs (baseline {', '.join(sorted(hb))}; "
                f"candidate {', '.join(sorted(hc))}): the suite changed between runs"
            )
    for attr in ("seed", "temperature"):
        per_b, per_c = defaultdict(set), defaultdict(set)
        for k in base:
            per_b[(k.suite, k.item_id)].add(getattr(k, attr))
        for k in cand:
            per_c[(k.suite, k.item_id)].add(getattr(k, attr))
        differ = sorted(i for i in per_b.keys() & per_c.keys() if per_b[i] != per_c[i])
        if differ:
            s, item = differ[0]
            reasons.append(
                f"{attr}s differ for {len(differ)} item(s), e.g. {s}/{item}: baseline "
                f"{sorted(per_b[(s, item)])}, candidate {sorted(per_c[(s, item)])}"
            )
    items_b = {(k.suite, k.item_id) for k in base}
    items_c = {(k.suite, k.item_id) for k in cand}
    only_b = sorted(f"{s}/{i}" for s, i in items_b - items_c)
    only_c = sorted(f"{s}/{i}" for s, i in items_c - items_b)
    if only_b:
        reasons.append(f"{len(only_b)} item(s) only in baseline: {_listing(only_b)}")
    if only_c:
        reasons.append(f"{len(only_c)} item(s) only in candidate: {_listing(only_c)}")
    if not reasons:  # e.g. the same seeds per item overall but combined differently with hashes
        reasons.append("keys differ: " + _listing(sorted(base ^ cand, key=_sort_key)))
    return reasons


def pair_records(
    baseline: Iterable[Mapping[str, Any]], candidate: Iterable[Mapping[str, Any]]
) -> list[Pair]:
    """Pair baseline and candidate records one to one on :data:`KEY_FIELDS`.

    Both sides must hold exactly the same keys, each once, and one decoder config each.
    Returns the pairs sorted by key. Raises :class:`PairingError` naming what differs.
    """
    base_list, cand_list = list(baseline), list(candidate)
    if not base_list or not cand_list:
        empty = [s for s, lst in (("baseline", base_list), ("candidate", cand_list)) if not lst]
        raise PairingError([f"no {' and no '.join(empty)} records"])
    base, cand = _index(base_list, "baseline"), _index(cand_list, "candidate")
    if base.keys() != cand.keys():
        only_b = sorted(base.keys() - cand.keys(), key=_sort_key)
        only_c = sorted(cand.keys() - base.keys(), key=_sort_key)
        raise PairingError(_diagnose(set(base), set(cand)), only_b, only_c)
    return [Pair(k, base[k], cand[k]) for k in sorted(base, key=_sort_key)]
