"""A decoder's answers from its worker, validated here: what the runner records, and a decoder in
a worker called as an in-process one by the stages after generation.

- `answer` / `returned`: one answer from a worker's pipe as the runner records it: a result with
  the attributes a record is made of, or a DecoderError naming why it cannot be judged.
- `RemoteDecoder`: `generate(request)` through the decoder's worker, for the stages that ask one
  request at a time after the generation stage (lm-eval tasks, the exactness windows). The
  decoder's own code never runs in this process, there as in generation: an item's failure is a
  DecoderError (that item's error), and a break (it raised, broke the generate_many contract,
  died, hung) is `Broke`, which the stage turns into the decoder's stop row.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

from decoders.base import DecoderError, GenerationResult, Timing
from harness.run.faults import garbage


class Broke(Exception):
    """A decoder broke in its worker: `kind` "raised" or "contract" (`payload`: exc_info, or the
    contract's why) or "died" (`payload`: harness.run.worker.Death)."""

    def __init__(self, kind: str, payload):
        self.kind, self.payload = kind, payload
        how = payload.how if kind == "died" else payload if kind == "contract" else payload.get("exception")
        super().__init__(f"{kind}: {how}")


def answer(kind: str, payload, request, vocab) -> object:
    """A worker's answer as the runner records it: a result, or a DecoderError naming why not."""
    if kind == "item-error":
        return DecoderError(payload)
    if kind == "garbage":
        return DecoderError(f"a result that cannot be judged: {payload}")
    result = returned(json.loads(payload))
    why = garbage(result, request, vocab)
    return DecoderError(f"a result that cannot be judged: {why}") if why else result


def returned(plain: dict):
    """A result from a worker's JSON, with the attributes a record is made of."""
    timing = plain.get("timing")
    ok = isinstance(timing, dict) and isinstance(timing.get("wall_s"), (int, float))
    return SimpleNamespace(**{k: plain.get(k) for k in ("tokens", "text", "decoder", "finish_reason", "margins",
                                                        "stats")},
                           timing=SimpleNamespace(as_dict=lambda: timing) if ok else None)


def as_result(r) -> GenerationResult:
    """A judged answer (`answer` found nothing wrong) as the GenerationResult a stage reads."""
    t = r.timing.as_dict()
    try:
        timing = Timing(float(t["wall_s"]), float(t.get("ttft_s", t["wall_s"])),
                        tuple(float(x) for x in t.get("token_times_s", ())))
    except (KeyError, TypeError, ValueError) as e:
        raise DecoderError(f"a result that cannot be judged: its timing {t!r} ({e})") from None
    return GenerationResult(tuple(r.tokens), r.text, str(r.decoder or ""), str(r.finish_reason or ""), timing,
                            tuple(r.margins), dict(r.stats))


class RemoteDecoder:
    """The decoder in `worker`, one request at a time; `limit` seconds per request (past it the
    worker is killed: a hang)."""

    def __init__(self, worker, vocab: int | None, limit: float | None):
        self.worker, self.vocab, self.limit = worker, vocab, limit
        self.requests = 0  # asked so far: the one a break names

    def generate(self, request) -> GenerationResult:
        self.requests += 1
        # Every event of the call is read (its "done" too), so the next call starts clean; a break
        # after the answer is a break all the same.
        events = list(self.worker.run([request], self.limit))
        ends = [(kind, payload) for kind, _, payload in events if kind in ("raised", "contract", "died")]
        if ends:
            raise Broke(*ends[0])
        if not events:
            raise Broke("contract", "generate_many ended with no result for its 1 request")
        kind, _, payload = events[0]
        out = answer(kind, payload, request, self.vocab)
        if isinstance(out, DecoderError):
            raise out
        return as_result(out)
