"""Faults found by a red-team review of the decoders and the exactness windows, each pinned by a
test that failed before its fix: hf sampling truncated to top-50, a failed window sample ending
the run, windows silently fewer than configured, sliding-window attention ignored by layer-wise
decoding, seeds and temperatures that overflow, stop strings split over many byte tokens, a NaN
in an unused verification row failing the item."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import decoders.speculative as spec
from decoders import GenerationRequest, make_decoder
from decoders.base import DecoderError
from decoders.common import Emitter
from decoders.drafters import check_tokenizers
from decoders.early_exit import EarlyExitDecoder
from decoders.speculative import SpeculativeDecoder
from decoders.standard import StandardDecoder
from harness.config import ConfigError, load_config
from harness.models import build_tiny, tiny_tokenizer
from harness.run import exactness
from helpers import spec_candidate, write_regress_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def llama():
    return build_tiny("llama")


# ------------------------------------------------------------------ 1. hf samples untruncated


def test_hf_sampling_reaches_tokens_beyond_the_top_50(llama):
    """transformers fills a top_k left unset with its default 50: at a temperature this high the
    distribution is near uniform over 259 tokens, so 200 draws see far more than 50 of them."""
    dec = make_decoder("hf", llama)
    ids = tuple(llama.encode("Hello"))
    seen = {dec.generate(GenerationRequest(ids, max_new_tokens=1, temperature=100.0, seed=s)).tokens[0]
            for s in range(200)}
    assert len(seen) > 50, f"only {len(seen)} distinct tokens in 200 near-uniform draws: truncated to top-k"


# --------------------------------------------------------------- 5, 6. seeds and temperatures


@pytest.mark.parametrize("seed", [2 ** 63, 2 ** 64, -1, 1.5, True])
def test_a_seed_outside_63_bits_is_refused(seed):
    with pytest.raises(DecoderError, match=re.escape("seed must be an integer in [0, 2**63)")):
        GenerationRequest((1, 2), seed=seed)


def test_the_largest_seed_samples(llama):
    import numpy as np
    GenerationRequest((1, 2), seed=np.int64(3))
    dec = StandardDecoder(llama)
    assert len(dec.generate(GenerationRequest((5, 6), max_new_tokens=2, temperature=0.7, seed=2 ** 63 - 1)).tokens) == 2


@pytest.mark.parametrize("t", [1e-39, 1e-10, 9e-7])
def test_a_vanishing_temperature_is_refused(t):
    with pytest.raises(DecoderError, match="use 0 for greedy"):
        GenerationRequest((1, 2), temperature=t)
    GenerationRequest((1, 2), temperature=1e-6)  # the smallest accepted


def _config(tmp_path: Path, seeds: str = "[0, 1]", temperatures: str = "[0.0, 0.7]") -> Path:
    suite = tmp_path / "s.jsonl"
    suite.write_text(json.dumps({"suite": "s", "version": "1", "description": "faults", "smoke": ["a"],
                                 "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}}) + "\n"
                     + json.dumps({"id": "a", "prompt": "Tell me", "references": ["x"]}) + "\n")
    return write_regress_config(tmp_path / "regress.toml", candidates=spec_candidate(),
                                suites={"s": {"margin": 0.5, "path": str(suite)}},
                                profile={"subset": "smoke", "suites": ["s"]},
                                tail=f"temperatures = {temperatures}\nseeds = {seeds}")  # TOML as given: nan, inf


def test_the_config_refuses_seeds_and_temperatures_requests_would(tmp_path):
    load_config(_config(tmp_path), "smoke")
    for seeds in ("[0, 9223372036854775808]", "[-1, 1]"):
        with pytest.raises(ConfigError, match=re.escape("seeds: seed must be an integer in [0, 2**63)")):
            load_config(_config(tmp_path, seeds=seeds), "smoke")
    with pytest.raises(ConfigError, match="use 0 for greedy"):
        load_config(_config(tmp_path, temperatures="[0.0, 1e-39]"), "smoke")
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        load_config(_config(tmp_path, temperatures="[0.0, nan]"), "smoke")


# --------------------------------------------------------- 7. stop strings over byte tokens


@pytest.mark.parametrize("stop", ["\U0001F642", "\U0001F642\U0001F642", "é!", "end"])
def test_a_stop_string_over_many_byte_tokens_stops(stop):
    """The tiny tokenizer has one token per byte: an emoji is 4 tokens for 1 character."""
    tok = tiny_tokenizer()
    before, after = tok("say ")["input_ids"], tok(" more")["input_ids"]
    ids = before + tok(stop)["input_ids"] + after
    assert len(tok(stop)["input_ids"]) == len(stop.encode("utf-8"))
    out = Emitter(GenerationRequest((1,), max_new_tokens=len(ids), stop_strings=(stop,)), tok, len(ids))
    for token in ids:
        if out.emit(token):
            break
    assert out.finish_reason == "stop_string"
    assert len(out.tokens) == len(before) + len(stop.encode("utf-8"))  # stopped on the string's last byte
    assert out.text() == "say "


# ------------------------------------------------------------ 4. sliding-window attention


@pytest.fixture(scope="module")
def windowed():
    loaded = build_tiny("mistral", seed=3)
    loaded.model.config.sliding_window = 8  # Mistral attends to the last 8 tokens
    return loaded


def test_layer_wise_decoding_refuses_a_request_past_the_window(windowed):
    long = GenerationRequest(tuple(range(5, 10)), max_new_tokens=12)
    for dec in (EarlyExitDecoder(windowed, threshold=0.5), SpeculativeDecoder(windowed, draft="self:2", k=2)):
        with pytest.raises(DecoderError, match="sliding-window"):
            dec.generate(long)
    # Inside the window the adapter's full attention is the model's: early exit still runs.
    short = GenerationRequest(tuple(range(5, 8)), max_new_tokens=4)
    assert len(EarlyExitDecoder(windowed, threshold=0.5).generate(short).tokens) == 4


def test_which_configs_slide():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    from decoders.adapter import sliding_window
    assert sliding_window(LlamaConfig()) is None
    assert sliding_window(MistralConfig(sliding_window=16)) == 16
    assert sliding_window(MistralConfig(sliding_window=None)) is None
    assert sliding_window(Qwen2Config(sliding_window=16)) is None  # use_sliding_window off
    assert sliding_window(Qwen2Config(use_sliding_window=True, sliding_window=16, num_hidden_layers=4,
                                      max_window_layers=2)) == 16
    assert sliding_window(Qwen2Config(use_sliding_window=True, sliding_window=16, num_hidden_layers=4,
                                      max_window_layers=4)) is None  # no layer slides


# -------------------------------------------------- 8. NaN only in a row the verdict never used


def test_nan_after_the_first_rejection_does_not_fail_the_item(llama, monkeypatch):
    """Rows past the first rejection score drafts that are thrown away; a NaN there must not end
    the request, and the output stays standard's."""
    draft = build_tiny("llama", seed=1)  # an unrelated model: its first draft is often wrong
    dec = SpeculativeDecoder(llama, draft=draft, k=4)
    real = dec.scorer.score
    injected = []

    def score(tokens, position):
        logits = real(tokens, position).clone()
        if len(tokens) > 2 and int(logits[0].argmax()) != tokens[1]:  # rejected at row 0: row 1.. unused
            logits[-1] = float("nan")
            injected.append(position)
        return logits

    monkeypatch.setattr(dec.scorer, "score", score)
    req = GenerationRequest(tuple(llama.encode("The cat sat on the mat")), max_new_tokens=24)
    got = dec.generate(req)
    assert injected, "no round rejected its first draft: the test did not test anything"
    assert got.tokens == StandardDecoder(llama).generate(req).tokens


def test_nan_in_a_used_row_still_fails(llama, monkeypatch):
    dec = SpeculativeDecoder(llama, draft=build_tiny("llama", seed=1), k=4)
    real = dec.scorer.score

    def score(tokens, position):
        logits = real(tokens, position).clone()
        if len(tokens) > 1:
            logits[0] = float("nan")
        return logits

    monkeypatch.setattr(dec.scorer, "score", score)
    with pytest.raises(DecoderError, match="NaN in logits"):
        dec.generate(GenerationRequest(tuple(llama.encode("The cat sat")), max_new_tokens=12))


# ------------------------------------------------------------- 9. draft tokenizer compared


def test_a_draft_tokenizer_of_the_same_size_with_other_tokens_is_refused():
    """Not a fault: the check compares the token -> id maps, not their size."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    target = tiny_tokenizer()
    vocab = dict(target.get_vocab())
    a, b = vocab["a"], vocab["b"]
    vocab["a"], vocab["b"] = b, a  # same size, same tokens, two ids swapped
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[])),
                                    eos_token="<|im_end|>", pad_token="<|endoftext|>")
    assert len(other.get_vocab()) == len(target.get_vocab())
    with pytest.raises(DecoderError, match="different ids for"):
        check_tokenizers(target, other)


# -------------------------------------------- 2, 3. exactness windows: errors and shortfalls


@pytest.fixture(scope="module")
def windows_config(smoke_config):
    """The shipped smoke profile on the bigram target (tests/test_exactness_gates.py), the
    prompt-lookup candidate alone, two windows of 60 samples."""
    text = smoke_config.read_text()
    text = text.replace("[profiles.smoke]\n", '[profiles.smoke]\ncandidates = ["lookup"]\n')
    text = re.sub(r"exactness_prompts = \d+", "exactness_prompts = 2", text)
    text = re.sub(r"exactness_samples = \d+", "exactness_samples = 60", text)
    cfg = smoke_config.parent / "windows.toml"
    cfg.write_text(text)
    return cfg


try:
    from test_exactness_gates import regress, smoke_config  # noqa: F401  (fixture)
except ImportError:  # tests/ imported as a package
    from tests.test_exactness_gates import regress, smoke_config  # noqa: F401


def _gates(summary: dict, name: str = "lookup") -> dict:
    return {g["name"]: g for g in summary["candidates"][name]["gates"]}


def test_a_failed_window_sample_is_inconclusive_not_the_end_of_the_run(windows_config, tmp_path, monkeypatch):
    real = spec.SpeculativeDecoder.generate

    def generate(self, request):
        if request.max_new_tokens == exactness.SEQ_LEN and request.seed == exactness.TEST_SEED + 3:
            raise DecoderError("NaN in logits at position 9: the model produced non-finite values")
        return real(self, request)

    monkeypatch.setattr(spec.SpeculativeDecoder, "generate", generate)
    summary = regress(windows_config, tmp_path / "run")  # before: exit 2, no summary.json
    tests = summary["candidates"]["lookup"]["exactness"]["tests"]
    assert len(tests) == 2
    for t in tests:
        assert t["pvalue"] is None and t["errors"] == 1 and "NaN in logits" in t["note"], t
        gate = _gates(summary)[f"exactness {t['item_id']}@{t['offset']} T={t['temperature']:g}"]
        assert gate["status"] != "pass" and "NaN in logits" in gate["detail"], gate
    stored = [json.loads(x) for x in (tmp_path / "run" / exactness.FILE).read_text().splitlines()]
    assert all(sum(bool(s.get("error")) for s in w["samples"]) == 1 for w in stored)


@pytest.mark.full
def test_a_resume_draws_the_windows_still_missing(windows_config, tmp_path):
    run = tmp_path / "run"
    first = regress(windows_config, run)
    keys = [(t["item_id"], t["offset"]) for t in first["candidates"]["lookup"]["exactness"]["tests"]]
    assert len(keys) == 2
    lines = (run / exactness.FILE).read_text().splitlines()
    (run / exactness.FILE).write_text(lines[0] + "\n")  # interrupted after the first window
    (run / "summary.json").unlink()
    again = regress(windows_config, run)
    tests = again["candidates"]["lookup"]["exactness"]["tests"]
    assert [(t["item_id"], t["offset"]) for t in tests] == keys  # before: the one stored window only
    assert len((run / exactness.FILE).read_text().splitlines()) == 2


@pytest.mark.full  # a regress (8 s); missing window evidence failing closed stays in make check above
def test_fewer_windows_than_configured_are_named_and_not_a_pass(windows_config, tmp_path):
    """Eight items give at most 16 windows: 20 configured cannot be had."""
    cfg = tmp_path / "short.toml"
    cfg.write_text(re.sub(r"exactness_prompts = \d+", "exactness_prompts = 20", windows_config.read_text())
                   .replace("exactness_samples = 60", "exactness_samples = 20"))
    summary = regress(cfg, tmp_path / "run")
    tests = summary["candidates"]["lookup"]["exactness"]["tests"]
    short = [t for t in tests if t.get("shortfall")]
    assert len(short) == 1 and short[0]["pvalue"] is None, tests  # before: no row for the missing windows
    assert short[0]["shortfall"] == 20 - (len(tests) - 1)
    gate = _gates(summary)[f"exactness windows@0 T={short[0]['temperature']:g}"]
    # Missing evidence fails the gate (the default for inconclusive), so the candidate cannot pass.
    assert gate["status"] == "fail" and f"only {len(tests) - 1} of the 20 exactness windows" in gate["detail"]
    assert summary["candidates"]["lookup"]["verdict"] != "pass"


# ------------------------------------------ layer-wise decoding on transformers before 5.2x


def test_layer_wise_decoding_passes_the_cache_by_the_layers_own_keyword():
    """transformers 5.17 (the GPU image's) names a decoder layer's cache `past_key_values`, 5.2x
    `cache`, and a layer handed the other name drops it into **kwargs and caches nothing: early
    exit and the self-draft broke on the first GPU run ("layer 0 caches 0 tokens"). Here every
    layer takes the old keyword and ignores the new one, as 5.17's do."""
    loaded = build_tiny("llama")
    request = GenerationRequest(tuple(loaded.encode("The quick brown fox")), max_new_tokens=12)
    want = StandardDecoder(loaded).generate(request).tokens
    base_cls = type(loaded.model.model.layers[0])

    class OldKeywordLayer(base_cls):
        def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=False, position_embeddings=None, **kwargs):
            kwargs.pop("cache", None)
            return super().forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                   cache=past_key_values, use_cache=use_cache,
                                   position_embeddings=position_embeddings, **kwargs)

    for layer in loaded.model.model.layers:
        layer.__class__ = OldKeywordLayer
    assert make_decoder("early-exit", loaded, threshold=1.0).generate(request).tokens == want


# ------------------------------------------ a death in the exactness windows (its worker)


# `make check` keeps the kill; an exit and garbage are the same path (`make test`).
@pytest.mark.parametrize("how", [pytest.param("os-exit-0", marks=pytest.mark.full), "sigkill",
                                 pytest.param("garbage", marks=pytest.mark.full)])
def test_a_death_drawing_a_window_is_the_candidates_fail_and_is_remembered(windows_config, tmp_path, monkeypatch, how):
    """The candidate dies (or answers garbage) on a window's request, in its worker: FAIL in
    this run naming the window, never exit 0 or 3; the rerun keeps the FAIL (a death is
    remembered) and draws no window for it."""
    import dataclasses
    import os
    import signal
    real = spec.SpeculativeDecoder.generate

    def generate(self, request):
        if request.max_new_tokens == exactness.SEQ_LEN and request.seed == exactness.TEST_SEED + 3:
            if how == "os-exit-0":
                os._exit(0)
            if how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            return dataclasses.replace(real(self, request), tokens=(10 ** 6,))
        return real(self, request)

    monkeypatch.setattr(spec.SpeculativeDecoder, "generate", generate)  # the worker, forked, has it too
    import helpers
    run = tmp_path / "run"
    for attempt in range(2):
        code = helpers.regress(windows_config, run)
        assert code == 1, (attempt, code)
        summary = helpers.summary(run)
        assert summary["candidates"]["lookup"]["verdict"] == "fail"
        failed = {g["name"]: g["detail"] for g in summary["candidates"]["lookup"]["gates"] if g["status"] == "fail"}
        if how == "garbage":
            assert any("outside the vocabulary" in d for d in failed.values()), failed
        else:
            words = "exited with status 0" if how == "os-exit-0" else "killed by SIGKILL"
            assert "crashed" in failed and "on exactness/window" in failed["crashed"] and words in failed["crashed"], failed
