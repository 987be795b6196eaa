"""The nucleus-boundary check of the engine exactness reference (harness/run/engine_exactness.py):
its top-k shortcut must leave out exactly the positions a full sort of each row leaves out."""
from __future__ import annotations

import types

import pytest
import torch

from harness.run import reference
from harness.run.engine_exactness import MASS_TOL, boundary_unsure


def _by_full_sort(pre, request, noise):
    """The definition, one row at a time: some token's mass-before (in descending order) has odds
    within the band of top_p's, or lies within MASS_TOL of top_p."""
    band, target = reference.boundary_band(noise, request.temperature), reference.odds(request.top_p)
    out = []
    for row in pre:
        q = torch.sort(row, descending=True).values
        before = (torch.cumsum(q, 0) - q).clamp(0.0, 1.0 - 1e-15)
        o = before / (1.0 - before)
        near = (o >= target / band) & (o < target * band) | ((before - request.top_p).abs() < MASS_TOL)
        out.append(bool((near & (q > 0)).any()))
    return out


def _rows(seed, n=64, vocab=4096):
    g = torch.Generator().manual_seed(seed)
    # from near-certain to flat: a flat row's nucleus reaches far past any top k
    scale = torch.logspace(-1, 1.5, n, dtype=torch.float64)[:, None]
    return torch.softmax(torch.randn(n, vocab, generator=g, dtype=torch.float64) * scale, -1)


@pytest.mark.parametrize("k", [1, 8, 256, 10_000])
@pytest.mark.parametrize("top_p,noise", [(0.8, 0.0), (0.8, 0.6), (0.95, 0.1), (0.5, 2.0)])
def test_the_shortcut_agrees_with_a_full_sort(k, top_p, noise):
    request = types.SimpleNamespace(temperature=0.7, top_p=top_p)
    pre = _rows(int(top_p * 100 + noise * 10 + k))
    want = _by_full_sort(pre, request, noise)
    got = boundary_unsure(pre, request, noise, k=k).tolist()
    assert got == want
    assert 0 < sum(want) < len(want)  # both answers occur: the comparison means something


def test_a_token_just_past_the_top_k_still_counts():
    # The top k = 2 hold 0.6 of the mass: the third token's mass-before, 0.6, lies within MASS_TOL
    # of top_p (though past the odds band, which is empty at no noise).
    request = types.SimpleNamespace(temperature=1.0, top_p=0.6 - MASS_TOL / 2)
    pre = torch.tensor([[0.2, 0.4, 0.2, 0.2]], dtype=torch.float64)
    assert _by_full_sort(pre, request, 0.0) == [True]
    assert boundary_unsure(pre, request, 0.0, k=2).tolist() == [True]
