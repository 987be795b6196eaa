"""Pieces every hand-written backend shares: the cached forward, context checks, and the
`Emitter` that turns accepted tokens into a result (stopping rules, per-token times, margins).
"""
from __future__ import annotations

import functools
import inspect
import time

import torch

from decoders.base import DecoderError, GenerationRequest, GenerationResult, Timing
from decoders.context import context_length
from decoders.lean import runner as lean_runner
from decoders.scopes import profiling_scopes, scope  # noqa: F401  (shared by the backends)


def check_prompt_fits(model, request: GenerationRequest) -> int:
    """Raise when the prompt alone fills the context; return how many new tokens fit."""
    limit = context_length(model)
    n = len(request.prompt_ids)
    if limit is None:
        return request.max_new_tokens
    if n >= limit:
        raise DecoderError(f"prompt is {n} tokens but the model's context is {limit}: "
                           f"shorten the prompt to at most {limit - 1} tokens")
    return min(request.max_new_tokens, limit - n)


def new_cache(model):
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


def rollback(cache, length: int) -> None:
    """Cut a KV cache back to `length` tokens (transformers 5: crop takes a negative count)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def cache_kwarg(model) -> str:
    """transformers >= 5.2x renamed `past_key_values` to `cache`; accept both."""
    return _cache_kwarg(type(model))


@functools.lru_cache(maxsize=None)
def _cache_kwarg(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


@torch.inference_mode()
def forward(model, input_ids: torch.Tensor, cache, n_logits: int = 1) -> torch.Tensor:
    """Run `input_ids` (1, T) through the model on top of `cache`; logits of the last n_logits
    positions, (n_logits, V). logits_to_keep avoids the LM head on the rest of a prefill.
    A one-token step or a K+1 block of a Llama-style model on a CPU goes through `decoders.lean`
    (the same logits, bit for bit, without transformers' per-module overhead)."""
    step = lean_runner(model)  # also lays out the weights of a model loaded elsewhere, before its first forward
    if step is not None and step.accepts(cache, input_ids.shape[1]):
        return step(input_ids, cache, n_logits)
    kw = {cache_kwarg(model): cache}
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=n_logits, **kw)
    return out.logits[0]


def pick_and_margin(logits: torch.Tensor, request: GenerationRequest, key: int, position: int,
                    where: str) -> tuple[int, float]:
    """`standard`'s choice at one position and the top-2 margin of logits (1, V), read from the
    device in one transfer (the finiteness check rides along): the only host sync of a step,
    and the one the stopping rule needs. Same token as `sampling.choose`, same margin as
    `sampling.top2_margin`, same error as `sampling.check_finite`."""
    from decoders.sampling import check_finite, choose, top2_margin
    if logits.device.type == "cpu":
        # On a CPU a read costs nothing, and packing the three into one costs more operators
        # than it saves (measured: ~+50% on a 259-token vocabulary): read them one by one.
        check_finite(logits, where)
        return int(choose(logits, request, key, [position])[0]), float(top2_margin(logits[0]))
    return pick_and_margin_one_read(logits, request, key, position, where)


def pick_and_margin_one_read(logits, request, key, position, where) -> tuple[int, float]:
    """`pick_and_margin` as one device-to-host transfer (the path on accelerators)."""
    from decoders.sampling import check_finite, choose
    row = logits[0]
    top = torch.topk(row.float(), 2).values
    token = choose(logits, request, key, [position])[0]
    finite = torch.isfinite(row).all()
    token_f, margin, ok = torch.stack([token.to(top.dtype), top[0] - top[1], finite.to(top.dtype)]).tolist()
    if not ok:
        check_finite(logits, where)  # raises with the NaN / inf wording
    return int(token_f), margin


_COMPILED: "weakref.WeakKeyDictionary" = None


def step_function(model, compile: bool = False):
    """The one-token decode step `(input_ids (1, 1), cache) -> logits (1, V)`: `forward`, or
    with `compile` that forward through `torch.compile` (once per model, shapes dynamic, so a
    growing cache does not recompile). Prefill and multi-token verification stay eager."""
    if not compile:
        return functools.partial(forward, model)
    global _COMPILED
    import weakref
    if _COMPILED is None:
        _COMPILED = weakref.WeakKeyDictionary()
    if model not in _COMPILED:
        kw = cache_kwarg(model)

        def step(input_ids, cache):
            return model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{kw: cache}).logits[0]
        _COMPILED[model] = torch.compile(step, dynamic=True)
    compiled = _COMPILED[model]

    @torch.inference_mode()
    def run(input_ids, cache):
        return compiled(input_ids, cache)
    return run


def sync(device) -> None:
    # Read clocks only after queued device work has finished.
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()


class Emitter:
    """Collects new tokens for one request and decides when to stop.

    Tokens are kept up to and including the one that triggered a stop (as transformers does),
    so token sequences from different backends are comparable.
    """

    def __init__(self, request: GenerationRequest, tokenizer, max_new_tokens: int):
        self.request = request
        self.tokenizer = tokenizer
        self.max_new = max_new_tokens
        self.tokens: list[int] = []
        self.margins: list[float] = []
        self.stamps: list[float] = []
        self.stop_ids = set(request.stop_token_ids)
        # In UTF-8 bytes: a token holds at least one byte, so a stop string of n bytes spans at
        # most n tokens (an emoji split into byte tokens spans 4 for one character).
        self.longest_stop = max((len(s.encode("utf-8")) for s in request.stop_strings), default=0)
        self.finish_reason: str | None = None
        self.t0 = time.perf_counter()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return self.max_new - len(self.tokens)

    def emit(self, token: int, margin: float | None = None, at: float | None = None) -> bool:
        """Append one token; returns True when generation must stop here. `at`: when the token
        arrived (a streamed engine's chunk time; default now)."""
        self.tokens.append(int(token))
        self.margins.append(float("nan") if margin is None else float(margin))
        self.stamps.append(time.perf_counter() if at is None else at)
        if token in self.stop_ids:
            self.finish_reason = "eos"
        elif self.longest_stop and self._hit_stop_string():
            self.finish_reason = "stop_string"
        elif len(self.tokens) >= self.max_new:
            self.finish_reason = "length"
        return self.done

    def _hit_stop_string(self) -> bool:
        # A stop string spans at most longest_stop tokens; decode a tail a little longer than that
        # (a tokenizer may drop a leading space from the first token it decodes).
        tail = self.tokenizer.decode(self.tokens[-(self.longest_stop + 2):], skip_special_tokens=False)
        return any(s in tail for s in self.request.stop_strings)

    def text(self) -> str:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if self.finish_reason == "stop_string":
            cut = min((i for i in (text.find(s) for s in self.request.stop_strings) if i >= 0), default=-1)
            if cut >= 0:
                text = text[:cut]
        return text

    def result(self, decoder: str, stats: dict) -> GenerationResult:
        end = self.stamps[-1] if self.stamps else time.perf_counter()
        times = [b - a for a, b in zip([self.t0] + self.stamps[:-1], self.stamps)]
        return GenerationResult(
            tokens=tuple(self.tokens),
            text=self.text(),
            decoder=decoder,
            finish_reason=self.finish_reason or "length",
            timing=Timing(wall_s=end - self.t0, ttft_s=times[0] if times else 0.0, token_times_s=tuple(times)),
            margins=tuple(self.margins),
            stats=stats,
        )


def reject_options(decoder: str, options: dict) -> None:
    if options:
        raise DecoderError(f"decoder {decoder!r} takes no option(s) {', '.join(sorted(options))}")
