"""The tiny test models set every config value the code reads away from transformers' defaults
(harness.models.TINY_OVERRIDES): a constant hard-coded where the config should have been read
(a norm eps, a rope base) is right on a default-config model and wrong on SmolLM2 (rms_norm_eps
1e-5), where baseline and candidates share it and no verdict can see it. Here the bit-identity
check of the written-out step (tests/test_lean.py) sees it on the test models, and would not on
default-config ones. Caches keyed by a model see the config too."""
from __future__ import annotations

import pytest
import torch

from decoders import lean
from harness.models import TINY_OVERRIDES, build_tiny, tiny_config
from tests.test_lean import _lean_and_modules

FAMILIES = ("llama", "qwen2", "mistral")
SMOLLM2_EPS = 1e-5

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _default_config(family: str):
    return type(tiny_config(family))()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_config_value_the_code_reads_is_not_the_default(family):
    cfg, default = tiny_config(family), _default_config(family)
    assert cfg.rms_norm_eps not in (default.rms_norm_eps, SMOLLM2_EPS)
    assert cfg.rope_parameters["rope_theta"] != default.rope_parameters["rope_theta"]
    assert cfg.rope_parameters["rope_type"] != default.rope_parameters["rope_type"]
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped key/value heads
    model = build_tiny(family).model
    attn = model.model.layers[0].self_attn
    if "head_dim" in TINY_OVERRIDES[family]:  # a head size that is not hidden / heads
        assert attn.head_dim != cfg.hidden_size // cfg.num_attention_heads
    assert attn.q_proj.bias is not None or family == "mistral"  # attention bias (Llama's off by default)


def test_the_families_take_each_value_both_ways():
    """Tied and untied embeddings, several eps and head sizes: a single value would hide a constant."""
    configs = [tiny_config(f) for f in FAMILIES]
    assert {c.tie_word_embeddings for c in configs} == {True, False}
    assert len({c.rms_norm_eps for c in configs}) == 3
    assert len({c.rope_parameters["rope_type"] for c in configs}) == 3
    tied = build_tiny("llama").model
    assert torch.equal(tied.lm_head.weight, tied.model.embed_tokens.weight)


def _hard_code_eps(monkeypatch, eps: float = 1e-6) -> None:
    """The written-out step with transformers' default eps in place of the model's own."""
    norm = lean._rms_norm
    monkeypatch.setattr(lean, "_rms_norm", lambda x, w, _eps: norm(x, w, eps))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_hard_coded_norm_eps_breaks_bit_identity_on_the_test_models(monkeypatch, family):
    assert _lean_and_modules(build_tiny(family))
    _hard_code_eps(monkeypatch)
    assert not _lean_and_modules(build_tiny(family))
    # On a model with transformers' default eps (the test models before) the constant went unseen.
    assert _lean_and_modules(build_tiny(family, rms_norm_eps=1e-6))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_default_rope_in_place_of_the_models_breaks_bit_identity(family):
    loaded = build_tiny(family)
    step = lean.runner(loaded.model)
    default = tiny_config(family, rope_parameters=_default_config(family).rope_parameters)
    step.rotary = type(loaded.model.model.rotary_emb)(config=default)  # rope base 10000, no scaling
    assert not _lean_and_modules(loaded)


def test_caches_keyed_by_a_model_see_its_config():
    """Exit heads and their training data are keyed by decoders.exit_heads.model_fingerprint, the
    baseline store by harness.run.fingerprint: a config value that changes no weight (eps) must
    change both, or a cache written for the old test models would be read for the new ones."""
    from decoders.exit_heads import model_fingerprint as heads_key
    from harness.run.fingerprint import model_fingerprint as store_key
    a, b = build_tiny("llama"), build_tiny("llama", rms_norm_eps=1e-6)
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    assert heads_key(a.model) != heads_key(b.model)
    assert store_key(a) != store_key(b)
