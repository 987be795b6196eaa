"""The real model on one device and dtype: token identity of every exact decoder with `standard`
and with transformers' greedy, and the margin noise between one-token steps and a batched forward.

Run by scripts/gpu-check.sh, once per dtype; prints one JSON object. The margin noise is what
the near-tie epsilon of the exactness contract should be on this device and dtype: speculative
verification scores K+1 tokens in one forward, `standard` one at a time, and the two differ by
rounding; a greedy divergence is excusable only where the baseline's top-2 margin is below it.

    python scripts/gpu_check.py --device cuda --dtype bf16 [--prompts 4] [--new 48] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

PROMPTS = ["What is the capital of France? Answer in one sentence.",
           "Write a Python function that returns the n-th Fibonacci number.",
           "List three facts about the Moon.",
           "Rewrite this sentence in the passive voice: The cat chased the mouse.",
           "Explain what a hash table is to a ten-year-old.",
           "Summarize the plot of Romeo and Juliet in two sentences."]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new", type=int, default=48, help="new tokens per prompt")
    p.add_argument("--self-layers", type=int, default=12)
    p.add_argument("--out", help="also write the JSON object to this file")
    args = p.parse_args(argv)

    from decoders import GenerationRequest, make_decoder
    from decoders.common import forward
    from harness.models import load_model
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    t0 = time.perf_counter()
    target = load_model(args.target, device=args.device, dtype=dtype)
    stop = target.stop_token_ids()
    requests = [GenerationRequest(tuple(target.encode([{"role": "user", "content": q}])), max_new_tokens=args.new,
                                  stop_token_ids=stop) for q in PROMPTS[:args.prompts]]
    standard = make_decoder("standard", target)
    candidates = {
        "standard@dynamic": make_decoder("standard", target, cache="dynamic"),
        "hf": make_decoder("hf", target),
        "spec[prompt-lookup]": make_decoder("speculative", target, draft="prompt-lookup", k=4),
        f"spec[self:{args.self_layers}]": make_decoder("speculative", target, draft=f"self:{args.self_layers}", k=4),
        "early-exit[1.0]": make_decoder("early-exit", target, threshold=1.0),
    }
    report = {"device": str(target.device), "dtype": args.dtype, "target": target.name,
              "torch": torch.__version__, "identity": {}, "divergences": []}
    if target.device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(target.device)
    baselines = [standard.generate(r) for r in requests]
    for label, dec in candidates.items():
        same = 0
        for i, (r, base) in enumerate(zip(requests, baselines)):
            res = dec.generate(r)
            if res.tokens == base.tokens:
                same += 1
                continue
            j = next((j for j, (a, b) in enumerate(zip(res.tokens, base.tokens)) if a != b),
                     min(len(res.tokens), len(base.tokens)))
            margin = base.margins[j] if j < len(base.margins) else float("inf")
            report["divergences"].append({"decoder": label, "prompt": i, "position": j, "baseline_margin": margin})
        report["identity"][label] = same / len(requests)

    # Margin noise: the baseline's own one-token-step logits against one batched forward of the
    # same tokens (what a speculative verification computes), position by position.
    diffs, margin_diffs, flips, small = [], [], 0, []
    with torch.inference_mode():
        for r, base in zip(requests, baselines):
            seq = list(r.prompt_ids) + list(base.tokens)
            # Row i of the last n + 1 predicts position i of the output; the very last row is unused.
            batched = forward(target.model, torch.tensor([seq], device=target.device), None,
                              len(base.tokens) + 1)[:-1].float()                          # (n, V)
            steps = _step_logits(target, r.prompt_ids, base.tokens).float()            # (n, V)
            diffs.append((batched - steps).abs().amax(dim=-1))
            top_b, top_s = batched.topk(2, dim=-1).values, steps.topk(2, dim=-1).values
            margin_diffs.append(((top_b[:, 0] - top_b[:, 1]) - (top_s[:, 0] - top_s[:, 1])).abs())
            flips += int((batched.argmax(-1) != steps.argmax(-1)).sum())
            small += [m for m in base.margins]
    d, md = torch.cat(diffs), torch.cat(margin_diffs)
    q = torch.tensor([0.5, 0.99, 1.0], device=d.device)
    report["margin_noise"] = {
        "positions": int(d.numel()),
        "max_abs_logit_diff_quantiles_p50_p99_max": torch.quantile(d, q).tolist(),
        "margin_diff_quantiles_p50_p99_max": torch.quantile(md, q).tolist(),
        "argmax_flips": flips,
        "baseline_margins_below_max_margin_diff": sum(m < float(md.max()) for m in small),
        "suggested_epsilon": float(md.max()),
    }
    report["wall_s"] = time.perf_counter() - t0
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if all(v == 1.0 or _all_near_ties(report, k) for k, v in report["identity"].items()) else 1


def _step_logits(target, prompt_ids, tokens):
    """Logits of each generated position as `standard` computed them: prefill, then one token
    at a time with the cache (row i chose token i)."""
    from decoders.common import forward
    from decoders.kv import CachePool
    cache = CachePool(target.model).new(len(prompt_ids) + len(tokens) + 1)
    rows = [forward(target.model, torch.tensor([list(prompt_ids)], device=target.device), cache)]
    for tok in tokens[:-1]:
        rows.append(forward(target.model, torch.tensor([[tok]], device=target.device), cache))
    return torch.cat(rows)


def _all_near_ties(report, label) -> bool:
    eps = report["margin_noise"]["suggested_epsilon"]
    return all(d["baseline_margin"] <= eps for d in report["divergences"] if d["decoder"] == label)


if __name__ == "__main__":
    sys.exit(main())
