"""An engine that answers, but wrongly: each fault is that item's error, named, and never a
result, a crash of the run or a hang. Real llama.cpp does not misbehave on cue, so these run
against a small HTTP server that speaks its streamed `/completion` and breaks it one way at a
time (the red-team cases: an error body with HTTP 200, a stream cut before its stop event, bad
JSON, a 503 for one prompt only, a gateway's HTML page on /metrics). The well-behaved path is
tested against the real server in test_engines.py."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from decoders import GenerationRequest
from decoders.engines.client import EngineRequestError
from decoders.engines.llamacpp import LlamaCppDecoder
from harness.models import load_model

TOKENS = [71, 72, 73, 74, 75, 76]


class Faulty(BaseHTTPRequestHandler):
    """`mode` (a class attribute, set per test) picks the fault; "good" streams TOKENS and stops."""
    mode = "good"
    scrapes = 0
    held = 0
    posts = 0
    hang_after = 0
    release = threading.Event()
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/health":
            return self._send(200, b'{"status": "ok"}')
        if self.path == "/metrics":
            type(self).scrapes += 1
            if self.mode == "metrics_hang" and self.scrapes > self.hang_after:   # a batch's closing scrape
                self.release.wait(120)
                self.close_connection = True
                return
            if self.mode == "metrics_html" and self.scrapes > 1:   # a gateway's page, with 200
                return self._send(200, b"<html><h1>502 Bad Gateway</h1></html>", "text/html")
            return self._send(200, b"# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
                                   b"vllm:spec_decode_num_draft_tokens_total 0\n"
                                   b"# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
                                   b"vllm:spec_decode_num_accepted_tokens_total 0\n", "text/plain")
        return self._send(404, b'{"error": "not found"}')

    def _event(self, data) -> None:
        self.wfile.write(b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n")
        self.wfile.flush()

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        type(self).posts += 1
        if self.path != "/completion":
            return self._send(404, b'{"error": "not found"}')
        if self.mode == "hang" and body["prompt"][-1] % 2:   # a wedged server: never answers, never closes
            type(self).held += 1
            self.release.wait(120)
            self.close_connection = True
            return
        if self.mode == "503_one" and body["prompt"][-1] % 2:
            return self._send(503, b'{"error": {"code": 503, "message": "busy"}}')
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if self.mode == "error_body":
            return self._event({"message": "server overloaded", "type": "unavailable"})
        if self.mode == "bad_json":
            return self._event(b"{not json")
        if self.mode == "empty":
            return self._event({"content": "", "tokens": [], "stop": True, "stop_type": "limit"})
        for i, t in enumerate(TOKENS):
            if self.mode == "cut" and i == 3:
                return
            self._event({"content": "x", "tokens": [t], "stop": False, "completion_probabilities": [
                {"id": t, "logprob": -0.05, "top_logprobs": [{"id": t, "logprob": -0.05},
                                                             {"id": t + 1, "logprob": -4.0}]}]})
        self._event({"content": "", "tokens": [], "stop": True, "stop_type": "limit"})


@pytest.fixture(scope="module")
def engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Faulty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _run(url: str, mode: str, prompts=((1, 2, 3), (1, 2, 4))) -> list:
    Faulty.mode, Faulty.scrapes = mode, 0
    dec = LlamaCppDecoder(load_model("tiny-llama"), base_url=url, retries=1)
    requests = [GenerationRequest(p, max_new_tokens=len(TOKENS)) for p in prompts]
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(r for _, r in dec.generate_many(requests)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), f"{mode}: generate_many hung"
    return out


def test_a_well_behaved_stream_is_a_result(engine):
    [a, b] = _run(engine, "good")
    assert list(a.tokens) == TOKENS and a.finish_reason == "length"


@pytest.mark.parametrize("mode, needle", [
    ("error_body", "ended its stream after 0 token(s) without a finish reason"),   # HTTP 200, an error object
    ("empty", "answered with no tokens"),             # a stop event, 'limit', and nothing before it
    ("cut", "without a finish reason"),               # 3 of 6 tokens, then the connection closed
    ("bad_json", "malformed or error response"),      # was: a JSONDecodeError ending the run, exit 3
])
def test_a_broken_answer_is_that_items_error(engine, mode, needle):
    """Before: the error body and the cut stream were results ("length", 0 or 3 tokens) that
    compared identical with each other and passed; bad JSON ended the whole run."""
    out = _run(engine, mode)
    assert len(out) == 2 and all(isinstance(r, EngineRequestError) for r in out), out
    assert all(needle in str(r) for r in out), [str(r) for r in out]


@pytest.mark.full
def test_one_prompt_refused_every_time_is_an_item_error_not_an_engine_down(engine):
    """The engine answers its health check and every other prompt: 'stopped answering' (which
    ends the run) was wrong; the refused prompt is an error row and the run goes on."""
    out = _run(engine, "503_one", prompts=((1, 2, 3), (1, 2, 4), (1, 2, 5)))
    errors = [r for r in out if isinstance(r, Exception)]
    assert len(out) == 3 and len(errors) == 2
    assert all(isinstance(e, EngineRequestError) and "refused the request 2 time(s): HTTP 503" in str(e)
               for e in errors)


def test_a_metrics_page_that_stops_parsing_costs_telemetry_not_the_run(engine):
    """A gateway's HTML page with 200 on /metrics mid-run killed the worker thread, and the runner
    waited for it forever."""
    out = _run(engine, "metrics_html")
    assert Faulty.scrapes > 1   # the counters were read, and then the page broke
    assert len(out) == 2 and all(list(r.tokens) == TOKENS for r in out)


def test_an_answer_from_another_model_than_the_config_pins_is_refused(engine):
    """A router that fell back to another deployment: OpenAI chunks name the model that answered,
    and nothing read it."""
    from decoders.engines.client import Piece
    from decoders.engines.openai_compat import parse_completion_chunk
    assert parse_completion_chunk({"model": "other", "choices": []}).final["model"] == "other"

    class Answers(LlamaCppDecoder):
        model_said = "other"

        async def stream(self, http, request):
            yield Piece(tokens=TOKENS[:2], margins=[3.0, 3.0], text="xy", finish_reason="length",
                        final={"model": self.model_said})

    Faulty.mode = "good"
    dec = Answers(load_model("tiny-llama"), base_url=engine, model="tiny", retries=0)
    [(_, out)] = list(dec.generate_many([GenerationRequest((1, 2, 3), max_new_tokens=2)]))
    assert isinstance(out, EngineRequestError) and "answered as model 'other'; the config pins model 'tiny'" in str(out)
    Answers.model_said = "tiny"
    [(_, out)] = list(dec.generate_many([GenerationRequest((1, 2, 3), max_new_tokens=2)]))
    assert list(out.tokens) == TOKENS[:2] and out.stats["answered_model"] == "tiny"


def test_a_wedged_request_ends_at_the_deadline_cancelled_and_the_answered_ones_are_kept(engine):
    """An engine decoder runs in decodegate's process: a request the server never answers must end
    at the runner's limit (`deadline`) with its client cancelled, not hold the run until the
    watchdog ends it. The prompt ending in 3 is held; the one ending in 4 answers first."""
    from decoders.engines.client import Overdue
    Faulty.mode, Faulty.held = "hang", 0
    Faulty.release.clear()
    dec = LlamaCppDecoder(load_model("tiny-llama"), base_url=engine, retries=0, concurrency=2)
    dec.server.warmed = True   # the timed batch alone (its warm-up would be held the same way)
    dec.deadline = time.monotonic() + 1.5
    got: list = []
    t0 = time.monotonic()
    try:
        with pytest.raises(Overdue, match="1 of 2 requests unanswered at the time limit"):
            for i, r in dec.generate_many([GenerationRequest(p, max_new_tokens=len(TOKENS)) for p in ((1, 2, 3), (1, 2, 4))]):
                got.append((i, r))
        took = time.monotonic() - t0
        assert Faulty.held >= 1 and 1.2 < took < 20, (Faulty.held, took)
        assert [(i, list(r.tokens)) for i, r in got] == [(1, TOKENS)]     # the answered one was yielded
        # Nothing of the batch is left running: its event-loop thread ended with the cancel.
        assert not _batch_threads()
    finally:
        Faulty.release.set()
    # The control: no deadline, nothing held, both answered.
    dec.deadline = None
    assert len(_run(engine, "good")) == 2


def _batch_threads() -> list:
    return [t for t in threading.enumerate()
            if getattr(getattr(t, "_target", None), "__qualname__", "").endswith("generate_many.<locals>.work")]


def test_a_deadline_already_past_sends_nothing_and_leaves_no_thread(engine):
    """A batch whose deadline passed before its event loop ran: the cancel found no loop to cancel,
    and the batch went on sending requests after Overdue said they were cancelled."""
    from decoders.engines.client import Overdue
    Faulty.mode = "good"
    dec = LlamaCppDecoder(load_model("tiny-llama"), base_url=engine, retries=0, concurrency=2)
    dec.server.warmed = True
    before = Faulty.posts
    dec.deadline = time.monotonic() - 1.0
    with pytest.raises(Overdue, match="2 of 2 requests unanswered at the time limit .*they were cancelled"):
        list(dec.generate_many([GenerationRequest(p, max_new_tokens=len(TOKENS)) for p in ((1, 2, 3), (1, 2, 4))]))
    time.sleep(0.5)
    assert Faulty.posts == before and not _batch_threads(), (Faulty.posts - before, _batch_threads())


def test_a_batch_whose_end_hangs_keeps_its_results_and_loses_only_its_telemetry(engine):
    """Every request answered, then the engine's /metrics (read to difference its counters)
    stopped answering: the batch waited out the request timeout past its deadline."""
    Faulty.mode, Faulty.scrapes = "metrics_hang", 0
    Faulty.release.clear()
    dec = LlamaCppDecoder(load_model("tiny-llama"), base_url=engine, retries=0, concurrency=2,
                          request_timeout_s=60)
    dec.server.warmed = True
    dec.metrics_ok = True   # scrape around the batch (this page's counter names are vLLM's, not llama.cpp's)
    Faulty.hang_after = Faulty.scrapes + 1   # the batch's first scrape answers, its closing one hangs
    try:
        t0 = time.monotonic()
        dec.deadline = t0 + 1.5
        out = [r for _, r in dec.generate_many([GenerationRequest(p, max_new_tokens=len(TOKENS))
                                                for p in ((1, 2, 3), (1, 2, 4))])]
        took = time.monotonic() - t0
        assert [list(r.tokens) for r in out] == [TOKENS, TOKENS]
        assert took < 20 and "ran past the time limit" in dec.last_batch.get("unmeasured", ""), (took, dec.last_batch)
        assert not _batch_threads()
    finally:
        Faulty.release.set()
