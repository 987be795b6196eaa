"""Capture the payloads decodegate's vLLM parsers rely on, from real servers, as test fixtures.

    python scripts/capture_vllm.py PLAIN_URL NGRAM_URL [OUT_DIR]   (default tests/data/vllm)

PLAIN_URL: `vllm serve <smollm2 folder> --served-model-name smollm2-135m --dtype float32
--max-model-len 2048 --no-enable-prefix-caching`; NGRAM_URL: the same with
`--speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,
"prompt_lookup_min":2}'`. Every file holds what the server sent, parsed from JSON and nothing
else: a stream as a JSON list of its `data:` events (the closing `[DONE]` left out), Prometheus
text as it came. `index.json` says what each file is and what was asked.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

MODEL = "smollm2-135m"
# The harness sends the prompt as token ids rendered by the target's chat template; these
# are the ids of the smollm2 chat template around each text (made with the harness's tokenizer).
REPEAT = "Repeat exactly, three times: the cat sat on the mat, the cat sat on the mat."
UNIQUE = "Name one colour."


def prompt_ids(text: str) -> list[int]:
    from harness.models import smollm2_folder
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok(rendered, add_special_tokens=False)["input_ids"]


def stream(url: str, path: str, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    return events


def completion_body(ids: list[int], **kw) -> dict:
    return {"model": MODEL, "prompt": ids, "max_tokens": 32, "temperature": 0.0, "logprobs": 2,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "top_k": -1, "min_p": 0.0,
            "repetition_penalty": 1.0, "include_stop_str_in_output": True, "skip_special_tokens": False,
            "stream_options": {"include_usage": True}, **kw}


def main(plain: str, ngram: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index = {}

    def save(name: str, data, what: str, request: dict | None = None):
        path = out / name
        path.write_text(data if isinstance(data, str) else json.dumps(data, indent=1) + "\n")
        index[name] = {"what": what, **({"request": request} if request else {})}

    for url, side in ((plain, "plain"), (ngram, "ngram")):
        save(f"{side}-models.json", httpx.get(url + "/v1/models").json(), f"GET /v1/models ({side})")
        save(f"{side}-version.json", httpx.get(url + "/version").json(), f"GET /version ({side})")
    tok_req = {"model": MODEL, "prompt": "The quick brown fox: 12 + 7 = 19.", "add_special_tokens": False}
    save("tokenize.json", httpx.post(plain + "/tokenize", json=tok_req).json(), "POST /tokenize", tok_req)

    repeat, unique = prompt_ids(REPEAT), prompt_ids(UNIQUE)
    # One request alone on the n-gram server, its counters scraped right before and after.
    save("ngram-metrics-before.txt", httpx.get(ngram + "/metrics").text, "GET /metrics before ngram-completion-stream")
    body = completion_body(repeat)
    save("ngram-completion-stream.json", stream(ngram, "/v1/completions", body),
         "streamed /v1/completions on the n-gram server, T=0, a prompt the drafter finds matches in", body)
    save("ngram-metrics-after.txt", httpx.get(ngram + "/metrics").text, "GET /metrics after ngram-completion-stream")

    body = completion_body(unique, max_tokens=3)
    save("ngram-completion-nomatch.json", stream(ngram, "/v1/completions", body),
         "streamed /v1/completions on the n-gram server: 3 tokens, no n-gram match (nothing drafted)", body)
    save("ngram-metrics-nomatch.txt", httpx.get(ngram + "/metrics").text, "GET /metrics after ngram-completion-nomatch")

    body = completion_body(repeat, temperature=0.7, top_p=0.95, seed=0, max_tokens=48)
    save("ngram-completion-sampled.json", stream(ngram, "/v1/completions", body),
         "streamed /v1/completions on the n-gram server, T=0.7 top-p 0.95 seed 0", body)

    body = completion_body(repeat)
    save("plain-completion-stream.json", stream(plain, "/v1/completions", body),
         "streamed /v1/completions on the plain server (no speculation), T=0", body)
    save("plain-metrics.txt", httpx.get(plain + "/metrics").text, "GET /metrics on the plain server")

    chat = {"model": MODEL, "messages": [{"role": "user", "content": REPEAT}], "max_tokens": 16,
            "temperature": 0.0, "logprobs": True, "top_logprobs": 2, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    save("ngram-chat-stream.json", stream(ngram, "/v1/chat/completions", chat),
         "streamed /v1/chat/completions on the n-gram server", chat)

    plain_out = [t for e in json.loads((out / "plain-completion-stream.json").read_text())
                 for c in e.get("choices") or [] for t in c.get("token_ids") or []]
    body = {"model": MODEL, "prompt": repeat + plain_out[:8], "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 20}
    save("plain-prompt-logprobs.json", httpx.post(plain + "/v1/completions", json=body, timeout=120).json(),
         f"prompt_logprobs: 20 over the prompt and the first 8 greedy tokens (the prompt is {len(repeat)} tokens)",
         body)
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/"), sys.argv[2].rstrip("/"), Path(sys.argv[3] if len(sys.argv) > 3 else "tests/data/vllm"))
