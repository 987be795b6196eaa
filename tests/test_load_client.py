"""The light streaming client and the load generator's own limits.

- The SSE reader (decoders.engines.client.sse_json) gives back the captured vLLM events exactly,
  however the bytes are split and whatever the line endings, over a real socket.
- A vLLM decoder streaming from the fake engine (scripts/fake_engine.py, its own process, vLLM's
  captured shapes) returns what the parser makes of the same events.
- A load generator starved on purpose (a busy loop on its event loop) makes its level say "the
  load generator could not keep up", and that level is never a speed or SLO verdict.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from decoders.engines.client import sse_json
from harness.run import load  # its play and level_info go to play_workers

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "vllm"
sys.path.insert(0, str(ROOT / "scripts"))


async def _serve_bytes(payload: bytes, piece: int, status: int = 200):
    """A real socket that answers one POST with `payload` as a chunked body, `piece` bytes a chunk."""
    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                     b"connection: close\r\n\r\n" % status)
        for i in range(0, len(payload), piece):
            part = payload[i:i + piece]
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()
    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _read(payload: bytes, piece: int, status: int = 200) -> list:
    async def go():
        server = await _serve_bytes(payload, piece, status)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                return [e async for e in sse_json(http, url, {"stream": True})]
        finally:
            server.close()
    return asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.parametrize("capture", ["ngram-completion-stream.json", "ngram-chat-stream.json",
                                     "plain-completion-stream.json"])
@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_the_sse_reader_gives_back_the_captured_events_however_the_bytes_are_split(capture, eol):
    events = json.loads((DATA / capture).read_text())
    # The shape servers send: "data: {json}" then a blank line; a comment and an id line that
    # carry nothing; one event's data over two lines (joined with \n, still one JSON value).
    body = b": keep-alive" + eol + eol
    for i, e in enumerate(events):
        text = json.dumps(e).encode()
        if i == 1:
            half = text.index(b",") + 1
            body += b"id: 7" + eol + b"data: " + text[:half] + eol + b"data:" + text[half:] + eol + eol
        else:
            body += b"data: " + text + eol + eol
    body += b"data: [DONE]" + eol + eol + b"data: {\"after\": \"done\"}" + eol + eol
    for piece in (1, 2, 7, 61, len(body)):
        assert _read(body, piece) == events, (capture, eol, piece)


def test_a_cut_event_is_dropped_and_an_error_status_is_httpx_error_with_its_body():
    full = b'data: {"a": 1}\n\ndata: {"b": 2}\n\n'
    assert _read(full + b'data: {"c": 3', 5) == [{"a": 1}, {"b": 2}]
    with pytest.raises(httpx.HTTPStatusError) as e:
        _read(b'{"error": "prompt too long"}', 4, status=400)
    assert e.value.response.status_code == 400 and "prompt too long" in e.value.response.text



def test_an_error_event_mid_stream_reaches_the_flavour_as_an_error_whichever_way_it_is_sent():
    """`event: error` (the SSE way) was read as an ordinary chunk: a row of tokens whose server
    said it failed; llama.cpp's `error: {json}` field was dropped, its message lost."""
    ok = b'data: {"a": 1}\n\n'
    after = b'data: {"b": 2}\n\n'
    for piece in (1, 3, 200):
        assert _read(ok + b'event: error\ndata: {"message": "KV cache full"}\n\n' + after, piece) == [
            {"a": 1}, {"error": {"message": "KV cache full"}}, {"b": 2}]
        assert _read(ok + b'error: {"code": 500, "message": "decode failed"}\n\n', piece) == [
            {"a": 1}, {"error": {"code": 500, "message": "decode failed"}}]
        assert _read(ok + b'event: error\ndata: out of memory\n\n', piece) == [{"a": 1}, {"error": "out of memory"}]
        assert _read(ok + b'event: message\ndata: {"c": 3}\n\ndata: [DONE]\n\n', piece) == [{"a": 1}, {"c": 3}]
    # Every flavour names it as that request's error.
    from decoders.engines.openai_compat import checked
    from decoders.engines.client import EngineRequestError
    with pytest.raises(EngineRequestError, match="KV cache full"):
        checked(_read(b'event: error\ndata: {"message": "KV cache full"}\n\n', 7)[0], "e")


def test_a_server_that_trickles_keep_alives_is_cut_at_the_request_timeout():
    """A slow-loris server (a comment every 0.2 s, never an answer) held a request as long as it
    liked: only each read had a timeout. request_timeout_s is the whole request's."""
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(100):    # 20 s of keep-alives, then a clean end with nothing in it
            writer.write(b"e\r\n: keep-alive\n\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.2)
        writer.write(b"0\r\n\r\n")
        writer.close()

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(1.0, connect=5.0)) as http:
                return [e async for e in sse_json(http, url, {"stream": True})]
        finally:
            server.close()
    with pytest.raises(httpx.ReadTimeout, match="whole request"):
        asyncio.run(asyncio.wait_for(go(), 60))

@pytest.fixture(scope="module")
def fake_engine():
    from bench_client import start_engine
    proc, url = start_engine()
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def smollm2_tokenizer_target():
    from bench_client import _Target
    return _Target()


def test_a_vllm_decoder_streams_from_the_fake_engine_what_the_parser_reads(fake_engine, smollm2_tokenizer_target):
    from decoders.base import GenerationRequest
    from decoders.engines.openai_compat import VLLMDecoder, parse_completion_chunk
    from fake_engine import completion_events
    decoder = VLLMDecoder(smollm2_tokenizer_target, base_url=fake_engine, model="smollm2-135m", retries=0)
    results = [r for _, r in decoder.generate_many([GenerationRequest(tuple(range(1, 20)), max_new_tokens=12)] * 3)]
    want_tokens, want_margins = [], []
    for e in completion_events(12)[:-1]:
        piece = parse_completion_chunk(json.loads(e))
        want_tokens += piece.tokens
        want_margins += piece.margins
    for r in results:
        assert list(r.tokens) == want_tokens and list(r.margins) == pytest.approx(want_margins)
        assert r.finish_reason == "length" and r.stats["engine_prompt_tokens"] == 50
        assert len(r.timing.token_times_s) == 12


# ------------------------------------------------------------------------ the generator's limits

class _Suite:
    name = "s"


class _Item:
    id = "i0"


class _Work:
    suite, item, seed, temperature = _Suite(), _Item(), 0, 0.0


def _gen_rows(lags, ttft=0.1):
    return [{"index": i, "lag_s": lag, "ttft_s": ttft, "e2e_s": ttft + 0.7, "token_times_s": [ttft] + [0.1] * 7,
             "n_tokens": 8, "error": None, "suite": "s", "item_id": f"i{i % 12}"} for i, lag in enumerate(lags)]


def test_the_generators_thresholds_lag_p99_against_ttft_and_a_busy_loop():
    from analysis.load import generator_limit
    late = [0.001] * 95 + [0.08] * 5                        # p99 80 ms
    assert generator_limit(_gen_rows(late))["limited"]      # TTFT 0.1 s: the limit is 50 ms
    assert not generator_limit(_gen_rows(late, ttft=2.0))["limited"]   # TTFT 2 s: the limit is 200 ms
    busy = generator_limit(_gen_rows([0.001] * 100), {"harness_cpu_s": 9.5, "loop_busy_share": 0.95})
    assert busy["limited"] and "on the CPU 95%" in busy["why"]
    assert busy["cpu_per_request_s"] == pytest.approx(0.095) and busy["cpu_per_token_s"] == pytest.approx(9.5 / 800)
    # Rows written before the lag was recorded, no level row: nothing to say, so nothing changes.
    old = [{k: v for k, v in r.items() if k != "lag_s"} for r in _gen_rows([0.0] * 10)]
    assert not generator_limit(old)["limited"]


def test_a_starved_load_generator_says_so_and_its_level_is_never_a_verdict(fake_engine, smollm2_tokenizer_target):
    """The issue's loaded repeat: a starved client sent requests up to 0.94 s late, read tokens in
    bursts, and its TTFT p50 read 3.7x the peer's, with nothing in the verdict saying so. Here a
    busy loop shares the generator's event loop (150 ms on the CPU, 10 ms off, over and over)."""
    import time

    from analysis.load import generator_limit, judge_level, level_metrics
    from decoders.base import GenerationRequest
    from decoders.engines.openai_compat import VLLMDecoder
    from harness.run.load import Arrival, play
    from harness.verdict.slo import level_outcome
    decoder = VLLMDecoder(smollm2_tokenizer_target, base_url=fake_engine, model="smollm2-135m", retries=0)
    arrivals = [Arrival(i, 0.01 * i, _Work()) for i in range(60)]
    requests = [GenerationRequest(tuple(range(1, 20)), max_new_tokens=8)] * 60

    async def starved():
        stop = asyncio.Event()

        async def spin():
            while not stop.is_set():
                end = time.perf_counter() + 0.15
                while time.perf_counter() < end:
                    pass
                await asyncio.sleep(0.01)
        async with httpx.AsyncClient(timeout=30) as http:
            task = asyncio.create_task(spin())
            try:
                return await play(decoder, arrivals, requests, http)
            finally:
                stop.set()
                await task
    rows, info = asyncio.run(asyncio.wait_for(starved(), 120))
    assert [r["error"] for r in rows] == [None] * 60
    gen = generator_limit(rows, info)
    assert gen["limited"] and gen["why"].startswith("the load generator could not keep up"), gen
    assert info["lag_p99_s"] > 0.05 and info["harness_cpu_per_token_s"] > 0

    # Its level is no speed verdict and no SLO verdict, on either side of the pair.
    other = [{**r, "lag_s": 0.0} for r in rows]
    for base, cand, levels in ((rows, other, (info, None)), (other, rows, (None, info))):
        # At 1 req/s the sends were not "late" (a median lag under the 1 s gap), yet the stalls are in the rows.
        j = judge_level(base, cand, duration_s=info["wall_s"], rate=1.0, base_level=levels[0], cand_level=levels[1])
        assert j["pays"] is None and "could not keep up" in j["why"], j["why"]
    slo = {"ttft_p95_s": 100.0}
    starved_m = {**level_metrics(rows, duration_s=info["wall_s"], slo=slo), "generator": gen}
    fine_m = {**level_metrics(other, duration_s=info["wall_s"], slo=slo), "generator": generator_limit(other)}
    assert level_outcome("ttft_p95_s", fine_m, fine_m)[0] != "inconclusive"
    for base, cand in ((starved_m, fine_m), (fine_m, starved_m)):
        outcome, words = level_outcome("ttft_p95_s", base, cand)
        assert outcome == "inconclusive" and "could not keep up" in words


# ------------------------------------------------------------------------------- warm, then time

def test_every_engine_is_warmed_before_its_first_timed_request_closed_loop_and_under_load(smollm2_tokenizer_target):
    """`regress` sent no warm-up request to the servers it started: the first timed baseline
    requests paid the server's warm-up (5.28 s against 2.13 s in the A/A repeat)."""
    from bench_client import start_engine

    from decoders.base import GenerationRequest
    from decoders.engines.client import WARMUP_SEQUENTIAL
    from decoders.engines.openai_compat import VLLMDecoder
    from harness.run.load import Arrival, play
    proc, url = start_engine()
    try:
        timed = [GenerationRequest((7, 8, 9, 10 + i), max_new_tokens=4) for i in range(3)]
        decoder = VLLMDecoder(smollm2_tokenizer_target, base_url=url, model="smollm2-135m", retries=0, concurrency=2)
        assert len(list(decoder.generate_many(timed))) == 3
        seen = httpx.get(url + "/requests").json()
        warm = seen[:-3]
        # First the warm-up: the timed shapes with their prompts reversed (no prefix-cache hits), then the timed.
        assert len(warm) == WARMUP_SEQUENTIAL + 2 and decoder.warmup["requests"] == len(warm)
        assert all(len(p) == 4 and p[-1] == 7 for p in warm)
        assert sorted(map(tuple, seen[-3:])) == sorted(r.prompt_ids for r in timed)
        list(decoder.generate_many(timed))   # the server is warm now: no second warm-up
        assert len(httpx.get(url + "/requests").json()) == len(seen) + 3

        # The load phase, in a process where this server was never warmed.
        cold = VLLMDecoder(smollm2_tokenizer_target, base_url=url, model="smollm2-135m", retries=0)
        before = len(httpx.get(url + "/requests").json())

        async def level():
            async with httpx.AsyncClient(timeout=30) as http:
                return await play(cold, [Arrival(i, 0.0, _Work()) for i in range(3)], timed, http)
        rows, info = asyncio.run(asyncio.wait_for(level(), 60))
        assert info["warmup"]["requests"] == WARMUP_SEQUENTIAL + 3 and info["warmup"]["errors"] == 0
        assert len(httpx.get(url + "/requests").json()) == before + info["warmup"]["requests"] + 3
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _summary(aa_ci, speed_status="pass"):
    return {"baseline": "base", "candidates": {
        "base~aa": {"role": "aa-floor", "verdict": "floor", "gates": [], "suites": {},
                    "speedup": {"statistic": 1.09, "ci_low": aa_ci[0], "ci_high": aa_ci[1], "confidence_level": 0.95}},
        "spec": {"role": "candidate", "verdict": "pass" if speed_status == "pass" else "fail", "suites": {},
                 "gates": [{"name": "speed", "status": speed_status, "detail": "lower bound 1.30x >= 1.10x"},
                           {"name": "identity", "status": "pass", "detail": "identical"}]}}}


def test_an_aa_speedup_whose_interval_excludes_1_leaves_no_speed_verdict_standing(tmp_path):
    """`make regress-vllm` reported 'speedup vllm~aa 1.09x', lower bound 1.02x, and still judged
    every candidate's speed on the same biased timing."""
    from harness.config import Gates
    from harness.verdict import timing
    biased = _summary((1.02, 1.16))
    assert not timing.apply(biased, Gates())
    speed = biased["candidates"]["spec"]["gates"][0]
    assert speed["status"] == "fail" and speed["detail"].startswith("inconclusive: timing biased")
    assert biased["candidates"]["spec"]["verdict"] == "fail" and biased["timing"]["biased"]
    assert biased["candidates"]["spec"]["gates"][1]["status"] == "pass"     # only speed verdicts
    # The report says it beside the verdicts, even where no speed gate turned on it.
    from harness.verdict.report import markdown, table
    for words in (table({**biased, "verdict": "fail"}), markdown({**biased, "verdict": "fail"})):
        assert "timing biased: the A/A run 'base~aa' (the baseline timed again) reads 1.09x" in words, words
    fine = _summary((0.97, 1.08))
    assert timing.apply(fine, Gates()) and fine["candidates"]["spec"]["gates"][0]["status"] == "pass"
    assert timing.bias({"candidates": {"spec": {"role": "candidate"}}}) is None   # no A/A run: judged as before

    # Under load, a biased run's levels are not evidence that a candidate pays.
    from analysis.load import judge_level
    from harness.verdict.load import summarize
    from test_load import _cfg, load_config, row
    cfg = load_config(_cfg(tmp_path, "rates = [1]\nload_requests = 30"), "load")
    base = [{**row(i, 0.2, [0.1] * 9), "candidate": "base", "rate": 1.0} for i in range(30)]
    fast = [{**row(i, 0.1, [0.05 + 0.001 * (i % 3)] * 9), "candidate": "spec", "rate": 1.0} for i in range(30)]
    levels = [{"candidate": n, "rate": 1.0, "wall_s": 30.0, "requests": 30} for n in ("base", "spec")]
    assert judge_level(base, fast, duration_s=30, rate=1.0)["pays"]
    load = summarize(cfg, base + fast, levels, "base", timing_bias=timing.bias(biased))
    entry = next(e for e in load["levels"] if e["decoder"] == "spec")
    assert entry["pays"] is None and entry["why"].startswith("timing biased")
    assert load["crossover"]["spec"]["status"] == "never pays" and "not measured" in load["crossover"]["spec"]["words"]



def test_every_aa_run_is_checked_for_timing_bias_not_only_the_first():
    """A sweep has an A/A run per concurrency level (and a config may name several): only the
    first was read, so a biased one after it left the candidates' speed PASS standing."""
    from harness.config import Gates
    from harness.verdict import timing
    summary = _summary((0.97, 1.08))
    cands = summary["candidates"]
    summary["candidates"] = {"base~aa@c1": cands["base~aa"], "base~aa@c4": {
        **cands["base~aa"], "speedup": {"statistic": 1.12, "ci_low": 1.04, "ci_high": 1.2}}, "spec": cands["spec"]}
    assert not timing.apply(summary, Gates())
    speed = summary["candidates"]["spec"]["gates"][0]
    assert speed["status"] == "fail" and "base~aa@c4" in speed["detail"] and "base~aa@c1" not in speed["detail"]
    assert summary["timing"]["biased"] and summary["candidates"]["spec"]["verdict"] == "fail"


@pytest.mark.parametrize("side", ["base", "c"])
def test_a_level_with_a_dead_client_worker_is_the_generators_limit_never_a_verdict(tmp_path, side):
    """One of 32 client workers SIGKILLed: on the baseline's side its candidate 'paid' (a speed
    PASS on a level not played as planned); on the candidate's, its 7 lost rows were the
    candidate's failures ('never pays', a load errors FAIL), the harness's death charged to the engine."""
    from harness.config import Gates
    from harness.verdict import slo as slo_gates
    from harness.verdict.load import summarize
    from test_load import _cfg, load_config, row
    cfg = load_config(_cfg(tmp_path, "rates = [1]\nload_requests = 200"), "load")
    lost = {"error": "LoadWorkerLost: load client worker 1 of 32 failed (it exited without a result; exit code -9)",
            "n_tokens": 0, "token_times_s": [], "e2e_s": None, "ttft_s": None}
    rows = []
    for name, ttft, gap in (("base", 0.4, 0.1), ("c", 0.2, 0.05)):
        for i in range(200):
            r = {**row(i, ttft, [gap + 0.001 * (i % 3)] * 9), "candidate": name, "rate": 1.0, "lag_s": 0.001}
            rows.append({**r, **lost} if name == side and i % 32 == 1 else r)
    levels = [{"candidate": n, "rate": 1.0, "wall_s": 200.0, "requests": 200, "client_workers": 32,
               "harness_cpu_s": 0.2, "loop_busy_share": 0.01} for n in ("base", "c")]
    load = summarize(cfg, rows, levels, "base")
    by = {e["decoder"]: e for e in load["levels"]}
    assert by[side]["metrics"]["generator"]["limited"] and by[side]["metrics"]["generator"]["lost"] == 7
    assert by["c"]["pays"] is None and "lost with a load client worker" in by["c"]["why"]
    errors = slo_gates.error_gate([{"rate": 1.0, "baseline": by["base"]["metrics"], "candidate": by["c"]["metrics"]}],
                                  Gates())
    assert errors.status == "fail" and errors.detail.startswith("inconclusive") and "7 of the" in errors.detail

# ------------------------------------------------------------------------------- client workers

def test_client_workers_follow_the_measured_cost_up_to_the_cores():
    from harness.run.load_workers import cores, workers_needed
    assert workers_needed(100.0, None, None)[0] == 1                  # nothing measured yet
    assert workers_needed(100.0, 0.004, None)[0] == min(1, cores())   # 0.4 of a core: one worker at 50%
    assert workers_needed(400.0, 0.004, None)[0] == min(4, cores())   # 1.6 cores at 50% each: 4, if there are
    assert workers_needed(400.0, 0.004, 3) == (3, "client_workers in the profile")


def test_several_client_workers_play_one_schedule_and_their_rows_merge_by_offset(fake_engine, smollm2_tokenizer_target):
    from analysis.load import generator_limit
    from decoders.base import GenerationRequest
    from decoders.engines.openai_compat import VLLMDecoder
    from harness.run.load import Arrival
    from harness.run.load_workers import play_workers
    decoder = VLLMDecoder(smollm2_tokenizer_target, base_url=fake_engine, model="smollm2-135m", retries=0)
    arrivals = [Arrival(i, 0.005 * i, _Work()) for i in range(40)]
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=6) for i in range(40)]
    rows, info = play_workers(decoder, arrivals, requests, 3, max_in_flight=8, timeout=60, play=load.play, level_info=load.level_info)
    assert [r["index"] for r in rows] == list(range(40)) and [r["error"] for r in rows] == [None] * 40
    assert [r["offset_s"] for r in rows] == [a.offset_s for a in arrivals] and all(r["n_tokens"] == 6 for r in rows)
    assert info["client_workers"] == 3 and len(info["worker_busy_shares"]) == 3
    assert info["max_in_flight_per_worker"] == 3 and info["harness_cpu_per_token_s"] > 0
    assert info["loop_busy_share"] == max(info["worker_busy_shares"])
    assert generator_limit(rows, info)["workers"] == 3


def test_a_client_worker_that_dies_leaves_an_error_row_for_each_of_its_requests(fake_engine, smollm2_tokenizer_target):
    import os

    from decoders.base import GenerationRequest
    from decoders.engines.openai_compat import VLLMDecoder
    from harness.run.load import Arrival
    from harness.run.load_workers import play_workers

    class Dies(VLLMDecoder):
        async def _stream_once(self, http, request):
            if request.prompt_ids[-1] == 8:     # the request at index 1: worker 1 of 2 dies on it
                os._exit(3)
            return await super()._stream_once(http, request)
    decoder = Dies(smollm2_tokenizer_target, base_url=fake_engine, model="smollm2-135m", retries=0)
    decoder.server.warmed = True
    arrivals = [Arrival(i, 0.01 * i, _Work()) for i in range(6)]
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=4) for i in range(6)]
    rows, info = play_workers(decoder, arrivals, requests, 2, max_in_flight=None, timeout=60, play=load.play, level_info=load.level_info)
    assert [r["index"] for r in rows] == list(range(6))
    assert [r["error"] is None for r in rows] == [True, False, True, False, True, False]
    assert all("load client worker 1 of 2 failed" in r["error"] and "exit code 3" in r["error"] for r in rows[1::2])


# `full`: two client worker processes and a hang waited out (14 s); a client worker that dies stays in
# make check, and so does a decoder that hangs (test_fault_matrix.py).
@pytest.mark.full
def test_a_client_worker_that_hangs_is_killed_and_its_rows_are_lost_never_a_level_that_waits(
        fake_engine, smollm2_tokenizer_target, monkeypatch):
    """A worker whose loop blocks (here a sleep on it; SIGSTOP reads the same) held the level,
    and the run, for ever: the harness waited on its pipe with no deadline."""
    import threading
    import time as clock

    from decoders.base import GenerationRequest
    from decoders.engines.openai_compat import VLLMDecoder
    from harness.run import load_workers
    from harness.run.load import Arrival

    class Hangs(VLLMDecoder):
        async def _stream_once(self, http, request):
            if request.prompt_ids[-1] == 8:     # the request at index 1: worker 1 of 2 blocks its loop
                clock.sleep(3600)
            return await super()._stream_once(http, request)
    monkeypatch.setattr(load_workers, "WORKER_GRACE_S", 1.0, raising=False)
    decoder = Hangs(smollm2_tokenizer_target, base_url=fake_engine, model="smollm2-135m", retries=0)
    decoder.server.warmed = True
    arrivals = [Arrival(i, 0.01 * i, _Work()) for i in range(6)]
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=4) for i in range(6)]
    out = {}
    t = threading.Thread(target=lambda: out.update(r=load_workers.play_workers(
        decoder, arrivals, requests, 2, max_in_flight=None, timeout=2, play=load.play,
        level_info=load.level_info)), daemon=True)
    t.start()
    t.join(120)
    assert "r" in out, "play_workers still waiting on a hung worker after 120 s"
    rows, _ = out["r"]
    assert [r["index"] for r in rows] == list(range(6))
    assert [r["error"] is None for r in rows] == [True, False, True, False, True, False]
    assert all("worker 1 of 2 failed" in r["error"] and "killed" in r["error"] for r in rows[1::2])


def test_client_workers_never_offer_the_engine_more_than_max_in_flight(fake_engine, smollm2_tokenizer_target):
    """max_in_flight = 3 over 2 workers was 2 slots each (rounded up): 4 requests at once, where
    one client held the engine to 3; max_in_flight = 1 over 2 workers: 2 at once."""
    from decoders.base import GenerationRequest
    from decoders.engines.openai_compat import VLLMDecoder
    from harness.run.load import Arrival
    from harness.run import load_workers
    decoder = VLLMDecoder(smollm2_tokenizer_target, base_url=fake_engine, model="smollm2-135m", retries=0)
    decoder.server.warmed = True
    arrivals = [Arrival(i, 0.0, _Work()) for i in range(12)]     # all due at once: every slot fills
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=6) for i in range(12)]
    for cap, n in ((3, 2), (1, 2)):
        rows, info = load_workers.play_workers(decoder, arrivals, requests, n, max_in_flight=cap, timeout=60, play=load.play, level_info=load.level_info)
        assert [r["error"] for r in rows] == [None] * 12
        assert info["most_in_flight"] <= cap, (cap, n, info["most_in_flight"])
    assert load_workers.workers_needed(400.0, 0.004, 4, 2)[0] == 2


@pytest.mark.full
def test_client_workers_start_the_level_once_every_worker_is_ready(fake_engine, smollm2_tokenizer_target, tmp_path):
    """The start was fixed before forking (0.5 s + 0.1 s a worker); a worker whose set-up took
    longer (forked before the harness had imported the openai SDK, it imported it after the
    start: 1.5-7 s on this machine) sent its first requests that late, and the level read as
    the generator's limit. Here a worker's set-up takes 3 s on purpose: the start follows it."""
    import os
    import time as clock

    from decoders.base import GenerationRequest
    from decoders.engines.openai_compat import VLLMDecoder
    from harness.run.load import Arrival
    from harness.run.load_workers import play_workers

    parent, marks = os.getpid(), tmp_path / "ready"

    class SlowToFork(type(VLLMDecoder(smollm2_tokenizer_target, base_url=fake_engine, retries=0).server)):
        @property
        def proc(self):
            return self.__dict__.get("_proc")

        @proc.setter
        def proc(self, value):      # the worker's first step (it forgets the engine's process)
            if os.getpid() != parent:
                clock.sleep(3.0)
                with open(marks, "a") as f:
                    f.write(f"{clock.perf_counter()!r}\n")
            self.__dict__["_proc"] = value
    decoder = VLLMDecoder(smollm2_tokenizer_target, base_url=fake_engine, model="smollm2-135m", retries=0)
    decoder.server.__class__ = SlowToFork
    decoder.server.warmed = True
    arrivals = [Arrival(i, 0.01 * i, _Work()) for i in range(6)]
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=4) for i in range(6)]
    rows, info = play_workers(decoder, arrivals, requests, 2, max_in_flight=None, timeout=60, play=load.play, level_info=load.level_info)
    assert [r["error"] for r in rows] == [None] * 6
    ready = [float(x) for x in marks.read_text().split()]
    assert len(ready) == 2 and info["start_at"] >= max(ready)


@pytest.mark.full
def test_a_stream_cut_mid_answer_by_a_server_that_still_answers_is_that_items_error(smollm2_tokenizer_target):
    """A server that answers /health but cuts one request's stream mid-chunk (every time) ended
    the whole closed-loop run as 'stopped answering' (EngineDown) for that one request."""
    from decoders.base import GenerationRequest
    from decoders.engines.client import EngineRequestError
    from decoders.engines.openai_compat import VLLMDecoder
    from decoders.engines.server import EngineDown
    from fake_engine import completion_events

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        if head.startswith(b"GET /metrics"):
            writer.write(b"HTTP/1.1 404 X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        elif not head.startswith(b"POST"):
            body = b'{"data": [{"id": "smollm2-135m"}]}'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        else:
            event = b"data: " + completion_events(4)[0] + b"\n\n"
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"%x\r\n%s\r\n40\r\ndata: {\"cho" % (len(event), event))
        await writer.drain()
        writer.transport.abort() if head.startswith(b"POST") else writer.close()

    out = {}

    async def serve():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        out["url"] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        out["ready"].set()
        await out["stop"].wait()
        server.close()
    import threading
    loop = asyncio.new_event_loop()
    out.update(ready=threading.Event(), stop=asyncio.Event())
    t = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    t.start()
    out["ready"].wait(30)
    try:
        decoder = VLLMDecoder(smollm2_tokenizer_target, base_url=out["url"], model="smollm2-135m", retries=1)
        decoder.server.warmed = True
        results = [r for _, r in decoder.generate_many([GenerationRequest((1, 2, 3), max_new_tokens=4)])]
        assert len(results) == 1 and isinstance(results[0], EngineRequestError)
        assert not isinstance(results[0], EngineDown) and "cut its answer" in str(results[0])
    finally:
        loop.call_soon_threadsafe(out["stop"].set)
        t.join(10)


# ------------------------------------------------------------------------- kept-alive connections

class _Server:
    """A real HTTP/1.1 server in a thread of its own, counting connections: it streams vLLM's
    captured shapes (scripts/fake_engine.py's events) and keeps each connection alive. With
    `drop_reused`, a connection's second request is closed without an answer: what a server
    does when its idle timeout fires just as the client takes the kept-alive connection."""

    def __init__(self, drop_reused: bool = False, tokens: int = 4, llama_slots: int | None = None,
                 metrics: bool = False):
        import threading

        from fake_engine import _frame, completion_events
        self.drop_reused, self.frames = drop_reused, [_frame(e) for e in completion_events(tokens)]
        self.metrics = metrics   # serve /metrics as vLLM's: every POST read counts as a request served
        self.props = (b'{"build_info": "b1", "total_slots": %d}' % llama_slots) if llama_slots else None  # as llama.cpp's
        self.connections = self.posts = self.dropped = 0   # connections: those that carried a stream
        self.open = 0                                      # connections open now, this side
        self.loop = asyncio.new_event_loop()
        self.ready, self.thread = threading.Event(), threading.Thread(target=self._run, daemon=True)

    async def _handle(self, reader, writer):
        served, posted = 0, False
        self.open += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                               if x.lower().startswith(b"content-length")), 0)
                await reader.readexactly(length)
                line = head.split(b"\r\n")[0]
                if not line.startswith(b"POST /v1/completions"):   # /health, /v1/models, /props; 404 for the rest
                    body = b'{"data": [{"id": "smollm2-135m"}]}' if line.startswith(b"GET /v1/models") else b"{}"
                    status = b"200 OK" if line.startswith((b"GET /v1/models", b"GET /health")) else b"404 X"
                    if self.props and line.startswith(b"GET /props"):
                        body, status = self.props, b"200 OK"
                    if self.metrics and line.startswith(b"GET /metrics"):
                        body, status = self._metrics(), b"200 OK"
                    writer.write(b"HTTP/1.1 %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                                 % (status, len(body), body))
                    await writer.drain()
                    return
                self.connections += not posted
                posted = True
                self.posts += 1
                if self.drop_reused and served:
                    self.dropped += 1
                    return       # closed under the client's request: no byte of an answer
                served += 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                for frame in self.frames:
                    writer.write(frame)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            await writer.wait_closed()
            self.open -= 1

    def _metrics(self) -> bytes:
        """vLLM's spec-decode counters and latency histograms, counting every POST read (a server or
        proxy that read a request served it, whether or not its answer reached the client)."""
        n = self.posts
        lines = [f"vllm:spec_decode_num_drafts_total {n}", f"vllm:spec_decode_num_draft_tokens_total {4 * n}",
                 f"vllm:spec_decode_num_accepted_tokens_total {3 * n}", "process_start_time_seconds 1.0"]
        for hist in ("time_to_first_token_seconds", "request_time_per_output_token_seconds",
                     "e2e_request_latency_seconds"):
            lines += [f"vllm:{hist}_sum {0.01 * n}", f"vllm:{hist}_count {n}"]
        return ("\n".join(lines) + "\n").encode()

    def quiet(self) -> bool:
        """Whether every connection the clients closed is closed on this side too (its sockets
        live in this process: counted before they are, they read as the client's leak)."""
        import time
        deadline = time.monotonic() + 30
        while self.open and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.open

    def _run(self):
        async def serve():
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            self.stop = asyncio.Event()
            self.ready.set()
            await self.stop.wait()
            server.close()
        self.loop.run_until_complete(serve())

    def __enter__(self):
        self.thread.start()
        self.ready.wait(30)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)


def _decoder(target, url, **options):
    from decoders.engines.openai_compat import VLLMDecoder
    decoder = VLLMDecoder(target, base_url=url, model="smollm2-135m", retries=0, **options)
    decoder.server.warmed = True
    return decoder


def test_a_batchs_streams_reuse_their_connections_closed_loop_and_under_load(smollm2_tokenizer_target):
    """Every stream opened a session and a TCP connection of its own (3.5-5.7 ms each on the
    loaded 2-core machine, more than a 64-token answer took to stream): 3,039 tokens/s at one
    in flight where `vllm bench serve`, which keeps its connection, read 35,478."""
    from decoders.base import GenerationRequest
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=4) for i in range(12)]
    with _Server() as server:
        results = [r for _, r in _decoder(smollm2_tokenizer_target, server.url, concurrency=3).generate_many(requests)]
        assert [len(r.tokens) for r in results] == [4] * 12
        assert server.posts == 12 and server.connections <= 3, server.connections   # 3 in flight

    with _Server() as server:
        decoder = _decoder(smollm2_tokenizer_target, server.url)
        arrivals = [load.Arrival(i, 0.01 * i, _Work()) for i in range(12)]

        async def level():
            async with httpx.AsyncClient(timeout=30) as http:
                return await load.play(decoder, arrivals, requests, http, max_in_flight=2)
        rows, _ = asyncio.run(asyncio.wait_for(level(), 60))
        assert [r["error"] for r in rows] == [None] * 12
        assert server.posts == 12 and server.connections <= 2, server.connections


def test_a_kept_alive_connection_the_server_closes_as_it_is_taken_is_no_error_row(smollm2_tokenizer_target):
    """aiohttp sends a request again on a fresh connection only for idempotent methods; a POST
    on a pooled connection that the server closed just then (its idle timeout; llama.cpp's
    server: "Server disconnected without sending a response") raised, and in the open loop,
    which does not retry, became an error row. Here every reused connection is closed so."""
    from decoders.base import GenerationRequest
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=4) for i in range(8)]
    with _Server(drop_reused=True) as server:
        decoder = _decoder(smollm2_tokenizer_target, server.url)
        arrivals = [load.Arrival(i, 0.01 * i, _Work()) for i in range(8)]

        async def level():
            async with httpx.AsyncClient(timeout=30) as http:
                return await load.play(decoder, arrivals, requests, http, max_in_flight=1)
        rows, _ = asyncio.run(asyncio.wait_for(level(), 60))
        assert [r["error"] for r in rows] == [None] * 8 and all(r["n_tokens"] == 4 for r in rows)
        assert server.dropped > 0      # the pool did take closed connections: the case was met
        dropped = server.dropped
        results = [r for _, r in _decoder(smollm2_tokenizer_target, server.url).generate_many(requests)]
        assert [len(r.tokens) for r in results] == [4] * 8 and server.dropped > dropped


def test_a_request_sent_again_is_counted_in_its_row_and_the_servers_figures_around_it_are_refused(
        smollm2_tokenizer_target):
    """The pool sends a POST again when its kept-alive connection closed under it. A server (or a
    proxy) that had read the request served it, then closed without a byte: it served it twice.
    Here the server counts every POST it read in its own /metrics (vLLM's names): the level's
    rows must account for each send (`resent`), and the server's figures differenced around the
    level (latency histograms, spec-decode counters) must be refused, never read as the level's:
    they counted 8 + resends requests for 8 rows. So must the closed loop's per-request and batch
    differences."""
    from types import SimpleNamespace

    from analysis.load import level_metrics
    from decoders.base import GenerationRequest
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=4) for i in range(8)]
    with _Server(drop_reused=True, metrics=True) as server:
        decoder = _decoder(smollm2_tokenizer_target, server.url)
        assert decoder.metrics_ok
        arrivals = [load.Arrival(i, 0.01 * i, _Work()) for i in range(8)]
        run = SimpleNamespace(plan=SimpleNamespace(max_in_flight=1, client_workers=1),
                              client_cost=lambda name, decoder: None)

        async def level():
            async with httpx.AsyncClient(timeout=30) as http:
                return await load.LoadRun.play_level(run, http, "b", decoder, 8.0, arrivals, requests)
        rows, info, delta = asyncio.run(asyncio.wait_for(level(), 60))
        assert [r["error"] for r in rows] == [None] * 8 and server.dropped > 0
        assert "unmeasured" in info["server_latency"], (server.posts, info["server_latency"])
        assert sum(r["resent"] for r in rows) == server.dropped == info["resent"]
        assert len(rows) + info["resent"] == server.posts          # every send the server read is in a row
        assert delta["draft_tokens"] == 4 * server.posts            # what the server's counters hold
        level_acc = level_metrics(rows, duration_s=1.0, prometheus=delta)["acceptance"]["level"]
        assert level_acc["value"] is None and "sent again" in level_acc["error"], level_acc

        dropped = server.dropped
        results = [r for _, r in _decoder(smollm2_tokenizer_target, server.url).generate_many(requests)]
        resent = [r.stats.get("resent", 0) for r in results]
        assert sum(resent) == server.dropped - dropped > 0
        # One in flight: a request's own counter difference, but not where it was sent twice.
        assert all(("proposed" in r.stats) == (not n) for r, n in zip(results, resent)), [r.stats for r in results]
        batch = _decoder(smollm2_tokenizer_target, server.url)
        list(batch.generate_many(requests))
        assert batch.last_batch["resent"] > 0 and "proposed" not in batch.last_batch, batch.last_batch
        assert "unmeasured" in batch.last_batch


def test_a_server_that_closes_idle_connections_costs_no_request(smollm2_tokenizer_target):
    """A real server (aiohttp's) with a 0.2 s keep-alive: requests that come back while their
    connection is still open reuse it; after a pause it has closed them, and they connect anew."""
    from aiohttp import web

    from decoders.base import GenerationRequest
    from fake_engine import completion_events
    events = [b"data: " + e + b"\n\n" for e in completion_events(4)]
    peers: list = []

    async def complete(request):
        await request.read()
        peers.append(request.transport.get_extra_info("peername"))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for e in events:
            await response.write(e)
        await response.write_eof()
        return response

    async def models(request):
        return web.json_response({"data": [{"id": "smollm2-135m"}]})

    async def go(target):
        app = web.Application()
        app.add_routes([web.post("/v1/completions", complete), web.get("/v1/models", models), web.get("/health", models)])
        runner = web.AppRunner(app, keepalive_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            decoder = await asyncio.to_thread(_decoder, target, url)
            requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=4) for i in range(9)]
            # Offsets 0.02 s apart in threes, 0.6 s between the threes: past the server's keep-alive.
            arrivals = [load.Arrival(i, 0.6 * (i // 3) + 0.02 * (i % 3), _Work()) for i in range(9)]
            async with httpx.AsyncClient(timeout=30) as http:
                return await load.play(decoder, arrivals, requests, http, max_in_flight=1)
        finally:
            await runner.cleanup()
    rows, _ = asyncio.run(asyncio.wait_for(go(smollm2_tokenizer_target), 60))
    assert [r["error"] for r in rows] == [None] * 9 and all(r["n_tokens"] == 4 for r in rows)
    assert 1 < len(set(peers)) < 9, peers


def test_batches_and_levels_close_their_connections(smollm2_tokenizer_target, caplog):
    """Kept-alive connections live as long as their batch or level: after many, the process
    holds no more sockets than before, and no "Unclosed client session / connector" is logged."""
    import gc
    import os
    import warnings

    from decoders.base import GenerationRequest
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=4) for i in range(8)]
    with _Server() as server, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decoder = _decoder(smollm2_tokenizer_target, server.url, concurrency=4)
        list(decoder.generate_many(requests))   # the first batch: lazily made clients are made
        gc.collect()
        assert server.quiet()
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(5):
            assert len(list(decoder.generate_many(requests))) == 8

            async def level():
                async with httpx.AsyncClient(timeout=30) as http:
                    return await load.play(decoder, [load.Arrival(i, 0.0, _Work()) for i in range(8)], requests, http,
                                           max_in_flight=4)
            rows, _ = asyncio.run(asyncio.wait_for(level(), 60))
            assert [r["error"] for r in rows] == [None] * 8
        gc.collect()
        assert server.quiet(), f"{server.open} connection(s) still open 30 s after their batch or level"
        after = len(os.listdir("/proc/self/fd"))
    assert server.connections < server.posts     # connections were kept, and yet none is left open
    assert after <= before, (before, after)
    assert not [w for w in caught if "Unclosed" in str(w.message)]
    assert "Unclosed" not in caplog.text


def test_a_llama_cpp_server_keeps_connections_only_for_a_batch_within_its_slots(smollm2_tokenizer_target):
    """llama.cpp's server holds one of its HTTP threads (its slots + 2 at least) per kept
    connection: more kept connections than threads, and a request on a connection no thread
    holds waits behind newer ones on the kept connections, where a connection per request is
    served in the order it came. So a batch beyond its slots connects per request, as before."""
    from decoders.base import GenerationRequest
    requests = [GenerationRequest((5, 6, 7 + i), max_new_tokens=4) for i in range(6)]
    with _Server(llama_slots=2) as server:
        decoder = _decoder(smollm2_tokenizer_target, server.url, concurrency=2)
        assert decoder.server.info["engine"] == "llama.cpp"
        assert len(list(decoder.generate_many(requests))) == 6
        assert server.connections <= 2, server.connections       # 2 in flight, 2 slots: kept
        posts, connections = server.posts, server.connections

        async def level(cap):
            async with httpx.AsyncClient(timeout=30) as http:
                return await load.play(decoder, [load.Arrival(i, 0.01 * i, _Work()) for i in range(6)], requests,
                                       http, max_in_flight=cap)
        rows, _ = asyncio.run(asyncio.wait_for(level(None), 60))    # no cap: a connection per request
        assert [r["error"] for r in rows] == [None] * 6
        assert server.posts - posts == 6 and server.connections - connections == 6
        rows, _ = asyncio.run(asyncio.wait_for(level(3), 60))       # 3 in flight, 2 slots: the same
        assert server.connections - connections == 12


def test_the_client_benchmark_gives_decodegates_ratio_per_round_and_their_median():
    """scripts/bench_client.py --rounds: on a shared machine one round's ratio is the load's, so each
    round's clients run back to back and the ratio is taken per round, then the median."""
    from bench_client import ratios
    rows = [{"client": c, "in_flight": 64, "round": i, "tok_s": t, "cpu_per_token_us": u}
            for i, (dg, ref, sdk) in enumerate([(10, 20, 5), (30, 20, 6), (20, 20, 4)])
            for c, t, u in (("decodegate", dg, 20.0), ("vllm-bench", ref, None), ("openai-sdk", sdk, 200.0))]
    lines = ratios(rows + [{"client": "vllm-bench", "in_flight": 64, "round": 3, "error": "no vllm"}])
    assert "vllm bench serve's, per round 0.50 1.50 1.00, median 1.00" in " ".join(lines), lines
    assert "openai SDK path's, per round 0.10 0.10 0.10, median 0.10" in " ".join(lines), lines
