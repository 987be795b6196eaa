"""Measure early exit against `standard` on a real model: depth saved, what theory says that is
worth once the LM-head checks are paid for, what it is worth on the clock, and what it costs in
greedy token identity.

    .venv/bin/python -m harness.exits.measure [--target smollm2-135m] [--max-new-tokens 48]
        [--thresholds 0.5,0.8,0.9,0.95,0.99] [--confidence softmax] [--rounds 1] [--json FILE]

Costs are measured, not assumed: a one-token step at full depth and the LM head alone (final
norm + projection) on the same cache, medians over repetitions; a layer costs (step - head) / L.
Theoretical speedup per token (as in `analysis.exits`):

    (L * layer + head) / (avg_layers * layer + head_evals_per_token * head)

It leaves out the K/V projections written for skipped layers (state propagation) and the
softmax / top-k of each check. Measured speedup: standard's decode time per token over the
candidate's (the prompt pass and the first token excluded), runs interleaved prompt by prompt so
a change in machine load hits every decoder alike. Identity: a prompt counts as identical when
the whole greedy output equals standard's; the common-prefix fraction is the length of the
shared prefix over standard's length, averaged over prompts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the factorial of n.",
    "Explain what a hash table is in two sentences.",
    "List three tips for staying focused while studying.",
    "Give me a short recipe for scrambled eggs.",
)


def measure_costs(target, reps: int = 30) -> dict:
    """Median seconds of a full one-token step and of the LM head alone, on a short context."""
    from decoders.adapter import LayerAdapter
    from decoders.common import new_cache

    ad = LayerAdapter(target.model)
    ids = torch.tensor([target.encode(PROMPTS[0])], device=target.device)
    cache = new_cache(target.model)
    with torch.inference_mode():
        ad.forward(ids, cache, 0)
        n = ids.shape[1]
        tok = ids[:, -1:]
        step, head = [], []
        for i in range(reps + 3):                     # the first 3 are a warm-up, not timed
            if i == 3:
                step, head = [], []
            t0 = time.perf_counter()
            ad.forward(tok, cache, n)
            step.append(time.perf_counter() - t0)
            ad.rollback(cache, n)
            h = ad.embed(tok)
            t0 = time.perf_counter()
            ad.head(h)
            head.append(time.perf_counter() - t0)
    s, h = statistics.median(step), statistics.median(head)
    return {"step_s": s, "head_s": h, "layer_s": (s - h) / ad.num_layers, "num_layers": ad.num_layers}


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def decode_time_per_token(result) -> tuple[float, int]:
    """Decode seconds and tokens after the first (the prompt pass is left out)."""
    return result.timing.wall_s - result.timing.ttft_s, max(len(result.tokens) - 1, 0)


def run(target, *, thresholds, confidence, max_new_tokens, rounds, prompts=PROMPTS, control=True, log=print):
    from decoders import GenerationRequest
    from decoders.early_exit import EarlyExitDecoder
    from decoders.standard import StandardDecoder

    decoders = {"standard": StandardDecoder(target)}
    if control:
        decoders["ee@1.0"] = EarlyExitDecoder(target, threshold=1.0, confidence=confidence)
    for th in thresholds:
        decoders[f"ee@{th:g}"] = EarlyExitDecoder(target, threshold=th, confidence=confidence)
    requests = [GenerationRequest(tuple(target.encode(p)), max_new_tokens=max_new_tokens,
                                  stop_token_ids=target.stop_token_ids()) for p in prompts]
    decoders["standard"].generate(GenerationRequest(requests[0].prompt_ids, max_new_tokens=4))  # warm-up
    results = {name: [[None] * len(requests) for _ in range(rounds)] for name in decoders}
    names = list(decoders)
    for r in range(rounds):
        for i, req in enumerate(requests):
            order = names[(i + r) % len(names):] + names[:(i + r) % len(names)]  # rotate: no fixed slot
            for name in order:
                c0 = time.process_time()
                res = decoders[name].generate(req)
                res.stats["cpu_s"] = time.process_time() - c0   # this process's CPU time, all threads
                results[name][r][i] = res
            log(f"round {r + 1}/{rounds} prompt {i + 1}/{len(requests)} done", file=sys.stderr)
    return results


def _speeds(rounds) -> tuple[float, float, float]:
    """(mean decode s/token, median per-token s, CPU s/token) over all runs of one decoder."""
    flat = [res for rnd in rounds for res in rnd]
    t = sum(decode_time_per_token(res)[0] for res in flat)
    n = sum(decode_time_per_token(res)[1] for res in flat)
    per_token = [x for res in flat for x in res.timing.token_times_s[1:]]
    cpu = sum(res.stats.get("cpu_s", float("nan")) for res in flat) / sum(len(res.tokens) for res in flat)
    return t / max(n, 1), statistics.median(per_token) if per_token else float("nan"), cpu


def summarize(results, costs) -> list[dict]:
    """One row per decoder. Speedups are standard's time per token over the decoder's, three
    ways: mean wall time, median per-token wall time (robust to bursts of machine load), and this
    process's CPU time per token (prompt pass included; with --threads 1 it is close to work done)."""
    base = results["standard"][0]
    L, layer, head = costs["num_layers"], costs["layer_s"], costs["head_s"]
    b_mean, b_med, b_cpu = _speeds(results["standard"])
    rows = []
    for name, rounds in results.items():
        mean, med, cpu = _speeds(rounds)
        row = {"decoder": name, "ms_per_token": 1000 * mean, "median_ms_per_token": 1000 * med,
               "cpu_ms_per_token": 1000 * cpu, "measured_speedup": b_mean / mean,
               "median_speedup": b_med / med, "cpu_speedup": b_cpu / cpu}
        if name != "standard":
            layers = [l for res in rounds[0] for l in res.stats["exit_layers"]]
            evals = sum(res.stats["lm_head_evals"] for res in rounds[0])
            avg = sum(layers) / len(layers)
            row.update(avg_layers=avg, early_fraction=sum(l < L for l in layers) / len(layers),
                       head_evals_per_token=evals / len(layers),
                       theoretical_speedup=(L * layer + head) / (avg * layer + evals / len(layers) * head))
        same = [a.tokens == b.tokens for a, b in zip(rounds[0], base)]
        prefix = [common_prefix(a.tokens, b.tokens) / max(len(b.tokens), 1) for a, b in zip(rounds[0], base)]
        row.update(identical_prompts=sum(same) / len(same), mean_prefix_fraction=sum(prefix) / len(prefix))
        rows.append(row)
    return rows


def format_table(rows, costs) -> str:
    out = [f"costs: step {1000 * costs['step_s']:.1f} ms, LM head {1000 * costs['head_s']:.1f} ms "
           f"({costs['head_s'] / costs['step_s']:.0%} of a step, {costs['head_s'] / costs['layer_s']:.1f} layers), "
           f"layer {1000 * costs['layer_s']:.2f} ms, L = {costs['num_layers']}",
           "| decoder | avg layers | early-exit tokens | head evals/token | theoretical speedup "
           "| ms/token mean / median / cpu | measured speedup mean / median / cpu | identical prompts "
           "| mean common prefix |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(key, fmt):
            return format(r[key], fmt) if key in r else "-"
        out.append(f"| {r['decoder']} | {f('avg_layers', '.1f')} | {f('early_fraction', '.0%')} "
                   f"| {f('head_evals_per_token', '.2f')} | {f('theoretical_speedup', '.2f')}x "
                   f"| {r['ms_per_token']:.1f} / {r['median_ms_per_token']:.1f} / {r['cpu_ms_per_token']:.1f} "
                   f"| {r['measured_speedup']:.2f}x / {r['median_speedup']:.2f}x / {r['cpu_speedup']:.2f}x "
                   f"| {r['identical_prompts']:.0%} "
                   f"| {r['mean_prefix_fraction']:.0%} |")
    return "\n".join(out)


def _loadavg() -> str:
    try:
        import os
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.exits.measure", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--device", default=None)
    p.add_argument("--thresholds", default="0.5,0.8,0.9,0.95,0.99")
    p.add_argument("--confidence", default="softmax", choices=["softmax", "margin", "saturation"])
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many built-in prompts (max {len(PROMPTS)})")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-control", dest="control", action="store_false", help="skip the threshold-1.0 row")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's); 1 is steadier on a "
                                                 "shared machine")
    p.add_argument("--json", help="also write rows and costs to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from harness.models import load_model

    target = load_model(args.target, device=args.device)
    costs = measure_costs(target)
    thresholds = [float(x) for x in args.thresholds.split(",")]
    results = run(target, thresholds=thresholds, confidence=args.confidence, max_new_tokens=args.max_new_tokens,
                  rounds=args.rounds, prompts=PROMPTS[: args.prompts], control=args.control,
                  log=lambda *a, **k: print(*a, **k))
    rows = summarize(results, costs)
    print(format_table(rows, costs))
    print(f"threads {torch.get_num_threads()}, load average {_loadavg()}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"costs": costs, "rows": rows, "args": vars(args)}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
