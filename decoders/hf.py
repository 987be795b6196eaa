"""`hf` and `hf-assisted`: transformers' own `generate`, kept as the reference peers.

They return the same result record as our backends. Per-token times come from a streamer;
forward counts from forward hooks on the target and the assistant (transformers exposes no
acceptance counts, so `accepted` is inferred as emitted tokens minus target forwards).
Sampling here uses torch's global generator seeded with the request seed, so it is reproducible
but not token-identical to our keyed-noise sampling: compare it by distribution, not by identity.
"""
from __future__ import annotations

import contextlib
import time

import torch

from decoders.base import Decoder, DecoderError, GenerationRequest, GenerationResult, Timing
from decoders.common import check_prompt_fits, reject_options, sync
from decoders.sampling import check_finite


class _Clock:
    """A streamer that only reads the clock: transformers calls put() with the prompt, then with
    each accepted token (several at once under assisted generation)."""

    def __init__(self):
        self.stamps: list[tuple[float, int]] = []
        self.seen_prompt = False

    def put(self, value):
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.stamps.append((time.perf_counter(), int(value.numel())))

    def end(self):
        pass


@contextlib.contextmanager
def _count_forwards(module):
    counter = [0]
    handle = module.register_forward_pre_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    try:
        yield counter
    finally:
        handle.remove()


class _FiniteCheck:
    """A logits processor that stops generation on NaN/inf logits, as our own loops do."""

    def __call__(self, input_ids, scores):
        check_finite(scores, f"generated token {input_ids.shape[1]}")
        return scores


class HFDecoder(Decoder):
    name = "hf"

    def __init__(self, target, **options):
        reject_options(self.name, options)
        self.target = target

    def _config(self, request: GenerationRequest, max_new: int):
        from transformers import GenerationConfig
        tok = self.target.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else (request.stop_token_ids or [0])[0]
        cfg = GenerationConfig(
            max_new_tokens=max_new, do_sample=not request.greedy, pad_token_id=pad,
            eos_token_id=list(request.stop_token_ids) or None,
            stop_strings=list(request.stop_strings) or None,
        )
        if not request.greedy:
            # Set even when off: a field left None is filled from the model's generation_config,
            # then from transformers' defaults (top_k = 50), and the samples would come from a
            # truncated distribution. top_k = 0 and top_p = 1.0 are "off" in transformers.
            cfg.temperature = request.temperature
            cfg.top_k = request.top_k or 0
            cfg.top_p = request.top_p
        return cfg

    def _extra(self, request: GenerationRequest) -> dict:
        return {}

    @torch.inference_mode()
    def generate(self, request: GenerationRequest) -> GenerationResult:
        model, device = self.target.model, self.target.device
        max_new = check_prompt_fits(model, request)
        ids = torch.tensor([request.prompt_ids], device=device)
        clock = _Clock()
        from transformers import LogitsProcessorList
        kwargs = dict(generation_config=self._config(request, max_new), streamer=clock,
                      attention_mask=torch.ones_like(ids), logits_processor=LogitsProcessorList([_FiniteCheck()]))
        if request.stop_strings:
            kwargs["tokenizer"] = self.target.tokenizer
        if not request.greedy:
            torch.manual_seed(request.seed)
        with self._context(request, kwargs), _count_forwards(model) as target_calls, \
                self._draft_counter() as draft_calls:
            t0 = time.perf_counter()
            out = model.generate(ids, **kwargs)
            sync(device)
            wall = time.perf_counter() - t0
        tokens = out[0, ids.shape[1]:].tolist()
        # Spread each streamed block's time over its tokens.
        times, prev = [], t0
        for stamp, n in clock.stamps:
            times += [(stamp - prev) / n] * n
            prev = stamp
        times = times[:len(tokens)]
        text = self.target.tokenizer.decode(tokens, skip_special_tokens=True)
        finish = "length"
        if tokens and tokens[-1] in request.stop_token_ids:
            finish = "eos"
        elif request.stop_strings and any(s in text for s in request.stop_strings):
            finish = "stop_string"
            text = text[:min(text.find(s) for s in request.stop_strings if s in text)]
        stats = {"target_forwards": target_calls[0], "draft_forwards": draft_calls[0], "fallbacks": 0}
        stats.update(self._acceptance(len(tokens), target_calls[0]))
        return GenerationResult(
            tokens=tuple(tokens), text=text, decoder=self.name, finish_reason=finish,
            timing=Timing(wall_s=wall, ttft_s=times[0] if times else wall, token_times_s=tuple(times)),
            stats=stats)

    # Hooks for the assisted variant.
    def _context(self, request, kwargs):
        return contextlib.nullcontext()

    def _draft_counter(self):
        return contextlib.nullcontext([0])

    def _acceptance(self, n_tokens: int, target_forwards: int) -> dict:
        return {"proposed": 0, "accepted": 0}


class HFAssistedDecoder(HFDecoder):
    """`generate` with `assistant_model` (a draft model) or `prompt_lookup_num_tokens`.

    Options: draft = a loaded model (with `.model`) or "prompt-lookup"; k = draft length, held
    constant (transformers' default schedule changes K; a fixed K makes the comparison with our
    `speculative` fair).
    """

    name = "hf-assisted"

    def __init__(self, target, draft=None, k: int = 4, **options):
        reject_options(self.name, options)
        if draft is None:
            raise DecoderError("hf-assisted needs a draft: a model or 'prompt-lookup'")
        if int(k) < 1:
            raise DecoderError(f"k must be >= 1, got {k}")
        if isinstance(draft, str) and draft != "prompt-lookup" and not draft.startswith("self:"):
            raise DecoderError(f"hf-assisted supports a draft model, 'prompt-lookup' or 'self:L', not {draft!r}")
        if isinstance(draft, str) and draft.startswith("self:"):
            try:
                layers = int(draft[5:])
            except ValueError:
                raise DecoderError(f"self-draft must be self:L with an integer L, got {draft!r}") from None
            n = target.model.config.num_hidden_layers
            if not 1 <= layers < n:
                raise DecoderError(f"self-draft layer must be in [1, {n}), got {layers}")
        if not isinstance(draft, str):
            from decoders.drafters import check_tokenizers
            check_tokenizers(target.tokenizer, draft.tokenizer)
        self.target, self.draft, self.k = target, draft, int(k)

    @contextlib.contextmanager
    def _context(self, request, kwargs):
        if self.draft == "prompt-lookup":
            kwargs["generation_config"].prompt_lookup_num_tokens = self.k
            yield
            return
        if isinstance(self.draft, str):  # self:L, transformers' LayerSkip-style early-exit assistant
            kwargs["generation_config"].assistant_early_exit = int(self.draft[5:])
            kwargs["generation_config"].num_assistant_tokens = self.k
            kwargs["generation_config"].num_assistant_tokens_schedule = "constant"
            kwargs["generation_config"].assistant_confidence_threshold = 0.0
            yield
            return
        kwargs["assistant_model"] = self.draft.model
        gc = self.draft.model.generation_config
        saved = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold)
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = \
            self.k, "constant", 0.0
        try:
            yield
        finally:  # the draft model is shared: restore what we changed
            gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = saved

    def _draft_counter(self):
        if isinstance(self.draft, str):
            return contextlib.nullcontext([0])
        return _count_forwards(self.draft.model)

    def _acceptance(self, n_tokens: int, target_forwards: int) -> dict:
        # Every target forward after prefill verifies one block and emits accepted + 1 tokens.
        accepted = max(0, n_tokens - target_forwards)
        return {"accepted": accepted, "tau": n_tokens / max(1, target_forwards)}
