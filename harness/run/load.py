"""Open-loop load: requests arrive at a rate, on a seeded schedule, whether or not the engine keeps up.

A profile's `rates = [1, 2, 4]` runs, after the closed-loop quality run, one level per rate for
the baseline and each engine candidate, one decoder after the other (each on its own server):
- **The schedule** (`schedule`): `load_requests` arrivals whose gaps are gamma-distributed with
  shape `burstiness` and mean 1/rate, as `vllm bench serve --burstiness` draws them (1: Poisson;
  below 1 burstier, above 1 more regular). The gaps are drawn once from `load_seed` at unit rate
  and divided by the rate, and the items (the profile's work items, reshuffled each time round)
  are drawn once too: every level holds the same items in the same order, every decoder at a
  level gets the same item at the same offset, and a rerun gets the same schedule.
- **One client** (`httpx.AsyncClient`, streams read by decoders.engines.client.sse_json) and one
  event loop serve the whole phase; each request waits for its offset, then (under
  `max_in_flight`, when set) for a free slot, then streams. A level's streams share one pool of
  kept-alive connections (decoders.engines.client.stream_pool), closed with the level.
- **Warm before timing**: a server no timed request has reached yet in this process gets
  untimed warm-up requests shaped like the level's (decoders.engines.client.warm) first.
- **Client workers**: a level whose rate needs more client CPU than one event loop has is
  played by several forked client processes (harness.run.load_workers: `load.client_workers`,
  or as many as the measured cost per request needs, at most the cores).
- **The harness's own cost** is measured, not assumed: the event loop's CPU time over a level,
  per request and per streamed token, as a share of the level (`loop_busy_share`), and how late
  each request left against its offset (`lag_s`, p50/p99 per level). The loop thread does
  nothing else, so its CPU time is what the load generator costs; analysis.load.generator_limit
  says when a level's figures include its own stalls.
- **Faults**: a request the engine refuses or drops is an error row for that request at that
  level; the level and the run go on (an engine that stays down fails every later request too).
- **Telemetry**: per-request acceptance comes with each request where the engine reports it;
  Prometheus counters are read before and after each level and their difference is the level's
  (many requests were in flight), never a request's. So are vLLM's own latency histograms
  (`server_latency`: the server's mean TTFT / TPOT / E2E over the level, on its own clock).
  A request the client sent again (`resent` in its row: a kept-alive connection closed under
  it, decoders.engines.client.resends) may have been served twice, so a level with one has
  neither: `server_latency` says why, and analysis.load refuses the counters.
- **Crossover bracketing**: after the configured rates, up to `refine_levels` extra levels are
  run at the geometric midpoint between a candidate's last paying level and its first
  non-paying one (analysis.load.judge_level decides "pays", the same function the verdict uses).

Rows go to `load.jsonl` (one per request) and `load_levels.jsonl` (one per decoder and level,
written last: a level without one is incomplete and runs again on resume). Rows are kept in
memory during a level and written after it, so no disk sync stalls the event loop mid-level.
"""
from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from decoders.base import DecoderError
from decoders.engines.client import WARMUP_BURST, malformed, resends, stream_pool, warm
from decoders.engines.telemetry import latency_delta, latency_sums, spec_counters, spec_delta
from harness.run.records import LOAD, LOAD_LEVELS as LEVELS, RecordWriter, read_records
from harness.run.runner import WorkItem, make_request, work_items


@dataclass(frozen=True)
class Arrival:
    index: int          # position in the schedule: the pairing key across decoders at a level
    offset_s: float     # seconds after the level starts
    work: WorkItem


def unit_offsets(n: int, burstiness: float, seed: int) -> np.ndarray:
    """Arrival times at rate 1: gamma gaps of shape `burstiness` and mean 1, the first at 0."""
    gaps = np.random.default_rng([seed, 1]).gamma(shape=burstiness, scale=1.0 / burstiness, size=n)
    return np.cumsum(gaps) - gaps[0]


def item_order(n_items: int, n: int, seed: int) -> list[int]:
    """Which work item each of `n` requests carries: the items reshuffled each time round."""
    rng = np.random.default_rng([seed, 2])
    out: list[int] = []
    while len(out) < n:
        out += [int(i) for i in rng.permutation(n_items)]
    return out[:n]


def schedule(works: list[WorkItem], rate: float, *, requests: int, burstiness: float = 1.0,
             seed: int = 0) -> list[Arrival]:
    """The arrivals of one level (see the module docstring): the same for every decoder."""
    if not works:
        raise ValueError("the load schedule needs at least one work item")
    offsets = unit_offsets(requests, burstiness, seed) / float(rate)
    order = item_order(len(works), requests, seed)
    return [Arrival(i, float(offsets[i]), works[order[i]]) for i in range(requests)]


def load_specs(config, lineup) -> list:
    """The baseline and the engine candidates that play the schedule (the A/A rerun does not:
    it measures the engine's numerics, not its speed; in-process decoders are batch-1)."""
    from harness.run.sweep import is_engine, level_config, levels
    cfg = level_config(config, levels(config)[0])
    return [cfg.baseline] + [c for c in cfg.candidates if c.role != "aa-floor" and is_engine(c)]


def _error_text(e: Exception) -> str:
    if isinstance(e, httpx.HTTPStatusError):
        try:
            body = e.response.text[:200]
        except httpx.ResponseNotRead:
            body = ""
        return f"HTTP {e.response.status_code}: {body or e}"
    status = getattr(e, "status_code", None)  # the openai client's APIStatusError
    return (f"HTTP {status}: " if status else f"{type(e).__name__}: ") + str(e)[:300]


def _refusals() -> tuple:
    """What a refused or dropped request raises: httpx's and the openai client's errors, and
    the flavours' own (DecoderError). Anything else is a bug and stops the run."""
    import openai
    return (DecoderError, httpx.HTTPError, openai.OpenAIError)


async def play(decoder, arrivals: list[Arrival], requests: list, http: httpx.AsyncClient,
               max_in_flight: int | None = None, start_at: float | None = None) -> tuple[list[dict], dict]:
    """Send each request at its offset (one event loop, the shared client); return the request
    rows and the level's own measurements (wall time, the loop's CPU time, lag, most in flight).
    `start_at`: the level's start on `time.perf_counter`'s clock (the machine's monotonic clock,
    shared by the client workers of harness.run.load_workers); default now."""
    # The level's connections, kept alive between its requests where the server allows, closed with it.
    async with stream_pool(max_in_flight, keep_alive=decoder.keeps_connections(max_in_flight)):
        return await _play(decoder, arrivals, requests, http, max_in_flight, start_at)


async def _play(decoder, arrivals: list[Arrival], requests: list, http: httpx.AsyncClient,
                max_in_flight: int | None, start_at: float | None) -> tuple[list[dict], dict]:
    refused = _refusals()
    gate = asyncio.Semaphore(max_in_flight) if max_in_flight else None
    rows: list[dict] = []
    state = {"in_flight": 0, "most": 0}
    http.headers.clear()  # one engine plays at a time: its key (if any) is the client's for now
    http.headers.update(decoder.server.headers())
    decoder.session = await decoder.open_session()  # a flavour's own per-batch client, if any
    warmup = None
    if not getattr(decoder.server, "warmed", False):   # a cold server must not read as a slow one
        warmup = await warm(decoder, http, requests, min(max_in_flight or len(requests), WARMUP_BURST))
    cpu0, t0 = time.thread_time(), (time.perf_counter() if start_at is None else start_at)

    async def one(a: Arrival, request) -> None:
        delay = t0 + a.offset_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        due = time.perf_counter()
        if gate is not None:
            await gate.acquire()
        sent = time.perf_counter()
        state["in_flight"] += 1
        state["most"] = max(state["most"], state["in_flight"])
        row = {"index": a.index, "offset_s": a.offset_s, "suite": a.work.suite.name, "item_id": a.work.item.id,
               "seed": a.work.seed, "temperature": a.work.temperature, "lag_s": due - (t0 + a.offset_s),
               "cap_wait_s": sent - due, "sent_s": sent - t0}
        try:
            with resends() as sent:
                row.update(await _answer(decoder, http, request, refused, t0))
        finally:
            state["in_flight"] -= 1
            if gate is not None:
                gate.release()
        row["resent"] = sent[0]   # times the server may have been sent this request again (client.resends)
        rows.append(row)

    try:
        await asyncio.gather(*(one(a, r) for a, r in zip(arrivals, requests)))
    finally:
        if decoder.session is not None:
            await decoder.close_session()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    return sorted(rows, key=lambda r: r["index"]), {**level_info(rows, wall, cpu, state["most"]), "warmup": warmup}


async def _answer(decoder, http: httpx.AsyncClient, request, refused: tuple, t0: float) -> dict:
    """The fields one request's row gets from its answer: timings and tokens, or its error (a
    refusal, or an answer that could not be read). Any other exception is a bug and raises."""
    try:
        if not decoder.server.alive():
            raise DecoderError(f"engine {decoder.server.spec.name!r}: {decoder.server.exit_state() or 'its process exited'}")
        result = await decoder._stream_once(http, request)
        t = result.timing
        return dict(ttft_s=t.ttft_s, e2e_s=t.wall_s, token_times_s=list(t.token_times_s),
                    n_tokens=len(result.tokens), finish_reason=result.finish_reason, stats=result.stats,
                    tokens=list(result.tokens), done_s=time.perf_counter() - t0, error=None)
    except refused as e:
        return dict(error=_error_text(e), n_tokens=0, stats={}, done_s=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - an answer that could not be read is that request's error
        if not malformed(e):
            raise
        # As the closed-loop client counts it (decoders.engines.client._one): bad JSON in one
        # stream had ended the whole load phase, the level being played lost with it.
        return dict(error=f"engine {decoder.server.spec.name!r} sent a malformed or error response: "
                          f"{type(e).__name__}: {str(e)[:300]}", n_tokens=0, stats={},
                    done_s=time.perf_counter() - t0)


def level_info(rows: list[dict], wall: float, cpu: float, most: int, workers: int = 1) -> dict:
    """A level's own measurements: the client's CPU (per request, per streamed token, as a share
    of the level's wall time: of its busiest worker where there are several) and its send lag."""
    lags = [r["lag_s"] for r in rows if isinstance(r.get("lag_s"), (int, float))]  # a lost worker's rows have none
    tokens = sum(int(r.get("n_tokens") or 0) for r in rows)
    busy = cpu / wall if wall > 0 else None
    return {"requests": len(rows), "wall_s": wall, "harness_cpu_s": cpu,
            "harness_cpu_per_request_s": cpu / max(len(rows), 1), "harness_cpu_per_token_s": cpu / tokens if tokens
            else None, "loop_busy_share": busy, "lag_p50_s": float(np.median(lags)) if lags else None,
            "lag_p99_s": float(np.percentile(lags, 99)) if lags else None, "lag_max_s": max(lags) if lags else None,
            "most_in_flight": most, "client_workers": workers}


def _prometheus(decoder) -> dict | None:
    # Read outside the level's timed window; a blocking call here costs the schedule nothing.
    # A page that stopped parsing (a gateway's HTML with 200) costs the level's counters, not the
    # level: this read comes after the level is played and before its rows are written.
    if not getattr(decoder, "metrics_ok", False):
        return None
    try:
        return spec_counters(decoder.server.metrics())
    except ValueError:
        return None


def _server_latency(decoder) -> dict | None:
    """vLLM's own latency histograms now (telemetry.latency_sums), or None: the server's clock,
    differenced around each level beside the client's figures (outside the timed window)."""
    try:
        return latency_sums(decoder.server.metrics())
    except ValueError:
        return None


class LoadRun:
    """The load phase of one run folder: which levels are done, the rows so far, the next level."""

    def __init__(self, config, run_dir: Path, lineup, suites, progress: bool = True):
        self.config, self.run_dir, self.lineup, self.progress = config, Path(run_dir), lineup, progress
        self.plan = config.profile.load
        # lm-eval tasks run through lm-eval itself: the schedule draws from the suites' own items.
        self.works = work_items(config, [s for s in suites if not s.name.startswith("lmeval:")])
        self.specs = load_specs(config, lineup)
        self.base = self.specs[0].name
        levels = read_records(self.run_dir, LEVELS)
        self.done = {(r["candidate"], r["rate"]): r for r in levels}
        rows = read_records(self.run_dir, LOAD)
        kept = [r for r in rows if (r["candidate"], r["rate"]) in self.done]
        if len(kept) != len(rows):  # a level cut short by a kill: it runs again, whole
            _rewrite(self.run_dir / LOAD, kept)
        self.rows: dict = {}
        for r in kept:
            self.rows.setdefault((r["candidate"], r["rate"]), []).append(r)

    def arrivals(self, rate: float) -> list[Arrival]:
        p = self.plan
        return schedule(self.works, rate, requests=p.requests, burstiness=p.burstiness, seed=p.seed)

    def judged(self, name: str) -> list[tuple[float, bool]]:
        """(rate, pays) at every complete level of candidate `name` (analysis.load.judge_level)."""
        from analysis.load import judge_level
        out = []
        for (cand, rate), level in sorted(self.done.items(), key=lambda kv: kv[0][1]):
            if cand != name or (self.base, rate) not in self.done:
                continue
            j = judge_level(self.rows.get((self.base, rate), []), self.rows.get((name, rate), []),
                            duration_s=level["wall_s"], slo=self.plan.slo.items(), alpha=self.config.gates.alpha,
                            rate=rate, base_level=self.done.get((self.base, rate)), cand_level=level)
            out.append((rate, j["pays"]))
        return out

    def next_refinement(self) -> tuple[float, list[str]] | None:
        """The rate of the next bracketing level and the candidates whose bracket it splits
        (the widest bracket first); None when no candidate has a bracket left to split."""
        from analysis.load import crossover, refine_rate
        brackets = {}
        for spec in self.specs[1:]:
            levels = self.judged(spec.name)
            if refine_rate(levels) is not None:
                brackets[spec.name] = (crossover(levels), refine_rate(levels))
        if not brackets:
            return None
        _, rate = max(brackets.values(), key=lambda b: b[0]["next"] / b[0]["rate"])
        return rate, [n for n, (c, _) in brackets.items() if c["rate"] < rate < c["next"]]

    async def level(self, http: httpx.AsyncClient, rate: float, names: list[str], refine: bool) -> None:
        arrivals = self.arrivals(rate)
        for spec in (s for s in self.specs if s.name in names):
            if (spec.name, rate) in self.done:
                continue
            decoder, target = self.lineup.decoders[spec.name], self.lineup.targets[spec.name]
            # Requests are rendered before the level starts: tokenizing is setup, not load.
            requests = [make_request(self.config, target, a.work) for a in arrivals]
            rows, info, delta = await self.play_level(http, spec.name, decoder, rate, arrivals, requests)
            for r in rows:
                r.update(candidate=spec.name, rate=rate)
            level = {"candidate": spec.name, "rate": rate, **info, "refine": refine,
                     "burstiness": self.plan.burstiness, "max_in_flight": self.plan.max_in_flight,
                     "seed": self.plan.seed, "engine": decoder.server.spec.name,
                     "prometheus": ({k: delta[k] for k in ("drafts", "draft_tokens", "accepted")}
                                    if delta else None)}
            writer = RecordWriter(self.run_dir, LOAD)
            try:
                for r in rows:
                    writer.write(r)
            finally:
                writer.close()
            levels = RecordWriter(self.run_dir, LEVELS)
            try:
                levels.write(level)  # last: the level is complete
            finally:
                levels.close()
            self.rows[(spec.name, rate)], self.done[(spec.name, rate)] = rows, level
            # One line per level, progress bars or not: a level can take minutes.
            errors = sum(1 for r in rows if r.get("error"))
            print(f"decodegate: load {rate:g} req/s{' (bracketing)' if refine else ''} · {spec.name}: "
                  f"{len(rows)} requests, {errors} errors, {info['wall_s']:.1f} s, harness "
                  f"{1e3 * info['harness_cpu_per_request_s']:.2f} ms CPU per request, {info['client_workers']} "
                  f"client worker(s), send lag p99 {1e3 * (info['lag_p99_s'] or 0):.1f} ms", file=sys.stderr,
                  flush=True)

    def client_cost(self, name: str, decoder) -> float | None:
        """This decoder's measured client CPU per request: its costliest level so far, else its warm-up."""
        done = [lv["harness_cpu_per_request_s"] for (cand, _), lv in self.done.items()
                if cand == name and lv.get("harness_cpu_per_request_s")]
        if done:
            return max(done)
        w = getattr(decoder, "warmup", None) or {}
        return w["cpu_s"] / w["requests"] if w.get("requests") and w.get("cpu_s") is not None else None

    async def play_level(self, http, name: str, decoder, rate: float, arrivals, requests):
        """Warm the server (once), pick the client workers, play the level; (rows, info, counters)."""
        from harness.run.load_workers import play_workers, workers_needed
        warmed_now = None
        if not getattr(decoder.server, "warmed", False):
            http.headers.clear()
            http.headers.update(decoder.server.headers())
            burst = min(self.plan.max_in_flight or len(requests), WARMUP_BURST)
            async with stream_pool(burst, keep_alive=decoder.keeps_connections(burst)):
                warmed_now = decoder.warmup = await warm(decoder, http, requests, burst)
        n, why = workers_needed(rate, self.client_cost(name, decoder), self.plan.client_workers,
                                self.plan.max_in_flight)
        before, clock = _prometheus(decoder), _server_latency(decoder)
        if n == 1:
            rows, info = await play(decoder, arrivals, requests, http, self.plan.max_in_flight)
        else:
            rows, info = await asyncio.get_running_loop().run_in_executor(None, lambda: play_workers(
                decoder, arrivals, requests, n, self.plan.max_in_flight, decoder.timeout,
                play=play, level_info=level_info))
        delta, clock = spec_delta(before, _prometheus(decoder)), latency_delta(clock, _server_latency(decoder))
        resent = sum(int(r.get("resent") or 0) for r in rows)
        if resent:
            # A request sent twice may have been served twice (client.resends): the server's own
            # histograms then count it twice. Its counters are refused by analysis.load too.
            clock = {"unmeasured": f"{resent} request(s) sent again after a kept-alive connection closed under "
                                   f"them: a server that had read them served them twice"}
        info.update(client_workers=n, client_workers_why=why, warmup=warmed_now, server_latency=clock,
                    resent=resent)
        return rows, info, delta

    async def all_levels(self) -> None:
        names = [s.name for s in self.specs]
        timeout = max(self.lineup.decoders[n].timeout for n in names)
        # The streams go through each level's pool (stream_pool, which sends a request again when a
        # server closed its kept-alive connection just as it was taken); this client carries the
        # headers and timeouts and the few plain calls, with no keep-alive: a server may close an
        # idle connection just as the next request takes it (llama.cpp's does: "Server
        # disconnected without sending a response"), and nothing here sends those again.
        limits = httpx.Limits(max_connections=(self.plan.max_in_flight or self.plan.requests) + 4,
                              max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), limits=limits) as http:
            for rate in self.plan.rates:
                await self.level(http, rate, names, refine=False)
            used = {rate for (_, rate), lv in self.done.items() if lv.get("refine")}
            while len(used) < self.plan.refine_levels:
                nxt = self.next_refinement()
                if nxt is None:
                    break
                rate, cands = nxt
                await self.level(http, rate, [self.base, *cands], refine=True)
                used.add(rate)


def run(config, run_dir: Path, lineup, suites, progress: bool = True) -> list[dict]:
    """The load phase (see the module docstring); returns every request row of the run folder."""
    load = LoadRun(config, run_dir, lineup, suites, progress)
    asyncio.run(load.all_levels())
    return read_records(run_dir, LOAD)


def _rewrite(path: Path, rows: list[dict]) -> None:
    import json
    import os
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)

