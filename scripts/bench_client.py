"""How fast one client process can read streams: decodegate's load client, the `openai` SDK path
it replaced, and `vllm bench serve`, side by side against one fake engine (scripts/fake_engine.py,
its own process, pre-built chunks in vLLM's captured shapes, as fast as the socket allows).

Each (client, in-flight) cell runs in a fresh worker process that keeps N requests in flight
(closed loop) until its requests are done, and reports streamed tokens/s, requests/s and its own
CPU seconds per streamed token over the timed loop (imports and set-up excluded):
- `decodegate`: `VLLMDecoder._stream_once` (the light SSE reader, the vLLM parser, the Emitter
  that cuts and times tokens) with the streams' kept-alive connection pool (`stream_pool`) and
  the `httpx.AsyncClient` set up as harness.run.load sets them up;
- `openai-sdk`: the same decoder with its stream read as before this change (`openai.AsyncOpenAI`,
  a pydantic object per chunk, `model_dump()`, the same parser);
- `vllm-bench`: `vllm bench serve --backend vllm` at `--max-concurrency N` (its throughput only:
  its CPU cannot be told apart from its start-up), where a vllm executable is found.
A client that keeps up with the fake engine shows the engine's rate; below it, the client is the
bottleneck, which is what this measures. Numbers are this machine's, this run's: compare ratios.

On a shared machine the load decides more than the clients do (rates moved 6x between rounds). Two
options take it out of the comparison:
- `--priority NICE` runs the benchmark in a session of its own and sets that session's autogroup
  nice (/proc/self/autogroup). With sched_autogroup on, the kernel shares the CPU between sessions
  first and `nice` ranks a process only inside its own session; every process of the benchmark
  (the fake engine, each client worker, `vllm bench serve`) stays in that one session, so they
  all get one equal raised priority against the rest of the machine. A negative NICE needs root.
- `--rounds N` runs each in-flight level N times, the clients one after the other in each round
  (ABAB...), and reports decodegate's tokens/s over `vllm bench serve`'s per round and their median.

    python scripts/bench_client.py [--in-flight 1,64,512] [--tokens 64] [--json OUT]
    python scripts/bench_client.py --priority -10 --rounds 5 --clients decodegate,vllm-bench,openai-sdk
    python scripts/bench_client.py --open-loop 160 --workers 1,2 [--delay-s 0.05]   # ~512 in flight
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ the engine

def autogroup(pid: int | str = "self") -> str:
    """The autogroup line of a process ("/autogroup-N nice K"), or "" where the kernel has none."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().strip()
    except OSError:
        return ""


def take_priority(nice: int) -> str:
    """Set this session's autogroup nice (see the module docstring); the line it reads after."""
    try:
        Path("/proc/self/autogroup").write_text(f"{nice}\n")
    except OSError as e:
        raise SystemExit(f"bench_client: --priority {nice}: cannot write /proc/self/autogroup ({e}); a "
                         f"negative nice needs root (CAP_SYS_NICE), and the kernel sched_autogroup") from None
    return autogroup()


def start_engine(tokens: int | None = None, delay_s: float = 0.0) -> tuple[subprocess.Popen, str]:
    """The fake engine in its own process; (process, base URL)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "fake_engine.py")]
    if tokens:
        cmd += ["--tokens", str(tokens)]
    if delay_s:
        cmd += ["--delay-s", str(delay_s)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"the fake engine did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


# ----------------------------------------------------------------------------------- one worker

class _Target:
    """What an engine decoder needs of a target: the tokenizer (smollm2's, as the real runs)."""

    def __init__(self):
        from transformers import AutoTokenizer

        from harness.models import smollm2_folder
        self.name = "smollm2-135m"
        self.tokenizer = AutoTokenizer.from_pretrained(smollm2_folder())


def make_decoder(client: str, base_url: str):
    from decoders.engines.openai_compat import VLLMDecoder, completion_args, parse_completion_chunk

    class SDKDecoder(VLLMDecoder):
        """The stream as it was read before the light client: the openai SDK's objects."""

        async def stream(self, http, request):
            stream = await self.session.completions.create(
                **completion_args(self.server.served_model, request, self.extra_body(request)))
            async for chunk in stream:
                yield parse_completion_chunk(chunk.model_dump())

    cls = SDKDecoder if client == "openai-sdk" else VLLMDecoder
    return cls(_Target(), base_url=base_url, model="smollm2-135m", request_timeout_s=600, retries=0)


async def _closed_loop(decoder, client: str, in_flight: int, n_requests: int, tokens: int) -> dict:
    import httpx

    from decoders.base import GenerationRequest
    from decoders.engines.client import stream_pool
    request = GenerationRequest(tuple(range(1, 51)), max_new_tokens=tokens)
    if client == "openai-sdk":
        import openai
        decoder.session = openai.AsyncOpenAI(base_url=decoder.url("/v1"), api_key="unused", max_retries=0,
                                             timeout=600, http_client=httpx.AsyncClient(
                                                 limits=httpx.Limits(max_connections=in_flight + 4), timeout=600))
    # As harness.run.load's client: the streams on one pool of kept-alive connections (the SDK
    # path keeps its own), the httpx client for headers and timeouts.
    limits = httpx.Limits(max_connections=in_flight + 4, max_keepalive_connections=0)
    left, streamed, errors = [n_requests], [0], [0]
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=60), limits=limits) as http, \
            stream_pool(in_flight):
        async def lane():
            while left[0] > 0:
                left[0] -= 1
                try:
                    result = await decoder._stream_once(http, request)
                    streamed[0] += len(result.tokens)
                except Exception as e:  # noqa: BLE001 - counted and shown, a benchmark goes on
                    errors[0] += 1
                    if errors[0] == 1:
                        print(f"bench_client: {client}: {type(e).__name__}: {e}", file=sys.stderr)
        await lane_warmup(decoder, http, request)
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(in_flight)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"client": client, "in_flight": in_flight, "requests": n_requests, "errors": errors[0],
            "tokens": streamed[0], "wall_s": wall, "cpu_s": cpu, "tok_s": streamed[0] / wall,
            "req_s": (n_requests - errors[0]) / wall, "cpu_per_token_us": 1e6 * cpu / max(streamed[0], 1),
            "cpu_share": cpu / wall, "autogroup": autogroup()}


async def lane_warmup(decoder, http, request) -> None:
    for _ in range(3):   # imports, connection set-up and first-call costs are not the client's rate
        await decoder._stream_once(http, request)


def worker(args) -> None:
    decoder = make_decoder(args.worker, args.base_url)
    out = asyncio.run(_closed_loop(decoder, args.worker, args.in_flight[0], args.requests, args.tokens))
    print("RESULT " + json.dumps(out), flush=True)


# ------------------------------------------------------------------------------ vllm bench serve

def vllm_executable() -> str | None:
    for path in (os.environ.get("DECODEGATE_VLLM"), str(ROOT / ".venv-vllm" / "bin" / "vllm")):
        if path and Path(path).is_file():
            return path
    return None


def vllm_bench(vllm: str, base_url: str, in_flight: int, n_requests: int, tokens: int) -> dict:
    from harness.models import smollm2_folder
    cmd = [vllm, "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--model", "smollm2-135m",
           "--tokenizer", str(smollm2_folder()), "--dataset-name", "random", "--random-input-len", "50",
           "--random-output-len", str(tokens), "--num-prompts", str(n_requests), "--max-concurrency",
           str(in_flight), "--request-rate", "inf", "--ignore-eos", "--disable-tqdm"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:   # its autogroup once it runs (a process that made a session of its own would show it)
        stdout, stderr = proc.communicate(timeout=3)
        group = "(done within 3 s)"
    except subprocess.TimeoutExpired:
        group = autogroup(proc.pid)
        stdout, stderr = proc.communicate(timeout=1800)
    text = stdout + stderr

    def number(label: str) -> float | None:
        m = re.search(re.escape(label) + r"\s*:?\s*([0-9.]+)", text)
        return float(m.group(1)) if m else None
    out = {"client": "vllm-bench", "in_flight": in_flight, "requests": n_requests,
           "tok_s": number("Output token throughput (tok/s)"), "req_s": number("Request throughput (req/s)"),
           "wall_s": time.perf_counter() - t0, "rc": proc.returncode, "autogroup": group}
    if proc.returncode or out["tok_s"] is None:
        out["error"] = text.strip()[-600:]
    return out


# ---------------------------------------------------------------------------------------- driver

def cell(client: str, base_url: str, in_flight: int, n_requests: int, tokens: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", client, "--base-url", base_url,
           "--in-flight", str(in_flight), "--requests", str(n_requests), "--tokens", str(tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"client": client, "in_flight": in_flight, "error": (proc.stderr or proc.stdout)[-600:]}
    return json.loads(line[len("RESULT "):])


def requests_for(in_flight: int, scale: float) -> int:
    return max(int(scale * max(200, 4 * in_flight)), in_flight)


def table(results: list[dict]) -> str:
    rows = [("client", "in flight", "round", "requests", "tok/s", "req/s", "CPU µs/token", "CPU share", "load")]
    for r in results:
        rows.append((r["client"], str(r["in_flight"]), str(r.get("round", 0)), str(r.get("requests", "–")),
                     f"{r['tok_s']:.0f}" if r.get("tok_s") else "–", f"{r['req_s']:.1f}" if r.get("req_s") else "–",
                     f"{r['cpu_per_token_us']:.1f}" if r.get("cpu_per_token_us") else "–",
                     f"{r['cpu_share']:.2f}" if r.get("cpu_share") else "–",
                     f"{r['load_before']:.1f}" if r.get("load_before") is not None else "–"))
    widths = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(x, widths)) for x in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ratios(results: list[dict]) -> list[str]:
    """Per level: decodegate over the others, per round (the clients of one round ran back to back)
    and the median over rounds."""
    import statistics
    by = {(r["client"], r["in_flight"], r.get("round", 0)): r for r in results if "error" not in r}
    out = []
    for level in sorted({r["in_flight"] for r in results}):
        rounds = sorted({rnd for (_, lv, rnd) in by if lv == level})
        cpu, speed, sdk = [], [], []
        for rnd in rounds:
            new, old, ref = (by.get((c, level, rnd)) for c in ("decodegate", "openai-sdk", "vllm-bench"))
            if new and old and new.get("cpu_per_token_us") and old.get("cpu_per_token_us"):
                cpu.append(new["cpu_per_token_us"] / old["cpu_per_token_us"])
                sdk.append(new["tok_s"] / old["tok_s"])
            if new and ref and new.get("tok_s") and ref.get("tok_s"):
                speed.append(new["tok_s"] / ref["tok_s"])
        if cpu:
            out.append(f"{level} in flight: decodegate's CPU per token over the openai SDK path's, per round "
                       f"{' '.join(f'{x:.2f}' for x in cpu)}, median {statistics.median(cpu):.2f}; tokens/s "
                       f"median {statistics.median(sdk):.2f}x")
        if speed:
            out.append(f"{level} in flight: decodegate's tokens/s over vllm bench serve's, per round "
                       f"{' '.join(f'{x:.2f}' for x in speed)}, median {statistics.median(speed):.2f}")
    return out


def open_loop(rate: float, n_requests: int, tokens: int, delay_s: float, workers: list[int]) -> list[dict]:
    """One open-loop level (harness.run.load's own `play` / `play_workers`) against a fake engine
    that streams a token every `delay_s`: at `rate` about rate x tokens x delay_s requests are in
    flight. Per worker count: the rate achieved, send lag, client CPU and the generator's verdict."""
    import httpx

    from analysis.load import generator_limit
    from decoders.base import GenerationRequest
    from harness.run import load
    from harness.run.load import Arrival, play, schedule
    from harness.run.load_workers import play_workers

    class _W:
        class suite:
            name = "bench"

        class item:
            id = "i"
        seed, temperature = 0, 0.0
    arrivals = [Arrival(a.index, a.offset_s, _W) for a in schedule([_W], rate, requests=n_requests, seed=0)]
    requests = [GenerationRequest(tuple(range(1, 51)), max_new_tokens=tokens)] * n_requests
    engine, base_url = start_engine(delay_s=delay_s)
    out = []
    try:
        decoder = make_decoder("decodegate", base_url)
        for n in workers:
            if n == 1:
                async def go():
                    limits = httpx.Limits(max_connections=n_requests + 4, max_keepalive_connections=0)
                    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
                        return await play(decoder, arrivals, requests, http)
                rows, info = asyncio.run(go())
            else:
                rows, info = play_workers(decoder, arrivals, requests, n, None, 600, play=load.play,
                                            level_info=load.level_info)
            gen = generator_limit(rows, info)
            done = [r["done_s"] for r in rows if r.get("done_s") is not None]
            out.append({"workers": n, "rate_planned": rate, "rate_sent": n_requests / max(r["sent_s"] for r in rows if "sent_s" in r),
                        "errors": sum(1 for r in rows if r.get("error")), "most_in_flight": info["most_in_flight"],
                        "lag_p50_ms": 1e3 * info["lag_p50_s"], "lag_p99_ms": 1e3 * info["lag_p99_s"],
                        "busy_share": info["loop_busy_share"], "cpu_per_token_us": 1e6 * (info["harness_cpu_per_token_s"] or 0),
                        "tok_s": sum(r.get("n_tokens") or 0 for r in rows) / max(done), "kept_up": not gen["limited"],
                        "why": gen["why"]})
            print(f"bench_client: {json.dumps(out[-1])}", file=sys.stderr, flush=True)
    finally:
        engine.terminate()
        engine.wait(timeout=10)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--in-flight", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 512])
    p.add_argument("--tokens", type=int, default=64, help="streamed tokens per request (default: %(default)s)")
    p.add_argument("--scale", type=float, default=1.0, help="requests per cell: scale x max(200, 4 x in flight)")
    p.add_argument("--clients", default="decodegate,openai-sdk,vllm-bench")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--requests", type=int, help=argparse.SUPPRESS)
    p.add_argument("--open-loop", type=float, metavar="RATE",
                   help="instead: one open-loop level at RATE req/s through harness.run.load, per --workers count")
    p.add_argument("--workers", default="1,2", help="client worker counts for --open-loop (default: %(default)s)")
    p.add_argument("--delay-s", type=float, default=0.05, help="--open-loop: the fake engine's gap between tokens")
    p.add_argument("--open-requests", type=int, default=2048, help="--open-loop: requests in the level")
    p.add_argument("--rounds", type=int, default=1,
                   help="run each in-flight level this many times, the clients one after the other in each "
                        "round (ABAB...); ratios per round and their median (default: %(default)s)")
    p.add_argument("--priority", type=int, metavar="NICE",
                   help="run in a session of its own and set its autogroup nice to NICE (-20..19) for every "
                        "process of the benchmark (fake engine, client workers, vllm bench serve): with "
                        "sched_autogroup, plain `nice` ranks a process only inside its session. A negative "
                        "NICE needs root")
    args = p.parse_args()
    if args.priority is not None and not args.worker:
        if os.getsid(0) != os.getpid():
            # A session of its own: its autogroup holds the benchmark's processes and nothing else.
            return subprocess.run([sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]],
                                  start_new_session=True).returncode
        print(f"bench_client: priority {take_priority(args.priority)}", file=sys.stderr, flush=True)
    if args.worker:
        worker(args)
        return 0
    if args.open_loop:
        res = open_loop(args.open_loop, args.open_requests, args.tokens, args.delay_s,
                        [int(x) for x in args.workers.split(",")])
        print(f"open-loop level: {args.open_loop:g} req/s planned, {args.open_requests} requests, {args.tokens} tokens "
              f"each, a token every {args.delay_s:g} s ({os.cpu_count()} CPUs)")
        for r in res:
            print(f"  {r['workers']} worker(s): sent at {r['rate_sent']:.1f} req/s, most in flight {r['most_in_flight']}, "
                  f"lag p50/p99 {r['lag_p50_ms']:.1f}/{r['lag_p99_ms']:.1f} ms, loop busy {r['busy_share']:.0%}, "
                  f"{r['cpu_per_token_us']:.1f} µs CPU/token, {r['tok_s']:.0f} tok/s, errors {r['errors']}: "
                  + ("kept up" if r["kept_up"] else r["why"]))
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2))
        return 0
    return closed_loop(args)


def closed_loop(args) -> int:
    """Every (in-flight level, round, client) cell against one fake engine; the table and ratios."""
    engine, base_url = start_engine()
    group = autogroup(engine.pid)
    if args.priority is not None and group != autogroup():
        engine.kill()
        raise SystemExit(f"bench_client: the fake engine is in another autogroup ({group!r}, this process "
                         f"{autogroup()!r}): its priority would differ")
    results = []
    try:
        vllm = vllm_executable()
        for level in args.in_flight:
            n = requests_for(level, args.scale)
            for rnd in range(args.rounds):
                for client in args.clients.split(","):
                    load = os.getloadavg()[0]
                    if client == "vllm-bench":
                        if vllm is None:
                            print("bench_client: no vllm executable (DECODEGATE_VLLM or .venv-vllm): vllm bench serve "
                                  "not run", file=sys.stderr)
                            continue
                        r = vllm_bench(vllm, base_url, level, n, args.tokens)
                    else:
                        r = cell(client, base_url, level, n, args.tokens)
                    r.update(round=rnd, load_before=load, load_after=os.getloadavg()[0])
                    results.append(r)
                    print(f"bench_client: {json.dumps(r)}", file=sys.stderr, flush=True)
    finally:
        engine.terminate()
        engine.wait(timeout=10)
    print(f"client benchmark: {args.tokens} tokens per request, fake engine {base_url} "
          f"({os.cpu_count()} CPUs, {os.uname().machine}); {args.rounds} round(s); "
          f"priority: {group or 'no autogroup'}" + ("" if args.priority is not None else " (not set)"))
    print(table([r for r in results if "error" not in r]))
    for line in ratios(results):
        print(line)
    for r in (r for r in results if "error" in r):
        print(f"{r['client']} at {r['in_flight']} in flight failed: {r['error']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
