"""OpenAI-compatible routes, streamed through the light client (decoders.engines.client.sse_json:
httpx bytes, `json.loads` per chunk, no per-chunk model objects; the `openai` SDK built a pydantic
object per chunk and then `model_dump()`ed it, ~4x the client's CPU per token).

- `openai`: `/v1/completions` with the prompt as token ids. Any engine that speaks the route
  (vLLM, SGLang, TGI, llama.cpp, ...). Top-2 logprobs come from `logprobs: 2`; token ids only
  where the engine adds them, otherwise outputs are compared on text (the record says so).
- `vllm`: the same route with vLLM's extras: `return_token_ids` (generated ids),
  `return_tokens_as_token_ids` (logprob keys as "token_id:N", so top-2 gaps are tied to ids),
  vLLM's own samplers pinned off (min-p, repetition penalty), stop strings kept in the output so
  the harness cuts them exactly as in-process, and per-request `metrics.speculative_decoding`
  when the server was started with per-request spec-decode metrics.
- `openai-chat`: `/v1/chat/completions` with the item's messages. The engine applies its own chat
  template, so the prompt tokens are the engine's, not the harness's; the record keeps the
  engine's prompt token count beside the harness's so a template mismatch is visible.
"""
from __future__ import annotations

import re
import sys
from typing import AsyncIterator

import httpx

from decoders.base import DecoderError, GenerationRequest
from decoders.engines.client import EngineDecoder, EngineRequestError, Piece, sse_json, top2_gap

FINISH = {"stop": "eos", "length": "length"}


def _token_id(key) -> int | None:
    """vLLM's "token_id:123" logprob keys; None for plain token strings."""
    if isinstance(key, str) and key.startswith("token_id:"):
        try:
            return int(key.split(":", 1)[1])
        except ValueError:
            return None
    return None


def parse_completion_chunk(chunk: dict) -> Piece:
    """One streamed `/v1/completions` chunk (a plain dict) -> Piece. Called once per streamed
    token: each lookup here is the client's cost per token (the shapes are pinned by tests/data)."""
    choices = chunk.get("choices")
    if not choices:
        return Piece(final=_usage_and_metrics(chunk))
    c = choices[0]
    lp = c.get("logprobs") or _EMPTY
    tops = lp.get("top_logprobs") or ()
    margins = [top2_gap(list(t.values())) if t else None for t in tops]
    ids = c.get("token_ids")
    if ids is None:
        named = [_token_id(t) for t in lp.get("tokens") or []]
        ids = named if named and all(i is not None for i in named) else []
    finish = c.get("finish_reason")
    piece = Piece([int(i) for i in ids], margins if ids else [], c.get("text") or "", final=_usage_and_metrics(chunk))
    if finish:
        piece.finish_reason = FINISH.get(finish, finish)
        piece.final = {"finish_reason": finish, "stop_reason": c.get("stop_reason"), **piece.final}
    return piece


_EMPTY: dict = {}


def parse_chat_chunk(chunk: dict) -> Piece:
    """One streamed `/v1/chat/completions` chunk -> Piece."""
    choices = chunk.get("choices") or []
    if not choices:
        return Piece(final=_usage_and_metrics(chunk))
    c = choices[0]
    content = ((c.get("logprobs") or {}).get("content")) or []
    margins = [top2_gap([t.get("logprob") for t in e.get("top_logprobs") or []]) for e in content]
    ids = c.get("token_ids") or []
    piece = Piece(tokens=[int(i) for i in ids], margins=margins if ids else [],
                  text=(c.get("delta") or {}).get("content") or "")
    if c.get("finish_reason"):
        piece.finish_reason = FINISH.get(c["finish_reason"], c["finish_reason"])
        piece.final = {"finish_reason": c["finish_reason"]}
    piece.final.update(_usage_and_metrics(chunk))
    return piece


def _usage_and_metrics(chunk: dict) -> dict:
    out = {"model": chunk["model"]} if chunk.get("model") else {}   # which deployment answered
    if chunk.get("usage"):
        out["usage"] = chunk["usage"]
    metrics = chunk.get("metrics") or {}
    if isinstance(metrics, dict) and metrics.get("speculative_decoding"):
        out["speculative_decoding"] = metrics["speculative_decoding"]
    return out


def parse_prompt_logprobs(choice: dict, start: int, n: int, k: int) -> list[dict[int, float]]:
    """vLLM's `prompt_logprobs` (one {"token id": {"logprob", "rank", ...}} per prompt position,
    None first) at positions start..start+n-1, top-k only: vLLM adds the prompt's own token at
    any rank, which must not decide what the reference knows (it would tie the left-out
    positions to the sampled token)."""
    rows = choice.get("prompt_logprobs") or []
    if len(rows) < start + n:
        raise ValueError(f"prompt_logprobs has {len(rows)} positions, {start + n} needed")
    out = []
    for row in rows[start:start + n]:
        out.append({int(t): float(e["logprob"]) for t, e in (row or {}).items()
                    if e.get("rank") is None or int(e["rank"]) <= k})
    return out


def max_logprobs_allowed(response: httpx.Response) -> int | None:
    """The limit a vLLM 400 names ("Requested prompt logprobs of 1000, which is greater than max
    allowed: 20"); None for any other refusal."""
    if response.status_code != 400:
        return None
    m = re.search(r"greater than max allowed: (\d+)", response.text)
    return int(m.group(1)) if m else None


# vLLM 0.32's `metrics.speculative_decoding` (on the final usage chunk of a stream, with
# `--per-request-spec-decode-metrics summary|detailed`) -> the `stats` keys the analysis reads.
VLLM_SPEC_FIELDS = {"num_draft_tokens": "proposed", "num_accepted_draft_tokens": "accepted",
                    "num_spec_steps": "rounds", "num_spec_tokens": "k"}


def telemetry_from_vllm(final: dict) -> dict:
    """vLLM's per-request spec-decode metrics -> stats; {} where the request carried none (a
    server without `--per-request-spec-decode-metrics`). A field the payload lacks is not
    reported (named in `not_reported`), never taken as 0: a 0 would be shown as a measurement.
    A request whose drafter found nothing to propose is what the server says: 0 drafted."""
    sd = final.get("speculative_decoding")
    if not isinstance(sd, dict) or not sd:
        return {}
    stats: dict = {"telemetry": "per-request"}
    for field, key in VLLM_SPEC_FIELDS.items():
        if isinstance(sd.get(field), int):
            stats[key] = int(sd[field])
    missing = [f for f in VLLM_SPEC_FIELDS if f not in sd]
    acc, drafted = sd.get("per_step_accepted"), sd.get("per_step_drafted")
    if isinstance(acc, list) and isinstance(drafted, list) and len(acc) == len(drafted):
        stats["accepted_per_round"], stats["proposed_per_round"] = [int(a) for a in acc], [int(d) for d in drafted]
    hist = sd.get("acceptance_histogram")
    if isinstance(hist, list) and hist and "rounds" in stats:
        # histogram[j]: verify steps that accepted exactly j drafts. Position j was accepted in
        # every step that accepted more than j: Prometheus' per-position counter, per draft.
        stats["acceptance_by_position"] = [[sum(hist[j + 1:]), stats["rounds"]] for j in range(len(hist) - 1)]
    else:
        missing.append("acceptance_histogram")
    if missing:
        stats["not_reported"] = missing
    return stats


def final_stats(final: dict) -> dict:
    """`stats` from a stream's final chunks: vLLM's spec-decode metrics and the engine's own
    prompt token count (`usage`, sent with `include_usage`)."""
    stats = telemetry_from_vllm(final)
    usage = final.get("usage") or {}
    if usage.get("prompt_tokens") is not None:
        stats["engine_prompt_tokens"] = int(usage["prompt_tokens"])
    return stats


def top_k_field(request: GenerationRequest) -> dict:
    """`top_k` is not an OpenAI parameter, but the compatible servers (vLLM, SGLang, llama.cpp)
    read it from the body: sent when the request cuts, so that a server that cannot is refused
    by its own error rather than sampling without the cut."""
    return {"top_k": request.top_k} if request.top_k else {}


def completion_args(model: str, request: GenerationRequest, extra_body: dict) -> dict:
    """The openai client's `completions.create` arguments for one request. `include_usage`: the
    final chunk then carries `usage` (the engine's prompt token count) and, on vLLM, the
    per-request `metrics.speculative_decoding`, which vLLM sends on that chunk only."""
    return dict(model=model, prompt=list(request.prompt_ids), max_tokens=request.max_new_tokens,
                temperature=request.temperature, top_p=request.top_p, seed=request.seed,
                stop=list(request.stop_strings) or None, logprobs=2, stream=True,
                stream_options={"include_usage": True}, extra_body=extra_body)


def request_body(args: dict) -> dict:
    """The JSON body the `openai` client sent for `args` (`completion_args`): its keyword
    arguments with `extra_body` merged in at the top level, unset (None) fields left out."""
    extra = args.get("extra_body") or {}
    body = {k: v for k, v in args.items() if k != "extra_body" and v is not None}
    body.update(extra)
    return body


def checked(chunk, engine: str) -> dict:
    """A chunk that is an error event (`{"error": ...}` with HTTP 200, which the `openai` client
    raised as an APIError) is that request's error, named; anything else is passed on."""
    if isinstance(chunk, dict) and chunk.get("error"):
        raise EngineRequestError(f"engine {engine!r} sent an error event: {str(chunk['error'])[:300]}")
    return chunk


class OpenAICompletionsDecoder(EngineDecoder):
    name = "openai"
    flavour = "OpenAI /v1/completions"
    returns_ids = False  # the plain route has no ids; compare on text unless the engine adds them
    needs = "the route returned no top logprobs (it must honour logprobs = 2)"

    def extra_body(self, request: GenerationRequest) -> dict:
        return {**top_k_field(request), **self.extra}

    def create_args(self, request: GenerationRequest) -> dict:
        return completion_args(self.server.served_model, request, self.extra_body(request))

    route = "/v1/completions"

    def parse(self, chunk: dict) -> Piece:
        return parse_completion_chunk(chunk)

    async def stream(self, http: httpx.AsyncClient, request: GenerationRequest) -> AsyncIterator[Piece]:
        name = self.server.spec.name
        async for chunk in sse_json(http, self.url(self.route), request_body(self.create_args(request))):
            yield self.parse(checked(chunk, name))

    def telemetry(self, final: dict) -> dict:
        return final_stats(final)


class VLLMDecoder(OpenAICompletionsDecoder):
    name = "vllm"
    flavour = "vLLM /v1/completions"
    returns_ids = True
    needs = "vLLM returns ids with return_token_ids (vLLM >= 0.10.2) and top-2 logprobs with logprobs = 2"

    def extra_body(self, request: GenerationRequest) -> dict:
        return {"return_token_ids": True, "return_tokens_as_token_ids": True,
                "top_k": request.top_k or -1, "min_p": 0.0, "repetition_penalty": 1.0,
                "include_stop_str_in_output": True, "skip_special_tokens": False, **self.extra}

    def drafts_expected(self) -> bool:
        return bool(self.server.info.get("speculative"))

    # Top-k asked of vLLM as an exactness reference. At T = 0.7 and top-p 0.95, smollm2's nucleus
    # reaches past the top 20 at many positions, and the reference must see the whole nucleus to
    # test a token (docs/vllm.md, "Against the other reference"); vLLM allows 20 unless launched
    # with `--max-logprobs`, and then answers with what it allows (`prompt_logprobs`).
    reference_top_k = 1000

    def prompt_logprobs(self, context: list[int], tokens: list[int], k: int) -> list[dict[int, float]]:
        """One request: the whole sequence as the prompt, `prompt_logprobs: k` (vLLM's extension).
        A server that allows fewer (its `--max-logprobs`, 20 by default) is asked for what it
        allows, once, with a note: fewer positions are decided, none is judged wrongly."""
        k = min(int(k), self.reference_top_k)
        body = {"model": self.server.served_model, "prompt": list(context) + list(tokens), "max_tokens": 1,
                "temperature": 0.0, "prompt_logprobs": k}
        try:
            data = self.server.post_json("/v1/completions", body, timeout=self.timeout)
        except httpx.HTTPStatusError as e:
            allowed = max_logprobs_allowed(e.response)
            if allowed is None or not 2 <= allowed < k:
                raise
            print(f"decodegate: engine {self.server.spec.name!r} allows top-{allowed} prompt logprobs, not {k}: "
                  f"positions whose nucleus reaches past them are left out (launch it with --max-logprobs {k} "
                  f"to decide more)", file=sys.stderr)
            self.reference_top_k = k = allowed
            data = self.server.post_json("/v1/completions", {**body, "prompt_logprobs": k}, timeout=self.timeout)
        return parse_prompt_logprobs((data.get("choices") or [{}])[0], len(context), len(tokens), k)

    def tokenize(self, text: str) -> list[int]:
        body = self.server.post_json("/tokenize", {"model": self.server.served_model, "prompt": text,
                                                   "add_special_tokens": False})
        return [int(t) for t in body["tokens"]]

    def __init__(self, target, **options):
        super().__init__(target, **options)
        from decoders.engines.client import check_served
        check_served(self)


class OpenAIChatDecoder(OpenAICompletionsDecoder):
    name = "openai-chat"
    flavour = "OpenAI /v1/chat/completions"
    needs = "the route returned no top logprobs (it must honour logprobs = true, top_logprobs = 2)"

    def create_args(self, request: GenerationRequest) -> dict:
        if not request.messages:
            raise DecoderError("decoder 'openai-chat' needs chat messages; this request has token ids only "
                               "(use decoder 'openai', 'vllm' or 'llama.cpp' to send token ids)")
        return dict(model=self.server.served_model, messages=[dict(m) for m in request.messages],
                    max_tokens=request.max_new_tokens, temperature=request.temperature, top_p=request.top_p,
                    seed=request.seed, stop=list(request.stop_strings) or None, logprobs=True, top_logprobs=2,
                    stream=True, stream_options={"include_usage": True}, extra_body=self.extra_body(request))

    route = "/v1/chat/completions"

    def parse(self, chunk: dict) -> Piece:
        return parse_chat_chunk(chunk)
