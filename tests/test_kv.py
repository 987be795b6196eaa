"""The preallocated KV cache (`decoders.kv`) against transformers' `DynamicCache`, the path every
decoder took before it: the same logits bit for bit, rollback as a length change, and the same
tokens from every decoder (standard, speculative with each drafter and verifier, early exit),
rejections and their rollbacks included. The compiled step is held to the eager one in
tests/test_compiled_step.py."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from decoders import GenerationRequest
from decoders.base import DecoderError
from decoders.common import forward
from decoders.early_exit import EarlyExitDecoder
from decoders.kv import CachePool, PreallocatedCache
from decoders.speculative import SpeculativeDecoder
from decoders.standard import StandardDecoder
from harness.models import build_tiny

FAMILIES = ("llama", "qwen2")
PROMPT = "The cat sat on the mat. The cat sat on the"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    """(target, an unrelated draft of the same family: rejections in most rounds)."""
    return build_tiny(request.param), build_tiny(request.param, seed=1)


def req(target, **kw):
    kw.setdefault("max_new_tokens", 24)
    return GenerationRequest(tuple(target.encode(PROMPT, chat=False)), stop_token_ids=(), **kw)


# ------------------------------------------------------------------------------- the cache

def _script(model, cache):
    """Prefill, one-token steps, a K+1 block, a rollback into it, another block: every logit."""
    ids = list(range(3, 40, 3))
    out = [forward(model, torch.tensor([ids]), cache)]
    for tok in (5, 9, 11):
        out.append(forward(model, torch.tensor([[tok]]), cache))
    out.append(forward(model, torch.tensor([[7, 8, 9, 10, 12]]), cache, 5))
    length = len(ids) + 3 + 2
    extra = cache.get_seq_length() - length
    cache.crop(-extra)                       # keep two of the block's five tokens
    out.append(forward(model, torch.tensor([[13, 14, 15]]), cache, 3))
    out.append(forward(model, torch.tensor([[16]]), cache))
    return out, cache.get_seq_length()


@pytest.mark.parametrize("capacity", (64, 5))  # 5: the buffers must grow mid-request
def test_logits_are_bit_identical_to_the_dynamic_cache(pair, capacity):
    model = pair[0].model
    with torch.inference_mode():
        want, n_want = _script(model, DynamicCache(config=model.config))
        got, n_got = _script(model, PreallocatedCache(model.config.num_hidden_layers, capacity))
    assert n_got == n_want
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_rollback_moves_the_length_and_copies_nothing(pair):
    model = pair[0].model
    cache = PreallocatedCache(model.config.num_hidden_layers, 32)
    with torch.inference_mode():
        forward(model, torch.tensor([list(range(3, 13))]), cache)
        layer = cache.layers[0]
        where, kept = layer._k.data_ptr(), layer.keys[:, :, :7].clone()
        cache.crop(-3)
        assert cache.get_seq_length() == 7 and layer.keys.shape[-2] == 7
        assert layer._k.data_ptr() == where and torch.equal(layer.keys, kept)
        forward(model, torch.tensor([[4]]), cache)  # overwrites the stale entry at 7 in place
    assert cache.get_seq_length() == 8 and layer._k.data_ptr() == where
    assert all(layer.get_seq_length() == 8 for layer in cache.layers)
    with pytest.raises(ValueError, match="negative"):
        cache.crop(2)


def test_the_pool_reuses_buffers_but_never_a_private_cache(pair):
    model = pair[0].model
    pool = CachePool(model)
    with torch.inference_mode():
        first = pool.new(40)
        forward(model, torch.tensor([[3, 4, 5]]), first)
        second = pool.new(30)  # fits in the first one's buffers
        forward(model, torch.tensor([[6, 7]]), second)
        assert second.layers[0]._k.data_ptr() == first.layers[0]._k.data_ptr()
        private = pool.new(30, private=True)
        forward(model, torch.tensor([[6, 7]]), private)
        assert private.layers[0]._k.data_ptr() != second.layers[0]._k.data_ptr()
        bigger = pool.new(400)  # too big to reuse: fresh buffers
        forward(model, torch.tensor([[6]]), bigger)
        assert bigger.layers[0]._k.shape[-2] >= 400


def test_an_unknown_cache_kind_is_refused(pair):
    for make in (lambda: StandardDecoder(pair[0], cache="paged"),
                 lambda: SpeculativeDecoder(pair[0], draft="prompt-lookup", cache="paged"),
                 lambda: EarlyExitDecoder(pair[0], cache="paged")):
        with pytest.raises(DecoderError, match="cache must be one of static, dynamic"):
            make()


# ------------------------------------------------------------------------- whole decoders

SAMPLED = dict(temperature=0.9, top_p=0.9, seed=3)


@pytest.mark.parametrize("sampling", ({}, SAMPLED), ids=("greedy", "sampled"))
def test_standard_static_equals_dynamic(pair, sampling):
    target = pair[0]
    new = StandardDecoder(target).generate(req(target, **sampling))
    old = StandardDecoder(target, cache="dynamic").generate(req(target, **sampling))
    assert new.tokens == old.tokens and new.margins == old.margins and len(new.tokens) == 24


def _spec_pair(target, draft, **opts):
    r = req(target, **opts.pop("request", {}))
    new = SpeculativeDecoder(target, draft=draft, **opts).generate(r)
    old = SpeculativeDecoder(target, draft=draft, cache="dynamic", **opts).generate(r)
    return new, old


@pytest.mark.parametrize("drafter", ("model", "prompt-lookup", "self:2"))
@pytest.mark.parametrize("verify,sampling", ((None, {}), ("rejection", SAMPLED), ("coupled", SAMPLED)),
                         ids=("greedy", "rejection", "coupled"))
def test_speculative_static_equals_dynamic(pair, drafter, verify, sampling):
    target, unrelated = pair
    draft = unrelated if drafter == "model" else drafter
    new, old = _spec_pair(target, draft, k=4, verify=verify, request=sampling)
    assert new.tokens == old.tokens and new.margins == old.margins
    for key in ("proposed_per_round", "accepted_per_round", "rejected_draft_tokens", "target_forwards",
                "draft_forwards"):
        assert new.stats[key] == old.stats[key], key
    if drafter == "model":  # rollback after a rejection really happened, on both caches
        assert new.stats["accepted"] < new.stats["proposed"]
    baseline = StandardDecoder(target, cache="dynamic").generate(req(target, **sampling))
    if verify != "rejection":  # greedy and coupled: identical to standard too
        assert new.tokens == baseline.tokens


def test_speculative_kill_switch_and_adaptive_k_static_equals_dynamic(pair):
    target, unrelated = pair
    new, old = _spec_pair(target, unrelated, k=3, adaptive_k=True, min_acceptance=0.6, window=2, cooldown=3,
                          request=dict(max_new_tokens=40))
    assert new.tokens == old.tokens and new.stats["fallbacks"] == old.stats["fallbacks"] > 0
    assert new.stats["proposed_per_round"] == old.stats["proposed_per_round"]


@pytest.mark.parametrize("sampling", ({}, SAMPLED), ids=("greedy", "sampled"))
def test_early_exit_static_equals_dynamic(sampling):
    for family in FAMILIES:
        target = build_tiny(family, seed=1, layers=6)
        opts = dict(threshold={2: 0.6, 4: 0.75}, confidence="saturation")
        r = GenerationRequest(tuple(target.encode("The quick brown fox")), max_new_tokens=16, **sampling)
        new = EarlyExitDecoder(target, **opts).generate(r)
        old = EarlyExitDecoder(target, cache="dynamic", **opts).generate(r)
        assert new.tokens == old.tokens and new.margins == old.margins
        assert new.stats["exit_layers"] == old.stats["exit_layers"]
        assert len(set(new.stats["exit_layers"][1:])) > 1  # exits and propagation both exercised


@pytest.mark.parametrize("sampling", ({}, SAMPLED), ids=("greedy", "sampled"))
def test_the_one_read_pick_equals_the_separate_reads(sampling):
    """The accelerator path of `pick_and_margin` (token, margin and finiteness in one transfer),
    run here on CPU tensors, against the three separate reads the CPU path takes."""
    from decoders.common import pick_and_margin, pick_and_margin_one_read
    r = GenerationRequest((1, 2, 3), **sampling)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(1, 259, generator=g) * 4
        assert pick_and_margin_one_read(logits, r, 7, 5, "here") == pick_and_margin(logits, r, 7, 5, "here")
    for bad in (float("nan"), float("inf")):
        logits[0, 3] = bad
        for pick in (pick_and_margin, pick_and_margin_one_read):
            with pytest.raises(DecoderError, match="(NaN|inf) in logits at here"):
                pick(logits, r, 7, 5, "here")


def test_the_finiteness_check_reads_every_value():
    """`check_finite` looks at the sum first: finite values whose sum overflows must not be
    called non-finite, and one NaN or infinity anywhere (both infinities at once included, whose
    sum is NaN) must be, with its name."""
    from decoders.sampling import check_finite
    big = torch.full((2, 300), 3e38)  # every value finite, the sum +inf
    check_finite(big, "here")
    check_finite(-big, "here")
    check_finite(torch.empty(0, 5), "here")
    for values, name in (((float("nan"),), "NaN"), ((float("inf"),), "inf"), ((float("-inf"),), "inf"),
                         ((float("inf"), float("-inf")), "inf"), ((float("nan"), float("inf")), "NaN")):
        for base in (torch.randn(2, 300), big):
            logits = base.clone()
            for i, v in enumerate(values):
                logits[1, 7 + 50 * i] = v
            with pytest.raises(DecoderError, match=f"^{name} in logits at here"):
                check_finite(logits, "here")


def test_argmax_and_margin_is_argmax_and_top2_margin_on_every_row():
    """The greedy verifier reads its choices and margins from one top-2 pass. Where the top two
    tie, the top-2's index is not argmax's first maximum (on this torch it is the later one), so
    those rows must take argmax's own."""
    from decoders.sampling import argmax_and_margin, top2_margin
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 3000, generator=g) * 5
    for r in range(0, 64, 2):  # ties for the top in every other row, at random places
        i, j = sorted(torch.randperm(3000, generator=g)[:2].tolist())
        logits[r, i] = logits[r, j] = 40.0
    logits[1, :] = float("-inf")
    logits[3, 9] = float("nan")
    token, margin = argmax_and_margin(logits)
    assert torch.equal(token, logits.argmax(-1))
    torch.testing.assert_close(margin, top2_margin(logits), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("value, error", [(float("nan"), "NaN"), (float("inf"), "inf"), (3e38, None)],
                         ids=("nan", "inf", "finite-overflow"))
def test_a_verification_block_is_checked_value_by_value(pair, monkeypatch, value, error):
    """The K+1 block's finiteness rides in its one read as the sum's: a NaN or infinity in any row
    ends the request with the error naming it, and finite logits whose sum overflows do not."""
    target, _ = pair
    dec = SpeculativeDecoder(target, draft=target, k=3)  # its own draft: every round drafts
    score = dec.scorer.score

    def spoiled(tokens, position):
        logits = score(tokens, position)
        if len(tokens) > 1:
            logits = logits.clone()
            if error is None:
                logits[1:, -50:] = value  # every row's sum overflows, each value finite
            else:
                logits[-1, 3] = value
        return logits
    monkeypatch.setattr(dec.scorer, "score", spoiled)
    if error is None:
        assert len(dec.generate(req(target)).tokens) == 24
    else:
        with pytest.raises(DecoderError, match=f"^{error} in logits at positions"):
            dec.generate(req(target))


# ------------------------------------------------------------------- a reused prefill

def _counting_prefills(monkeypatch, module):
    """Count the multi-token forwards (prefills) `module` runs through decoders.common.forward."""
    calls = []

    def counted(model, ids, cache, n_logits=1):
        calls.append(ids.shape[1])
        return forward(model, ids, cache, n_logits)
    monkeypatch.setattr(module, "forward", counted)
    return calls


def _prompts(target):
    a = req(target, **SAMPLED).prompt_ids
    b = tuple(target.encode("A dog ran in the park. A dog ran in the", chat=False))
    return a, b


@pytest.mark.parametrize("make", ("standard", "prompt-lookup", "model"))
def test_a_reused_prefill_gives_the_fresh_tokens(pair, make, monkeypatch):
    """Samples of one prompt at several seeds, another prompt between them: with reuse on, every
    request gives what a fresh decoder gives it, and the repeated prompt is prefilled once a run
    of repeats."""
    import decoders.speculative as spec
    import decoders.standard as std
    target, unrelated = pair

    def build():
        if make == "standard":
            return StandardDecoder(target)
        return SpeculativeDecoder(target, draft=unrelated if make == "model" else make, k=3, verify="rejection")
    a, b = _prompts(target)
    order = [(a, 0), (a, 1), (a, 2), (b, 0), (a, 3), (a, 4)]
    fresh = [build().generate(GenerationRequest(p, max_new_tokens=12, temperature=0.9, top_p=0.9, seed=s))
             for p, s in order]
    calls = _counting_prefills(monkeypatch, std if make == "standard" else spec)
    dec = build()
    dec.reuse_prefill(True)
    got = [dec.generate(GenerationRequest(p, max_new_tokens=12, temperature=0.9, top_p=0.9, seed=s))
           for p, s in order]
    assert [g.tokens for g in got] == [f.tokens for f in fresh]
    assert [g.margins for g in got] == [f.margins for f in fresh]
    assert len({tuple(f.tokens) for f in fresh}) > 3  # the seeds draw different samples
    prefills = [n for n in calls if n > 1 and n in (len(a), len(b))]
    assert prefills == [len(a), len(b), len(a)]


def test_a_prompt_overwritten_while_reuse_was_off_is_prefilled_again(pair):
    """Reuse on for prompt a, off for prompt b (b's prefill overwrites a's keys in the same
    buffers), on again for a: a must not be served from the overwritten buffers."""
    target = pair[0]
    a, b = _prompts(target)
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]  # the same length: b's keys land exactly on a's
    fresh = StandardDecoder(target).generate(GenerationRequest(a, max_new_tokens=12))
    dec = StandardDecoder(target)
    dec.reuse_prefill(True)
    dec.generate(GenerationRequest(a, max_new_tokens=12))
    dec.reuse_prefill(False)
    dec.generate(GenerationRequest(b, max_new_tokens=12))
    dec.reuse_prefill(True)
    assert dec.generate(GenerationRequest(a, max_new_tokens=12)).tokens == fresh.tokens
