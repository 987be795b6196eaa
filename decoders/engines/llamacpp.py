"""llama.cpp's server through its native `/completion` route (streamed, token ids in and out).

Why the native route: it takes the prompt as token ids, returns the generated ids
(`return_tokens`), the top-2 raw logprobs per token (`n_probs: 2`, `post_sampling_probs: false`)
and, per request, how many tokens were drafted and accepted (`timings.draft_n`,
`timings.draft_n_accepted`; absent when nothing was drafted). Every sampler llama.cpp would apply
by default (top-k 40, min-p 0.05, repetition penalties, DRY, XTC, ...) is switched off or set
to the request's value, so "temperature 0.7, top-p 0.95" means what it means in-process.
Tokens that arrive as accepted drafts carry no probabilities in this build; their margins are
left unknown (the analysis reads the baseline's margins, and the baseline does not draft).
"""
from __future__ import annotations

from typing import AsyncIterator

import httpx

from decoders.base import GenerationRequest
from decoders.engines.client import EngineDecoder, EngineRequestError, Piece, sse_json, top2_gap

STOP_TYPES = {"eos": "eos", "word": "stop_string", "limit": "length"}


def completion_body(request: GenerationRequest, extra: dict) -> dict:
    body = {
        "prompt": list(request.prompt_ids),
        "n_predict": request.max_new_tokens,
        "temperature": request.temperature,
        "top_k": request.top_k,                # 0: off, as in-process
        "top_p": request.top_p,
        # The in-process order (decoders.sampling.shape_logits): temperature, then top-k, then top-p
        # on the tempered softmax. llama.cpp's own default puts top-p before temperature, which
        # draws from another nucleus at T != 1.
        "samplers": ["top_k", "temperature", "top_p"],
        "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0,
        "seed": request.seed,
        "stop": list(request.stop_strings),
        "return_tokens": True,
        "n_probs": 2,
        "post_sampling_probs": False,
        # A reused prompt cache changes the batch shapes the prompt is computed with, and so the
        # numerics: off by default, so a rerun sees the same logits (`extra` may turn it on).
        "cache_prompt": False,
        "stream": True,
    }
    body.update(extra)
    return body


def parse_chunk(data: dict) -> Piece:
    """One streamed `/completion` event -> the tokens and margins it adds."""
    tokens = [int(t) for t in data.get("tokens") or []]
    probs = data.get("completion_probabilities") or []
    # Probabilities come, in order, for the tokens the target sampled itself; accepted drafts
    # have none, so a position is matched only where the ids agree.
    margins = [top2_gap([t.get("logprob") for t in probs[i].get("top_logprobs") or []])
               if i < len(probs) and int(probs[i].get("id", -1)) == tok else None
               for i, tok in enumerate(tokens)]
    piece = Piece(tokens=tokens, margins=margins, text=data.get("content") or "")
    if data.get("stop"):
        piece.finish_reason = STOP_TYPES.get(data.get("stop_type", ""), None)
        piece.final = {k: data[k] for k in ("timings", "stop_type", "truncated", "tokens_evaluated") if k in data}
    return piece


def telemetry_from_timings(final: dict) -> dict:
    timings = final.get("timings") or {}
    if "draft_n" not in timings:
        return {}
    return {"proposed": int(timings["draft_n"]), "accepted": int(timings.get("draft_n_accepted", 0)),
            "telemetry": "per-request"}


# The flag that bounds the draft length, per speculation type (this build's names).
DRAFT_LENGTH_FLAGS = ("--spec-draft-n-max", "--spec-ngram-simple-size-m", "--spec-ngram-map-k-size-m",
                      "--spec-ngram-map-k4v-size-m", "--spec-ngram-mod-n-max")


def draft_length_from_flags(command: list[str]) -> int | None:
    """K from a launch command, when /props does not say it (this build does not)."""
    for i, arg in enumerate(command[:-1]):
        if arg in DRAFT_LENGTH_FLAGS:
            try:
                return int(command[i + 1])
            except ValueError:
                return None
    return None


class LlamaCppDecoder(EngineDecoder):
    name = "llama.cpp"
    flavour = "llama.cpp /completion"
    needs = "llama.cpp returns probabilities with n_probs > 0 (this backend sends n_probs = 2)"

    def __init__(self, target, **options):
        super().__init__(target, **options)
        spec = self.server.info.get("speculative") or {}
        self.k = (self.extra.get("speculative.n_max") or spec.get("speculative.n_max")
                  or draft_length_from_flags(self.server.command))
        from decoders.engines.client import check_served
        check_served(self)

    def prompt_logprobs(self, context: list[int], tokens: list[int], k: int) -> list[dict[int, float]]:
        """The engine's top-k raw logprobs (log-softmax of the logits, no sampler applied) at each
        position of `tokens` continuing `context`. This server returns no prompt logprobs, so it
        is one `n_predict: 1` request per position, in order, with the prompt cache on: each
        request extends the previous one's KV cache by one token."""
        out = []
        for t in range(len(tokens)):
            prompt = list(context) + list(tokens[:t])
            # A greedy next token that is part of a UTF-8 character comes back without its
            # probabilities until the character completes: then ask for a few more tokens.
            for n_predict in (1, 4):
                body = {"prompt": prompt, "n_predict": n_predict, "n_probs": int(k), "post_sampling_probs": False,
                        "temperature": 0.0, "cache_prompt": True, "return_tokens": True, "stream": False}
                data = self.server.post_json("/completion", body, timeout=self.timeout)
                probs = data.get("completion_probabilities") or []
                if probs:
                    break
            else:
                shown = {key: data[key] for key in ("error", "content", "tokens", "stop_type", "truncated")
                         if key in data}
                raise EngineRequestError(f"engine {self.server.spec.name!r} returned no probabilities for a "
                                         f"{len(prompt)}-token prompt (n_probs = {k}): {shown}")
            out.append({int(e["id"]): float(e["logprob"]) for e in probs[0].get("top_logprobs") or []})
        return out

    def tokenize(self, text: str) -> list[int]:
        body = self.server.post_json("/tokenize", {"content": text, "add_special": False, "parse_special": True})
        return [int(t) for t in body["tokens"]]

    async def stream(self, http: httpx.AsyncClient, request: GenerationRequest) -> AsyncIterator[Piece]:
        url = self.url("/completion")
        async for data in sse_json(http, url, completion_body(request, self.extra)):
            if "error" in data:
                err = data["error"]   # a dict from llama.cpp; text where the event's data was not JSON
                code = err.get("code", 500) if isinstance(err, dict) else 500
                raise httpx.HTTPStatusError(str(err), request=httpx.Request("POST", url),
                                            response=httpx.Response(int(code) if isinstance(code, int) else 500,
                                                                    text=str(err)))
            yield parse_chunk(data)

    def telemetry(self, final: dict) -> dict:
        stats = telemetry_from_timings(final)
        if self.k:
            # Speculation is on: a request with nothing drafted (llama.cpp then omits draft_n)
            # proposed zero tokens, which the acceptance statistics must count too.
            stats = {"proposed": 0, "accepted": 0, "telemetry": "per-request", **stats, "k": int(self.k)}
        return stats
