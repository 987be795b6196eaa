"""Acceptance telemetry from an engine's Prometheus counters, in the `stats` keys the analysis reads.

vLLM and llama.cpp's server export the same spec-decode counters under their own prefix
(`vllm:spec_decode_num_drafts_total`, `llamacpp:spec_decode_num_drafts_total`, ...). Counters are
read before and after a stretch of requests and differenced; the difference belongs to those
requests only when nothing else ran on the engine meanwhile (one request in flight, or an engine
that serves one candidate alone). Per position, vLLM counts accepted tokens per draft slot and
rates them per draft (accepted_j / num_drafts); `acceptance_by_position` keeps that basis.
"""
from __future__ import annotations

import asyncio
import re

_SUFFIXES = {
    "spec_decode_num_drafts_total": "drafts",
    "spec_decode_num_draft_tokens_total": "draft_tokens",
    "spec_decode_num_accepted_tokens_total": "accepted",
    "spec_decode_num_accepted_tokens_per_pos_total": "per_pos",
}
_POSITION = re.compile(r'position="(\d+)"')


def flatten(text: str) -> dict[str, float]:
    """Prometheus exposition text -> {'name{label="v",...}': value}, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out


def spec_counters(metrics: dict[str, float] | None) -> dict | None:
    """Sum the spec-decode counters over labels (engines, model names); per position kept apart."""
    if not metrics:
        return None
    out: dict = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": {}}
    seen = False
    for key, value in metrics.items():
        name = key.split("{", 1)[0].rsplit(":", 1)[-1]
        field = _SUFFIXES.get(name)
        if field is None:
            continue
        seen = True
        if field == "per_pos":
            m = _POSITION.search(key)
            if m:
                pos = int(m.group(1))
                out["per_pos"][pos] = out["per_pos"].get(pos, 0.0) + value
        else:
            out[field] += value
    return out if seen else None


def spec_delta(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    delta = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    positions = set(before["per_pos"]) | set(after["per_pos"])
    delta["per_pos"] = {p: after["per_pos"].get(p, 0.0) - before["per_pos"].get(p, 0.0) for p in sorted(positions)}
    return delta


def stats_from_delta(delta: dict | None, drafts_expected: bool = False) -> dict:
    """`stats` fields from a counter difference. Empty when the engine drafted nothing, unless
    it is known to speculate (`drafts_expected`): then nothing drafted is a count of 0, what the
    server says (an n-gram drafter that found no match), not a request without stats."""
    if not delta or (delta["draft_tokens"] <= 0 and not drafts_expected):
        return {}
    drafts = int(round(delta["drafts"]))
    stats = {"proposed": int(round(delta["draft_tokens"])), "accepted": int(round(delta["accepted"])),
             "rounds": drafts, "telemetry": "prometheus"}
    if delta["per_pos"]:
        k = max(delta["per_pos"]) + 1
        stats["k"] = k
        stats["acceptance_by_position"] = [[int(round(delta["per_pos"].get(j, 0.0))), drafts] for j in range(k)]
    return stats


async def request_delta(scrape, before: dict | None, own: dict, *, tries: int = 20, wait_s: float = 0.05,
                        drafts_expected: bool = False) -> dict:
    """`stats_from_delta` for one request in flight, from `before` to a scrape after it
    (`scrape`: an async callable returning `spec_counters`). llama.cpp folds a finished request
    into its counters when it releases the slot, which can come after the last streamed chunk:
    a scrape right then showed nothing drafted, the record lost its per-position counts, and the
    estimator of its whole group changed (2 of 36 records in one run). Where the engine's own
    per-request counts exist (`own`), scrape until the difference reaches them; one that passes
    them holds another request's counts and is not this request's (empty)."""
    per_request = own.get("telemetry") == "per-request" and "proposed" in own and "accepted" in own
    want = (own["proposed"], own["accepted"]) if per_request else None
    for attempt in range(tries):
        stats = stats_from_delta(spec_delta(before, await scrape()), drafts_expected)
        got = (stats.get("proposed", 0), stats.get("accepted", 0))
        if want is None or got == want:
            return stats
        if got[0] > want[0] or got[1] > want[1]:
            return {}
        await asyncio.sleep(wait_s)
    return {}


# vLLM's own per-request latency histograms (`_sum` and `_count`, summed over labels): the
# server's clock. TTFT and E2E run from when the API server received the request to its first
# token and to its end; TPOT is (E2E - TTFT) / (tokens - 1) per request, decodegate's definition.
LATENCY_HISTOGRAMS = {"ttft": "time_to_first_token_seconds", "tpot": "request_time_per_output_token_seconds",
                      "e2e": "e2e_request_latency_seconds"}


def latency_sums(metrics: dict[str, float] | None) -> dict | None:
    """{"ttft": [sum, count], "tpot": ..., "e2e": ..., "started": the server process's start
    time or None} from a scrape; None where the engine does not export these histograms
    (llama.cpp's server does not)."""
    if not metrics:
        return None
    out: dict = {key: [0.0, 0.0] for key in LATENCY_HISTOGRAMS}
    seen = False
    for name, value in metrics.items():
        base = name.split("{", 1)[0].rsplit(":", 1)[-1]
        for key, hist in LATENCY_HISTOGRAMS.items():
            if base in (f"{hist}_sum", f"{hist}_count"):
                out[key][base.endswith("_count")] += value
                seen = True
    out["started"] = metrics.get("process_start_time_seconds")
    return out if seen else None


def latency_delta(before: dict | None, after: dict | None) -> dict | None:
    """The server's mean TTFT / TPOT / E2E over the requests that finished between two scrapes
    (`latency_sums`): {"requests", "ttft_mean_s", "tpot_mean_s", "e2e_mean_s"}; a mean with no
    request under it is None, never 0. None where either scrape lacks the histograms, and where
    the server restarted between them (its start time moved, or a sum or count went back): the
    difference of two processes' counters is no measurement (it read -80 requests and a mean
    TTFT of -0.33 s)."""
    if before is None or after is None:
        return None
    if before.get("started") != after.get("started") or any(
            after[key][i] < before[key][i] for key in LATENCY_HISTOGRAMS for i in (0, 1)):
        return None
    out: dict = {"requests": int(round(after["e2e"][1] - before["e2e"][1]))}
    for key in LATENCY_HISTOGRAMS:
        total, count = after[key][0] - before[key][0], after[key][1] - before[key][1]
        out[f"{key}_mean_s"] = total / count if count > 0 else None
        out[f"{key}_requests"] = int(round(count))
    return out
