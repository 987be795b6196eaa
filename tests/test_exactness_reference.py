"""The exactness reference (`harness/run/reference.py`) is independent of `decoders.sampling`, and
the gate reads its controls fail closed (`harness/verdict/gate.py`, the exactness region).

- The reference's shaping (transformers' warpers) agrees with the decoders' documented contract,
  and a bug injected into the decoders' top-p shaping does not move it.
- A draft's q rebuilt by replay is the q it sampled from, also for a dynamically quantized draft,
  where one batched forward is not.
- Gate: a failing baseline control fails the run naming the harness's sampler, and excuses a
  candidate only as far as its deviation goes; checks without a p-value where drafts were
  rejected are inconclusive; a failing draft control makes the residual test inconclusive.
"""
from __future__ import annotations

import pytest
import torch

import decoders.sampling as sampling
import decoders.speculative as spec
from decoders import GenerationRequest, make_decoder
from harness.config import Gates
from harness.models import build_tiny, quantize_int8
from harness.run import reference
from harness.verdict.gate import decide

SETTINGS = [(0.7, 0, 0.95), (1.0, 50, 1.0), (0.5, 20, 0.9), (1.3, 0, 0.5), (0.7, 3, 0.95)]


def shortcut_bug(x, logp, top_p, probe=256):
    """The 256-token top-p shortcut with its test turned the wrong way: whenever the top tokens
    already cover top_p, nothing is cut (the nucleus is the whole vocabulary)."""
    k = min(probe, logp.shape[-1])
    if bool((torch.topk(logp, k, dim=-1).values.exp().sum(dim=-1) >= top_p).all()):
        return x
    return ORIGINAL_TOP_P(x, logp, top_p, probe)


ORIGINAL_TOP_P = sampling._top_p_only


@pytest.mark.parametrize("t,top_k,top_p", SETTINGS)
def test_reference_matches_the_documented_contract(t, top_k, top_p):
    # temperature, then top-k (ties with the k-th kept), then top-p on what is left, top token kept
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=g) * 3
    logits[:8, :2] = 9.0                    # a few rows where one tie holds almost everything
    req = GenerationRequest((1,), temperature=t, top_k=top_k, top_p=top_p)
    ref = reference.shaped_probs(logits, req)
    ours = sampling.probs(logits, req).double()
    assert ref.dtype == torch.float64 and torch.allclose(ref.sum(-1), torch.ones(64, dtype=torch.float64))
    assert (ref > 0).sum(-1).min() >= 1
    differ = (ref > 0) != (ours > 0)
    for row, tok in differ.nonzero().tolist():
        if ref[row, tok] == 0:  # the check sets such a token aside rather than call it impossible
            assert reference.at_top_p_boundary(logits[row], tok, req, 1e-4)
        else:                   # the deliberate difference: which of two tied logits closes the nucleus
            tied = (logits[row] == logits[row, tok]) & (ours[row] > 0) & (ref[row] == 0)
            assert tied.any(), (row, tok)
    assert int(differ.sum()) <= 4
    same = ~differ.any(-1)
    assert torch.allclose(ref[same], ours[same], atol=1e-6)


def test_a_top_p_bug_in_the_decoders_does_not_move_the_reference(monkeypatch):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(32, 200, generator=g) * 2
    req = GenerationRequest((1,), temperature=0.7, top_p=0.9)
    before_ref, before_ours = reference.shaped_probs(logits, req), sampling.probs(logits, req)
    monkeypatch.setattr(sampling, "_top_p_only", shortcut_bug)
    after = sampling.probs(logits, req)
    assert ((after > 0) & (before_ours == 0)).any()        # the bug is real: the decoders sample outside the nucleus
    assert torch.equal(reference.shaped_probs(logits, req), before_ref)


@pytest.fixture(scope="module")
def tiny_target():
    return build_tiny("llama")


# A near copy of the target (rounds accepted in full: the next chunk holds two tokens) and an
# unrelated model (rejections: the draft rolls back).
@pytest.mark.parametrize("draft_seed", [0, 1])
def test_replayed_q_is_the_q_the_draft_sampled_from(tiny_target, draft_seed, monkeypatch):
    """Dynamic int8: activation scales depend on the tokens in each forward, so only a replay in
    the drafter's own chunks gives back its q (one batched forward does not)."""
    target, draft = tiny_target, quantize_int8(build_tiny("llama", seed=draft_seed))
    seen = []
    real = spec.verify_rejection

    def watch(p, q, d, u_accept, u_sample):  # observes the q the verifier was given; changes nothing
        seen.append((q[0].clone(), d[0].tolist()))
        return real(p, q, d, u_accept, u_sample)

    monkeypatch.setattr(spec, "verify_rejection", watch)
    dec = make_decoder("speculative", target, draft=draft, k=3, verify="rejection")
    prompt = tuple(target.encode("the river runs past the old mill and on to the sea"))
    req = GenerationRequest(prompt, max_new_tokens=24, temperature=1.0, seed=3)
    res = dec.generate(req)
    st, tokens = res.stats, list(res.tokens)
    rounds = [(n, a) for n, a in zip(st["proposed_per_round"], st["accepted_per_round"]) if n]
    assert any(a == n for n, a in rounds) if draft_seed == 0 else any(a < n for n, a in rounds)
    rows = reference.replayed_draft_logits(draft, prompt, tokens, st)
    batched = reference.teacher_forced_logits(draft, prompt, [tokens])[0]
    vocab = reference.output_size(target.model)
    worst_replay = worst_batched = 0.0
    for (q, d), off, n, a in zip(seen, st["round_offsets"], st["proposed_per_round"], st["accepted_per_round"]):
        for j in range(min(a + 1, n)):
            if off + j >= len(tokens):
                break
            mine = reference.shaped_probs(reference.to_vocab(rows[off + j], vocab), req)
            flat = reference.shaped_probs(reference.to_vocab(batched[off + j], vocab), req)
            worst_replay = max(worst_replay, float((mine - q[j].double()).abs().max()))
            worst_batched = max(worst_batched, float((flat - q[j].double()).abs().max()))
            assert mine[d[j]] > 0
    assert worst_replay < 1e-6 < 1e-3 < worst_batched


# ------------------------------------------------------------------------------------ the gate


def pit(pvalue, n=1000, rejected=50, impossible=0, deviation=0.01, proposed=200):
    return {"pvalue": pvalue, "n": n, "proposed": proposed, "rejected": rejected, "impossible": impossible,
            "detectable_tv": 0.04, "deviation": deviation}


def cand(subsets, control=None, draft_control=None, tests=()):
    ex = {"tests": list(tests), "pit": {"subsets": subsets, "control": control, "reference": "transformers' warpers"}}
    if draft_control is not None:
        ex["pit"]["draft_control"] = draft_control
    return {"kind": "exact", "decoder": "speculative", "options": {"verify": "rejection"}, "exactness": ex,
            "suites": {"s": {"identity": {"T=0": {"rate": 1.0, "n": 10, "identical": 10, "near_ties": 0,
                                                  "divergences": [], "real_divergences": 0}}}}}


def by_name(decision):
    return {r.name: r for r in decision.results}


def test_a_failing_control_names_the_sampler_and_fails_closed():
    bad_control = pit(0.0, impossible=30, deviation=0.03)
    for inconclusive in ("fail", "warn"):
        d = decide(cand({"all": pit(0.0, impossible=40, deviation=0.08), "drafted": pit(0.4)}, bad_control),
                   Gates(inconclusive=inconclusive))
        gates = by_name(d)
        assert not d.passed
        ctl = gates["exactness control"]
        assert ctl.status == "fail" and "harness's sampler is wrong" in ctl.detail and "decoders.sampling" in ctl.detail
        # further from the reference than the baseline: not excused
        assert gates["exactness PIT all"].status == "fail"
        assert "further from the reference than the baseline" in gates["exactness PIT all"].detail


def test_a_failing_control_excuses_only_a_deviation_no_larger_than_its_own():
    d = decide(cand({"all": pit(1e-9, deviation=0.02), "drafted": pit(0.4)}, pit(1e-8, deviation=0.03)),
               Gates(inconclusive="warn"))
    gates = by_name(d)
    assert gates["exactness PIT all"].status == "warn" and "no further from the reference" in gates["exactness PIT all"].detail
    assert not d.passed and gates["exactness control"].status == "fail"


def test_no_p_value_although_drafts_were_rejected_is_inconclusive():
    few = {"pvalue": None, "n": 6, "proposed": 40, "rejected": 12, "impossible": 0, "note": "6 token(s): too few"}
    window = {"item_id": "x", "offset": 4, "temperature": 0.7, "pvalue": None, "n": 200, "proposed": 30,
              "rejected": 9, "note": "only 1 category"}
    d = decide(cand({"all": few, "drafted": few, "rejected": few}, tests=[window]), Gates())
    assert not d.passed
    assert by_name(d)["exactness"].status == "fail" and "no exactness check yielded a p-value" in by_name(d)["exactness"].detail
    assert by_name(d)["exactness x@4 T=0.7"].status == "fail"


def test_a_broken_draft_control_is_inconclusive_not_p_zero():
    subsets = {"all": pit(0.5), "drafted": pit(0.6), "rejected": pit(0.0, n=345, impossible=21)}
    broken = {**pit(0.0, n=700, impossible=9), "what": "the draft's 700 tested proposals under the rebuilt q"}
    d = decide(cand(subsets, pit(0.3), broken), Gates())
    gates = by_name(d)
    assert not d.passed
    assert gates["exactness draft control"].status == "fail" and "reference is broken" in gates["exactness draft control"].detail
    rej = gates["exactness PIT rejected"]
    assert "inconclusive" in rej.detail and "draft control" in rej.detail and "p = 0" not in rej.detail
    assert decide(cand(subsets, pit(0.3), broken), Gates(inconclusive="warn")).passed
    # with a sound draft control the same residual failure is the candidate's
    d = decide(cand(subsets, pit(0.3), pit(0.4, n=700)), Gates(inconclusive="warn"))
    assert not d.passed and "p = 0" in by_name(d)["exactness PIT rejected"].detail
