"""Open-loop load against an engine that answers wrongly: each fault costs that request (or the
level's telemetry), never the level or the run. Runs harness.run.load's own `play` and counter
reads against test_engine_faults' small server that speaks llama.cpp's streamed `/completion`
and breaks it one way at a time (real llama.cpp does not misbehave on cue)."""
from __future__ import annotations

import asyncio
import threading
from http.server import ThreadingHTTPServer

import httpx
import pytest

from decoders import GenerationRequest
from decoders.engines.llamacpp import LlamaCppDecoder
from harness.models import load_model
from harness.run.load import Arrival, _prometheus, play
from test_engine_faults import TOKENS, Faulty


class _Suite:
    name = "s"


class _Item:
    id = "i0"


class _Work:
    suite, item, seed, temperature = _Suite(), _Item(), 0, 0.0


@pytest.fixture(scope="module")
def decoder():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Faulty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Faulty.mode, Faulty.scrapes = "good", 0
    yield LlamaCppDecoder(load_model("tiny-llama"), base_url=f"http://127.0.0.1:{server.server_port}", retries=0)
    server.shutdown()


def _play(decoder, mode: str) -> list[dict]:
    Faulty.mode, Faulty.scrapes = mode, 0
    arrivals = [Arrival(i, 0.01 * i, _Work()) for i in range(3)]
    requests = [GenerationRequest((1, 2, 3 + i), max_new_tokens=len(TOKENS)) for i in range(3)]

    async def go():
        async with httpx.AsyncClient(timeout=30) as http:
            return await play(decoder, arrivals, requests, http)
    rows, info = asyncio.run(asyncio.wait_for(go(), 60))
    assert info["requests"] == 3
    return rows


def test_a_well_behaved_level_is_measured(decoder):
    rows = _play(decoder, "good")
    assert [r["error"] for r in rows] == [None] * 3 and all(r["n_tokens"] == len(TOKENS) for r in rows)


def test_bad_json_in_a_stream_under_load_is_that_requests_error(decoder):
    """Bad JSON in a streamed answer raised JSONDecodeError out of `play`: the load phase ended
    with a traceback and the level being played was lost (the closed-loop client already made it
    the item's error)."""
    rows = _play(decoder, "bad_json")
    assert len(rows) == 3 and all(r["n_tokens"] == 0 for r in rows)
    assert all("sent a malformed or error response: JSONDecodeError" in r["error"] for r in rows), rows


def test_a_metrics_page_that_stops_parsing_costs_the_levels_counters_not_the_level(decoder):
    """The counters read after a level (before its rows are written) raised ValueError on a
    gateway's HTML page with 200: the level's rows were lost and the run ended."""
    Faulty.mode, Faulty.scrapes = "metrics_html", 0
    assert decoder.metrics_ok and _prometheus(decoder) is not None   # the first scrape still parses
    assert _prometheus(decoder) is None
