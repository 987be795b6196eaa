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
