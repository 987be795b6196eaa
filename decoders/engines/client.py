"""The part every engine flavour shares: a `Decoder` whose `generate` is one streamed HTTP request.

A flavour (llama.cpp's `/completion`, OpenAI `/v1/completions`, SGLang's `/generate`, ...) only
says how to turn a `GenerationRequest` into a request and each streamed chunk into a `Piece`
(new token ids, their top-1 minus top-2 logprob, new text). This module does the rest the same
way for all of them:
- stopping rules: the engine's tokens go through the same `Emitter` as the in-process decoders,
  so EOS, stop strings and the token budget cut the output where `standard` would cut it;
- timing: a token's time is when the chunk carrying it arrived (TTFT = first chunk with a token);
- faults: connection errors and timeouts are retried a bounded number of times; an engine that
  still does not answer (or whose process died) raises `EngineDown`, which ends the run with the
  finished records kept; an HTTP error on one request (prompt too long, bad option) is a
  `DecoderError` for that item only;
- concurrency: `generate_many` keeps up to `concurrency` requests in flight (asyncio) and yields
  each result as it finishes, so the runner writes every record the moment it exists; the
  batch's streams share one pool of kept-alive connections (`stream_pool`), closed with it;
- resends: a request sent to the server again (a kept-alive connection closed under it, a retry
  after an attempt that reached the server) may have been served twice; each is counted
  (`resends`), and the server's counters differenced around it are not taken as its own;
- warm-up: before its first timed request to a server, a decoder sends a few untimed requests
  shaped like the timed ones (`warm`), so a cold server does not read as a slow one;
- telemetry: per-request acceptance from the final chunk when the flavour has it, else the
  engine's Prometheus counters differenced around the request (one request in flight only).
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator

import httpx

from decoders.base import Decoder, DecoderError, GenerationRequest, GenerationResult, Timing
from decoders.common import Emitter
from decoders.engines.server import EngineDown, EngineError, EngineServer, EngineSpec
from decoders.engines.telemetry import flatten, request_delta, spec_counters, spec_delta, stats_from_delta


@dataclass
class Piece:
    """What one streamed chunk adds."""
    tokens: list[int] = field(default_factory=list)
    margins: list[float | None] = field(default_factory=list)   # top-1 minus top-2 logprob per token
    text: str = ""
    finish_reason: str | None = None                            # "eos", "stop_string", "length"
    final: dict = field(default_factory=dict)                   # last chunk's extras (timings, meta)


def top2_gap(logprobs: list[float]) -> float | None:
    """Top-1 minus top-2 logprob: the logit gap (softmax shifts every logit by one constant)."""
    if len(logprobs) == 2:   # what `logprobs: 2` sends for every token: no sort
        a, b = logprobs
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b):
            return a - b if a >= b else b - a
    finite = sorted((x for x in logprobs if x is not None and math.isfinite(x)), reverse=True)
    return finite[0] - finite[1] if len(finite) >= 2 else None


# Warm-up before any timed request (`warm`): requests shaped like the timed ones, timed by no
# one. A cold server reads as a slower baseline (compilation, allocator and cache warm-up land
# on the first requests): `make regress-vllm` once timed its first baseline request at 5.28 s
# against 2.13 s for the same request in the A/A repeat, and reported the plain server 1.09x
# faster than itself.
WARMUP_SEQUENTIAL = 2   # one at a time: first-call costs
WARMUP_BURST = 8        # then up to this many at once (at most the timed concurrency): batch shapes


def warmup_requests(requests: list[GenerationRequest], n: int) -> list[GenerationRequest]:
    """`n` requests shaped like the timed ones (the same lengths, budget and sampling options),
    cycling through them, each with its prompt ids reversed: a prefix cache (vLLM's, on by
    default) then holds nothing a timed request would find, so warming does not make the timed
    prompts cheaper than they are. A chat request keeps its messages (the engine renders those)."""
    import dataclasses
    return [dataclasses.replace(r, prompt_ids=tuple(reversed(r.prompt_ids)))
            for r in (requests[i % len(requests)] for i in range(n))] if requests else []


async def warm(decoder: "EngineDecoder", http: httpx.AsyncClient, requests: list[GenerationRequest],
               burst: int) -> dict:
    """Send warm-up requests (see WARMUP_SEQUENTIAL) and drop their answers; their errors are
    counted, not raised: a server that is down is found by the timed requests, with their rows."""
    t0, cpu0, errors = time.perf_counter(), time.thread_time(), []

    async def one(r):
        try:
            await decoder._stream_once(http, r)
        except Exception as e:  # noqa: BLE001 - a warm-up's failure is reported, never a run's
            errors.append(f"{type(e).__name__}: {str(e)[:200]}")
    sequential = warmup_requests(requests, WARMUP_SEQUENTIAL)
    for r in sequential:
        await one(r)
    wave = warmup_requests(requests, min(burst, WARMUP_BURST)) if burst > 1 else []
    await asyncio.gather(*(one(r) for r in wave))
    decoder.server.warmed = True
    return {"requests": len(sequential) + len(wave), "errors": len(errors), "first_error": errors[0] if errors else None,
            "wall_s": time.perf_counter() - t0, "cpu_s": time.thread_time() - cpu0}


class Overdue(Exception):
    """A batch ran past the runner's time limit (`EngineDecoder.deadline`): the engine hung. Not a
    DecoderError: it is the decoder's stop, like a worker that hung, not one item's error."""


def _cancel(running: dict, worker: threading.Thread) -> bool:
    """Stop a batch from another thread; True once its thread has ended. The flag stops a loop that
    has not started (it returns at once), the cancel one that is running (its requests abandoned)."""
    running["stop"].set()
    if "loop" in running and worker.is_alive():
        with contextlib.suppress(RuntimeError):   # the loop closed in between: nothing left to cancel
            running["loop"].call_soon_threadsafe(running["task"].cancel)
    worker.join(timeout=10)
    return not worker.is_alive()


class EngineRequestError(DecoderError):
    """One request the engine refused (HTTP 4xx/5xx): recorded for that item, the run goes on."""


RETRY_STATUS = {429, 502, 503, 504}


def _transient(e: Exception) -> bool:
    """Connection refused or reset, timeouts: worth a retry (httpx's and the openai client's)."""
    import openai
    return isinstance(e, (httpx.TransportError, openai.APIConnectionError))


def _status(e: Exception) -> int | None:
    import openai
    if isinstance(e, httpx.HTTPStatusError):
        return e.response.status_code
    if isinstance(e, openai.APIStatusError):
        return e.status_code
    return None


def malformed(e: Exception) -> bool:
    """A response that could not be read (bad JSON, fields missing, an error event in a 200
    stream that the openai client raises as a bare APIError): that item's error, named."""
    import json
    import openai
    return isinstance(e, (json.JSONDecodeError, ValueError, KeyError, TypeError, IndexError, openai.APIError))


def _detail(e: Exception) -> str:
    if isinstance(e, httpx.HTTPStatusError):
        return _body(e.response)
    return str(e)[:300]


class EngineDecoder(Decoder):
    """Base of the engine flavours. Options: `engine` (an `EngineServer`, given by the harness
    from the config's [engines] table) or `base_url` (an engine already running); `extra`
    (request fields passed through as they are, e.g. llama.cpp's `speculative.n_max`);
    `concurrency`, `request_timeout_s`, `retries` override the engine's."""

    name = "engine"
    flavour = "?"
    returns_ids = True          # False: the route gives text only; outputs are compared on text
    needs = ""                  # what to turn on when token ids or logprobs are missing

    def __init__(self, target, engine: EngineServer | None = None, base_url: str | None = None,
                 model: str | None = None, extra: dict | None = None, concurrency: int | None = None,
                 request_timeout_s: float | None = None, retries: int | None = None, **options):
        if options:
            raise DecoderError(f"decoder {self.name!r} takes no option(s) {', '.join(sorted(options))}; "
                               f"it takes engine, base_url, model, extra, concurrency, request_timeout_s, retries")
        if engine is None:
            if not base_url:
                raise DecoderError(f"decoder {self.name!r} needs an engine: name one from the config's "
                                   f"[engines] table (engine = \"NAME\") or give base_url")
            engine = EngineServer(EngineSpec(name=base_url, base_url=base_url, model=model))
            engine.start()
        self.target = target
        self.tokenizer = target.tokenizer
        self.server = engine
        spec = engine.spec
        self.extra = dict(extra or {})
        self.concurrency = int(concurrency or spec.concurrency)
        if self.concurrency < 1:
            raise DecoderError(f"concurrency must be >= 1, got {self.concurrency}")
        self.timeout = float(request_timeout_s or spec.request_timeout_s)
        self.retries = int(spec.retries if retries is None else retries)
        self.metrics_ok = spec_counters(engine.metrics()) is not None
        self.last_batch: dict = {}
        self.warmup: dict | None = None   # what `warm` sent before this decoder's first timed batch
        self.deadline: float | None = None  # time.monotonic() by which a batch must be answered (the runner's)

    # ------------------------------------------------------------------------- for flavours

    def stream(self, http: httpx.AsyncClient, request: GenerationRequest) -> AsyncIterator[Piece]:
        raise NotImplementedError

    def telemetry(self, final: dict) -> dict:
        """Per-request acceptance stats from the final chunk; {} when the flavour has none."""
        return {}

    def drafts_expected(self) -> bool:
        """Whether the engine is known to speculate, so counters that did not move mean
        "0 drafted" (the drafter found nothing) rather than "no speculation here"."""
        return False

    def keeps_connections(self, in_flight: int | None) -> bool:
        """Whether a batch of up to `in_flight` streams keeps its connections alive (stream_pool).
        llama.cpp's server serves a connection on one of its HTTP threads for as long as the
        connection is kept (at least its slots + 2 threads): with more kept connections than
        threads, a request on a connection no thread holds waits behind newer requests sent on
        the kept ones, where a connection per request is served in the order it came. So there,
        only a batch of at most its slots (`total_slots` in /props) keeps them."""
        info = getattr(self.server, "info", None) or {}
        if info.get("engine") != "llama.cpp":
            return True
        slots = (info.get("props") or {}).get("total_slots")
        return bool(in_flight and isinstance(slots, int) and in_flight <= slots)

    async def open_session(self):
        """A client object for one batch, made inside its event loop (the openai client)."""
        return None

    async def close_session(self) -> None:
        pass

    def url(self, path: str) -> str:
        return self.server.base_url + path

    def prompt_logprobs(self, context: list[int], tokens: list[int], k: int) -> list[dict[int, float]]:
        """The engine's top-k raw logprobs {token id: logprob} at each position of `tokens`
        continuing `context` (teacher forcing: the exactness reference `engine:NAME`)."""
        raise DecoderError(f"decoder {self.name!r} ({self.flavour}) cannot return prompt logprobs: it cannot serve "
                           f"as an exactness reference (reference = \"engine:...\"); use reference = \"target\"")

    # ------------------------------------------------------------------------------ contract

    def generate(self, request: GenerationRequest) -> GenerationResult:
        for _, out in self.generate_many([request]):
            if isinstance(out, BaseException):
                raise out
            return out
        raise AssertionError("unreachable")

    def generate_many(self, requests) -> Iterator[tuple[int, GenerationResult | DecoderError]]:
        """Up to `concurrency` in flight; yields (index, result or per-item error) as each finishes.
        An `EngineDown` is raised after every result that finished before it has been yielded;
        `Overdue`, with the requests left in flight cancelled, once `deadline` has passed."""
        requests = list(requests)
        done: queue.Queue = queue.Queue()
        running: dict = {"stop": threading.Event()}   # the batch's event loop and task, for a cancel from here

        def work():
            try:
                asyncio.run(self._many(requests, done, running))
            except BaseException as e:  # noqa: BLE001 - whatever ends the worker reaches the runner, never a hang
                done.put(e)

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        for n in range(len(requests)):
            try:
                item = done.get(timeout=self._left())
            except queue.Empty:
                how = "they were cancelled" if _cancel(running, worker) else "the batch's thread did not stop"
                raise Overdue(f"{len(requests) - n} of {len(requests)} requests unanswered at the time limit "
                              f"(--item-timeout, --hang-factor); {how}") from None
            if isinstance(item, BaseException):
                worker.join(timeout=30)
                raise item
            yield item
        # Every request answered: what is left (the engine's counters, closing) is bounded too, and
        # past the limit it costs the batch's telemetry, not its results.
        worker.join(timeout=self._left())
        if worker.is_alive():
            _cancel(running, worker)
            self.last_batch = {"requests": len(requests), "unmeasured": "the batch's end (the engine's counters) "
                                                                        "ran past the time limit"}

    def _left(self) -> float | None:
        """Seconds until `deadline` (None: no limit)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    async def _many(self, requests, done: queue.Queue, running: dict) -> None:
        running.update(loop=asyncio.get_running_loop(), task=asyncio.current_task())
        if running["stop"].is_set():   # the deadline passed before this loop ran: send nothing
            return
        gate = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency + 2)
        timeout = httpx.Timeout(self.timeout, connect=10.0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=self.server.headers()) as http, \
                stream_pool(self.concurrency, keep_alive=self.keeps_connections(self.concurrency)):
            self.session = await self.open_session()
            if not getattr(self.server, "warmed", False):   # once per server and process, before any timing
                self.warmup = await warm(self, http, requests, self.concurrency)
            before = await self._spec_counters(http) if self.metrics_ok else None
            batch_resent = _RESENT.set([0])   # this task's and its request tasks' (resends)

            async def one(i, request):
                async with gate:
                    try:
                        done.put((i, await self._one(http, request)))
                    except DecoderError as e:
                        if isinstance(e, EngineDown):
                            raise
                        done.put((i, e))

            tasks = [asyncio.create_task(one(i, r)) for i, r in enumerate(requests)]
            try:
                try:
                    await asyncio.gather(*tasks)
                finally:
                    await self.close_session()
            except EngineDown as e:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                done.put(e)
                return
            except BaseException as e:  # a bug in a flavour: surface it, never hang the runner
                for t in tasks:
                    t.cancel()
                done.put(e)
                return
            after = await self._spec_counters(http) if self.metrics_ok else None
            resent = _RESENT.get()[0]
            _RESENT.reset(batch_resent)
            self.last_batch = {"requests": len(requests), "concurrency": self.concurrency, "resent": resent,
                               **stats_from_delta(spec_delta(before, after) if not resent else None,
                                                  self.drafts_expected())}
            if resent:   # a request sent twice may have been served twice: the counters are not the batch's
                self.last_batch["unmeasured"] = (f"{resent} request(s) sent again after the server may have "
                                                 f"read them (client.resends)")

    async def _spec_counters(self, http: httpx.AsyncClient) -> dict | None:
        """The speculative counters now, or None where /metrics did not answer with Prometheus text
        (a proxy's HTML error page answers 200 too): telemetry is then missing, never a crash."""
        try:
            r = await http.get(self.url("/metrics"))
            r.raise_for_status()
            return spec_counters(flatten(r.text))
        except (httpx.HTTPError, ValueError):
            return None

    async def _answers_health(self, http: httpx.AsyncClient) -> bool:
        try:
            return (await http.get(self.url("/health"), timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def _one(self, http: httpx.AsyncClient, request: GenerationRequest) -> GenerationResult:
        last: Exception | None = None
        resent = 0
        for attempt in range(self.retries + 1):
            if not self.server.alive():
                break
            if last is not None and not isinstance(last, (httpx.ConnectError, httpx.ConnectTimeout)):
                _count_resend()   # the last attempt reached the server: a retry may be served twice
                resent += 1
            try:
                before = await self._spec_counters(http) if self.metrics_ok and self.concurrency == 1 else None
                with resends() as sent:
                    try:
                        result = await self._stream_once(http, request)
                    finally:
                        resent += sent[0]
                if resent:
                    result.stats["resent"] = resent   # see resends: the server may have served it twice
                if sent[0]:
                    before = None   # the counters' difference may hold this request twice: not its own
                if before is not None:
                    # One request in flight: the counters' difference is this request's alone.
                    # Per-request fields from the engine's own payload take precedence.
                    delta = await request_delta(lambda: self._spec_counters(http), before, result.stats,
                                                drafts_expected=self.drafts_expected())
                    for key, value in delta.items():
                        result.stats.setdefault(key, value)
                add_target_forwards(result)
                return result
            except DecoderError:
                raise
            except Exception as e:  # noqa: BLE001 - sorted into transient / refused / malformed below
                status = _status(e)
                if status is None and not _transient(e):
                    if malformed(e):
                        raise EngineRequestError(f"engine {self.server.spec.name!r} sent a malformed or error "
                                                 f"response: {type(e).__name__}: {str(e)[:300]}") from None
                    raise
                if status is not None and status not in RETRY_STATUS:
                    raise EngineRequestError(f"engine {self.server.spec.name!r} refused the request: "
                                             f"HTTP {status}: {_detail(e)}") from None
                last = e
            await asyncio.sleep(min(2.0 ** attempt, 10.0))
        if last is not None and _status(last) is not None and self.server.alive() and await self._answers_health(http):
            # It answers, and refused this request every time (a 503 for this prompt only): an
            # error for this item, not an engine that stopped answering.
            raise EngineRequestError(f"engine {self.server.spec.name!r} refused the request {self.retries + 1} "
                                     f"time(s): HTTP {_status(last)}: {_detail(last)}")
        if isinstance(last, httpx.RemoteProtocolError) and self.server.alive() and await self._answers_health(http):
            # It answers /health, and cut its answer to this request every time (a stream ended
            # mid-chunk, a connection dropped mid-answer): that item's error, not an engine that
            # stopped answering (which ended the whole run, resumable, for one request's cut).
            raise EngineRequestError(f"engine {self.server.spec.name!r} cut its answer to this request "
                                     f"{self.retries + 1} time(s) while it still answers /health: {last}")
        state = (self.server.exit_state() or "its process exited" if not self.server.alive()
                 else f"{type(last).__name__}: {last}" if last else "no answer")
        log = f"; log {self.server.log_path}:\n{self.server.log_tail()}" if self.server.log_path else ""
        raise EngineDown(f"engine {self.server.spec.name!r} at {self.server.base_url} stopped answering "
                         f"after {self.retries + 1} attempt(s) ({state}){log}")

    async def _stream_once(self, http: httpx.AsyncClient, request: GenerationRequest) -> GenerationResult:
        out = Emitter(request, self.tokenizer, request.max_new_tokens)
        text, chunk_times, finish, final = [], [], None, {}
        clock, emit = time.perf_counter, out.emit   # looked up once, not once per streamed token
        async for piece in self.stream(http, request):
            now = clock()
            tokens, margins = piece.tokens, piece.margins
            text.append(piece.text)
            if piece.text or tokens:
                chunk_times.append(now)
            finish = piece.finish_reason or finish
            if piece.final:
                final.update(piece.final)
            if len(margins) < len(tokens):
                margins = margins + [None] * (len(tokens) - len(margins))
            for token, margin in zip(tokens, margins):
                if out.done:
                    break
                emit(token, margin, at=now)
        stats = {"engine": self.server.spec.name, "flavour": self.flavour, **self.telemetry(final)}
        answered = final.get("model")
        if answered:
            stats["answered_model"] = answered
            if self.server.spec.model and answered != self.server.spec.model:
                # A router that fell back to another deployment (another model, speculation off):
                # its tokens are not the configured engine's.
                raise EngineRequestError(f"engine {self.server.spec.name!r} answered as model {answered!r}; the "
                                         f"config pins model {self.server.spec.model!r}")
        if not out.done and finish is None:
            # No stop event, no finish reason: a connection cut mid-stream, or an error event the
            # flavour does not know. What arrived is not the engine's answer.
            raise EngineRequestError(f"engine {self.server.spec.name!r} ended its stream after {len(out.tokens)} "
                                     f"token(s) without a finish reason (a cut connection or an error it did not "
                                     f"name)")
        if not out.tokens and not "".join(text) and finish == "length":
            raise EngineRequestError(f"engine {self.server.spec.name!r} answered with no tokens and finish "
                                     f"reason 'length' (asked for up to {request.max_new_tokens})")
        if not out.tokens and "".join(text):
            if self.returns_ids:
                raise EngineRequestError(f"engine {self.server.spec.name!r} returned text but no token ids; "
                                         f"{self.needs}")
            return self._text_result("".join(text), finish, out.t0, chunk_times, stats)
        if not out.done:
            out.finish_reason = finish or "length"
        result = out.result(self.name, stats)
        if result.tokens and all(math.isnan(m) for m in result.margins):
            result.stats["margins"] = f"missing: {self.needs}"
        return result

    def _text_result(self, text: str, finish, t0: float, chunk_times: list[float], stats: dict) -> GenerationResult:
        # Compared on text: the tokens are the harness tokenizer's reading of the engine's text.
        ids = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        stamps = chunk_times or [time.perf_counter()]
        times = [b - a for a, b in zip([t0] + stamps[:-1], stamps)]
        return GenerationResult(tokens=ids, text=text, decoder=self.name, finish_reason=finish or "length",
                                timing=Timing(wall_s=stamps[-1] - t0, ttft_s=times[0], token_times_s=tuple(times)),
                                stats={**stats, "compare_on": "text"})


def add_target_forwards(result: GenerationResult) -> None:
    """τ's denominator, once the stats are complete: after the Prometheus difference is merged,
    so τ is known on that path too, not only where the engine sent per-request counts. Each
    target forward emits its accepted drafts plus one token of its own."""
    stats = result.stats
    if "accepted" in stats and "target_forwards" not in stats and result.tokens:
        stats["target_forwards"] = max(len(result.tokens) - int(stats["accepted"]), 1)


def _body(response: httpx.Response) -> str:
    try:
        text = response.text
    except httpx.ResponseNotRead:  # flavours read error bodies before raising; this is a fallback
        text = ""
    return (text or "(no body)")[:300]


JSON = {"content-type": "application/json"}

# The streams' connections: one aiohttp session per batch (generate_many's) or load level
# (harness.run.load.play), its connections kept alive from one request to the next. A new
# session and TCP connection per request cost 3.5-5.7 ms each on the loaded 2-core machine,
# more than a 64-token answer streams in.
_POOL: contextvars.ContextVar = contextvars.ContextVar("decodegate_stream_pool", default=None)
POOL_SLACK = 4      # connections past the batch's in-flight cap: one still being released is no wait
# An idle connection is dropped by the client before the servers drop it (uvicorn's 5 s for vLLM
# and SGLang, cpp-httplib's 5 s for llama.cpp), so a level's pauses do not meet closed sockets.
KEEPALIVE_S = 2.0


@contextlib.asynccontextmanager
async def stream_pool(in_flight: int | None, keep_alive: bool = True):
    """The connections `sse_json` streams through in this task and the tasks it starts: one
    aiohttp session whose connector holds up to `in_flight` (+ POOL_SLACK) connections (None: no
    cap), kept alive between requests (`keep_alive`; else one per request, see
    EngineDecoder.keeps_connections), all closed when the block ends."""
    import aiohttp
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_mark_reused)
    limit = in_flight + POOL_SLACK if in_flight else 0
    connector = (aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_S) if keep_alive
                 else aiohttp.TCPConnector(limit=limit, force_close=True))
    session = aiohttp.ClientSession(connector=connector, trace_configs=[trace])
    token = _POOL.set((asyncio.get_running_loop(), session))
    try:
        yield session
    finally:
        _POOL.reset(token)
        await session.close()


async def _mark_reused(session, context, params) -> None:
    if isinstance(context.trace_request_ctx, dict):
        context.trace_request_ctx["reused"] = True


# Requests sent to the server more than once, counted for whoever opened a counter around them
# (`resends`): the load phase's rows and the closed loop's batches. A server that had read a
# request (or a proxy that had passed it on) before it closed the connection without a byte
# served it twice: its counters and histograms, differenced around a request, batch or level,
# then count one request twice, which nothing else in the row would show.
_RESENT: contextvars.ContextVar = contextvars.ContextVar("decodegate_resent", default=None)


@contextlib.contextmanager
def resends() -> Iterator[list[int]]:
    """Count the requests sent again inside this block (this task and the tasks it starts):
    yields a one-element list, [times sent again], read when the block ends."""
    outer, count = _RESENT.get(), [0]
    token = _RESENT.set(count)
    try:
        yield count
    finally:
        _RESENT.reset(token)
        if outer is not None:   # a request's count is its batch's too
            outer[0] += count[0]


def _count_resend() -> None:
    count = _RESENT.get()
    if count is not None:
        count[0] += 1


async def _answer(stack: contextlib.AsyncExitStack, url: str, **options):
    """The response to a POST: through the pool of this batch where there is one (stream_pool),
    else on a connection of its own. A kept-alive connection that the server closed as the
    request took it (an idle timeout that fired just then; llama.cpp's server does it: "Server
    disconnected") fails before any byte of an answer, and aiohttp retries only idempotent
    methods: that request goes again once, on a new connection, as it would have gone with no
    pool. Nothing on the client can tell that close from a server (or proxy) that read the
    request, served it and closed without a byte, so each such resend is counted (`resends`):
    the row says `resent`, and the server-side differences around it are refused as unmeasured.
    A new connection that fails, or an answer cut after it began, is raised as before."""
    import aiohttp
    pool = _POOL.get()
    if pool is not None and pool[0] is asyncio.get_running_loop():
        mark: dict = {}
        try:
            return await stack.enter_async_context(pool[1].post(url, trace_request_ctx=mark, **options))
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError) as e:
            if isinstance(e, aiohttp.ClientConnectorError) or not mark.get("reused"):
                raise
        _count_resend()
    return await stack.enter_async_context(aiohttp.request("POST", url, **options))


_json = json.JSONDecoder().decode   # json.loads(str) without its checks: the parse, once per chunk
DRAIN_S = 0.1   # after [DONE]: how long the body's end may take (it follows at once) before the connection is dropped


async def sse_json(http: httpx.AsyncClient, url: str, body: dict) -> AsyncIterator:
    """POST `body` as JSON and yield each server-sent event's `data` parsed with `json.loads`,
    until the stream ends or sends `[DONE]`: the whole per-chunk cost of the light client.

    The stream is read with aiohttp (its C HTTP parser: a few µs a read, where httpx's h11 and
    anyio layers cost ~30 µs, and a GPU server sends a read per token), on a kept-alive
    connection of the batch's pool (stream_pool; a connection of its own outside one). After
    `[DONE]` the rest of the body (the chunked stream's end) is read, up to DRAIN_S, so the
    connection goes back to the pool; the answer's times were taken before. `http` (the batch's
    httpx client) gives the headers and timeouts; its errors are raised as httpx's (a refusal
    as `HTTPStatusError` with the body read, a connection that fails as `ConnectError`, a cut as
    `RemoteProtocolError`, a silence or a stream not done within the request's timeout as
    `ReadTimeout`), so what is retried, refused or counted as malformed is decided as before.

    No per-chunk objects: the bytes are split into lines here (SSE ends a line at \\n, \\r\\n or
    \\r), an event's `data:` lines are joined with \\n and the event is parsed when its blank
    line arrives, as the SSE spec and httpx-sse read it; `id:` and comments carry nothing the
    parsers use. An error event is yielded as `{"error": ...}`, the shape every flavour already
    refuses as that request's error, whichever way the server sends it: `event: error` with its
    data (the SSE way), or llama.cpp's own `error: {json}` field; read as data, the first was
    taken for an ordinary chunk (a row of tokens whose server said it failed) and the second
    was dropped (its message lost). An event cut off by the end of the stream is dropped (the
    spec's rule), so a cut stream ends without a finish reason and the request says so."""
    import aiohttp
    content = json.dumps(body, separators=(",", ":")).encode()
    t = http.timeout
    # `request_timeout_s` is the whole request's, streaming included (EngineSpec): a bound on each
    # read alone let a server that trickles keep-alive comments (or tokens past the budget) hold
    # a request, and the level or batch waiting on it, for ever. No `sock_read`: a silence is cut
    # by `total` as soon as it would be (the same bound), and aiohttp re-arms a `sock_read` timer
    # on every read (a cancel and a `call_later` per streamed token, the heaviest line of the
    # client's profile at 512 streams in flight).
    timeout = aiohttp.ClientTimeout(total=t.read, sock_connect=t.connect)
    headers = {**{k: v for k, v in http.headers.items() if k.lower() in ("authorization",)}, **JSON}
    try:
        async with contextlib.AsyncExitStack() as stack:
            response = await _answer(stack, url, data=content, headers=headers, timeout=timeout)
            if response.status >= 400:
                text = await response.text(errors="replace")
                request = httpx.Request("POST", url)
                raise httpx.HTTPStatusError(f"HTTP {response.status} from {url}", request=request,
                                            response=httpx.Response(response.status, text=text, request=request))
            events = _Events()
            async for block in response.content.iter_any():
                for payload, error in events.feed(block):
                    # str, not bytes: json.loads would first guess the bytes' encoding (UTF-8 in SSE)
                    yield {"error": _error_value(payload)} if error else _json(payload.decode())
                if events.done:
                    break
            await _drain(response.content)
    except aiohttp.ClientConnectorError as e:
        raise httpx.ConnectError(str(e)) from e
    except (aiohttp.ServerTimeoutError, asyncio.TimeoutError) as e:
        raise httpx.ReadTimeout(f"no complete answer from {url} within {t.read} s (request_timeout_s: the "
                                f"whole request, streaming included)") from e
    except aiohttp.ClientError as e:   # a reset, a cut chunk, a server that went away mid-stream
        raise httpx.RemoteProtocolError(f"{type(e).__name__}: {e}") from e


async def _drain(content) -> None:
    """Read what follows `[DONE]` (the chunked body's end) so the connection can be kept; a
    server that goes on sending, or is slow to end, costs only that connection (closed)."""
    import aiohttp
    if content.at_eof():
        return

    async def rest():
        read = 0
        while read < 1 << 16 and not content.at_eof():
            read += len(await content.readany())
    with contextlib.suppress(asyncio.TimeoutError, aiohttp.ClientError):
        await asyncio.wait_for(rest(), DRAIN_S)


def _error_value(payload: bytes):
    """An error event's data: its JSON (the `error` member of `{"error": ...}`), else its text."""
    try:
        value = json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace")[:300] or "(no detail)"
    return value["error"] if isinstance(value, dict) and value.get("error") else value


class _Events:
    """The complete events in a byte stream (see sse_json), block by block: `feed(block)` gives
    (data, is an error event) for each event the block completes, up to `[DONE]` (then `done`).
    A plain object called once per read, not an async generator between the socket and the
    parser: one generator hop less per token (the reader's cost is per read, and a GPU server
    sends a read per token)."""

    __slots__ = ("data", "error", "rest", "done")

    def __init__(self):
        self.data: list[bytes] = []
        self.error = False
        self.rest = b""
        self.done = False

    def feed(self, block: bytes) -> list[tuple[bytes, bool]]:
        buf = self.rest + block if self.rest else block
        if b"\r" in buf:   # rare: normalise, keeping a final \r back (its \n may be in the next block)
            held = b"\r" if buf.endswith(b"\r") else b""
            buf = buf[:len(buf) - len(held)].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            lines = buf.split(b"\n")
            self.rest = lines.pop() + held
        else:
            lines = buf.split(b"\n")
            self.rest = lines.pop()
        out = []
        data = self.data
        for line in lines:
            if not line:
                if data or self.error:
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    if not self.error and payload.strip() == b"[DONE]":
                        self.done = True
                        return out
                    out.append((payload, self.error))
                    data = self.data = []
                    self.error = False
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.startswith(b"event:"):
                self.error = line[6:].strip() == b"error"
            elif line.startswith(b"error:"):   # llama.cpp's server: `error: {json}`, no data line
                data.append(line[7:] if line[6:7] == b" " else line[6:])
                self.error = True
        return out


async def raise_for_status(response: httpx.Response) -> None:
    """`raise_for_status` on a streamed response, with its body read so the error can show it."""
    if response.is_error:
        await response.aread()
        response.raise_for_status()


def check_served(decoder: EngineDecoder) -> None:
    """Refuse an engine whose tokenizer disagrees with the harness's on a probe text."""
    probe = "The quick brown fox: 12 + 7 = 19. déjà vu — naïve café\n  def f(x):"
    want = list(decoder.tokenizer(probe, add_special_tokens=False)["input_ids"])
    try:
        got = decoder.tokenize(probe)
    except (httpx.HTTPError, ValueError, KeyError):
        return  # the engine has no tokenize route: nothing to compare
    if got and list(got) != want:  # an empty answer: the route exists but ignored our fields
        raise EngineError(f"engine {decoder.server.spec.name!r} (model {decoder.server.served_model!r}) "
                          f"tokenizes a probe text differently from the target "
                          f"{getattr(decoder.target, 'name', '?')!r}: engine {got[:12]}... vs harness {want[:12]}...; "
                          f"both must use the same tokenizer")
