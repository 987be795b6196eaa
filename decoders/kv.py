"""KV caches for the hand-written decoders: transformers' growing `DynamicCache`, or a
preallocated one whose rollback is a length change (gpt-fast's cache, written by position).

`PreallocatedLayer` is a `DynamicLayer` (so the model's mask and attention code treat it exactly
as the default cache) whose keys and values live in buffers sized once per request: a step
writes its new entries in place at [length, length + T) and attention reads the view [:length];
rolling back after a rejected draft only lowers `length`, nothing is copied or cropped, and the
next step overwrites the stale entries. The views hold the same values in the same shapes as
`DynamicCache`'s concatenated tensors, so logits are bit-identical to it (tests/test_kv.py).
Lengths are Python ints: reading one never waits for the device.

The buffers of a finished request are kept by a `CachePool` (one per decoder and model) and
handed to the next request when they are large enough, so a request allocates nothing in the
common case. A write past the capacity grows the buffers (a copy), which only happens when the
capacity given was too small: correctness never depends on it.

A pool can also hand back the previous request's prompt (`prefilled`, off unless
`reuse_prefill` is set): a request never writes below its prompt's length, so when the next
request has the same prompt its keys and values still sit at [0, len(prompt)) of the buffers, and
the prefill's logits were kept. Many samples of one context (the exactness windows) then pay one
prefill. It is opt-in because it changes what a prefill time measures.

Kinds: "static" (this cache, the default) and "dynamic" (transformers' `DynamicCache`, the
previous behaviour, kept selectable so that both can be measured side by side).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from decoders.base import DecoderError
from decoders.context import context_length

CACHE_KINDS = ("static", "dynamic")
DEFAULT_CACHE = "static"


def check_cache_kind(kind: str) -> str:
    if kind not in CACHE_KINDS:
        raise DecoderError(f"cache must be one of {', '.join(CACHE_KINDS)}, got {kind!r}")
    return kind


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in preallocated buffers (1, KV heads, capacity, D)."""

    def __init__(self, capacity: int, buffers=None):
        super().__init__()
        self.capacity = max(int(capacity), 1)
        self.length = 0
        self._k, self._v = buffers if buffers is not None else (None, None)
        if self._k is not None:
            self.capacity = self._k.shape[-2]

    # `keys` / `values` are what readers of a transformers cache look at: the valid prefix.
    @property
    def keys(self):
        return None if self._k is None else self._k[:, :, :self.length]

    @keys.setter
    def keys(self, value):  # DynamicLayer.__init__ assigns None; nothing else may write here
        if value is not None:
            raise AttributeError("a preallocated cache layer is written through update() only")

    @property
    def values(self):
        return None if self._v is None else self._v[:, :, :self.length]

    @values.setter
    def values(self, value):
        if value is not None:
            raise AttributeError("a preallocated cache layer is written through update() only")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        fits = (self._k is not None and self._k.shape[:2] == key_states.shape[:2]
                and self._k.shape[-1] == key_states.shape[-1] and self._k.dtype == key_states.dtype
                and self._k.device == key_states.device and self._v.shape[-1] == value_states.shape[-1])
        if not fits:
            b, h = key_states.shape[:2]
            self._k = key_states.new_empty((b, h, self.capacity, key_states.shape[-1]))
            self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self._k.shape[-2]:
            self._grow(end)
        # narrow: one view operator where [:, :, a:b] is three (a decode step makes 120 of these)
        self._k.narrow(2, start, end - start).copy_(key_states)
        self._v.narrow(2, start, end - start).copy_(value_states)
        self.length = end
        return self._k.narrow(2, 0, end), self._v.narrow(2, 0, end)

    def _grow(self, need: int) -> None:
        # Only when the capacity given was too small: double, copy the valid prefix.
        size = max(need, 2 * self._k.shape[-2])
        k = self._k.new_empty((*self._k.shape[:2], size, self._k.shape[-1]))
        v = self._v.new_empty((*self._v.shape[:2], size, self._v.shape[-1]))
        k[:, :, :self.length].copy_(self._k[:, :, :self.length])
        v[:, :, :self.length].copy_(self._v[:, :, :self.length])
        self._k, self._v, self.capacity = k, v, size

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last `-tokens_to_remove` entries (transformers' convention: a negative
        count). A length change: the buffers stay where they are."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self.length = 0

    def buffers(self):
        return (self._k, self._v) if self._k is not None else None


class PreallocatedCache(Cache):
    """A transformers `Cache` of `PreallocatedLayer`s, one per model layer."""

    def __init__(self, num_layers: int, capacity: int, buffers=None):
        buffers = buffers or [None] * num_layers
        super().__init__(layers=[PreallocatedLayer(capacity, b) for b in buffers])

    def buffers(self) -> list:
        return [layer.buffers() for layer in self.layers]


class CachePool:
    """Hands out caches for one model, reusing the buffers of the previous request when they are
    large enough. One request at a time (a decoder's `generate` is not re-entrant)."""

    def __init__(self, model, kind: str = DEFAULT_CACHE):
        self.model, self.kind = model, check_cache_kind(kind)
        self.num_layers = int(model.config.num_hidden_layers)
        self._last: PreallocatedCache | None = None
        self.reuse_prefill = False
        self._prompt: tuple | None = None  # the prompt whose keys and values _last's buffers hold
        self._logits: torch.Tensor | None = None

    def new(self, capacity: int, private: bool = False):
        """An empty cache for a request that will hold at most `capacity` tokens. `private`: a
        cache handed out of the decoder (for forensics) whose buffers no later request reuses."""
        if self.kind == "dynamic":
            return DynamicCache(config=self.model.config)
        last = self._last
        reuse = None
        if last is not None and not private:
            bufs = last.buffers()
            if all(b is not None and b[0].shape[-2] >= capacity for b in bufs):
                reuse = bufs
        cache = PreallocatedCache(self.num_layers, capacity, reuse)
        if not private:
            self._last, self._prompt, self._logits = cache, None, None  # the prompt will be overwritten
        return cache

    def prefilled(self, prompt_ids, capacity: int):
        """(cache holding `prompt_ids`, the prefill's logits) when reuse is on and the previous
        request prefilled the same prompt into buffers large enough; else None."""
        prompt = tuple(prompt_ids)
        if not self.reuse_prefill or self._prompt != prompt:
            return None
        bufs = self._last.buffers()
        if not all(b is not None and b[0].shape[-2] >= capacity for b in bufs):
            return None
        cache = PreallocatedCache(self.num_layers, capacity, bufs)
        for layer in cache.layers:
            layer.length, layer.device, layer.is_initialized = len(prompt), layer._k.device, True
        self._last = cache
        return cache, self._logits.clone()

    def remember(self, prompt_ids, logits: torch.Tensor) -> None:
        """Note that the cache just handed out holds `prompt_ids`, prefilled to `logits`."""
        if self.reuse_prefill and self.kind == "static":
            self._prompt, self._logits = tuple(prompt_ids), logits.clone()


def request_capacity(model, prompt_len: int, new_tokens: int, lookahead: int = 0) -> int:
    """Tokens a request's cache can hold at most: the prompt, the new tokens, and the draft
    tokens a speculative round may score beyond them; never more than the model's context."""
    need = prompt_len + new_tokens + lookahead + 1
    limit = context_length(model)
    return min(need, limit) if limit else need
