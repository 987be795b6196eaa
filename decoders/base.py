"""The decoder contract: one request in, one result out, and a registry of backends by name.

Every backend (standard, speculative, early-exit, hf, hf-assisted) implements
`Decoder.generate(request) -> GenerationResult`. The harness and the analysis only ever see these
two records; nothing outside `decoders/` knows how a backend works inside.

Backends are registered lazily as "module:Class" strings (as lm-eval does), so choosing `hf`
never imports the speculative code and vice versa.
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any


class DecoderError(ValueError):
    """Bad decoder input: unknown backend, bad option, prompt too long, NaN logits."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int = 64
    temperature: float = 0.0          # 0 means greedy
    top_k: int = 0                    # 0 disables
    top_p: float = 1.0                # 1.0 disables
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self):
        if len(self.prompt_ids) == 0:
            raise DecoderError("prompt is empty: give at least one token")
        if self.max_new_tokens < 1:
            raise DecoderError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise DecoderError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DecoderError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise DecoderError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Timing:
    wall_s: float                      # whole request, prefill included
    ttft_s: float                      # request start to first new token
    token_times_s: tuple[float, ...]   # per new token: time since the previous one (first = ttft)

    def as_dict(self) -> dict:
        return {"wall_s": self.wall_s, "ttft_s": self.ttft_s, "token_times_s": list(self.token_times_s)}


@dataclass(frozen=True)
class GenerationResult:
    tokens: tuple[int, ...]            # new token ids only
    text: str
    decoder: str
    finish_reason: str                 # "eos", "stop_string", "length"
    timing: Timing
    # Per generated step, top-1 minus top-2 raw target logit. The analysis uses the baseline's
    # margins to tell numerical near-ties from real divergences. Empty where a backend cannot see it.
    margins: tuple[float, ...] = ()
    stats: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "tokens": list(self.tokens),
            "text": self.text,
            "decoder": self.decoder,
            "finish_reason": self.finish_reason,
            "margins": list(self.margins),
            "stats": self.stats,
            "timing": self.timing.as_dict(),
        }


class Decoder:
    """Base class. Subclasses set `name` and implement `generate`.

    Constructed as `Cls(target, **options)` where `target` is a `harness.models.LoadedModel`-like
    object with `.model`, `.tokenizer`, `.device`, `.name`.
    """

    name = "?"

    def generate(self, request: GenerationRequest) -> GenerationResult:  # pragma: no cover
        raise NotImplementedError


_REGISTRY: dict[str, str] = {}


def register_decoder(name: str, target: str) -> None:
    """Register a backend as a lazy "module:Class" string. Duplicate names are refused."""
    if name in _REGISTRY and _REGISTRY[name] != target:
        raise DecoderError(f"decoder {name!r} is already registered as {_REGISTRY[name]}")
    _REGISTRY[name] = target


def decoder_names() -> list[str]:
    return sorted(_REGISTRY)


def get_decoder_class(name: str) -> type[Decoder]:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise DecoderError(f"unknown decoder {name!r}{hint} (known: {', '.join(decoder_names())})")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_decoder(name: str, target, **options) -> Decoder:
    return get_decoder_class(name)(target, **options)


register_decoder("standard", "decoders.standard:StandardDecoder")
register_decoder("speculative", "decoders.speculative:SpeculativeDecoder")
register_decoder("early-exit", "decoders.early_exit:EarlyExitDecoder")
register_decoder("hf", "decoders.hf:HFDecoder")
register_decoder("hf-assisted", "decoders.hf:HFAssistedDecoder")
