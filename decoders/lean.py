"""The decode step of a Llama-style model, written out (gpt-fast's loop) over the weights
`decoders.layout` laid out: one product for q/k/v and one for gate/up per layer, and none of
transformers' per-module dispatch or output bookkeeping. On smollm2-135m that dispatch was about a
third of a step on a CPU.

It performs the same operators, in the same order and dtype, as transformers' Llama, Mistral and
Qwen2 modules do (RMSNorm in fp32, rotary embedding from the model's own `rotary_emb`, SDPA, with
transformers' own causal mask for a block; grouped key/value heads are read in place through
`enable_gqa` where transformers copies them for a mask: the same bits), so its logits are
bit-identical to `model(...)` on the same cache (tests/test_lean.py). It takes one token, or a block of up to `panel.MAX_ROWS` tokens (a K+1
verification) when `decoders.panel`'s kernel is in use (not for Qwen2 with a sliding window, whose
layers mix mask kinds); longer inputs (a prefill) go through transformers. It runs only on `decoders.kv`'s preallocated cache,
and falls back (returns None from `runner`, or `accepts` is False) wherever the shapes differ:
other architectures, a sliding window the context has reached, weights not on a CPU. A model
quantized with torch's dynamic int8 (`smollm2-135m-int8`, a draft) runs the one-token step through
its own quantized projection modules: the calls transformers makes, without the rest of its
dispatch.
"""
from __future__ import annotations

import inspect
import weakref

import torch
import torch.nn.functional as F

from decoders import layout, panel
from decoders.kv import PreallocatedCache
from decoders.scopes import scope

FAMILIES = ("llama", "mistral", "qwen2")
_RUNNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _rms_norm_modules(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' LlamaRMSNorm, operator for operator (bit-identical results)
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(dtype)


_TORCH_NORM: list = []  # [bool]: whether torch's own rms_norm gives the same bits here


def _torch_norm_agrees() -> bool:
    """torch's `rms_norm` runs the same operators in C++ (pow, mean, + eps, rsqrt, two products;
    ~7.6 against ~10.3 us a call from Python, 61 calls a step on smollm2-135m). It is used only
    where it gives transformers' bits, checked once on this build and processor: a torch whose
    kernel sums in another order falls back to the operators above."""
    if not _TORCH_NORM:
        g = torch.Generator().manual_seed(0)
        ok = True
        for width, rows, scale in ((576, 1, 1.0), (576, 5, 1e3), (64, 3, 1e-3), (960, 1, 10.0), (37, 2, 1.0)):
            x = torch.randn(1, rows, width, generator=g) * scale
            w = torch.randn(width, generator=g)
            ok = ok and torch.equal(F.rms_norm(x, (width,), w, 1e-5), _rms_norm_modules(x, w, 1e-5))
        _TORCH_NORM.append(ok)
    return _TORCH_NORM[0]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == weight.dtype == torch.float32 and _torch_norm_agrees():
        return F.rms_norm(x, weight.shape, weight, eps)
    return _rms_norm_modules(x, weight, eps)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated, once per forward: rotate_half(x) * sin, transformers'
    (-x2, x1) * (s1, s2), is then x.roll(half) * (-s1, s2), the same products bit for bit (a
    negation is exact and a product's sign is the sign of its factors), in 2 operators, not 5."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    # transformers' apply_rotary_pos_emb: (x * cos) + (rotate_half(x) * sin)
    return (x * cos) + (x.roll(x.shape[-1] // 2, -1) * signed_sin)


def _mm(laid_out, bias):
    w, panels = laid_out
    if panels is not None and panel.available():
        return lambda x: panel.linear(x, panels, w.shape[1], bias)
    if bias is None:
        return lambda x: torch.mm(x, w)
    return lambda x: torch.addmm(bias, x, w)


def _fused_projections(model):
    """Per layer (qkv, o, gate_up, down) over `decoders.layout`'s fused (in, out) tensors and their
    panels, and the head: one product per group (their columns equal the modules' own, bit for
    bit). A group without panels (a width not a multiple of 16) runs through its modules."""
    fused = layout.fused_weights(model)
    out = []
    for layer, (qkv, o, gate_up, down) in zip(model.model.layers, fused[:-1]):
        a = layer.self_attn
        bias = None if a.q_proj.bias is None else torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
        q, kv = a.q_proj.out_features, a.k_proj.out_features
        qkv_mm, gu_mm, inter = _mm(qkv, bias), _mm(gate_up, None), layer.mlp.gate_proj.out_features

        def split_qkv(x, f=qkv_mm, qk=q + kv):
            t = f(x)
            return t[:, :qk], t[:, qk:]

        def split_gu(x, f=gu_mm, i=inter):
            t = f(x)
            return t[:, :i], t[:, i:]

        def each_qkv(x, a=a):  # a group without shared panels: each module's own
            return torch.cat((a.q_proj(x), a.k_proj(x)), -1), a.v_proj(x)

        def each_gu(x, m=layer.mlp):
            return m.gate_proj(x), m.up_proj(x)
        unshared = panel.available()
        out.append((each_qkv if unshared and qkv[1] is None else split_qkv, _mm(o, a.o_proj.bias),
                    each_gu if unshared and gate_up[1] is None else split_gu, _mm(down, layer.mlp.down_proj.bias)))
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
        out.append(((lambda x, q=q, k=k, v=v: (torch.cat((q(x), k(x)), -1), v(x))), o,
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


def _mask_call(sliding: bool):
    """The mask builder transformers' model calls (Mistral's with a window), and the keyword its
    version takes the cache by."""
    from transformers import masking_utils
    make = masking_utils.create_sliding_window_causal_mask if sliding else masking_utils.create_causal_mask
    params = inspect.signature(make).parameters
    return make, ("cache" if "cache" in params else "past_key_values"), "position_ids" in params


class LeanStep:
    """`(input_ids (1, T), cache, n_logits) -> logits (n_logits, V)` for one model, given its
    projections; T is 1, or up to `panel.MAX_ROWS` where `multi` is True."""

    def __init__(self, model, projections, head, multi: bool = False):
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
                                a.scaling, a.num_key_value_groups))
        self.norm_w, self.norm_eps = model.model.norm.weight, model.model.norm.variance_epsilon
        self.head = head
        self.head_dim = model.model.layers[0].self_attn.head_dim
        self.heads = model.model.layers[0].self_attn.q_proj.out_features // self.head_dim
        window = getattr(cfg, "sliding_window", None)
        self.window = window if window and getattr(cfg, "use_sliding_window", True) else None
        # Several tokens need transformers' own mask: Llama's, or Mistral's with its window (Qwen2
        # with a window mixes layer kinds: one token only there).
        self.multi = multi and (self.window is None or cfg.model_type == "mistral")
        self.config = cfg

    def accepts(self, cache, tokens: int = 1) -> bool:
        if not isinstance(cache, PreallocatedCache) or len(cache.layers) != len(self.layers):
            return False
        if tokens > 1 and not (self.multi and tokens <= panel.MAX_ROWS and cache.layers[0].length > 0):
            return False
        # Past the window transformers masks the oldest keys; this step does not.
        return self.window is None or cache.layers[0].length + tokens <= self.window

    def _mask(self, h, cache, positions):
        if h.shape[1] == 1:
            return None  # what transformers' mask is for one new token under SDPA
        make, cache_kw, by_position = _mask_call(self.window is not None)
        kw = {"position_ids": positions} if by_position else {"cache_position": positions[0]}
        mask = make(config=self.config, inputs_embeds=h, attention_mask=None, **{cache_kw: cache}, **kw)
        if mask is not None and mask.dtype == torch.bool:
            # what SDPA turns a boolean mask into on every call; here once for all layers
            mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill_(
                mask.logical_not(), float("-inf"))
        return mask

    def __call__(self, input_ids: torch.Tensor, cache, n_logits: int = 1) -> torch.Tensor:
        t = input_ids.shape[1]
        start = cache.layers[0].length
        h = F.embedding(input_ids, self.embed)                                # (1, T, H)
        positions = torch.arange(start, start + t, device=h.device).unsqueeze(0)
        mask = self._mask(h, cache, positions)
        cos, sin = self.rotary(h, positions)
        cos, sin = cos.unsqueeze(2), _signed_sin(sin.unsqueeze(2))           # (1, T, 1, D)
        hd, heads = self.head_dim, self.heads
        for kv, (w_in, eps_in, qkv, o, w_post, eps_post, gate_up, down, act, scaling, groups) in zip(
                cache.layers, self.layers):
            with scope("norms"):  # the parts `bench --profile-round` splits a step into
                x = _rms_norm(h, w_in, eps_in)
            with scope("attention"):
                qk, v = qkv(x.view(t, -1))                                     # (T, q + kv), (T, kv)
                # Queries and keys sit side by side: one rotation for both (elementwise, so the
                # same bits as rotating each), in (1, T, heads, D) order, then viewed per head.
                qk = _rotate(qk.view(1, t, -1, hd), cos, sin)
                q = qk.narrow(2, 0, heads).transpose(1, 2)                     # (1, heads, T, D)
                k = qk.narrow(2, heads, qk.shape[2] - heads).transpose(1, 2)
                k, v = kv.update(k, v.view(1, t, -1, hd).transpose(1, 2))
                att = self._attend(q, k, v, mask, scaling, groups)
                att = o(att.transpose(1, 2).contiguous().reshape(t, -1)).view(1, t, -1)
            h = h.add_(att)  # h is this forward's own tensor (the embedding's output, then sums)
            with scope("norms"):
                x = _rms_norm(h, w_post, eps_post).view(t, -1)
            with scope("mlp"):
                g, u = gate_up(x)
                mlp = down(act(g).mul_(u)).view(1, t, -1)
            h = h.add_(mlp)
        with scope("lm_head"):
            h = _rms_norm(h[:, t - n_logits:], self.norm_w, self.norm_eps)
            return self.head(h.view(n_logits, -1))                            # (n_logits, V)

    @staticmethod
    def _attend(q, k, v, mask, scaling, groups):
        # transformers' sdpa_attention_forward for these shapes. With a mask it repeats grouped
        # key/value heads; SDPA's `enable_gqa` reads them in place and gives the same bits on a
        # CPU (tests/test_lean.py) without copying the whole cache per layer.
        kw = {"enable_gqa": True} if groups > 1 else {}
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scaling,
                                              is_causal=mask is None and q.shape[2] > 1, **kw)


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
            step, laid_out = LeanStep(model, *_fused_projections(model), multi=panel.available()), True
        elif _quantized(model):
            step = LeanStep(model, *_module_projections(model))
    _RUNNERS[model] = (step, laid_out)
    return step
