"""The engine reference's shaping from top-k logprobs (`harness.run.reference.shaped_from_top_logprobs`)
against the full-vocabulary reference (`shaped_probs`): equal where it decides, None where the
top-k cannot decide the nucleus, and the decision never depends on the token sampled."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from decoders.base import GenerationRequest
from harness.run.reference import shaped_from_top_logprobs, shaped_probs

V = 500


def _request(t=0.7, top_p=0.95, top_k=0):
    return GenerationRequest((1, 2), max_new_tokens=4, temperature=t, top_p=top_p, top_k=top_k)


def _top(logits: torch.Tensor, k: int) -> dict[int, float]:
    lp = torch.log_softmax(logits.double(), -1)
    v, i = torch.topk(lp, k)
    return {int(a): float(b) for a, b in zip(i, v)}


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("t,top_p,top_k", [(0.7, 0.95, 0), (1.0, 0.9, 0), (0.5, 0.8, 0), (1.3, 0.95, 0),
                                           (0.7, 1.0, 10), (0.7, 0.95, 15)])
def test_decided_positions_equal_the_full_reference(seed, t, top_p, top_k):
    g = torch.Generator().manual_seed(seed)
    scale = [0.5, 2.0, 4.0, 8.0][seed % 4]  # flat to peaked
    logits = torch.randn(V, generator=g, dtype=torch.float64) * scale
    req = _request(t, top_p, top_k)
    got = shaped_from_top_logprobs(_top(logits, 20), req, V)
    want = shaped_probs(logits, req)
    if got is None:
        # Undecided only where the nucleus really reaches past the top 20 or sits near its edge.
        assert int((want > 0).sum()) >= 2
        return
    assert torch.allclose(got, want, atol=1e-9, rtol=1e-7)


def test_a_nucleus_past_the_top_k_is_left_out():
    logits = torch.zeros(V, dtype=torch.float64)  # uniform: the 0.95 nucleus holds 475 tokens
    assert shaped_from_top_logprobs(_top(logits, 20), _request(), V) is None
    assert shaped_from_top_logprobs(_top(logits, 20), _request(top_p=1.0), V) is None  # no cut at all


def test_the_noise_band_leaves_out_a_boundary_that_rounding_could_move():
    # Two tokens: masses 0.9 and 0.09 at T=1, the rest tiny; top-p 0.9 sits right at the first.
    logits = torch.full((V,), -30.0, dtype=torch.float64)
    logits[0], logits[1] = 0.0, float(torch.log(torch.tensor(0.1001)))
    req = _request(t=1.0, top_p=0.91)
    assert shaped_from_top_logprobs(_top(logits, 20), req, V) is not None
    assert shaped_from_top_logprobs(_top(logits, 20), req, V, band=1.2) is None


def test_the_decision_does_not_depend_on_the_sampled_token():
    # The function never sees the token: same inputs, same answer, whatever is drawn after.
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(V, generator=g, dtype=torch.float64) * 4
    req = _request()
    a = shaped_from_top_logprobs(_top(logits, 20), req, V)
    b = shaped_from_top_logprobs(_top(logits, 20), dataclasses.replace(req, seed=99), V)
    assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def test_peaked_positions_are_decided():
    decided = 0
    for seed in range(40):
        logits = torch.randn(V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 8
        decided += shaped_from_top_logprobs(_top(logits, 20), _request(), V) is not None
    assert decided >= 30, decided
