"""Several load client processes for one level, when one event loop on one core cannot keep up.

A vLLM server on one H100 streams thousands of tokens a second across hundreds of requests in
flight; one Python event loop that reads them all saturates its core first, and then the level
measures the client (AIPerf and GuideLLM run their clients in several processes for this).
So a level may be played by `n` worker processes:
- **How many** (`workers_needed`): `load.client_workers` when the profile sets it; otherwise as
  many as the measured client cost needs for the level's rate: rate x CPU seconds per request
  (this decoder's busiest level so far, else its warm-up) over `TARGET_BUSY` of a core per
  worker, at least 1 and at most the cores this process may run on.
- **Each worker** is a process forked from the harness (it inherits the decoder: flavour,
  tokenizer, server address) with its own event loop and HTTP client, and plays its share of
  the schedule, every n-th arrival (so each share spans the whole level at rate / n), against
  one start time on the machine's monotonic clock, fixed once every worker is ready: every
  request still leaves at its own offset.
  `max_in_flight` is split among the workers to sum to it exactly (`split_cap`; never more
  workers than slots), so the engine is never offered more requests at once than configured.
- **Rows merge by scheduled offset** (the schedule's index): the level's rows are the same rows
  one worker would have written. The level's client CPU is the workers' sum; its busy share is
  the busiest worker's (analysis.load.generator_limit judges that one). A worker that dies, or
  is still silent when its last request's timeout is long past (stuck: it is killed), leaves an
  error row for each request of its share, naming it: the level is never short, never hangs.
The parent warms the server first (decoders.engines.client.warm), then forks: the workers time
only. Forking happens from a thread of its own, never from the running event loop's.
"""
from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import time

import httpx

TARGET_BUSY = 0.5   # a worker's planned share of one core: room for bursts before its lag grows
WORKER_GRACE_S = 30.0   # past the last request's offset and timeout: a worker still silent is stuck
WORKER_READY_S = 120.0  # from forking to ready (its loop and client made): a worker still not ready is stuck
START_MARGIN_S = 0.05   # from the last worker's ready to the level's start: the start reaches every worker


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def workers_needed(rate: float, cpu_per_request_s: float | None, configured: int | None,
                   max_in_flight: int | None = None) -> tuple[int, str]:
    """(workers, why) for a level at `rate` (see the module docstring); never more workers than
    `max_in_flight` (each needs a slot of its own: the split never offers the engine more)."""
    if configured:
        n, why = int(configured), "client_workers in the profile"
    elif cpu_per_request_s is None:
        n, why = 1, "no measured client cost yet"
    else:
        need = max(1, math.ceil(rate * cpu_per_request_s / TARGET_BUSY))
        n = min(need, cores())
        why = (f"{rate:g} req/s x {1e3 * cpu_per_request_s:.2f} ms client CPU per request at {TARGET_BUSY:.0%} "
               f"of a core per worker needs {need}" + (f", at most the {cores()} cores" if need > n else ""))
    if max_in_flight and n > max_in_flight:
        n, why = max_in_flight, why + f", at most max_in_flight = {max_in_flight} (a slot each)"
    return n, why


def split_cap(max_in_flight: int | None, n: int) -> list[int | None]:
    """Each worker's share of `max_in_flight`, summing to it exactly: rounded up for every worker,
    n x ceil(m / n) slots offered the engine more requests at once than the profile allows
    (max_in_flight = 3 over 2 workers: 4)."""
    if not max_in_flight:
        return [None] * n
    return [max_in_flight // n + (1 if w < max_in_flight % n else 0) for w in range(n)]


def _worker(conn, play, decoder, arrivals, requests, cap: int | None, timeout: float) -> None:
    # The server's process is the harness's child, not this one's: polling it from here reads
    # as "exited" (waitpid fails). An engine that dies still fails this worker's requests.
    decoder.server.proc = None
    try:
        async def go():
            # Imported before the start, never after it: play() names what a refusal raises with the
            # openai SDK's errors, and a worker forked before the harness had imported it spent
            # 1.5-7 s of the level importing it, its first sends that late (the generator's limit).
            import aiohttp  # noqa: F401
            import openai  # noqa: F401
            limits = httpx.Limits(max_connections=(cap or len(requests)) + 4, max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), limits=limits) as http:
                conn.send(("ready", None))
                start_at = conn.recv()   # blocks this loop, which has nothing to run before the start
                return await play(decoder, arrivals, requests, http, cap, start_at=start_at)
        conn.send(("ok", asyncio.run(go())))
    except BaseException as e:  # noqa: BLE001 - whatever ends a worker is reported to the harness
        conn.send(("error", f"{type(e).__name__}: {str(e)[:300]}"))
    finally:
        conn.close()
        os._exit(0)   # no atexit handlers of the harness (MLflow, engines) in a forked child


def _answer(conn, proc, deadline: float, what: str) -> tuple[str, object]:
    """The worker's next message, or ("error", why) where it died or stayed silent past `deadline`
    (then it is killed: stuck, its loop blocked or its process stopped)."""
    try:
        if conn.poll(max(deadline - time.perf_counter(), 0.0)):
            return conn.recv()
        proc.kill()
        return "error", f"no {what} by its deadline: killed"
    except (EOFError, OSError):
        return "error", "it exited without a result"


def play_workers(decoder, arrivals: list, requests: list, n: int, max_in_flight: int | None,
                 timeout: float, *, play, level_info) -> tuple[list[dict], dict]:
    """Play one level with `n` forked workers (blocking: run it in a thread); (rows, info).
    The level starts once every worker is ready (forked, its loop and client made): a start
    fixed before forking (0.5 s + 0.1 s a worker) was seconds in the past on a loaded machine,
    and the late first sends read as the generator's limit (4 workers: send lag p99 4.9 s).
    `play` and `level_info` are harness.run.load's (passed in: that module imports this one)."""
    ctx = multiprocessing.get_context("fork")
    n = min(n, max_in_flight) if max_in_flight else n   # a slot each (workers_needed says so too)
    caps = split_cap(max_in_flight, n)
    shares = [(arrivals[w::n], requests[w::n]) for w in range(n)]
    running = []
    for share, cap in zip(shares, caps):
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(theirs, play, decoder, *share, cap, timeout), daemon=True)
        proc.start()
        theirs.close()
        running.append((mine, proc))
    up_by = time.perf_counter() + WORKER_READY_S
    ready = [_answer(conn, proc, up_by, "sign of being ready") for conn, proc in running]
    start_at = time.perf_counter() + START_MARGIN_S
    for w, ((conn, _), (status, _)) in enumerate(zip(running, ready)):
        if status == "ready":
            try:
                conn.send(start_at)
            except OSError:   # it died between ready and the start: its result says so (EOF)
                ready[w] = ("error", "it exited before the level's start")
    # Every request of a share ends within its timeout (retries and their backoff included), so a
    # worker silent past that is stuck (its loop blocked, the process stopped): it is killed and its
    # rows are lost, never a level that waits for ever.
    retries = max(int(getattr(decoder, "retries", 0) or 0), 0)
    deadline = start_at + max((a.offset_s for a in arrivals), default=0.0) + (retries + 1) * (timeout + 10.0) \
        + WORKER_GRACE_S
    rows, infos = [], []
    for w, ((conn, proc), (mine, _), (status, out)) in enumerate(zip(running, shares, ready)):
        if status == "ready":
            status, out = _answer(conn, proc, deadline, "result")
        proc.join(timeout=30)
        if status == "ok":
            rows += out[0]
            infos.append(out[1])
        else:
            rows += [_lost(a, f"load client worker {w} of {n} failed ({out}; exit code {proc.exitcode})")
                     for a in mine]
    rows.sort(key=lambda r: r["index"])
    wall = max([i["wall_s"] for i in infos], default=time.perf_counter() - start_at)
    info = level_info(rows, wall, sum(i["harness_cpu_s"] for i in infos), sum(i["most_in_flight"] for i in infos),
                      workers=n)
    busy = [i["loop_busy_share"] for i in infos if i.get("loop_busy_share") is not None]
    info.update(loop_busy_share=max(busy) if busy else None, worker_busy_shares=busy,
                max_in_flight_per_worker=max(caps) if max_in_flight else None, start_at=start_at)
    return rows, info


def _lost(a, why: str) -> dict:
    return {"index": a.index, "offset_s": a.offset_s, "suite": a.work.suite.name, "item_id": a.work.item.id,
            "seed": a.work.seed, "temperature": a.work.temperature, "error": f"LoadWorkerLost: {why}", "n_tokens": 0,
            "stats": {}}
