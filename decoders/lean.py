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
sliding window the context has reached, quantized or non-CPU weights.
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


class LeanStep:
    """`(input_ids (1, 1), cache) -> logits (1, V)` for one prepared model."""

    def __init__(self, model):
        cfg = model.config
        self.model = model
        self.embed = model.get_input_embeddings().weight
        self.rotary = model.model.rotary_emb
        self.layers = []
        fused = layout.fused_weights(model)
        for layer, (qkv, o, gate_up, down) in zip(model.model.layers, fused[:-1]):
            a, m = layer.self_attn, layer.mlp
            qkv_bias = None
            if a.q_proj.bias is not None:
                qkv_bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            self.layers.append((layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, qkv, qkv_bias,
                                o, a.o_proj.bias, layer.post_attention_layernorm.weight,
                                layer.post_attention_layernorm.variance_epsilon, gate_up, down, m.act_fn,
                                a.scaling, a.num_key_value_groups > 1))
        self.norm_w, self.norm_eps = model.model.norm.weight, model.model.norm.variance_epsilon
        self.head = fused[-1]
        self.head_bias = model.lm_head.bias
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = model.model.layers[0].self_attn.head_dim
        self.q_size, self.kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.inter = model.model.layers[0].mlp.gate_proj.out_features
        window = getattr(cfg, "sliding_window", None)
        self.window = window if window and getattr(cfg, "use_sliding_window", True) else None

    def accepts(self, cache) -> bool:
        if not isinstance(cache, PreallocatedCache) or len(cache.layers) != len(self.layers):
            return False
        # Past the window transformers masks the oldest keys; this step does not.
        return self.window is None or cache.layers[0].length + 1 <= self.window

    @staticmethod
    def _linear(x, w, bias):
        return torch.mm(x, w) if bias is None else torch.addmm(bias, x, w)

    def __call__(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        position = cache.layers[0].length
        h = F.embedding(input_ids, self.embed)                                # (1, 1, H)
        cos, sin = self.rotary(h, torch.tensor([[position]], device=h.device))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        hd, qs, kvs = self.head_dim, self.q_size, self.kv_size
        for kv, (w_in, eps_in, qkv_w, qkv_b, o_w, o_b, w_post, eps_post, gu_w, down_w, act, scaling, gqa) in zip(
                cache.layers, self.layers):
            with scope("norms"):  # the parts `bench --profile-round` splits a step into
                x = _rms_norm(h, w_in, eps_in)
            with scope("attention"):
                qkv = self._linear(x.view(1, -1), qkv_w, qkv_b)                # (1, q+2kv)
                q = qkv[:, :qs].view(1, 1, -1, hd).transpose(1, 2)
                k = qkv[:, qs:qs + kvs].view(1, 1, -1, hd).transpose(1, 2)
                v = qkv[:, qs + kvs:].view(1, 1, -1, hd).transpose(1, 2)
                q = (q * cos) + (_rotate_half(q) * sin)
                k = (k * cos) + (_rotate_half(k) * sin)
                k, v = kv.update(k, v)
                if gqa:
                    att = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=scaling,
                                                         is_causal=False, enable_gqa=True)
                else:
                    att = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=scaling,
                                                         is_causal=False)
                att = att.transpose(1, 2).contiguous().reshape(1, -1)
                att = self._linear(att, o_w, o_b).view(1, 1, -1)
            h = h + att
            with scope("norms"):
                x = _rms_norm(h, w_post, eps_post).view(1, -1)
            with scope("mlp"):
                gu = torch.mm(x, gu_w)
                mlp = torch.mm(act(gu[:, :self.inter]) * gu[:, self.inter:], down_w).view(1, 1, -1)
            h = h + mlp
        with scope("lm_head"):
            h = _rms_norm(h, self.norm_w, self.norm_eps)
            return self._linear(h.view(1, -1), self.head, self.head_bias)     # (1, V)


def runner(model):
    """The lean step for `model` (laying its weights out on first use), or None where it does
    not apply."""
    if model in _RUNNERS:
        step = _RUNNERS[model]
        return step if step is not None and layout.intact(model) else None
    step = None
    cfg = getattr(model, "config", None)
    if (cfg is not None and getattr(cfg, "model_type", None) in FAMILIES
            and getattr(cfg, "_attn_implementation", None) == "sdpa"
            and not getattr(cfg, "mlp_bias", False) and layout.prepare(model)):
        step = LeanStep(model)
    _RUNNERS[model] = step
    return step
