"""Pairing: strict one-to-one joins, and clear errors for every kind of mismatch."""

import pytest

from analysis import PairingError, pair_records, split_by_candidate
from harness.calibration.synthetic import make_record


def side(name, items=("a", "b", "c"), seeds=(0,), suite_hash="h1", temperature=0.0, suite="factual"):
    return [make_record(candidate=name, item_id=i, seed=s, suite_hash=suite_hash,
                        temperature=temperature, suite=suite)
            for i in items for s in seeds]


def test_pairs_sorted_and_complete():
    base = side("baseline", items=("c", "a", "b"), seeds=(1, 0))
    cand = list(reversed(side("spec", seeds=(0, 1))))
    pairs = pair_records(base, cand)
    assert [str(p.key) for p in pairs][:2] == ["factual/a seed=0 T=0", "factual/a seed=1 T=0"]
    assert len(pairs) == 6
    for p in pairs:
        assert p.baseline["candidate"] == "baseline" and p.candidate["candidate"] == "spec"
        assert (p.baseline["item_id"], p.baseline["seed"]) == (p.candidate["item_id"], p.candidate["seed"])


def test_int_and_float_temperature_pair():
    assert len(pair_records(side("b", temperature=0), side("c", temperature=0.0))) == 3


def test_missing_item_is_named():
    with pytest.raises(PairingError) as err:
        pair_records(side("baseline"), side("spec", items=("a", "b")))
    assert isinstance(err.value, ValueError)
    assert "only in baseline" in str(err.value) and "factual/c" in str(err.value)
    assert [k.item_id for k in err.value.only_baseline] == ["c"]
    assert err.value.only_candidate == ()


def test_suite_hash_mismatch_is_named():
    with pytest.raises(PairingError, match=r"suite_hash differs \(baseline h1; candidate h2\)"):
        pair_records(side("baseline"), side("spec", suite_hash="h2"))


def test_seed_mismatch_is_named():
    with pytest.raises(PairingError, match=r"seeds differ for 3 item\(s\), e.g. factual/a: baseline \[0, 1\], candidate \[0, 2\]"):
        pair_records(side("baseline", seeds=(0, 1)), side("spec", seeds=(0, 2)))


def test_temperature_mismatch_is_named():
    with pytest.raises(PairingError, match="temperatures differ"):
        pair_records(side("baseline"), side("spec", temperature=0.7))


def test_suite_only_on_one_side():
    with pytest.raises(PairingError, match="suite 'code' is only in the candidate"):
        pair_records(side("baseline"), side("spec") + side("spec", suite="code"))


def test_duplicates_rejected():
    base = side("baseline") + side("baseline", items=("a",))
    with pytest.raises(PairingError, match=r"baseline has 1 duplicated key\(s\): factual/a seed=0"):
        pair_records(base, side("spec"))


def test_mixed_candidates_rejected():
    with pytest.raises(PairingError, match="mix several candidates"):
        pair_records(side("baseline"), side("spec") + side("other", items=("z",)))


def test_missing_field_and_bad_types():
    bad = side("spec")
    del bad[1]["suite_hash"]
    with pytest.raises(PairingError, match="candidate record 1 lacks the pairing field"):
        pair_records(side("baseline"), bad)
    bad = side("spec")
    bad[0]["seed"] = "0"
    with pytest.raises(PairingError, match="seed must be an int"):
        pair_records(side("baseline"), bad)


def test_empty_side():
    with pytest.raises(PairingError, match="no candidate records"):
        pair_records(side("baseline"), [])


def test_split_by_candidate():
    groups = split_by_candidate(side("baseline") + side("spec"))
    assert list(groups) == ["baseline", "spec"] and len(groups["spec"]) == 3
    with pytest.raises(PairingError):
        split_by_candidate([{"item_id": "x"}])
