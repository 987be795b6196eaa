"""The standard decoder against transformers' generate, sampling primitives, model aliases,
and the CLI's handling of bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy import stats

from decoders import GenerationRequest, make_decoder
from decoders.base import DecoderError, get_decoder_class
from decoders.sampling import prompt_key, shape_logits
from harness.cli import main
from harness.models import ModelError, build_tiny, load_model
from numerics import assert_close_scaled

PROMPTS = ["Hi", "The quick brown fox jumps over the lazy dog.", "x" * 120]


def request(model, prompt, **kw):
    kw.setdefault("stop_token_ids", model.stop_token_ids())
    return GenerationRequest(tuple(model.encode(prompt)), **kw)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_standard_greedy_equals_transformers(tiny_model, prompt):
    req = request(tiny_model, prompt, max_new_tokens=40)
    ours = make_decoder("standard", tiny_model).generate(req)
    ref = make_decoder("hf", tiny_model).generate(req)
    assert ours.tokens == ref.tokens
    assert ours.finish_reason == ref.finish_reason
    assert len(ours.margins) == len(ours.tokens) and min(ours.margins) >= 0


def test_stops_on_eos_and_on_max_new_tokens(tiny_model):
    free = make_decoder("standard", tiny_model).generate(
        GenerationRequest(tuple(tiny_model.encode("Hello")), max_new_tokens=30))
    assert free.finish_reason == "length" and len(free.tokens) == 30
    # Make the 6th generated token an end-of-sequence token: both decoders must stop there.
    eos = free.tokens[5]
    first = free.tokens.index(eos)
    req = GenerationRequest(tuple(tiny_model.encode("Hello")), max_new_tokens=30, stop_token_ids=(eos,))
    ours = make_decoder("standard", tiny_model).generate(req)
    ref = make_decoder("hf", tiny_model).generate(req)
    assert ours.tokens == free.tokens[: first + 1] == ref.tokens
    assert ours.finish_reason == "eos"
    short = make_decoder("standard", tiny_model).generate(
        GenerationRequest(tuple(tiny_model.encode("Hello")), max_new_tokens=3))
    assert short.tokens == free.tokens[:3] and short.finish_reason == "length"


def test_stop_string_truncates_text(tiny_llama):
    free = make_decoder("standard", tiny_llama).generate(
        GenerationRequest(tuple(tiny_llama.encode("Hello")), max_new_tokens=20))
    stop = tiny_llama.tokenizer.decode(free.tokens[4:6])
    assert stop.strip(), "need a printable stop string"
    res = make_decoder("standard", tiny_llama).generate(
        GenerationRequest(tuple(tiny_llama.encode("Hello")), max_new_tokens=20, stop_strings=(stop,)))
    assert res.finish_reason == "stop_string"
    assert stop not in res.text and len(res.tokens) <= 6


def test_sampling_is_reproducible_and_seed_dependent(tiny_llama):
    dec = make_decoder("standard", tiny_llama)
    req = request(tiny_llama, "Hello", max_new_tokens=20, temperature=1.0, seed=7)
    a, b = dec.generate(req), dec.generate(req)
    assert a.tokens == b.tokens
    others = {dec.generate(request(tiny_llama, "Hello", max_new_tokens=20, temperature=1.0, seed=s)).tokens
              for s in range(8, 12)}
    assert len(others | {a.tokens}) > 1


# 3.5 s each: `make check` keeps a temperature below 1 with top-p and one above 1 with top-k.
@pytest.mark.parametrize("temperature,top_k,top_p", [pytest.param(1.0, 0, 1.0, marks=pytest.mark.full), (0.7, 0, 0.9),
                                                     (1.3, 5, 1.0), pytest.param(1.0, 6, 0.8, marks=pytest.mark.full)])
def test_first_token_frequencies_match_the_shaped_softmax(temperature, top_k, top_p):
    """Goodness of fit of 3,000 seeded first tokens against softmax(logits / T) after top-k/top-p."""
    tiny = build_tiny("llama", seed=3, vocab_size=8, layers=2, hidden=32)
    prompt = (3, 4, 5)
    with torch.inference_mode():
        logits = tiny.model(torch.tensor([prompt])).logits[0, -1]
    expected = shape_logits(logits, temperature, top_k, top_p).exp().double().numpy()
    expected /= expected.sum()
    dec = make_decoder("standard", tiny)
    n = 3000
    counts = np.zeros(8)
    for seed in range(n):
        tok = dec.generate(GenerationRequest(prompt, max_new_tokens=1, temperature=temperature,
                                             top_k=top_k, top_p=top_p, seed=seed)).tokens[0]
        counts[tok] += 1
    support = expected > 0
    assert counts[~support].sum() == 0, "sampled a token that top-k/top-p filtered out"
    exp = expected[support] * n
    assert stats.chisquare(counts[support], exp).pvalue > 1e-3


def assert_probabilities_close(logp, want):
    """exp(log p) carries the rounding of log p (relative to |log p|) times p."""
    finite = logp[torch.isfinite(logp)]
    assert_close_scaled(logp.exp(), want, scale=float(want.max() * finite.abs().max()))


def test_shape_logits_matches_transformers_warpers():
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    for t, k, p in [(0.7, 0, 0.9), (1.3, 10, 1.0), (1.0, 7, 0.5)]:
        ref = TemperatureLogitsWarper(t)(None, logits.clone())
        if k:
            ref = TopKLogitsWarper(k)(None, ref)
        if p < 1:
            ref = TopPLogitsWarper(p)(None, ref)
        ours = shape_logits(logits, t, k, p)
        assert torch.equal(torch.isinf(ours), torch.isinf(ref))
        assert_probabilities_close(ours, torch.softmax(ref, -1))


def _masked_reference(logits, t, k, p):
    """shape_logits as the plain definition: a full sort, a mask over the vocabulary, the same
    operators on what is kept (what the sampler computed before the kept values were scattered)."""
    x = logits.float() / t
    if k:
        x = x.masked_fill(x < torch.topk(x, k, dim=-1).values[..., -1:], float("-inf"))
    logp = torch.log_softmax(x, dim=-1)
    if p < 1:
        sorted_logp, idx = torch.sort(logp, dim=-1, descending=True)
        ps = sorted_logp.exp()
        drop_sorted = (ps.cumsum(dim=-1) - ps) >= p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(logp, dtype=torch.bool).scatter(-1, idx, drop_sorted)
        logp = torch.log_softmax(x.masked_fill(drop, float("-inf")), dim=-1)
    return logp


@pytest.mark.parametrize("vocab", [5000, 49152])
def test_shape_logits_gives_the_masked_definitions_bits(vocab):
    """Sampled tokens depend on these bits: the nucleus is computed over the top few hundred
    tokens and its values scattered into a row of -inf, and that must equal masking the full
    vocabulary, on peaked rows (the top-256 path) and flat ones (the full-sort fallback)."""
    g = torch.Generator().manual_seed(3)
    for scale in (0.05, 3.0, 12.0):
        logits = torch.randn(5, vocab, generator=g) * scale
        for t, k, p in ((0.7, 0, 0.95), (1.0, 0, 0.5), (0.3, 0, 0.9), (1.2, 40, 0.9), (0.7, 0, 1.0)):
            assert torch.equal(shape_logits(logits, t, k, p), _masked_reference(logits, t, k, p)), (scale, t, k, p)


def test_noise_key_depends_on_seed_and_prompt():
    assert prompt_key(0, [1, 2, 3]) == prompt_key(0, [1, 2, 3])
    assert prompt_key(0, [1, 2, 3]) != prompt_key(1, [1, 2, 3])
    assert prompt_key(0, [1, 2, 3]) != prompt_key(0, [1, 2, 4])


def test_tiny_models_are_deterministic():
    a, b = build_tiny("qwen2", seed=0), build_tiny("qwen2", seed=0)
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n
    c = build_tiny("qwen2", seed=1)
    assert not torch.equal(a.model.lm_head.weight, c.model.lm_head.weight)


def test_registry_rejects_unknown_and_suggests():
    with pytest.raises(DecoderError, match="did you mean 'standard'"):
        get_decoder_class("standart")


def test_unknown_model_suggests_alias():
    with pytest.raises(ModelError, match="smollm2-135m"):
        load_model("smolm2-135m")


def test_request_validation():
    for bad in [dict(prompt_ids=()), dict(prompt_ids=(1,), temperature=-0.1),
                dict(prompt_ids=(1,), top_p=0.0), dict(prompt_ids=(1,), top_p=1.5),
                dict(prompt_ids=(1,), max_new_tokens=0)]:
        with pytest.raises(DecoderError):
            GenerationRequest(**bad)


@pytest.mark.parametrize("args,needle", [
    (["--decoder", "nope"], "unknown decoder"),
    (["--target", "no-such-model"], "unknown model"),
    (["--prompt", ""], "empty"),
    (["--prompt", "x" * 400, "--no-chat"], "context"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
])
def test_cli_bad_input_exits_2_with_one_line(capsys, args, needle):
    base = ["generate", "--target", "tiny-llama", "--prompt", "hi"]
    rc = main(base + args)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.full
def test_cli_generate_json_contract():
    out = subprocess.run([sys.executable, "-m", "harness.cli", "generate", "--target", "tiny-qwen2",
                          "--prompt", "hello", "--max-new-tokens", "8", "--json"],
                         capture_output=True, text=True, check=True)
    row = json.loads(out.stdout)
    assert {"tokens", "text", "decoder", "stats", "timing"} <= set(row)
    assert {"target_forwards", "draft_forwards", "proposed", "accepted", "exit_layers", "fallbacks"} <= set(row["stats"])
    assert {"wall_s", "ttft_s"} <= set(row["timing"])
    assert len(row["tokens"]) <= 8 and row["decoder"] == "standard"


@pytest.mark.full
def test_cli_unknown_model_subprocess_has_no_traceback():
    out = subprocess.run([sys.executable, "-m", "harness.cli", "generate", "--target", "nope", "--prompt", "hi"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "unknown model" in out.stderr


# ------------------------------------------------------------------ the real default model (offline)

@pytest.mark.slow
def test_aliases_load_offline(smollm2):
    assert smollm2.model.config.model_type == "llama" and smollm2.has_chat_template
    assert smollm2.stop_token_ids()  # <|im_end|>
    int8 = load_model("smollm2-135m-int8")
    assert any("quantized" in type(m).__module__ for m in int8.model.modules())
    for alias in ("tiny-llama", "tiny-qwen2", "tiny-mistral"):
        assert load_model(alias).model.config.vocab_size == 259


@pytest.mark.slow
def test_smollm2_standard_greedy_equals_hf(smollm2):
    req = request(smollm2, "What is the capital of France?", max_new_tokens=12)
    ours = make_decoder("standard", smollm2).generate(req)
    ref = make_decoder("hf", smollm2).generate(req)
    assert ours.tokens == ref.tokens
    assert "Paris" in ours.text


@pytest.mark.parametrize("scale", [0.05, 8.0])  # flat: the full-sort fallback; peaked: the top-256 path
def test_top_p_on_a_large_vocabulary_matches_transformers(scale):
    from transformers.generation.logits_process import TopPLogitsWarper
    torch.manual_seed(1)
    logits = torch.randn(3, 5000) * scale
    for p in (0.5, 0.9, 0.95):
        ref = torch.softmax(TopPLogitsWarper(p)(None, logits.clone()), -1)
        ours = shape_logits(logits, 1.0, 0, p)
        assert torch.equal(ours.exp() > 0, ref > 0)
        assert_probabilities_close(ours, ref)
