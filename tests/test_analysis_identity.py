"""Token identity and divergence forensics on synthetic records with planted divergences."""

import numpy as np
import pytest
from statsmodels.stats.proportion import proportion_confint

from analysis import DEFAULT_EPS, common_prefix_length, pair_records, token_identity
from harness.calibration.synthetic import make_record

BASE = [5, 6, 7, 8, 9, 10, 11, 12]


def build():
    """10 identical, 3 near-ties, 2 real divergences, 1 where the baseline stops early."""
    base, cand, planted = [], [], {}
    margins = [2.0, 1.5, 3.0, 0.7, 4.0, 2.2, 1.1, 0.9]
    n = 0

    def add(cand_tokens, base_tokens=BASE, base_margins=margins, kind=None, pos=None):
        nonlocal n
        item = f"item-{n:03d}"
        n += 1
        base.append(make_record(item_id=item, tokens=base_tokens, margins=base_margins))
        cand.append(make_record(candidate="spec", decoder="speculative", item_id=item, tokens=cand_tokens))
        if kind:
            planted[item] = (kind, pos)

    for _ in range(10):
        add(BASE)
    for pos in (2, 5, 5):  # near-ties: the baseline's margin at the divergence is tiny
        m = list(margins)
        m[pos] = 3e-5
        add(BASE[:pos] + [99] + BASE[pos + 1:], base_margins=m, kind="near-tie", pos=pos)
    for pos in (0, 4):  # real: clear margins
        add(BASE[:pos] + [77] + BASE[pos + 1:], kind="real", pos=pos)
    add(BASE, base_tokens=BASE[:6], base_margins=margins[:6], kind="unknown", pos=6)
    return pair_records(base, cand), planted


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix_length([1, 2, 3], [1, 9, 3]) == 1
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0


def test_identity_and_forensics():
    pairs, planted = build()
    res = token_identity(pairs)
    assert res.n == 16 and res.identical == 10 and res.statistic == pytest.approx(10 / 16)
    low, high = proportion_confint(10, 16, alpha=0.05, method="wilson")
    assert res.confidence_interval() == pytest.approx((low, high), abs=1e-12)
    assert res.pvalue is None and res.eps == DEFAULT_EPS
    # prefixes: 10 x 8, near-ties 2, 5, 5, real 0, 4, length 6
    assert res.mean_common_prefix == pytest.approx((80 + 2 + 5 + 5 + 0 + 4 + 6) / 16)
    assert res.first_divergence_histogram == {0: 1, 2: 1, 4: 1, 5: 2, 6: 1}
    got = {d.key.item_id: (d.kind, d.position) for d in res.divergences}
    assert got == planted
    assert {k.item_id for k in res.near_ties} == {i for i, (k, _) in planted.items() if k == "near-tie"}
    assert {k.item_id for k in res.real_divergences} == {i for i, (k, _) in planted.items() if k == "real"}
    assert len(res.unknown) == 1
    tie = next(d for d in res.divergences if d.kind == "near-tie")
    assert tie.margin == pytest.approx(3e-5) and tie.candidate_token == 99
    assert tie.margin_quantile < 0.05  # among the lowest baseline margins
    real = next(d for d in res.divergences if d.kind == "real" and d.position == 0)
    assert real.margin == 2.0 and real.baseline_token == 5 and real.candidate_token == 77
    unk = next(d for d in res.divergences if d.kind == "unknown")
    assert unk.baseline_token is None and unk.candidate_token == BASE[6] and unk.margin is None
    counts, edges = res.binned_histogram(bins=[0, 3, 6, 9])
    assert counts.tolist() == [2, 3, 1]


def test_eps_boundary_and_clopper_pearson():
    pairs, _ = build()
    res = token_identity(pairs, eps=3e-5, method="clopper-pearson", confidence_level=0.9)
    assert len(res.near_ties) == 0 and len(res.real_divergences) == 5  # margin == eps is real
    low, high = proportion_confint(10, 16, alpha=0.1, method="beta")
    assert res.confidence_interval() == pytest.approx((low, high), abs=1e-10)


def test_all_identical():
    pairs, _ = build()
    res = token_identity(pairs[:10])
    assert res.statistic == 1.0 and res.divergences == () and res.ci_high == 1.0
    assert res.ci_low == pytest.approx(proportion_confint(10, 10, method="wilson")[0])


def test_bad_input():
    pairs, _ = build()
    with pytest.raises(ValueError, match="at least one pair"):
        token_identity([])
    with pytest.raises(ValueError, match="method"):
        token_identity(pairs, method="agresti")
    with pytest.raises(ValueError, match="eps"):
        token_identity(pairs, eps=-1)


def test_measured_noise_widens_eps_only_as_far_as_rounding_goes():
    from analysis.identity import near_tie_epsilon
    assert near_tie_epsilon("torch.float32", 2e-5)[0] == 1e-3                  # rounding: the default holds
    assert near_tie_epsilon("torch.float32", 3e-3)[0] == pytest.approx(6e-3)   # widened to 2 x noise
    # Batched and one-token forwards 2.4 logits apart are not rounding: eps 4.8 made every
    # divergence below it a "near-tie", and identity passed on real divergences.
    eps, source = near_tie_epsilon("torch.float32", 2.4)
    assert eps == 1e-3 and "not used" in source and "2.4" in source
    assert near_tie_epsilon("bfloat16", 4.0)[0] == pytest.approx(8.0)      # bf16: within 10 x its 1.0
    assert near_tie_epsilon("bfloat16", 6.0)[0] == 1.0


def test_sampled_divergences_are_not_excused_by_the_raw_margin():
    """Issue 49 (3): a coupled sampler picks argmax(log p + Gumbel noise); the recorded margin is
    the raw greedy top-2 gap, which says nothing about the perturbed scores' tie. At bf16's eps
    of 1.0 a candidate that diverged on 2 of 8 sampled pairs passed as "2 near-tie divergence(s)"."""
    from harness.config import Gates
    from harness.verdict.gate import decide
    from harness.verdict.summary import _identity

    base, cand = [], []
    for i in range(8):
        toks = [5, 6, 7, 8, 9, 10]
        base.append(make_record(item_id=f"p{i}", temperature=0.7, seed=1, tokens=toks, margins=[0.5] * 6))
        wrong = toks[:3] + [99] + toks[4:] if i < 2 else toks
        cand.append(make_record(candidate="spec", decoder="speculative", item_id=f"p{i}", temperature=0.7,
                                seed=1, tokens=wrong))
    pairs = pair_records(base, cand)
    res = token_identity(pairs, eps=1.0)
    assert [d.kind for d in res.divergences] == ["real", "real"]
    ident = _identity(pairs, 1.0)
    summary = {"kind": "exact", "decoder": "speculative", "options": {"verify": "coupled"},
               "suites": {"s": {"identity": {"T=0.7": ident}}}}
    d = decide(summary, Gates())
    assert not d.passed and "identity s T=0.7" in {r.name for r in d.failures}
    # a greedy pair at the same raw margin is still a near-tie
    greedy = pair_records([dict(r, temperature=0.0) for r in base], [dict(r, temperature=0.0) for r in cand])
    assert [d.kind for d in token_identity(greedy, eps=1.0).divergences] == ["near-tie", "near-tie"]
