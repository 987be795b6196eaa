"""A fake OpenAI-compatible engine that streams pre-built chunks as fast as the socket allows.

What it is for: measuring the load client (scripts/bench_client.py, tests/test_load_client.py),
not an engine. It answers `/v1/completions` and `/v1/chat/completions` with vLLM 0.32's own
payload shapes (the captures under tests/data/vllm: every token chunk with `token_ids` and
`token_id:N` top-2 logprobs, a finish chunk, the `usage` chunk, `[DONE]`), `max_tokens` token
chunks per request (or `--tokens`), each event one HTTP chunk, every stream yielding to the others
after each event so requests in flight interleave as on a batched server. The bytes of every
event are built once at start: the server's cost per token is a socket write, so what limits the
rate is the client.

Also: `/health`, `/v1/models` (serves `smollm2-135m`), `/requests` (the prompts asked for, in
order, for tests), 404 elsewhere (no `/metrics`, no
`/tokenize`). `--delay-s X` sleeps X between a stream's events (a server that is not the
bottleneck, for a client starved on purpose). Stdlib only, so it runs in any Python.

    python scripts/fake_engine.py [--port 0] [--tokens N] [--delay-s X]   # prints "PORT <n>"
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
from pathlib import Path

CAPTURES = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm"
MODEL = "smollm2-135m"
TOKEN_IDS = [504, 2644, 2643, 335, 260, 1171, 30, 198, 1848, 7018, 411, 28, 260, 2767, 67, 436]


def _frame(event: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    data = b"data: " + event + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def completion_events(n_tokens: int) -> list[bytes]:
    """`/v1/completions` events in the captured shape: token chunks, finish, usage, [DONE]."""
    captured = json.loads((CAPTURES / "ngram-completion-stream.json").read_text())
    token_chunk = next(c for c in captured if c.get("choices") and c["choices"][0].get("token_ids")
                       and not c["choices"][0].get("finish_reason") and c["choices"][0].get("prompt_token_ids") is None)
    usage = copy.deepcopy(next(c for c in captured if not c.get("choices")))
    out = []
    for i in range(n_tokens):
        c = copy.deepcopy(token_chunk)
        tok = TOKEN_IDS[i % len(TOKEN_IDS)]
        choice = c["choices"][0]
        choice["token_ids"], choice["text"] = [tok], f" t{tok}"
        choice["logprobs"] = {"text_offset": [i], "token_logprobs": [-0.05], "tokens": [f"token_id:{tok}"],
                              "top_logprobs": [{f"token_id:{tok}": -0.05, f"token_id:{tok + 1}": -3.5}]}
        if i == n_tokens - 1:
            choice["finish_reason"] = "length"
        out.append(json.dumps(c).encode())
    usage["usage"] = {"prompt_tokens": 50, "total_tokens": 50 + n_tokens, "completion_tokens": n_tokens}
    usage.pop("metrics", None)
    out.append(json.dumps(usage).encode())
    out.append(b"[DONE]")
    return out


def chat_events(n_tokens: int) -> list[bytes]:
    """`/v1/chat/completions` events in the captured shape."""
    captured = json.loads((CAPTURES / "ngram-chat-stream.json").read_text())
    token_chunk = next(c for c in captured if c.get("choices") and (c["choices"][0].get("delta") or {}).get("content"))
    out = []
    for i in range(n_tokens):
        c = copy.deepcopy(token_chunk)
        tok = TOKEN_IDS[i % len(TOKEN_IDS)]
        choice = c["choices"][0]
        choice["delta"] = {"content": f" t{tok}"}
        choice["token_ids"] = [tok]
        text = f" t{tok}"
        choice["logprobs"] = {"content": [{"token": text, "logprob": -0.05, "bytes": list(text.encode()), "top_logprobs": [
            {"token": text, "logprob": -0.05, "bytes": list(text.encode())}, {"token": " x", "logprob": -3.5,
                                                                              "bytes": [32, 120]}]}]}
        if i == n_tokens - 1:
            choice["finish_reason"] = "length"
        out.append(json.dumps(c).encode())
    out.append(json.dumps({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
                           "usage": {"prompt_tokens": 50, "completion_tokens": n_tokens}}).encode())
    out.append(b"[DONE]")
    return out


class FakeEngine:
    def __init__(self, tokens: int | None, delay_s: float):
        self.tokens, self.delay_s = tokens, delay_s
        self.cache: dict = {}
        self.seen: list = []   # the prompts asked for, in order (the last 10,000): GET /requests

    def frames(self, route: str, n: int) -> list[bytes]:
        key = (route, n)
        if key not in self.cache:
            events = completion_events(n) if route == "/v1/completions" else chat_events(n)
            self.cache[key] = [_frame(e) for e in events]
        return self.cache[key]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self.one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def one(self, reader, writer) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
        body = await reader.readexactly(int(headers.get("content-length") or 0))
        keep = headers.get("connection", "").lower() != "close"
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            asked = json.loads(body or b"{}")
            self.seen = self.seen[-9999:] + [asked.get("prompt", asked.get("messages"))]
            n = self.tokens or int(asked.get("max_tokens") or 16)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                         + (b"" if keep else b"connection: close\r\n") + b"\r\n")
            for frame in self.frames(path, n):
                writer.write(frame)
                await writer.drain()
                await asyncio.sleep(self.delay_s)   # 0: yield, so the streams in flight interleave
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return keep
        if method == "GET" and path == "/health":
            payload, status = b"{}", b"200 OK"
        elif method == "GET" and path == "/requests":
            payload, status = json.dumps(self.seen).encode(), b"200 OK"
        elif method == "GET" and path == "/v1/models":
            payload, status = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode(), b"200 OK"
        else:
            payload, status = b'{"error": "not found"}', b"404 Not Found"
        writer.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, len(payload), payload))
        await writer.drain()
        return keep


async def serve(port: int, tokens: int | None, delay_s: float) -> None:
    engine = FakeEngine(tokens, delay_s)
    server = await asyncio.start_server(engine.handle, "127.0.0.1", port, backlog=4096)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tokens", type=int, default=None, help="tokens per request (default: the request's max_tokens)")
    p.add_argument("--delay-s", type=float, default=0.0, help="sleep between a stream's events (default: 0)")
    args = p.parse_args()
    try:
        asyncio.run(serve(args.port, args.tokens, args.delay_s))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
