"""The decoders' order within a block: each baseline first, the rest of its level shuffled per
block. A fixed order made `make regress-vllm`'s A/A run, always right after the baseline on the
same server, read 1.06x the baseline (95% interval [1.04, 1.08]): what runs just before a
decoder lands on it every time. Shuffled, each decoder takes each place and follows each other
decoder equally often."""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from harness.run.runner import block_order


def _specs(*names):
    return [SimpleNamespace(name=n) for n in names]


def _names(order):
    return [s.name for s in order]


def test_the_baseline_is_first_and_the_others_take_every_place_equally_often():
    specs = _specs("base", "base~aa", "ngram", "draft")
    blocks = 1200
    orders = [_names(block_order(specs, {"base"}, k)) for k in range(blocks)]
    assert all(o[0] == "base" and sorted(o) == sorted(_names(specs)) for o in orders)
    places = Counter((name, o.index(name)) for o in orders for name in o[1:])
    for name in ("base~aa", "ngram", "draft"):
        for place in (1, 2, 3):
            assert abs(places[(name, place)] / blocks - 1 / 3) < 0.06, places
    # What runs just before the A/A run: the baseline (its server, warm) no more often than chance,
    # and the baseline's own predecessor (the last of the block before) as often the A/A run.
    before_aa = Counter(o[o.index("base~aa") - 1] for o in orders)
    before_base = Counter(prev[-1] for prev in orders[:-1])
    assert abs(before_aa["base"] / blocks - 1 / 3) < 0.06, before_aa
    assert abs(before_base["base~aa"] / (blocks - 1) - 1 / 3) < 0.06, before_base


def test_a_blocks_order_is_reproducible_and_changes_between_blocks():
    specs = _specs("base", "a", "b", "c", "d")
    assert [_names(block_order(specs, {"base"}, k)) for k in range(20)] == \
           [_names(block_order(specs, {"base"}, k)) for k in range(20)]
    assert len({tuple(_names(block_order(specs, {"base"}, k))) for k in range(20)}) > 5


def test_each_concurrency_level_keeps_its_baseline_first_and_its_own_decoders():
    specs = _specs("base", "base~aa", "spec", "base@c4", "base~aa@c4", "spec@c4")
    for k in range(50):
        order = _names(block_order(specs, {"base", "base@c4"}, k))
        assert order[0] == "base" and set(order[1:3]) == {"base~aa", "spec"}
        assert order[3] == "base@c4" and set(order[4:]) == {"base~aa@c4", "spec@c4"}
