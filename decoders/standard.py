"""`standard`: plain KV-cached autoregressive decoding, built from the shared primitives.

This is the baseline every other backend is measured against, and the loop the speculative and
early-exit backends reuse pieces of. It is deliberately its own loop, not `model.generate`.
"""
from __future__ import annotations

import torch

from decoders.base import Decoder, GenerationRequest, GenerationResult
from decoders.common import Emitter, check_prompt_fits, forward, new_cache, reject_options, sync
from decoders.sampling import check_finite, choose, prompt_key, top2_margin


class StandardDecoder(Decoder):
    name = "standard"

    def __init__(self, target, **options):
        reject_options(self.name, options)
        self.target = target

    @torch.inference_mode()
    def generate(self, request: GenerationRequest) -> GenerationResult:
        model, device = self.target.model, self.target.device
        out = Emitter(request, self.target.tokenizer, check_prompt_fits(model, request))
        key = prompt_key(request.seed, request.prompt_ids)
        cache = new_cache(model)
        position = len(request.prompt_ids)          # absolute position of the next new token
        logits = forward(model, torch.tensor([request.prompt_ids], device=device), cache)  # (1, V)
        forwards = 1
        while True:
            check_finite(logits, f"position {position}")
            token = int(choose(logits, request, key, [position])[0])
            if out.emit(token, float(top2_margin(logits[0]))):
                break
            logits = forward(model, torch.tensor([[token]], device=device), cache)
            forwards += 1
            position += 1
        sync(device)
        return out.result(self.name, {"target_forwards": forwards, "draft_forwards": 0,
                                      "proposed": 0, "accepted": 0, "fallbacks": 0})
