"""The in-process reference of the engine exactness check (harness/run/engine_exactness.py):
teacher-forcing every sample of a prompt in one call must give what teacher-forcing each sample
alone gives, must compute each prompt once, and must not hold every sample's logits."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from analysis import pit
from harness.run import engine_exactness
from harness.run.engine_exactness import Reference, Seqs

A, B = [5, 9, 13, 21, 34, 55], [7, 3, 11]


def _reference(loaded) -> Reference:
    config = types.SimpleNamespace(profile=types.SimpleNamespace(exactness_reference="target"))
    return Reference(config, types.SimpleNamespace(baseline_target=loaded), None)


def _seqs(outs) -> Seqs:
    seqs = Seqs.__new__(Seqs)
    seqs.rows = [({"tokens": t, "temperature": 0.7, "margins": [1.0] * len(t)},
                  types.SimpleNamespace(prompt_ids=p, temperature=0.7, top_p=0.8, top_k=0)) for p, t in outs]
    return seqs


@pytest.fixture
def calls(monkeypatch):
    """(prompt, number of outputs) of every teacher-forced call the reference makes."""
    seen = []
    real = engine_exactness.teacher_forced_logits
    monkeypatch.setattr(engine_exactness, "teacher_forced_logits",
                        lambda loaded, ctx, seqs: seen.append((tuple(ctx), len(seqs))) or real(loaded, ctx, seqs))
    return seen


def test_a_prompts_samples_in_one_call_match_one_at_a_time(tiny_llama, calls):
    outs = [[1, 2, 3, 4], [4, 3, 2, 1], [8, 8], [1, 2, 3, 4]]
    batched = _reference(tiny_llama).raw_many(A, outs)
    assert calls == [(tuple(A), 3)]  # one call, each distinct output once
    alone = _reference(tiny_llama)
    for out, got in zip(outs, batched):
        want = alone.raw_many(A, [out])[0]
        # fp32 logits of a batched and a single forward: rounding in the last bits only
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_features_go_one_prompt_at_a_time_and_agree_with_each_sample_alone(tiny_llama, calls):
    base = _seqs([(A, [1, 2, 3, 4]), (B, [2, 4, 6, 8]), (A, [8, 8])])
    cand = _seqs([(A, [4, 3, 2, 1]), (B, [9]), (A, [1, 2, 3, 4])])
    ref = _reference(tiny_llama)
    got = engine_exactness.features(ref, {"base": base, "cand": cand})
    assert sorted(calls) == sorted([(tuple(A), 3), (tuple(B), 2)])
    assert ref._cache == {} and ref._kept == 0  # nothing held once the features are made

    alone = _reference(tiny_llama)
    for name, seqs in (("base", base), ("cand", cand)):
        parts, tokens, left_out = [], 0, 0
        for r, req in seqs.rows:
            rows = alone.rows(req.prompt_ids, r["tokens"], req)
            keep = [t for t, row in enumerate(rows) if row is not None]
            tokens, left_out = tokens + len(rows), left_out + len(rows) - len(keep)
            if keep:
                parts.append(pit.features(torch.stack([rows[t] for t in keep]).numpy(), [r["tokens"][t] for t in keep]))
        want = pit.PitFeatures.concat(parts)
        assert got[name]["tokens"] == tokens and got[name]["left_out"] == left_out and got[name]["records"] == 3
        assert len(got[name]["features"]) == len(want) > 0
        for f in pit.PitFeatures.FIELDS:  # pooled in record order
            np.testing.assert_allclose(getattr(got[name]["features"], f), getattr(want, f), rtol=0, atol=1e-5)


def test_the_noise_pass_keeps_logits_only_up_to_its_budget(tiny_llama, calls, monkeypatch):
    outs = [(A, [i, i + 1, i + 2]) for i in range(1, 9)]
    one = _reference(tiny_llama).raw_many(A, [outs[0][1]])[0]
    per = one.numel() * one.element_size()
    monkeypatch.setattr(engine_exactness, "KEEP_BYTES", 3 * per)
    ref, base = _reference(tiny_llama), _seqs(outs)
    calls.clear()
    engine_exactness.measured_noise(ref, base)
    assert calls == [(tuple(A), 8)] and len(ref._cache) == 3 and ref._kept == 3 * per
    calls.clear()
    engine_exactness.features(ref, {"base": base})
    assert calls == [(tuple(A), 5)]  # the three kept are not computed again; the rest are


def test_top_logprobs_that_are_no_log_probabilities_are_refused():
    """An engine reference's top-k logprobs with a NaN, a value above 0, or a sum past 1 cannot
    decide a nucleus. Read as they were, a NaN token dropped out of the nucleus (a candidate that
    drew it then "failed" on a token of probability 0) and a sum past 1 hid the unseen mass."""
    from harness.run.reference import shaped_from_top_logprobs
    request = types.SimpleNamespace(temperature=0.7, top_k=0, top_p=0.8)
    good = {1: -0.2, 2: -2.5, 3: -3.0, 4: -4.0, 5: float("-inf")}
    assert shaped_from_top_logprobs(good, request, 10) is not None  # -inf is probability 0: fine
    for top, why in (({1: -0.1, 2: float("nan"), 3: -3.0}, "token 2 has nan"),
                     ({1: float("nan"), 2: -0.1, 3: -3.0}, "token 1 has nan"),
                     ({1: 0.5, 2: -0.3, 3: -3.0}, "token 1 has 0.5"),
                     ({1: -0.05, 2: -0.3, 3: -3.0}, "sum to probability 1.7"),
                     ({1: float("-inf"), 2: float("-inf")}, "all -inf")):
        with pytest.raises(ValueError, match=why):
            shaped_from_top_logprobs(top, request, 10)


def test_an_invalid_engine_reference_is_named_with_the_record():
    """The check of a level fails closed on such a reference (harness.run.engine_exactness.run_checks
    turns the ValueError into the candidates' error); the message names the record it came from."""

    class NanEngine:  # an engine reference whose logprobs hold a NaN (no real server here returns one)
        def prompt_logprobs(self, context, tokens, k):
            return [{1: -0.1, 2: float("nan")} for _ in tokens]

    ref = Reference.__new__(Reference)
    ref.engine, ref.noise, ref.vocab, ref._cache, ref._kept = NanEngine(), 0.0, 64, {}, 0
    seqs = _seqs([(A, [1, 2, 1])])
    seqs.rows[0][0].update(suite="longform", item_id="lf-3", seed=1)
    with pytest.raises(ValueError, match=r"cand longform/lf-3 seed 1: .*token 2 has nan"):
        engine_exactness.features(ref, {"cand": seqs})
