"""Capture llama.cpp server /metrics for tests/data/llamacpp (the rules' promtool tests read them):
the n-gram server before and after a request the drafter finds matches in, after one it does not,
and the server without speculation after a request.

    PYTHONPATH=. python scripts/capture_llamacpp_metrics.py
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

from decoders.engines.server import EngineServer, EngineSpec, free_port
from harness.run.engines import gguf, llama_tool

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "llamacpp"
MATCH = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog."
NOMATCH = "What is the capital of France? Answer in a few words."


def launch(spec: str) -> list[str]:
    flags = (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"]
             if spec == "ngram" else ["--spec-type", "none"])
    return [llama_tool("llama-server"), "-m", gguf("smollm2-135m"), "--host", "127.0.0.1", "--port", "{port}",
            "--alias", "smollm2-135m", "-t", "1", "-np", "1", "--metrics", *flags]


def ask(url: str, prompt: str) -> None:
    httpx.post(url + "/v1/chat/completions", timeout=300, json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "temperature": 0}).raise_for_status()
    time.sleep(0.3)  # llama.cpp folds a request into its counters when it frees the slot


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    index = {}
    for spec in ("ngram", "plain"):
        with EngineServer(EngineSpec(name=spec, launch=tuple(launch(spec)), model="smollm2-135m", health_timeout_s=300),
                          log_dir=Path("/tmp")) as server:
            version = httpx.get(server.base_url + "/props").json().get("build_info")
            steps = ([("before", None), ("after", MATCH), ("nomatch", NOMATCH)] if spec == "ngram"
                     else [("after", MATCH)])
            for name, prompt in steps:
                if prompt:
                    ask(server.base_url, prompt)
                (OUT / f"{spec}-metrics-{name}.txt").write_text(httpx.get(server.base_url + "/metrics").text)
                index[f"{spec}-metrics-{name}.txt"] = {"what": f"GET /metrics, {name}" + (f" (prompt {prompt!r})" if prompt else ""),
                                                      "launch": launch(spec)[2:], "build_info": version}
    (OUT / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
