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
import operator
from dataclasses import dataclass, field
from typing import Any


class DecoderError(ValueError):
    """Bad decoder input: unknown backend, bad option, prompt too long, NaN logits."""


# Seeds are hashed as signed 64-bit integers (decoders.sampling.prompt_key), and engines read a
# negative seed as "pick one at random": only 0 <= seed < 2**63 is reproducible everywhere.
SEED_LIMIT = 2 ** 63
# Below this, logits / T overflow float32 to inf (and inf - inf = NaN): the shaped distribution
# is garbage, not the argmax. Greedy is temperature 0.
MIN_TEMPERATURE = 1e-6


def seed_problem(seed) -> str | None:
    """Why `seed` is not a usable seed, or None."""
    try:
        ok = not isinstance(seed, bool) and 0 <= operator.index(seed) < SEED_LIMIT  # numpy ints too
    except TypeError:
        ok = False
    return None if ok else f"seed must be an integer in [0, 2**63), got {seed!r}"


def temperature_problem(temperature) -> str | None:
    """Why `temperature` is not a usable temperature, or None."""
    if not temperature >= 0:
        return f"temperature must be >= 0, got {temperature}"
    if temperature == float("inf"):  # sampling from a uniform distribution tests nothing of the model
        return f"temperature must be finite, got {temperature}"
    if 0 < temperature < MIN_TEMPERATURE:
        return (f"temperature {temperature:g} is too small to sample with (logits / T overflow): use "
                f"0 for greedy decoding, or a temperature >= {MIN_TEMPERATURE:g}")
    return None


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
    # The chat messages the prompt was rendered from, for backends that must send messages
    # (an engine's chat route) rather than `prompt_ids`. Every other backend ignores them.
    messages: tuple = ()

    def __post_init__(self):
        if len(self.prompt_ids) == 0:
            raise DecoderError("prompt is empty: give at least one token")
        if self.max_new_tokens < 1:
            raise DecoderError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        problem = temperature_problem(self.temperature) or seed_problem(self.seed)
        if problem:
            raise DecoderError(problem)
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

    def reuse_prefill(self, on: bool) -> None:
        """Let a request whose prompt equals the previous request's skip its prefill, with the
        same logits and cache it would compute (decoders/kv.py). Off by default, since a skipped
        prefill takes no time; the exactness windows turn it on. Backends without it ignore it."""

    def generate_many(self, requests):
        """Yield `(index, result)` for each request as it finishes, or `(index, DecoderError)`
        for a request that failed on its own. The default runs them one after another; engine
        backends keep several in flight. Any other exception ends the call (the runner makes
        it the decoder's failure, named with its item: harness.run.faults)."""
        for i, request in enumerate(requests):
            try:
                yield i, self.generate(request)
            except DecoderError as e:
                yield i, e


_REGISTRY: dict[str, str] = {}


def register_decoder(name: str, target: str) -> None:
    """Register a backend as a lazy "module:Class" string. Duplicate names are refused."""
    if name in _REGISTRY and _REGISTRY[name] != target:
        raise DecoderError(f"decoder {name!r} is already registered as {_REGISTRY[name]}")
    _REGISTRY[name] = target


def decoder_names() -> list[str]:
    return sorted(_REGISTRY)


ENTRY_POINT_GROUP = "decodegate.decoders"


def _entry_points() -> None:
    """Decoders other packages register under the `decodegate.decoders` entry-point group
    (`name = "package.module:Class"`): recorded as lazy strings, imported only when chosen."""
    from importlib.metadata import entry_points
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _REGISTRY.setdefault(ep.name, ep.value)


def _load(target: str, name: str) -> type[Decoder]:
    module, _, cls = target.partition(":")
    try:
        obj = getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as e:
        raise DecoderError(f"decoder {name!r}: cannot import module {module!r} ({e})") from None
    except AttributeError:
        raise DecoderError(f"decoder {name!r}: module {module!r} has no class {cls!r}") from None
    if not (isinstance(obj, type) and callable(getattr(obj, "generate", None))):
        raise DecoderError(f"decoder {name!r}: {target} is not a decoder class (it needs a generate method)")
    return obj


def get_decoder_class(name: str) -> type[Decoder]:
    """A registered name, an entry point, or "package.module:Class" (a decoder of one's own)."""
    if name not in _REGISTRY:
        _entry_points()
    if name not in _REGISTRY:
        if ":" in name and "." not in name.split(":", 1)[1]:
            return _load(name, name)
        close = difflib.get_close_matches(name, _REGISTRY, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise DecoderError(f"unknown decoder {name!r}{hint} (known: {', '.join(decoder_names())}; "
                           f"or a class of your own as \"package.module:Class\")")
    return _load(_REGISTRY[name], name)


def is_builtin(name: str) -> bool:
    """A decoder that ships with decodegate (its code is decodegate's, not a team's)."""
    return _REGISTRY.get(name, "").startswith("decoders.")


def make_decoder(name: str, target, **options) -> Decoder:
    return get_decoder_class(name)(target, **options)


register_decoder("standard", "decoders.standard:StandardDecoder")
register_decoder("speculative", "decoders.speculative:SpeculativeDecoder")
register_decoder("early-exit", "decoders.early_exit:EarlyExitDecoder")
register_decoder("hf", "decoders.hf:HFDecoder")
register_decoder("hf-assisted", "decoders.hf:HFAssistedDecoder")
register_decoder("llama.cpp", "decoders.engines.llamacpp:LlamaCppDecoder")
register_decoder("openai", "decoders.engines.openai_compat:OpenAICompletionsDecoder")
register_decoder("openai-chat", "decoders.engines.openai_compat:OpenAIChatDecoder")
register_decoder("vllm", "decoders.engines.openai_compat:VLLMDecoder")
register_decoder("sglang", "decoders.engines.sglang:SGLangDecoder")
