"""The verifiers alone, vectorised over many draws on fixed distributions.

Rejection: over 20,000 draws the emitted token at each block position follows the target's p
(chi-square goodness of fit), and the same test rejects deliberately broken verifiers (test
fixtures below, not library code) with p < 0.001: the test has power.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import decoders.verify as V
from decoders.verify import sample_inverse_cdf, verify_coupled, verify_greedy, verify_rejection

DRAWS = 20_000
ALPHA = 1e-3

# Fixed target rows p (K+1 = 4 positions) and draft rows q (K = 3) over V = 5 tokens. The rows
# differ from each other (a bonus drawn from the wrong row shows) and q overlaps p by ~0.6-0.8
# per row (both acceptances and rejections are common).
P = torch.tensor([[0.40, 0.25, 0.15, 0.12, 0.08],
                  [0.10, 0.45, 0.20, 0.15, 0.10],
                  [0.30, 0.10, 0.35, 0.05, 0.20],
                  [0.05, 0.15, 0.10, 0.50, 0.20]], dtype=torch.float64)
Q = torch.tensor([[0.20, 0.40, 0.10, 0.20, 0.10],
                  [0.25, 0.25, 0.25, 0.15, 0.10],
                  [0.30, 0.30, 0.20, 0.10, 0.10]], dtype=torch.float64)


def gof_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; cells expected below 5 are pooled; any count in a cell of
    probability 0 is an outright failure."""
    counts, probs = np.asarray(counts, float), np.asarray(probs, float)
    if counts[probs == 0].sum() > 0:
        return 0.0
    counts, probs = counts[probs > 0], probs[probs > 0]
    expected = probs * counts.sum()
    small = expected < 5
    obs, exp = list(counts[~small]), list(expected[~small])
    if small.any():
        obs.append(counts[small].sum())
        exp.append(expected[small].sum())
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(obs, exp).pvalue)


def draws(p: torch.Tensor, q: torch.Tensor | None, seed: int = 0, n: int = DRAWS):
    """n independent blocks: draft tokens drawn from q (or fixed, for a point-mass q), uniforms."""
    g = torch.Generator().manual_seed(seed)
    k = p.shape[0] - 1
    if q is None:
        draft = torch.tensor([[1, 0, 3][:k]]).expand(n, k)
    else:
        draft = torch.multinomial(q, n, replacement=True, generator=g).T  # (n, K)
    return dict(p=p.expand(n, -1, -1), q=None if q is None else q.expand(n, -1, -1), draft=draft,
                u_accept=torch.rand(n, k, generator=g, dtype=torch.float64),
                u_sample=torch.rand(n, k + 1, generator=g, dtype=torch.float64))


def block_pvalue(verifier, p, q, seed=0) -> float:
    """Bonferroni-combined p-value over block positions: at position i (reached when >= i drafts
    were kept) the emitted token must follow p[i]; the rows are context-free, so reaching
    position i says nothing about the token there."""
    d = draws(p, q, seed)
    verdict = verifier(d["p"], d["q"], d["draft"], d["u_accept"], d["u_sample"])
    k, v = d["draft"].shape[1], p.shape[1]
    pvals = []
    for i in range(k + 1):
        reached = verdict.accepted >= i
        tok = torch.where(verdict.accepted[reached] > i, d["draft"][reached, min(i, k - 1)],
                          verdict.token[reached])
        counts = np.bincount(tok.numpy(), minlength=v)
        pvals.append(gof_pvalue(counts, p[i].numpy()))
    return min(1.0, min(pvals) * len(pvals))


# --------------------------------------------------------------------- broken verifier fixtures

def accept_all(p, q, draft, u_accept, u_sample):
    """Bug: every draft token is kept, and the bonus drawn from row K."""
    k = draft.shape[1]
    return V.Verdict(torch.full((draft.shape[0],), k, dtype=torch.long), sample_inverse_cdf(p[:, k], u_sample[:, k]))


def bonus_wrong_position(p, q, draft, u_accept, u_sample):
    """Bug: after K acceptances the bonus token is drawn from row K-1 instead of row K."""
    k = draft.shape[1]
    return verify_rejection(torch.cat([p[:, :k], p[:, k - 1:k]], dim=1), q, draft, u_accept, u_sample)


def _unnormalised_sampler(weights, u):
    w = weights.double()
    cum = w.cumsum(dim=-1)
    idx = torch.searchsorted(cum, u.double()[..., None], right=True)[..., 0]  # u not scaled by the mass
    last = (w > 0).long().cumsum(dim=-1).argmax(dim=-1)
    return torch.minimum(idx, last)


def residual_not_normalised(p, q, draft, u_accept, u_sample):
    """Bug: the residual max(p - q, 0) is sampled as if it summed to one."""
    saved = V.sample_inverse_cdf
    V.sample_inverse_cdf = _unnormalised_sampler
    try:
        return verify_rejection(p, q, draft, u_accept, u_sample)
    finally:
        V.sample_inverse_cdf = saved


def resample_from_p(p, q, draft, u_accept, u_sample):
    """Bug: after a rejection, draw from p instead of the residual."""
    verdict = verify_rejection(p, q, draft, u_accept, u_sample)
    rows = p.gather(1, verdict.accepted[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]
    u = u_sample.gather(1, verdict.accepted[:, None])[:, 0]
    return V.Verdict(verdict.accepted, sample_inverse_cdf(rows, u))


BROKEN = {"accept_all": accept_all, "bonus_wrong_position": bonus_wrong_position,
          "residual_not_normalised": residual_not_normalised, "resample_from_p": resample_from_p}


# ----------------------------------------------------------------------------------- rejection

def test_rejection_matches_target_distribution():
    assert block_pvalue(verify_rejection, P, Q) > ALPHA


def test_rejection_with_point_mass_draft_matches_target_distribution():
    # Prompt lookup has no q: the verifier treats its tokens as q = one_hot(d).
    assert block_pvalue(verify_rejection, P, None) > ALPHA


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_verifiers_fail_the_same_test(name):
    assert block_pvalue(BROKEN[name], P, Q) < ALPHA


def _every_row_rejection(p, q, draft, u_accept, u_sample):
    """verify_rejection as Algorithm 1 reads: every residual row formed, then the one that draws
    picked (the verifier forms only that row now)."""
    b, k = draft.shape
    p_draft = p[:, :k].gather(-1, draft[..., None])[..., 0]
    if q is None:
        q_draft, q_rows = torch.ones_like(p_draft), torch.zeros_like(p[:, :k]).scatter_(-1, draft[..., None], 1.0)
    else:
        q_draft, q_rows = q.gather(-1, draft[..., None])[..., 0], q
    accepted = (u_accept * q_draft < p_draft).long().cumprod(dim=1).sum(dim=1)
    rows = torch.cat([(p[:, :k] - q_rows).clamp_min(0), p[:, k:]], dim=1)
    at = accepted[:, None, None].expand(b, 1, rows.shape[-1])
    chosen = rows.gather(1, at)[:, 0]
    u = u_sample.gather(1, accepted[:, None])[:, 0]
    token = sample_inverse_cdf(chosen, u)
    empty = chosen.sum(dim=-1) <= 0
    return V.Verdict(accepted, torch.where(empty, sample_inverse_cdf(p.gather(1, at)[:, 0], u), token))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "point-mass"])
def test_rejection_forms_only_the_drawing_row_with_the_same_result(dtype, with_q):
    d = draws(P.to(dtype), Q.to(dtype) if with_q else None, seed=4)
    got = verify_rejection(d["p"], d["q"], d["draft"], d["u_accept"], d["u_sample"])
    want = _every_row_rejection(d["p"], d["q"], d["draft"], d["u_accept"], d["u_sample"])
    assert torch.equal(got.accepted, want.accepted) and torch.equal(got.token, want.token)
    assert set(got.accepted.tolist()) == set(range(P.shape[0]))  # every row drew in some block


def test_rejection_acceptance_rate_is_one_minus_total_variation():
    d = draws(P, Q, seed=1)
    verdict = verify_rejection(d["p"], d["q"], d["draft"], d["u_accept"], d["u_sample"])
    expected = float(torch.minimum(P[0], Q[0]).sum())  # P(accept d_1) = sum_x min(p, q)
    hits = int((verdict.accepted >= 1).sum())
    assert stats.binomtest(hits, DRAWS, expected).pvalue > ALPHA


def test_rejection_keeps_to_the_support_of_p():
    # top-k / top-p shaped rows: zeros in p and in q; no token of zero target probability.
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.3, 0.7, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.0, 0.0, 0.8]], dtype=torch.float64)
    d = draws(p, q, seed=2)
    verdict = verify_rejection(d["p"], d["q"], d["draft"], d["u_accept"], d["u_sample"])
    first = torch.where(verdict.accepted > 0, d["draft"][:, 0], verdict.token)
    assert gof_pvalue(np.bincount(first.numpy(), minlength=4), p[0].numpy()) > ALPHA
    assert set(first.tolist()) <= {0, 1}
    assert not bool(((verdict.accepted > 0) & (d["draft"][:, 0] == 3)).any())  # p(3) = 0: never kept


def test_identical_draft_is_always_accepted():
    d = draws(P, P[:3], seed=3)
    verdict = verify_rejection(d["p"], d["q"], d["draft"], d["u_accept"], d["u_sample"])
    assert bool((verdict.accepted == 3).all())


def test_inverse_cdf_sampler_normalises_and_skips_zero_weight():
    w = torch.tensor([0.0, 0.2, 0.0, 0.1]).expand(DRAWS, -1)  # sums to 0.3
    u = torch.rand(DRAWS, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    tok = sample_inverse_cdf(w, u)
    assert gof_pvalue(np.bincount(tok.numpy(), minlength=4), np.array([0, 2 / 3, 0, 1 / 3])) > ALPHA
    top = sample_inverse_cdf(torch.tensor([[0.3, 0.7, 0.0]]), torch.tensor([1.0 - 1e-16]))
    assert top.tolist() == [1]  # the top of the CDF never lands on a zero-weight tail


# ------------------------------------------------------------------------------ greedy, coupled

def test_greedy_keeps_drafts_until_first_mismatch():
    logits = torch.tensor([[[0., 5, 1], [3, 0, 1], [0, 0, 9]],   # argmax 1, 0, 2
                           [[0., 5, 1], [3, 0, 1], [0, 0, 9]],
                           [[0., 5, 1], [3, 0, 1], [0, 0, 9]]])
    draft = torch.tensor([[1, 0], [1, 2], [0, 0]])
    verdict = verify_greedy(logits, draft)
    assert verdict.accepted.tolist() == [2, 1, 0]
    assert verdict.token.tolist() == [2, 0, 1]  # bonus, correction, correction


def test_coupled_emits_the_standard_choice_and_follows_p():
    g = torch.Generator().manual_seed(5)
    n, k = DRAWS, 3
    logp, logq = P.float().log().expand(n, -1, -1), Q.float().log().expand(n, -1, -1)
    noise = -torch.log(-torch.log(torch.rand(n, k + 1, 5, generator=g).clamp(1e-20, 1 - 1e-7)))
    draft = (logq + noise[:, :k]).argmax(-1)           # the draft proposes with the same noise
    verdict = verify_coupled(logp, draft, noise)
    standard = (logp + noise).argmax(-1)               # what standard sampling emits, per position
    # Identity: every kept draft and the next token equal standard's choice at that position.
    for i in range(k + 1):
        reached = verdict.accepted >= i
        emitted = torch.where(verdict.accepted[reached] > i, draft[reached, min(i, k - 1)], verdict.token[reached])
        assert torch.equal(emitted, standard[reached, i])
    first = torch.where(verdict.accepted > 0, draft[:, 0], verdict.token)
    assert gof_pvalue(np.bincount(first.numpy(), minlength=5), P[0].numpy()) > ALPHA
