"""`standard`: plain KV-cached autoregressive decoding, built from the shared primitives.

This is the baseline every other backend is measured against, and the loop the speculative and
early-exit backends reuse pieces of. It is deliberately its own loop, not `model.generate`.

Options: `cache` ("static": preallocated, the default; "dynamic": transformers' growing cache,
the previous behaviour) and `compile` (torch.compile the one-token step; the eager step stays
the reference, and tests hold both to the same tokens). A step reads the device once: the
token and its margin, which the stopping rule needs.
"""
from __future__ import annotations

import torch

from decoders.base import Decoder, GenerationRequest, GenerationResult
from decoders.common import (Emitter, check_prompt_fits, forward, pick_and_margin, reject_options, scope,
                             step_function, sync)
from decoders.kv import DEFAULT_CACHE, CachePool, request_capacity
from decoders.sampling import prompt_key


class StandardDecoder(Decoder):
    name = "standard"

    def __init__(self, target, cache: str = DEFAULT_CACHE, compile: bool = False, **options):
        reject_options(self.name, options)
        self.target = target
        self.pool = CachePool(target.model, cache)
        self.step = step_function(target.model, compile)

    def reuse_prefill(self, on: bool) -> None:
        self.pool.reuse_prefill = bool(on)

    @torch.inference_mode()
    def generate(self, request: GenerationRequest) -> GenerationResult:
        model, device = self.target.model, self.target.device
        out = Emitter(request, self.target.tokenizer, check_prompt_fits(model, request))
        key = prompt_key(request.seed, request.prompt_ids)
        capacity = request_capacity(model, len(request.prompt_ids), out.max_new)
        position = len(request.prompt_ids)          # absolute position of the next new token
        with scope("prefill"):
            kept = self.pool.prefilled(request.prompt_ids, capacity)
            if kept is not None:
                cache, logits = kept
            else:
                cache = self.pool.new(capacity)
                logits = forward(model, torch.tensor([request.prompt_ids], device=device), cache)  # (1, V)
                self.pool.remember(request.prompt_ids, logits)
        forwards = 1
        while True:
            with scope("sampling"):
                token, margin = pick_and_margin(logits, request, key, position, f"position {position}")
            if out.emit(token, margin):
                break
            logits = self.step(torch.tensor([[token]], device=device), cache)
            forwards += 1
            position += 1
        sync(device)
        return out.result(self.name, {"target_forwards": forwards, "draft_forwards": 0,
                                      "proposed": 0, "accepted": 0, "fallbacks": 0})
