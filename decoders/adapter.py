"""Layer-by-layer access to a decoder-only transformer, for early exit and self-drafting.

`LayerAdapter` runs any contiguous range of layers on top of a `DynamicCache`, applies the final
norm and LM head to any intermediate hidden state (the logit lens), and writes a skipped layer's
keys and values from a copied hidden state (state propagation, CALM: Schuster et al. 2022).

Supported: the Llama / Qwen2 / Mistral family (pre-norm layers with `input_layernorm`,
`self_attn.{k,v}_proj`, rotary embeddings, no q/k norm). Other architectures are refused with a
clear error rather than silently computing something else. Sliding-window attention is not
applied here: a request that could reach past the window is refused (`check_capacity`).

Layers may hold different lengths of cache while a self-draft runs ahead on the lower layers, so
the attention mask is built per call from the length of the layer range's own cache, not from
layer 0's (which is what the model's own forward would use).
"""
from __future__ import annotations

import torch

from decoders.base import DecoderError
from decoders.common import _cache_kwarg

SUPPORTED = ("llama", "qwen2", "mistral")


def sliding_window(config) -> int | None:
    """The attention window a model's layers use, or None for full attention. Mistral applies
    `sliding_window` whenever it is set; Qwen2 only on the layers `layer_types` marks (from
    `use_sliding_window` and `max_window_layers`)."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    if getattr(config, "model_type", None) == "mistral":
        return int(window)
    types = getattr(config, "layer_types", None)
    if types is not None:
        return int(window) if "sliding_attention" in types else None
    return int(window) if getattr(config, "use_sliding_window", False) else None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LayerAdapter:
    def __init__(self, model):
        model_type = getattr(model.config, "model_type", "?")
        if model_type not in SUPPORTED:
            raise DecoderError(f"layer-wise decoding (early exit, self-draft) supports {', '.join(SUPPORTED)} "
                               f"models; this model is {model_type!r}")
        self.model = model
        self.body = model.model
        self.layers = self.body.layers
        self.num_layers = len(self.layers)
        self.impl = model.config._attn_implementation or "eager"
        # The keyword a decoder layer takes its cache by: `cache` from transformers 5.2x on,
        # `past_key_values` before (a layer given the other name silently caches nothing).
        self.cache_kw = _cache_kwarg(type(self.layers[0])) if self.num_layers else "cache"
        self.window = sliding_window(model.config)

    def check_capacity(self, capacity: int) -> None:
        """Refuse a request whose context (prompt, new tokens, drafts) can reach `capacity`
        tokens when that is past the model's attention window: the masks here attend to the whole
        context, so past the window the logits would not be the model's."""
        if self.window is not None and capacity > self.window:
            raise DecoderError(f"layer-wise decoding (early exit, self-draft) does not apply sliding-window "
                               f"attention: this model attends to the last {self.window} tokens, and this "
                               f"request can reach {capacity}; shorten the prompt or max_new_tokens, or use "
                               f"a decoder that runs the whole model (standard, speculative with another draft)")

    # -------------------------------------------------------------------------------- pieces
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.body.embed_tokens(input_ids)  # (1, T, H)

    def rope(self, hidden: torch.Tensor, start: int) -> tuple:
        """cos/sin for absolute positions start .. start+T-1."""
        pos = torch.arange(start, start + hidden.shape[1], device=hidden.device)[None]
        return self.body.rotary_emb(hidden, position_ids=pos), pos

    def mask(self, q_len: int, past: int, hidden: torch.Tensor):
        """Causal mask for q_len new queries after `past` cached keys; None for one query."""
        if q_len == 1:
            return None
        i = torch.arange(q_len, device=hidden.device)[:, None] + past
        j = torch.arange(past + q_len, device=hidden.device)[None, :]
        allowed = (j <= i)[None, None]  # (1, 1, q, kv)
        if self.impl == "sdpa":
            return allowed
        return torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device).masked_fill(
            ~allowed, torch.finfo(hidden.dtype).min)

    def layer_length(self, cache, layer: int) -> int:
        return cache.layers[layer].get_seq_length() if layer < len(cache.layers) else 0

    @torch.inference_mode()
    def run_layers(self, hidden: torch.Tensor, start: int, end: int, cache, position: int) -> torch.Tensor:
        """Run layers [start, end) on hidden (1, T, H) whose first token is at absolute `position`.
        Each of those layers must hold exactly `position` cached tokens."""
        (cos_sin, pos) = self.rope(hidden, position)
        mask = self.mask(hidden.shape[1], position, hidden)
        for i in range(start, end):
            have = self.layer_length(cache, i)
            if have != position:
                raise RuntimeError(f"layer {i} caches {have} tokens, expected {position}")
            hidden = self.layers[i](hidden, attention_mask=mask, position_embeddings=cos_sin,
                                    position_ids=pos, use_cache=True, **{self.cache_kw: cache})
        return hidden

    @torch.inference_mode()
    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on any hidden state: (1, T, H) -> (T, V)."""
        return self.model.lm_head(self.body.norm(hidden))[0]

    @torch.inference_mode()
    def propagate(self, hidden: torch.Tensor, start: int, end: int, cache, position: int) -> None:
        """State propagation: write keys/values of layers [start, end) for tokens whose hidden
        state stopped at layer `start`, computing each as if `hidden` were that layer's input
        (input norm, K/V projections, rotary embedding only; no attention, no MLP)."""
        (cos, sin), _ = self.rope(hidden, position)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (1, 1, T, D)
        for i in range(start, end):
            layer = self.layers[i]
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            shape = (*x.shape[:-1], -1, attn.head_dim)
            k = attn.k_proj(x).view(shape).transpose(1, 2)  # (1, KV, T, D)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            k = k * cos + _rotate_half(k) * sin
            cache.update(k, v, i)

    def rollback(self, cache, length: int, layers=None) -> None:
        """Cut the given layers' caches (all by default) back to `length` tokens."""
        for i in (range(len(cache.layers)) if layers is None else layers):
            extra = cache.layers[i].get_seq_length() - length
            if extra > 0:
                cache.layers[i].crop(-extra)

    # ---------------------------------------------------------------------------- whole model
    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache, position: int) -> torch.Tensor:
        """All layers + head: the same logits as the model's own forward. (T, V)."""
        return self.head(self.run_layers(self.embed(input_ids), 0, self.num_layers, cache, position))
