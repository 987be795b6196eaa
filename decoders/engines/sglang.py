"""SGLang's native `/generate` route (httpx, streamed), token ids in and out.

Request: `input_ids`, `sampling_params` (temperature, top_p, top_k, stop, max_new_tokens,
sampling_seed), `return_logprob: true`, `top_logprobs_num: 2`, `stream: true`. Each streamed
event carries `meta_info` with the output so far: `output_token_logprobs` as
[logprob, token_id, text] triples and `output_top_logprobs` as one list of such triples per
position (SGLang streams these cumulatively by default: this parser takes the part it has not
seen yet). `meta_info.spec_verify_ct` counts the target's verify forwards of the request, so
τ = completion_tokens / spec_verify_ct; the drafted-token count needs the draft length, which is
SGLang's `--speculative-num-draft-tokens` minus one (give it as option `extra.k` if wanted).
"""
from __future__ import annotations

from typing import AsyncIterator

import httpx

from decoders.base import GenerationRequest
from decoders.engines.client import EngineDecoder, EngineRequestError, Piece, sse_json, top2_gap

FINISH = {"stop": "eos", "length": "length", "abort": "abort"}


def generate_body(request: GenerationRequest, extra: dict) -> dict:
    params = {"max_new_tokens": request.max_new_tokens, "temperature": request.temperature,
              "top_p": request.top_p, "top_k": request.top_k or -1, "min_p": 0.0,
              "repetition_penalty": 1.0, "stop": list(request.stop_strings), "sampling_seed": request.seed,
              "no_stop_trim": True}
    body = {"input_ids": list(request.prompt_ids), "sampling_params": params, "return_logprob": True,
            "top_logprobs_num": 2, "stream": True}
    extra = {k: v for k, v in extra.items() if k != "k"}
    body["sampling_params"].update(extra.pop("sampling_params", {}))
    body.update(extra)
    return body


class StreamState:
    """SGLang streams the output so far; keep what was seen to hand out only the new part."""

    def __init__(self):
        self.seen = 0

    def parse(self, data: dict) -> Piece:
        meta = data.get("meta_info") or {}
        triples = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        new = triples[self.seen:]
        margins = [top2_gap([t[0] for t in (tops[i] or [])]) if i < len(tops) else None
                   for i in range(self.seen, self.seen + len(new))]
        self.seen += len(new)
        piece = Piece(tokens=[int(t[1]) for t in new], margins=margins)
        finish = meta.get("finish_reason")
        if finish:
            kind = finish.get("type") if isinstance(finish, dict) else str(finish)
            piece.finish_reason = FINISH.get(kind, kind)
            piece.final = {k: meta[k] for k in ("spec_verify_ct", "completion_tokens", "prompt_tokens",
                                                "finish_reason") if k in meta}
        return piece


def parse_input_top_logprobs(meta: dict, n: int) -> list[dict[int, float]]:
    """`meta_info.input_top_logprobs` from `logprob_start_len` on: per input position, the
    [logprob, token_id, text] triples of the distribution that predicted it."""
    rows = meta.get("input_top_logprobs") or []
    if len(rows) < n:
        raise ValueError(f"input_top_logprobs has {len(rows)} positions, {n} needed")
    return [{int(t[1]): float(t[0]) for t in (row or []) if t[0] is not None} for row in rows[:n]]


def telemetry_from_meta(final: dict, k: int | None = None) -> dict:
    verify = final.get("spec_verify_ct")
    tokens = final.get("completion_tokens")
    if not verify or tokens is None:
        return {}
    stats = {"target_forwards": int(verify), "accepted": max(int(tokens) - int(verify), 0),
             "rounds": int(verify), "telemetry": "per-request"}
    if k:
        stats.update(k=int(k), proposed=int(verify) * int(k))
    return stats


class SGLangDecoder(EngineDecoder):
    name = "sglang"
    flavour = "SGLang /generate"
    needs = "SGLang returns ids and top-2 logprobs with return_logprob = true, top_logprobs_num = 2"

    async def stream(self, http: httpx.AsyncClient, request: GenerationRequest) -> AsyncIterator[Piece]:
        state = StreamState()
        async for data in sse_json(http, self.url("/generate"), generate_body(request, self.extra)):
            if isinstance(data, dict) and "error" in data:   # how SGLang reports an error mid-stream
                raise EngineRequestError(f"engine {self.server.spec.name!r} sent an error event: "
                                         f"{str(data['error'])[:300]}")
            yield state.parse(data)

    def telemetry(self, final: dict) -> dict:
        return telemetry_from_meta(final, self.extra.get("k"))

    def prompt_logprobs(self, context: list[int], tokens: list[int], k: int) -> list[dict[int, float]]:
        """One request: the whole sequence as input, its logprobs from the first token of `tokens`."""
        body = {"input_ids": list(context) + list(tokens), "return_logprob": True, "top_logprobs_num": int(k),
                "logprob_start_len": len(context), "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        data = self.server.post_json("/generate", body, timeout=self.timeout)
        return parse_input_top_logprobs(data.get("meta_info") or {}, len(tokens))
