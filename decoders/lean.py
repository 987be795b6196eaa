"""The one-token decode step of a Llama-style model, written out (gpt-fast's loop) over the weights
`decoders.layout` laid out: one product for q/k/v and one for gate/up per layer, and none of
transformers' per-module dispatch, mask building or output bookkeeping. On smollm2-135m that
dispatch was about a third of a step on a CPU.

It performs the same operators, in the same order and dtype, as transformers' Llama, Mistral and
Qwen2 modules do for one new token with no mask (RMSNorm in fp32, rotary embedding from the model's
own `rotary_emb`, SDPA with `enable_gqa` where heads are grouped), so its logits are bit-identical
to `model(...)` on the same cache (tests/test_lean.py); a multi-token forward (prefill, K+1
verification) still goes through transformers. It runs only on `decoders.kv`'s preallocated cache,
and falls back (returns None from `runner`) wherever the shapes differ: other architectures, a
sliding window the context has reached, weights not on a CPU. A model quantized with torch's
dynamic int8 (`smollm2-135m-int8`, a draft) runs the same step through its own quantized
projection modules: the calls transformers makes, without the rest of its dispatch.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from decoders import layout
from decoders.kv import PreallocatedCache
from decoders.scopes import scope

FAMILIES = ("llama", "mistral", "qwen2")
_RUNNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' LlamaRMSNorm, operator for operator (bit-identical results)
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _mm(w, bias):
    if bias is None:
        return lambda x: torch.mm(x, w)
    return lambda x: torch.addmm(bias, x, w)


def _fused_projections(model):
    """Per layer (qkv, o, gate_up, down) over `decoders.layout`'s fused (in, out) tensors, and the
    head: one product per group (their columns equal the modules' own, bit for bit)."""
    fused = layout.fused_weights(model)
    out = []
    for layer, (qkv, o, gate_up, down) in zip(model.model.layers, fused[:-1]):
        a = layer.self_attn
        bias = None if a.q_proj.bias is None else torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
        q, kv = a.q_proj.out_features, a.k_proj.out_features
        qkv_mm, gu_mm, inter = _mm(qkv, bias), _mm(gate_up, None), layer.mlp.gate_proj.out_features

        def split_qkv(x, f=qkv_mm, q=q, kv=kv):
            t = f(x)
            return t[:, :q], t[:, q:q + kv], t[:, q + kv:]

        def split_gu(x, f=gu_mm, i=inter):
            t = f(x)
            return t[:, :i], t[:, i:]
        out.append((split_qkv, _mm(o, a.o_proj.bias), split_gu, _mm(down, layer.mlp.down_proj.bias)))
    return out, _mm(fused[-1], model.lm_head.bias)


def _module_projections(model):
    """The same through the model's own projection modules (torch's dynamic int8 `Linear`): the
    calls transformers makes, on the (1, 1, H) shapes it makes them on."""
    def flat(f):
        return lambda x: f(x.view(1, 1, -1)).view(1, -1)
    out = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        q, k, v, o, g, u, d = (flat(f) for f in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj,
                                                  m.down_proj))
        out.append(((lambda x, q=q, k=k, v=v: (q(x), k(x), v(x))), o,
                    (lambda x, g=g, u=u: (g(x), u(x))), d))
    return out, flat(model.lm_head)


def _quantized(model) -> bool:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
    body = getattr(model, "model", None)
    mods = [getattr(model, "lm_head", None)]
    for layer in getattr(body, "layers", []):
        mods += [getattr(layer.self_attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        mods += [getattr(layer.mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return len(mods) > 1 and all(type(m) is DynamicInt8Linear for m in mods)


class LeanStep:
    """`(input_ids (1, 1), cache) -> logits (1, V)` for one model, given its projections."""

    def __init__(self, model, projections, head):
        cfg = model.config
        self.model = model
        self.embed = model.get_input_embeddings().weight
        self.rotary = model.model.rotary_emb
        self.layers = []
        for layer, (qkv, o, gate_up, down) in zip(model.model.layers, projections):
            a, m = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, qkv, o,
                                layer.post_attention_layernorm.weight,
                                layer.post_attention_layernorm.variance_epsilon, gate_up, down, m.act_fn,
                                a.scaling, a.num_key_value_groups > 1))
        self.norm_w, self.norm_eps = model.model.norm.weight, model.model.norm.variance_epsilon
        self.head = head
        self.head_dim = model.model.layers[0].self_attn.head_dim
        window = getattr(cfg, "sliding_window", None)
        self.window = window if window and getattr(cfg, "use_sliding_window", True) else None

    def accepts(self, cache) -> bool:
        if not isinstance(cache, PreallocatedCache) or len(cache.layers) != len(self.layers):
            return False
        # Past the window transformers masks the oldest keys; this step does not.
        return self.window is None or cache.layers[0].length + 1 <= self.window

    def __call__(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        position = cache.layers[0].length
        h = F.embedding(input_ids, self.embed)                                # (1, 1, H)
        cos, sin = self.rotary(h, torch.tensor([[position]], device=h.device))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        hd = self.head_dim
        for kv, (w_in, eps_in, qkv, o, w_post, eps_post, gate_up, down, act, scaling, gqa) in zip(
                cache.layers, self.layers):
            with scope("norms"):  # the parts `bench --profile-round` splits a step into
                x = _rms_norm(h, w_in, eps_in)
            with scope("attention"):
                q, k, v = qkv(x.view(1, -1))                                   # (1, q), (1, kv), (1, kv)
                q = q.view(1, 1, -1, hd).transpose(1, 2)
                k = k.view(1, 1, -1, hd).transpose(1, 2)
                v = v.view(1, 1, -1, hd).transpose(1, 2)
                q = (q * cos) + (_rotate_half(q) * sin)
                k = (k * cos) + (_rotate_half(k) * sin)
                k, v = kv.update(k, v)
                if gqa:
                    att = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=scaling,
                                                         is_causal=False, enable_gqa=True)
                else:
                    att = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=scaling,
                                                         is_causal=False)
                att = o(att.transpose(1, 2).contiguous().reshape(1, -1)).view(1, 1, -1)
            h = h + att
            with scope("norms"):
                x = _rms_norm(h, w_post, eps_post).view(1, -1)
            with scope("mlp"):
                g, u = gate_up(x)
                mlp = down(act(g) * u).view(1, 1, -1)
            h = h + mlp
        with scope("lm_head"):
            h = _rms_norm(h, self.norm_w, self.norm_eps)
            return self.head(h.view(1, -1))                                   # (1, V)


def runner(model):
    """The lean step for `model` (laying its weights out on first use), or None where it does
    not apply."""
    if model in _RUNNERS:
        step, laid_out = _RUNNERS[model]
        return step if step is not None and (not laid_out or layout.intact(model)) else None
    step, laid_out = None, False
    cfg = getattr(model, "config", None)
    if (cfg is not None and getattr(cfg, "model_type", None) in FAMILIES and layout.enabled()
            and getattr(cfg, "_attn_implementation", None) == "sdpa" and not getattr(cfg, "mlp_bias", False)):
        if layout.prepare(model):
            step, laid_out = LeanStep(model, *_fused_projections(model)), True
        elif _quantized(model):
            step = LeanStep(model, *_module_projections(model))
    _RUNNERS[model] = (step, laid_out)
    return step
