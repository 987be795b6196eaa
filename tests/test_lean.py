"""The CPU weight layout (`decoders.layout`) and the written-out one-token step (`decoders.lean`):
bit-identical logits and cache entries to transformers' modules on every supported family, the
same tokens as before the layout, and a fallback wherever the step does not apply."""
from __future__ import annotations

import pytest
import torch

from decoders import GenerationRequest, lean, layout
from decoders.common import cache_kwarg, forward
from decoders.kv import CachePool
from decoders.standard import StandardDecoder
from harness.models import build_tiny, quantize_int8
from tests.numerics import assert_close_scaled

FAMILIES = ("llama", "qwen2", "mistral")
PROMPT = "The cat sat on the mat. The cat sat on the"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _transformers_step(model, ids, cache):
    return model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache}).logits[0]


def _lean_and_modules(loaded, steps: int = 12, blocks=(2, 5, 3)):
    """Run the same greedy continuation twice, through the lean step and through transformers'
    modules, on two caches after the same prefill, then blocks of several tokens (K+1
    verifications) where the step takes them; True when every logit and cache entry is equal."""
    model = loaded.model
    ids = loaded.encode(PROMPT, chat=False)
    step = lean.runner(model)
    assert step is not None
    caches = [CachePool(model).new(len(ids) + steps + sum(blocks) + 1, private=True) for _ in range(2)]
    with torch.inference_mode():
        first = [forward(model, torch.tensor([ids]), c) for c in caches]
        assert torch.equal(first[0], first[1])
        token = int(first[0].argmax())
        for _ in range(steps):
            t = torch.tensor([[token]])
            ours, theirs = step(t, caches[0]), _transformers_step(model, t, caches[1])
            if not torch.equal(ours, theirs):
                return False
            for a, b in zip(caches[0].layers, caches[1].layers):
                if not (torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)):
                    return False
            token = int(theirs.argmax())
        for n in (blocks if step.multi else ()):
            t = torch.tensor([[token] + [(token + 7 * i) % 200 + 3 for i in range(1, n)]])
            ours = forward(model, t, caches[0], n_logits=n)
            theirs = model(input_ids=t, use_cache=True, logits_to_keep=n, **{cache_kwarg(model): caches[1]}).logits[0]
            if ours.shape != (n, theirs.shape[-1]) or not torch.equal(ours, theirs):
                return False
            for a, b in zip(caches[0].layers, caches[1].layers):
                if not (torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)):
                    return False
            token = int(theirs[-1].argmax())
    return True


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_step_is_bit_identical_to_transformers_modules(family):
    loaded = build_tiny(family)
    assert layout.fused_weights(loaded.model) is not None  # build_tiny lays the weights out
    # K+1 blocks go through the lean forward too (the panel kernel builds on this machine)
    assert lean.runner(loaded.model).multi
    assert _lean_and_modules(loaded)


def test_a_broken_lean_step_is_caught(monkeypatch):
    """The identity check above has teeth: a step that rotates keys wrongly, or that drops one
    residual, no longer matches."""
    loaded = build_tiny("llama")
    monkeypatch.setattr(lean, "_signed_sin", lambda sin: sin)  # rotate_half's negation dropped
    assert not _lean_and_modules(loaded)
    monkeypatch.undo()
    monkeypatch.setattr(lean, "_rotate", lambda x, cos, sin: x)  # no rotation at all
    assert not _lean_and_modules(loaded)
    monkeypatch.undo()
    assert _lean_and_modules(loaded)
    monkeypatch.setattr(lean, "_rms_norm", lambda x, w, eps: w * x)
    assert not _lean_and_modules(loaded)


def test_torch_norm_is_used_only_where_it_gives_the_modules_bits(monkeypatch):
    """torch's own `rms_norm` stands in for transformers' operators only where a check on this
    build gives the same bits; a torch whose norm rounds otherwise falls back, and the step then
    still matches the modules bit for bit."""
    loaded = build_tiny("llama")
    assert lean._torch_norm_agrees()  # torch 2.13 on a CPU: the same operators in C++
    real = torch.nn.functional.rms_norm

    def other_order(x, shape, weight, eps):  # the same formula, the squares summed backwards
        v = x.pow(2).flip(-1).cumsum(-1)[..., -1:] / x.shape[-1]
        return weight * (x * torch.rsqrt(v + eps))
    monkeypatch.setattr(lean, "_TORCH_NORM", [])
    monkeypatch.setattr(lean.F, "rms_norm", other_order)
    assert not lean._torch_norm_agrees()
    assert _lean_and_modules(loaded)
    monkeypatch.setattr(lean, "_TORCH_NORM", [True])  # forced in, it is caught
    assert not _lean_and_modules(loaded)
    monkeypatch.setattr(lean.F, "rms_norm", real)
    assert _lean_and_modules(loaded)


@pytest.mark.parametrize("family", ("llama", "qwen2"))
def test_layout_keeps_tokens_and_logits(family, monkeypatch):
    """The laid-out model gives the tokens of the model as loaded (transformers' own layout and
    kernels, DECODEGATE_LAYOUT=0), and logits equal up to fp32 rounding: only the order of the
    products' sums may change."""
    new = build_tiny(family)
    monkeypatch.setenv("DECODEGATE_LAYOUT", "0")
    old = build_tiny(family)
    assert layout.fused_weights(old.model) is None and lean.runner(old.model) is None
    req = GenerationRequest(tuple(new.encode(PROMPT, chat=False)), max_new_tokens=32, stop_token_ids=())
    a, b = StandardDecoder(new).generate(req), StandardDecoder(old).generate(req)
    assert a.tokens == b.tokens
    ids = torch.tensor([list(req.prompt_ids)])
    with torch.inference_mode():
        la = new.model(input_ids=ids).logits
        lb = old.model(input_ids=ids).logits
    assert_close_scaled(la, lb, layers=new.model.config.num_hidden_layers + 1)


def test_where_the_lean_step_does_not_apply():
    loaded = build_tiny("llama")
    model = loaded.model
    from transformers import DynamicCache
    assert not lean.runner(model).accepts(DynamicCache(config=model.config))
    # A window the context has reached: transformers masks the oldest keys there.
    from transformers import AutoModelForCausalLM

    from harness.models import tiny_config
    config = tiny_config("mistral")
    config.sliding_window = 8
    windowed = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    step = lean.runner(windowed)
    cache = CachePool(windowed).new(32, private=True)
    with torch.inference_mode():
        forward(windowed, torch.tensor([list(range(3, 10))]), cache)
        assert step.accepts(cache)   # 7 cached + 1 new = the window
        forward(windowed, torch.tensor([[11]]), cache)
        assert not step.accepts(cache)
    # Moved to another dtype after the layout: the prepared weights are gone, the step with them.
    moved = build_tiny("qwen2")
    assert lean.runner(moved.model) is not None
    moved.model.to(torch.float64)
    assert lean.runner(moved.model) is None and not layout.prepare(moved.model)


def test_quantizing_a_laid_out_model_quantizes_every_projection():
    fp32 = build_tiny("llama")
    int8 = quantize_int8(fp32)
    from torch.ao.nn.quantized.dynamic import Linear as QLinear
    linears = [m for m in fp32.model.modules() if isinstance(m, torch.nn.Linear)]
    quantized = [m for m in int8.model.modules() if isinstance(m, QLinear)]
    assert len(quantized) == len(linears) > 0
    assert not any(type(m) is layout.FastLinear for m in int8.model.modules())
    assert layout.fused_weights(fp32.model) is not None  # the fp32 model keeps its layout
    # The int8 model's lean step goes through its quantized modules: bit-identical to transformers.
    assert lean.runner(int8.model) is not None and layout.fused_weights(int8.model) is None
    assert _lean_and_modules(int8)


def test_fast_linear_under_autograd_is_nn_linear():
    loaded = build_tiny("llama")
    proj = loaded.model.model.layers[0].mlp.up_proj
    assert type(proj) is layout.FastLinear and proj._panels is not None
    x = torch.randn(3, proj.in_features, requires_grad=True)
    proj(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with torch.inference_mode():
        y = torch.randn(5, proj.in_features)
        # Two kernels sum the same products in other orders: rounding relative to the sum of |terms|.
        terms = float((y.abs() @ proj.weight.abs().t()).max())
        assert_close_scaled(proj(y), torch.nn.functional.linear(y, proj.weight), scale=terms)


def test_a_deep_copy_is_plain_and_laid_out_again_on_first_use():
    import copy
    loaded = build_tiny("llama")
    clone = copy.deepcopy(loaded.model)
    assert layout.fused_weights(clone) is None
    assert all(type(m) is torch.nn.Linear for m in clone.modules() if isinstance(m, torch.nn.Linear))
    assert all(p.is_contiguous() for p in clone.parameters())
    ids = torch.tensor([loaded.encode(PROMPT, chat=False)])
    with torch.inference_mode():
        before = clone(input_ids=ids).logits
        forward(clone, ids, CachePool(clone).new(ids.shape[1] + 1))  # decoders lay it out here
        assert layout.fused_weights(clone) is not None and lean.runner(clone) is not None
        assert_close_scaled(clone(input_ids=ids).logits, before, layers=clone.config.num_hidden_layers + 1)


def test_no_layout_where_the_extra_copy_would_not_fit(monkeypatch):
    """A model that fitted in memory before still fits: no extra copy past half the free memory."""
    monkeypatch.setattr(layout, "available_memory", lambda: 4096)
    loaded = build_tiny("llama")
    assert layout.fused_weights(loaded.model) is None and lean.runner(loaded.model) is None
    assert all(type(m) is torch.nn.Linear for m in loaded.model.modules() if isinstance(m, torch.nn.Linear))
    req = GenerationRequest(tuple(loaded.encode(PROMPT, chat=False)), max_new_tokens=8, stop_token_ids=())
    assert len(StandardDecoder(loaded).generate(req).tokens) == 8
    monkeypatch.setattr(layout, "available_memory", lambda: None)  # a system that does not say
    assert layout.prepare(build_tiny("llama").model)
