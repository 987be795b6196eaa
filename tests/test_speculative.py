"""The speculative backend on tiny random models (CPU): exactness against `standard`, block edge
cases, the kill switch, stats, bad input. The verifiers alone are tested in test_verify.py.

Exactness contract (DESIGN.md): greedy and coupled are token-identical to `standard`, except at a
numerical near-tie of the baseline (top-2 margin below NEAR_TIE), which `assert_same` reports;
rejection sampling follows the target's exact sequence probabilities (teacher forcing).
"""
from __future__ import annotations

import copy
import itertools
import json

import numpy as np
import pytest
import torch

import decoders.speculative as spec
from decoders import GenerationRequest
from decoders.base import DecoderError
from decoders.drafters import SelfDraft
from decoders.speculative import SpeculativeDecoder
from decoders.standard import StandardDecoder
from harness.models import LoadedModel, build_tiny, tiny_tokenizer
from numerics import assert_close_scaled

try:  # the statistics helpers and broken-verifier fixtures live with the verifier tests
    from test_verify import BROKEN, gof_pvalue
except ImportError:  # tests/ imported as a package
    from tests.test_verify import BROKEN, gof_pvalue

NEAR_TIE = 1e-4
FAMILIES = ("llama", "qwen2")
DRAFTS = ("target", "perturbed", "unrelated", "prompt-lookup", "self:2")
KS = (1, 2, 4, 7)
PROMPTS = ("The cat sat on the mat. The cat sat on the", "<|im_start|>user\nhi there<|im_end|>\n")
NEW = 24


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def perturbed(loaded: LoadedModel, scale: float = 0.02, seed: int = 7) -> LoadedModel:
    model = copy.deepcopy(loaded.model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return LoadedModel(loaded.name + "-perturbed", model, loaded.tokenizer, loaded.device, loaded.dtype)


@pytest.fixture(scope="module")
def models():
    out = {}
    for family in FAMILIES:
        target = build_tiny(family)
        out[family] = {"target": target, "perturbed": perturbed(target),
                       "unrelated": build_tiny(family, seed=1),
                       "prompt-lookup": "prompt-lookup", "self:2": "self:2"}
    return out


def depth(loaded: LoadedModel) -> int:
    return loaded.model.config.num_hidden_layers


def request(target, prompt, **kw) -> GenerationRequest:
    kw.setdefault("max_new_tokens", NEW)
    kw.setdefault("stop_token_ids", target.stop_token_ids())
    return GenerationRequest(tuple(target.encode(prompt, chat=False)), **kw)


def assert_same(result, baseline):
    """Token identity, or a first divergence at a near-tie of the baseline (then reported)."""
    if result.tokens == baseline.tokens:
        return
    i = next((j for j, (a, b) in enumerate(zip(result.tokens, baseline.tokens)) if a != b),
             min(len(result.tokens), len(baseline.tokens)))
    margin = baseline.margins[i] if i < len(baseline.margins) else float("inf")
    assert margin < NEAR_TIE, (f"diverged at new token {i} (baseline margin {margin:.3g}): "
                               f"{result.tokens} vs {baseline.tokens}")
    print(f"near-tie divergence at token {i}, margin {margin:.3g}")


# ------------------------------------------------------------------------------ identity

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("draft", DRAFTS)
def test_greedy_identical_to_standard(models, family, draft):
    target = models[family]["target"]
    for prompt in PROMPTS:
        r = request(target, prompt)
        baseline = StandardDecoder(target).generate(r)
        for k in KS:
            result = SpeculativeDecoder(target, draft=models[family][draft], k=k).generate(r)
            assert_same(result, baseline)
            assert result.stats["verifier"] == "greedy"
            assert len(result.margins) == len(result.tokens)
            if draft == "unrelated":
                assert result.stats["accepted"] < result.stats["proposed"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("temperature", (0.7, 1.3))
def test_coupled_identical_to_standard_sampling(models, family, draft, temperature):
    target = models[family]["target"]
    r = request(target, PROMPTS[temperature > 1], temperature=temperature, top_p=0.9, seed=11)
    baseline = StandardDecoder(target).generate(r)
    for k in KS:
        result = SpeculativeDecoder(target, draft=models[family][draft], k=k, verify="coupled").generate(r)
        assert_same(result, baseline)
        assert result.stats["verifier"] == "coupled"
        if draft == "unrelated":  # rejections happened: the identity is not just copying the draft
            assert result.stats["accepted"] < result.stats["proposed"]


def test_a_different_seed_changes_coupled_output(models):
    # Identity above is not vacuous: sampling really depends on the seed.
    target = models["llama"]["target"]
    a, b = (SpeculativeDecoder(target, draft=target, verify="coupled").generate(
        request(target, PROMPTS[0], temperature=1.3, seed=s)) for s in (1, 2))
    assert a.tokens != b.tokens


def test_margins_are_the_target_margins_of_each_token(models):
    target = models["llama"]["target"]
    r = request(target, PROMPTS[0])
    baseline = StandardDecoder(target).generate(r)
    result = SpeculativeDecoder(target, draft=models["llama"]["unrelated"], k=4).generate(r)
    assert result.tokens == baseline.tokens
    # A margin's rounding is relative to the logits it is the difference of.
    with torch.no_grad():
        scale = float(target.model(torch.tensor([r.prompt_ids])).logits.abs().max())
    assert_close_scaled(result.margins, baseline.margins, scale=scale, layers=depth(target) + 1)


# -------------------------------------------------------------------- caches and drafters

@pytest.mark.parametrize("draft", ("target", "self:4"))
def test_a_perfect_draft_is_always_accepted(models, draft):
    # The target as its own draft (self:4 = all four layers) proposes exactly what the target
    # picks, so every token is accepted, provided both caches stay aligned: in particular the
    # drafter must process the last draft token of a fully accepted block before the next one.
    target = models["llama"]["target"]
    for k in KS:
        s = SpeculativeDecoder(target, draft=models["llama"].get(draft, draft), k=k).generate(
            request(target, PROMPTS[0])).stats
        assert s["accepted"] == s["proposed"] > 0
        # One draft forward per draft token: the catch-up rides along with the first step.
        assert s["draft_forwards"] == s["proposed"]
        assert s["target_forwards"] == 1 + s["rounds"]


def test_self_draft_verification_equals_a_full_forward(models):
    # The self-draft reuses its lower-layer KV and layer-L hidden states in verification; the
    # logits must be those of a plain forward over the whole sequence.
    target = models["qwen2"]["target"]
    prompt = target.encode(PROMPTS[0], chat=False)
    sd = SelfDraft(target, 2)
    sd.prefill(prompt)
    sd.start(prompt)
    context = list(prompt) + [5]
    draft = sd.propose(context, 3, lambda logits, pos: (int(logits.argmax()), None))
    logits = sd.score([context[-1]] + draft.tokens, len(context) - 1)  # (4, V)
    with torch.no_grad():
        full = target.model(torch.tensor([context + draft.tokens])).logits[0, -4:]
    assert_close_scaled(logits, full, layers=depth(target) + 1)
    # After a rollback to a partly accepted block, the next score is again a full forward.
    sd.rollback(len(context) + 1)
    context2 = context + draft.tokens[:1] + [7]
    draft2 = sd.propose(context2, 2, lambda logits, pos: (int(logits.argmax()), None))
    logits2 = sd.score([context2[-1]] + draft2.tokens, len(context2) - 1)
    with torch.no_grad():
        full2 = target.model(torch.tensor([context2 + draft2.tokens])).logits[0, -3:]
    assert_close_scaled(logits2, full2, layers=depth(target) + 1)


def test_draft_with_a_differently_sized_lm_head(models):
    # Same tokenizer, a larger draft head: draft logits are cut to the target's ids.
    small = build_tiny("llama", vocab_size=8)
    for temperature, verify in ((0.0, None), (1.0, "coupled"), (1.0, "rejection")):
        r = GenerationRequest((1, 3, 4), max_new_tokens=12, temperature=temperature, seed=1, stop_token_ids=())
        result = SpeculativeDecoder(small, draft=models["llama"]["unrelated"], k=3, verify=verify).generate(r)
        assert max(result.tokens) < 8 and result.stats["proposed"] > 0
        if verify != "rejection":
            assert result.tokens == StandardDecoder(small).generate(r).tokens
    # A draft that cannot even embed every id the target emits is refused.
    with pytest.raises(DecoderError, match="embeds"):
        SpeculativeDecoder(models["llama"]["target"], draft=small)


def test_prompt_lookup_proposes_the_continuation_of_a_match():
    from decoders.drafters import PromptLookup
    pl = PromptLookup(3, 1)
    assert pl.propose([1, 2, 3, 4, 5, 9, 2, 3], 2, None).tokens == [4, 5]
    assert pl.propose([1, 2, 3, 4, 5, 9, 2, 3], 5, None).tokens == [4, 5, 9, 2, 3]
    assert pl.propose([1, 2, 3], 2, None).tokens == []


# ---------------------------------------------------------------------------- block edges

def _first_fresh_index(tokens, lo):
    return next(i for i in range(lo, len(tokens)) if tokens[i] not in tokens[:i])


@pytest.mark.parametrize("draft", ("target", "unrelated", "self:2"))
def test_eos_inside_a_block(models, draft):
    target = models["llama"]["target"]
    free = StandardDecoder(target).generate(request(target, PROMPTS[0], stop_token_ids=()))
    i = _first_fresh_index(free.tokens, 3)  # a token first emitted mid-sequence serves as EOS
    r = request(target, PROMPTS[0], stop_token_ids=(free.tokens[i],))
    baseline = StandardDecoder(target).generate(r)
    assert baseline.finish_reason == "eos" and len(baseline.tokens) == i + 1
    for k in (2, 4, 7):
        result = SpeculativeDecoder(target, draft=models["llama"][draft], k=k).generate(r)
        assert result.tokens == baseline.tokens and result.finish_reason == "eos"
    if draft == "target":  # with every draft accepted, the EOS sits inside the K=4 block
        assert result.stats["proposed"] > result.stats["rounds"]


def test_stop_string_inside_a_block(models):
    target = models["llama"]["target"]
    free = StandardDecoder(target).generate(request(target, PROMPTS[0], stop_token_ids=()))
    stop = free.text[8:10]
    r = request(target, PROMPTS[0], stop_strings=(stop,))
    baseline = StandardDecoder(target).generate(r)
    assert baseline.finish_reason == "stop_string"
    result = SpeculativeDecoder(target, draft=target, k=7).generate(r)
    assert (result.tokens, result.text, result.finish_reason) == (baseline.tokens, baseline.text, "stop_string")


@pytest.mark.parametrize("draft", ("target", "prompt-lookup"))
def test_max_new_tokens_inside_a_block(models, draft):
    target = models["qwen2"]["target"]
    free = StandardDecoder(target).generate(request(target, PROMPTS[0], stop_token_ids=(), max_new_tokens=12))
    for n in range(1, 13):
        r = request(target, PROMPTS[0], stop_token_ids=(), max_new_tokens=n)
        result = SpeculativeDecoder(target, draft=models["qwen2"][draft], k=4).generate(r)
        assert result.tokens == free.tokens[:n] and result.finish_reason == "length"
        # K is capped by the tokens still to emit: nothing is drafted that could not be emitted.
        assert result.stats["proposed"] <= max(0, n - 1)


@pytest.mark.parametrize("draft", DRAFTS)
def test_prompt_near_the_context_limit(models, draft):
    target = models["llama"]["target"]          # context 256
    for prompt_len in (255, 250, 246):
        ids = tuple((np.arange(prompt_len) * 7 % 200 + 3).tolist())
        r = GenerationRequest(ids, max_new_tokens=64, stop_token_ids=())
        baseline = StandardDecoder(target).generate(r)
        assert len(baseline.tokens) == 256 - prompt_len
        result = SpeculativeDecoder(target, draft=models["llama"][draft], k=7).generate(r)
        assert_same(result, baseline)
        assert len(result.tokens) == len(baseline.tokens)


def test_draft_with_a_shorter_context_than_the_target(models):
    target = models["llama"]["target"]
    short = build_tiny("llama", max_positions=128)  # same weights' shapes, context 128
    ids = tuple((np.arange(126) * 5 % 200 + 3).tolist())
    r = GenerationRequest(ids, max_new_tokens=16, stop_token_ids=())
    result = SpeculativeDecoder(target, draft=short, k=4).generate(r)
    assert result.tokens == StandardDecoder(target).generate(r).tokens


# ---------------------------------------------------------------------- stats, adaptive K

def test_stats_are_consistent(models):
    target = models["llama"]["target"]
    result = SpeculativeDecoder(target, draft=models["llama"]["perturbed"], k=4).generate(request(target, PROMPTS[1]))
    s = result.stats
    for key in ("rounds", "proposed", "accepted", "proposed_per_round", "accepted_per_round",
                "acceptance_by_position", "target_forwards", "draft_forwards", "draft_time_s",
                "verify_time_s", "other_time_s", "fallbacks", "k", "drafter", "verifier"):
        assert key in s
    assert len(s["proposed_per_round"]) == len(s["accepted_per_round"]) == s["rounds"]
    assert sum(s["proposed_per_round"]) == s["proposed"] and sum(s["accepted_per_round"]) == s["accepted"]
    assert [sum(col) for col in zip(*s["acceptance_by_position"])] == [s["accepted"], s["proposed"]]
    assert s["target_forwards"] == 1 + s["rounds"] + s["fallback_tokens"]
    # Each round emits its accepted drafts plus one target token (the last round may stop early).
    assert len(result.tokens) <= 1 + s["accepted"] + s["rounds"]
    assert s["tau"] == pytest.approx(len(result.tokens) / s["target_forwards"])
    assert (s["k"], s["drafter"], s["verifier"]) == (4, "model:tiny-llama-perturbed", "greedy")
    assert min(s["draft_time_s"], s["verify_time_s"], s["other_time_s"]) >= 0
    json.dumps(result.as_dict())


def test_adaptive_k_grows_with_a_perfect_draft_and_shrinks_with_a_bad_one(models):
    target = models["llama"]["target"]
    r = request(target, PROMPTS[0], max_new_tokens=48)
    baseline = StandardDecoder(target).generate(r)
    good = SpeculativeDecoder(target, draft=target, k=2, adaptive_k=True, k_max=6).generate(r)
    bad = SpeculativeDecoder(target, draft=models["llama"]["unrelated"], k=4, adaptive_k=True).generate(r)
    assert good.tokens == baseline.tokens == bad.tokens
    assert max(good.stats["proposed_per_round"]) == 6 and good.stats["k_final"] == 6
    assert bad.stats["k_final"] == 1


# --------------------------------------------------------------------------- kill switch

def test_kill_switch_fires_with_an_unrelated_draft(models):
    target = models["llama"]["target"]
    r = request(target, PROMPTS[0], max_new_tokens=48)
    baseline = StandardDecoder(target).generate(r)
    result = SpeculativeDecoder(target, draft=models["llama"]["unrelated"], k=4, min_acceptance=0.5,
                                window=4).generate(r)
    s = result.stats
    assert result.tokens == baseline.tokens
    assert s["fallbacks"] == 1 and s["rounds"] == 4 and s["fallback_tokens"] > 0
    # With a cool-down, drafting resumes and the switch fires again.
    cooled = SpeculativeDecoder(target, draft=models["llama"]["unrelated"], k=4, min_acceptance=0.5,
                                window=2, cooldown=4).generate(r).stats
    assert cooled["fallbacks"] >= 2 and cooled["fallback_tokens"] <= 4 * cooled["fallbacks"]


@pytest.mark.parametrize("temperature", (0.0, 1.0))
def test_kill_switch_never_fires_with_the_target_as_its_own_draft(models, temperature):
    target = models["llama"]["target"]
    r = request(target, PROMPTS[0], max_new_tokens=48, temperature=temperature, seed=3)
    s = SpeculativeDecoder(target, draft=target, k=4, min_acceptance=0.9, window=2).generate(r).stats
    assert s["fallbacks"] == 0 and s["fallback_tokens"] == 0


# ------------------------------------------------------------ rejection: whole generations

TINY = dict(vocab_size=6, hidden=32, layers=2)
GEN = dict(prompt_ids=(1, 3), max_new_tokens=3, temperature=1.0, top_k=3)  # 3 of 6 tokens: 27 sequences
GEN_DRAWS = 2000


@pytest.fixture(scope="module")
def tiny_pair():
    """A tiny-vocabulary target, an unrelated draft, and the exact probability of every 3-token
    continuation under the target's shaped distribution (teacher forcing, computed here
    independently of the library's sampling code)."""
    target = build_tiny("llama", seed=0, **TINY)
    draft = build_tiny("llama", seed=1, **TINY)
    v = TINY["vocab_size"]
    with torch.no_grad():
        pairs = torch.tensor(list(itertools.product(range(v), repeat=2)))                  # (36, 2)
        ids = torch.cat([torch.tensor(GEN["prompt_ids"]).expand(len(pairs), -1), pairs], dim=1)
        logits = target.model(ids).logits.double()[:, -3:] / GEN["temperature"]           # (36, 3, V)
    kth = logits.topk(GEN["top_k"], dim=-1).values[..., -1:]
    logp = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)
    first = logp[:, 0].gather(1, pairs[:, :1])[:, 0]
    second = logp[:, 1].gather(1, pairs[:, 1:])[:, 0]
    exact = ((first + second)[:, None] + logp[:, 2]).exp().reshape(-1).numpy()            # (V^3,)
    assert abs(exact.sum() - 1) < 1e-9 and (exact > 0).sum() == GEN["top_k"] ** 3
    return target, draft, exact


def _generation_pvalue(tiny_pair, n, verifier=None, monkeypatch=None):
    """n whole generations (seeds 0..n-1) -> GOF p-value of the 3-token sequences, acceptance."""
    target, draft, exact = tiny_pair
    if verifier is not None:
        monkeypatch.setattr(spec, "verify_rejection", verifier)
    dec = SpeculativeDecoder(target, draft=draft, k=2, verify="rejection")
    v = TINY["vocab_size"]
    counts = np.zeros(v ** 3)
    accepted = proposed = 0
    for seed in range(n):
        res = dec.generate(GenerationRequest(**GEN, seed=seed))
        a, b, c = res.tokens
        counts[v * v * a + v * b + c] += 1
        accepted, proposed = accepted + res.stats["accepted"], proposed + res.stats["proposed"]
    return gof_pvalue(counts, exact), accepted / proposed


def test_rejection_generations_follow_exact_target_probabilities(tiny_pair):
    pvalue, alpha = _generation_pvalue(tiny_pair, GEN_DRAWS)
    assert pvalue > 1e-3
    assert 0.2 < alpha < 0.8  # the draft really differs: accepts, rejections and bonuses all occur


# The 1,000-generation cases (5-8 s each) are `full`: tests/test_verify.py's block test catches
# both bugs in milliseconds, and accept-all here shows the whole-generation test failing.
@pytest.mark.parametrize("name, draws", [("accept_all", 200),
                                         pytest.param("bonus_wrong_position", 1000, marks=pytest.mark.full),
                                         pytest.param("residual_not_normalised", 1000, marks=pytest.mark.full)])
def test_broken_verifiers_fail_on_whole_generations(tiny_pair, monkeypatch, name, draws):
    # The same test, with fewer generations to save time, already rejects each bug. On the test
    # models with non-default configs (α 0.6 here) the p-values at 200 / 500 / 1000 generations
    # were 0.86 / 0.11 / 7e-5 (bonus) and 0.16 / 0.002 / 6e-6 (residual); each falls further with more.
    pvalue, _ = _generation_pvalue(tiny_pair, draws, BROKEN[name], monkeypatch)
    assert pvalue < 1e-3


def test_rejection_with_the_target_as_draft_accepts_everything(models):
    target = models["llama"]["target"]
    s = SpeculativeDecoder(target, draft=target, k=4).generate(
        request(target, PROMPTS[0], temperature=1.0, seed=5)).stats
    assert s["verifier"] == "rejection" and s["accepted"] == s["proposed"]


@pytest.mark.parametrize("draft", ("prompt-lookup", "self:2"))
def test_rejection_runs_with_every_drafter(models, draft):
    target = models["qwen2"]["target"]
    res = SpeculativeDecoder(target, draft=draft, k=3).generate(
        request(target, PROMPTS[0], temperature=0.8, top_k=20, seed=2))
    assert len(res.tokens) == NEW or res.finish_reason == "eos"


# ----------------------------------------------------------------------------- bad input

def _other_vocab():
    tok = tiny_tokenizer()
    tok.add_tokens(["<extra>"])
    return tok


def _other_eos():
    tok = tiny_tokenizer()
    tok.eos_token = "<|endoftext|>"
    return tok


@pytest.mark.parametrize("tokenizer, words", [(_other_vocab, "vocabulary"), (_other_eos, "eos_token")])
def test_draft_with_another_tokenizer_is_refused(models, tokenizer, words):
    target = models["llama"]["target"]
    draft = LoadedModel("odd", models["llama"]["unrelated"].model, tokenizer(), target.device, target.dtype)
    with pytest.raises(DecoderError, match=words):
        SpeculativeDecoder(target, draft=draft)


@pytest.mark.parametrize("options, words", [
    (dict(draft="prompt-lookup", k=0), "k must be"),
    (dict(draft="prompt-lookup", k=-2), "k must be"),
    (dict(draft="nonsense"), "unknown draft"),
    (dict(draft=None), "needs a draft"),
    (dict(draft="self:9"), "1..4"),
    (dict(draft="self:x"), "integer"),
    (dict(draft="prompt-lookup", verify="greedy"), "verify must be"),
    (dict(draft="prompt-lookup", min_acceptance=1.5), "min_acceptance"),
    (dict(draft="prompt-lookup", threshold=0.5), "threshold"),
])
def test_bad_options_are_refused(models, options, words):
    with pytest.raises(DecoderError, match=words):
        SpeculativeDecoder(models["llama"]["target"], **options)


# ---------------------------------------------------------------------------------- CLI

def test_cli_generate_speculative_json(capsys):
    from harness.cli import main
    rc = main(["generate", "--target", "tiny-llama", "--decoder", "speculative", "--draft", "tiny-llama",
               "--k", "4", "--prompt", "hi", "--json", "--max-new-tokens", "12"])
    assert rc == 0
    row = json.loads(capsys.readouterr().out)
    assert row["decoder"] == "speculative" and len(row["tokens"]) >= 1
    assert row["stats"]["proposed"] == row["stats"]["accepted"] > 0
    assert {"target_forwards", "draft_forwards", "fallbacks", "exit_layers"} <= set(row["stats"])


@pytest.mark.parametrize("args", [
    ["--draft", "tiny-llama", "--k", "0"],
    ["--draft", "self:99"],
    ["--draft", "no-such-draft"],
    ["--draft", "ODD"],
])
def test_cli_bad_input_exits_2(capsys, tmp_path, args):
    from harness.cli import main
    if "ODD" in args:  # a draft folder whose tokenizer has an extra token
        odd = build_tiny("llama", seed=3)
        odd.model.save_pretrained(tmp_path)
        _other_vocab().save_pretrained(tmp_path)
        args = [str(tmp_path) if a == "ODD" else a for a in args]
        capsys.readouterr()  # drop save_pretrained's progress output
    rc = main(["generate", "--target", "tiny-llama", "--decoder", "speculative", "--prompt", "hi", *args])
    assert rc == 2
    # Loading a model folder may draw progress bars first; the error itself is one last line.
    err = capsys.readouterr().err.strip().replace("\r", "\n").splitlines()
    assert err[-1].startswith("decodegate: error:")
    assert "Traceback" not in "\n".join(err)
