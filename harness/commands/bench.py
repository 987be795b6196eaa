"""Speed side by side: our decoders against transformers' and against theory.

For one target and a few drafts, on fixed chat prompts from the suites (one category each),
runs `standard`, `hf` greedy, `speculative` per drafter, `hf-assisted` with the same draft and K,
and `early-exit` at a few thresholds — interleaved (A B C A B C ...) after a warm-up, so that
machine noise hits every decoder alike. Reports tokens/s, per-token latency p50/p95, the paired
speedup over `standard` with a bootstrap interval, α, τ, c, the theoretical speedup and
achieved/theoretical (the decode phase's speedup, prefill left out, as the theory has it), per
category; a roofline line (weight bytes per token / the device's copy
bandwidth, probed between the decoders in every round); the measured cost of verifying K+1
tokens in one-token steps; and with `--profile-round` a torch-profiler split of a step (LM head,
attention, MLPs, norms, KV-cache writes, sampling, verification, drafting, Python overhead) per
decoder, and where a speculative round spends its time. `--compare-old` runs every in-process
decoder a second time with the previous KV cache (`cache="dynamic"`, labels ending in
`@dynamic`) in the same interleaved rounds, and `--compile` adds `standard[compiled]`; the goals
section prints the ratios side by side.
Timings are measurements on this machine in this run; compare ratios, not absolute numbers.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

DEFAULT_DRAFTS = "smollm2-135m-int8,prompt-lookup,self:12"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
CATEGORIES = ("summary", "rewrite", "explain", "list")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m", help="target model (default: %(default)s)")
    p.add_argument("--draft", default=None,
                   help=f"comma-separated drafts: models, prompt-lookup, self:L (default for smollm2-135m: "
                        f"{DEFAULT_DRAFTS}; for other targets: prompt-lookup and self:<a third of the layers>)")
    p.add_argument("--k", type=int, default=4, help="draft length K for every drafter (default: %(default)s)")
    p.add_argument("--min-acceptance", type=float, default=None,
                   help="kill switch for every speculative decoder: fall back to standard decoding when the "
                        "rolling acceptance falls below this (default: off, so raw drafter speed is measured)")
    p.add_argument("--thresholds", default="0.9,0.99",
                   help="early-exit thresholds, or calibrated:DIR (`decodegate calibrate-exits`); '' for none "
                        "(default: %(default)s)")
    p.add_argument("--exit-heads", help="exit heads folder (`decodegate train-exits`): every self:L draft and "
                                        "every numeric early-exit threshold also runs through the heads, beside "
                                        "the logit lens")
    p.add_argument("--prompts-per-category", type=int, default=1, help="longform prompts per category (default: 1)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds after the warm-up (default: 2)")
    p.add_argument("--temperatures", default="0,0.7", help="comma-separated (default: %(default)s: greedy and sampled)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers peers")
    p.add_argument("--profile-round", action="store_true",
                   help="also profile one request per decoder: a torch-profiler split of a step, and where a "
                        "speculative round spends its time")
    p.add_argument("--compare-old", action="store_true",
                   help="also run every in-process decoder with the previous KV cache (cache=dynamic, labels "
                        "ending in @dynamic), interleaved with the new one, and print old and new goal ratios")
    p.add_argument("--compile", action="store_true",
                   help="also run standard with its one-token step compiled (torch.compile; the first request "
                        "compiles, in the warm-up)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="weights' dtype (default: bf16 on cuda, fp32 on cpu)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--tracking-uri", help="log the result to MLflow at this URI (default: not logged)")


# ----------------------------------------------------------------------------------- roofline

class Bandwidth:
    """Copy bandwidth (bytes read + written per second, GB/s) of the memory the weights live in:
    the target's device, so a GPU's own memory, not the host's.

    `probe()` takes the best of a few copies of `mb` MiB. `run_bench` probes once before every
    prompt of every round, between the decoders. The bound then sees the same machine as the
    steps it divides: this machine's bandwidth moved from 28 to 40 GB/s between runs of one day,
    and a single probe after the rounds could land in another phase than the steps."""

    def __init__(self, device="cpu", mb: int = 256):
        import torch
        self.device = torch.device(device)
        self.src = torch.ones(mb * 2**20 // 4, dtype=torch.float32, device=self.device)
        self.dst = torch.empty_like(self.src)
        self.dst.copy_(self.src)
        self.probes: list[float] = []

    def probe(self, repeats: int = 3) -> float:
        from decoders.common import sync
        best = float("inf")
        for _ in range(repeats):
            sync(self.device)
            t = time.perf_counter()
            self.dst.copy_(self.src)
            sync(self.device)  # a device copy is queued: the clock stops when it has finished
            best = min(best, time.perf_counter() - t)
        self.probes.append(2 * self.src.numel() * 4 / best / 1e9)
        return self.probes[-1]

    def release(self) -> None:
        self.src = self.dst = None


def weight_bytes_per_token(model) -> int:
    """Bytes of weights a one-token decode step reads: every parameter once, except an untied
    input embedding table, of which one row is gathered."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight if model.get_output_embeddings() is not None else None
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if head is None or emb.data_ptr() != head.data_ptr():
        total -= emb.numel() * emb.element_size() - emb.shape[1] * emb.element_size()
    return total


# ----------------------------------------------------------------------------------- lineup

def lineup(args) -> list[tuple[str, str, dict]]:
    """(label, backend, options) for every decoder to run."""
    out = [("standard", "standard", {})]
    if not args.no_hf:
        out.append(("hf", "hf", {}))
    heads = getattr(args, "exit_heads", None)
    for d in [x for x in args.draft.split(",") if x]:  # resolved in run()
        opts = {"draft": d, "k": args.k}
        if args.min_acceptance is not None:
            opts["min_acceptance"] = args.min_acceptance
        out.append((f"spec[{d}]", "speculative", opts))
        if heads and d.startswith("self:"):  # the same self-draft read through its trained head
            out.append((f"spec[{d}+head]", "speculative", {**opts, "exit_heads": heads}))
        if not args.no_hf:  # transformers' self-draft reads the logit lens: it has no exit heads
            out.append((f"hf-assisted[{d}]", "hf-assisted", {"draft": d, "k": args.k}))
    for t in [x.strip() for x in args.thresholds.split(",") if x.strip()]:
        if t.startswith("calibrated:"):  # thresholds, confidence and heads from the calibration
            name = t[len("calibrated:"):].rstrip("/").split("/")[-1]
            out.append((f"early-exit[calibrated:{name}]", "early-exit", {"threshold": t}))
            continue
        out.append((f"early-exit[{t}]", "early-exit", {"threshold": float(t)}))
        if heads:
            out.append((f"early-exit[{t}+heads]", "early-exit", {"threshold": float(t), "exit_heads": heads}))
    if getattr(args, "compile", False):
        out.insert(1, ("standard[compiled]", "standard", {"compile": True}))
    if getattr(args, "compare_old", False):  # the previous cache, side by side in the same rounds
        out += [(f"{label}@dynamic", backend, {**opts, "cache": "dynamic"})
                for label, backend, opts in out if backend in IN_PROCESS and not opts.get("compile")]
    return out


IN_PROCESS = ("standard", "speculative", "early-exit")


def pick_prompts(per_category: int, target, max_new: int):
    """The first longform items of each category that fit the target's context."""
    from decoders.base import DecoderError
    from decoders.context import context_length
    from suites import load_suite
    suite = load_suite("longform")
    limit = context_length(target.model) or 10**9
    picked = []
    for cat in CATEGORIES:
        fits = [it for it in suite.items if cat in it.categories
                and len(target.encode(it.messages or it.prompt)) + max_new <= limit]
        picked += [(cat, it) for it in fits[:per_category]]
    if not picked:
        raise DecoderError(f"no longform prompt fits {target.name}'s context of {limit} tokens")
    return suite, picked


def run_bench(args) -> dict:
    import numpy as np

    import analysis
    import analysis.latency
    from harness.build import build_decoder

    target = bench_target(args)
    suite, prompts = pick_prompts(args.prompts_per_category, target, args.max_new_tokens)
    temps = [float(t) for t in args.temperatures.split(",") if t != ""]
    decoders = {label: (backend, opts, build_decoder(backend, target, opts))
                for label, backend, opts in lineup(args)}
    # Warm-up: every decoder once, short, so that lazy init and allocator growth are not timed.
    for backend, opts, dec in decoders.values():
        dec.generate(_request(target, prompts[0][1], 0.0, max_new=8))
    rows, bandwidth = _interleaved_rows(args, target, suite, prompts, temps, decoders)

    by = analysis.split_by_candidate(rows)
    rng = np.random.default_rng(0)
    result = {"target": target.name, "device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
              "k": args.k, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
              "temperatures": temps, "prompts": [f"{c}:{i.id}" for c, i in prompts], "decoders": {}}
    base_step = analysis.latency.decode_step_seconds(by["standard"])
    for label, (backend, opts, _) in decoders.items():
        result["decoders"][label] = _decoder_entry(label, backend, opts, by, temps, target, rng)
    result["roofline"] = _roofline(bandwidth, target, decoders, by, base_step)
    from decoders.measure import block_cost
    context = target.encode(prompts[0][1].messages or prompts[0][1].prompt)
    kinds = ("static", "dynamic") if getattr(args, "compare_old", False) else ("static",)
    result["verify_cost"] = {kind: block_cost(target.model, target.device, context, args.k, cache=kind).ratio
                             for kind in kinds}
    result["goals"] = goals(result)
    if args.profile_round:
        _add_profiles(result, target, decoders, _request(target, prompts[0][1], 0.0, max_new=args.max_new_tokens))
    return result


def _request(target, item, t, seed=0, *, max_new):
    """The generation request for one prompt at temperature t (top-p 0.95 when sampling)."""
    from decoders import GenerationRequest
    ids = target.encode(item.messages or item.prompt)
    return GenerationRequest(tuple(ids), max_new_tokens=max_new, temperature=t, top_p=0.95 if t > 0 else 1.0,
                             stop_token_ids=target.stop_token_ids(), seed=seed)


def _interleaved_rows(args, target, suite, prompts, temps, decoders):
    """Every decoder on every (round, prompt, temperature), interleaved (A B C A B C ...) with a
    bandwidth probe before each group: (result rows, the Bandwidth prober)."""
    from tqdm import tqdm
    rows: list[dict] = []
    total = args.rounds * len(prompts) * len(temps) * len(decoders)
    bar = tqdm(total=total, desc="bench", unit="gen", disable=args.json, dynamic_ncols=True)
    bandwidth = Bandwidth(target.device)
    for r in range(args.rounds):
        for cat, item in prompts:
            for t in temps:
                bandwidth.probe()
                for label, (backend, opts, dec) in decoders.items():  # interleaved
                    bar.set_postfix_str(f"{label} {item.id} T={t:g}", refresh=False)
                    res = dec.generate(_request(target, item, t, seed=r, max_new=args.max_new_tokens))
                    rows.append({"candidate": label, "decoder": backend, "suite": "bench", "suite_hash": suite.hash,
                                 "item_id": f"{item.id}#r{r}", "categories": [cat], "seed": r, "temperature": t,
                                 "tokens": list(res.tokens), "text": res.text, "stats": res.stats,
                                 "timing": res.timing.as_dict(), "margins": list(res.margins)})
                    bar.update(1)
    bar.close()
    return rows, bandwidth


def _decoder_entry(label, backend, opts, by, temps, target, rng) -> dict:
    """One decoder's summary per temperature: latency, the paired speedup over `standard` (per
    category too), and the speculative or early-exit figures against theory."""
    import analysis
    mine = by[label]
    entry: dict = {"decoder": backend, "options": opts}
    for t in temps:
        tag = f"T={t:g}"
        lat = analysis.latency_summary([x for x in mine if x["temperature"] == t])
        entry[tag] = {"tokens_per_s": lat.tokens_per_s, "p50_s_per_token": lat.per_token.p50,
                      "p95_s_per_token": lat.per_token.p95, "ttft_p50_s": lat.ttft.p50}
        pairs = analysis.pair_records([x for x in by["standard"] if x["temperature"] == t],
                                      [x for x in mine if x["temperature"] == t])
        if label != "standard":
            sp = analysis.paired_speedup(pairs, rng=rng)
            entry[tag].update(speedup=sp.statistic, ci=[sp.ci_low, sp.ci_high],
                              identity=analysis.token_identity(pairs).statistic)
            entry[tag]["by_category"] = {}
            for cat in CATEGORIES:
                cp = [p for p in pairs if cat in p.candidate["categories"]]
                if cp:
                    entry[tag]["by_category"][cat] = {"speedup": analysis.paired_speedup(cp, rng=rng, n_resamples=999).statistic}
        if backend == "speculative":
            entry[tag] = {**entry.get(tag, {}), **_speculative_fields(pairs, rng)}
            for cat in CATEGORIES:
                cp = [p for p in pairs if cat in p.candidate["categories"]]
                if cp and cat in entry[tag].get("by_category", {}):
                    a = analysis.acceptance_summary(cp, rng=rng, n_resamples=200)
                    entry[tag]["by_category"][cat].update(alpha=a.alpha, tau=a.tau)
        if backend == "early-exit":
            from harness.models import lm_head_cost_in_layers
            ex = analysis.exit_summary([p.candidate for p in pairs], lm_head_cost=lm_head_cost_in_layers(target.model))
            entry[tag] = {**entry.get(tag, {}), "avg_layers": ex.mean_layers, "num_layers": ex.num_layers,
                          "theoretical_speedup": ex.theoretical_speedup}
    return entry


def _speculative_fields(pairs, rng) -> dict:
    """A speculative decoder's acceptance against theory, its plain rounds, fallbacks and where
    its time went."""
    import numpy as np

    import analysis
    acc = analysis.acceptance_summary(pairs, rng=rng)
    return {"alpha": acc.alpha, "acceptance_rate": acc.acceptance_rate,
            "tau": acc.tau, "c": acc.c, "theoretical_speedup": acc.theoretical_speedup,
            "achieved_over_theoretical": acc.achieved_over_theoretical,
            "decode_speedup": acc.achieved_decode.statistic,
            "theoretical_speedup_fixed_k": acc.theoretical_speedup_fixed_k,
            "theoretical_speedup_measured_verify": acc.theoretical_speedup_measured_verify,
            "plain_rounds": sum(int(np.sum(np.asarray(p.candidate["stats"].get("proposed_per_round") or [1]) == 0))
                                for p in pairs),
            "fallbacks": sum(p.candidate["stats"].get("fallbacks", 0) for p in pairs),
            "time_split_s": {k: float(sum(p.candidate["stats"].get(k, 0.0) for p in pairs))
                             for k in ("prefill_time_s", "draft_time_s", "verify_time_s", "other_time_s")}}


def _roofline(bandwidth, target, decoders, by, base_step) -> dict:
    """Weight bytes per token over the probed copy bandwidth: the step's lower bound, and each
    plain decoder's step against it."""
    import numpy as np

    import analysis.latency
    bandwidth.release()
    probes = bandwidth.probes
    bw = float(np.median(probes))
    wb = weight_bytes_per_token(target.model)
    bound = wb / (bw * 1e9)
    # The goal reads the median probe; the best one (the tightest bound) is kept beside it.
    roofline = {"weight_bytes_per_token": wb, "memory_bandwidth_gbs": bw, "step_lower_bound_s": bound,
                "memory_bandwidth_probes_gbs": probes, "best_probe_gbs": max(probes),
                "standard_step_s": base_step, "standard_over_bound": base_step / bound,
                "standard_over_best_probe_bound": base_step * max(probes) * 1e9 / wb}
    for label in decoders:
        if decoders[label][0] == "standard" and label != "standard":
            step = analysis.latency.decode_step_seconds(by[label])
            roofline[f"{label}_step_s"] = step
            roofline[f"{label}_over_bound"] = step / bound
    return roofline


def _add_profiles(result: dict, target, decoders, request) -> None:
    """--profile-round: where a speculative round spends its time, and a torch-profiler split of
    a step per in-process decoder."""
    from decoders.profile import profile_request as profile_step
    result["profile"] = {label: profile_request(dec, request)
                         for label, (backend, _, dec) in decoders.items() if backend == "speculative"}
    result["step_profile"] = {}
    for label, (backend, opts, dec) in decoders.items():
        if backend in IN_PROCESS:
            loaded = getattr(getattr(dec, "drafter", None), "loaded", None)  # a draft model's own parts
            models = [target.model] + ([loaded.model] if loaded is not None else [])
            result["step_profile"][label] = profile_step(dec, request, models=models)


def bench_target(args):
    """The target, in --dtype when one is given (drafts named as models load in their default)."""
    from harness.build import get_model
    if not getattr(args, "dtype", None):
        return get_model(args.target, args.device)
    import torch

    from harness.models import load_model
    return load_model(args.target, device=args.device, dtype=getattr(torch, DTYPES[args.dtype]))


def goals(result: dict) -> dict:
    """The ratios issue 26 sets goals for, for the new decoders and (with --compare-old) the old:
    standard's step over the roofline (goal <= 1.5), the K+1 verification in one-token steps
    (<= 1.2), greedy prompt lookup's achieved over theoretical speedup (>= 0.8; the theory over the
    rounds it ran, `analysis.acceptance.round_speedup`, and beside it over Leviathan's formula at K,
    which assumes every round drafts K tokens; both over the decode phase's speedup, which is what
    they predict, and the end-to-end speedup over the theory beside them), and each exact
    in-process speculative decoder's tokens/s over transformers' own with the same draft (>= 1)."""
    r, ds = result["roofline"], result["decoders"]
    out = {"standard_over_roofline": {"new": r["standard_over_bound"]},
           "verify_k1_in_steps": {"new": result["verify_cost"].get("static")}}
    if "standard@dynamic_over_bound" in r:
        out["standard_over_roofline"]["old"] = r["standard@dynamic_over_bound"]
        out["verify_k1_in_steps"]["old"] = result["verify_cost"].get("dynamic")
    if "standard[compiled]_over_bound" in r:
        out["standard_over_roofline"]["compiled"] = r["standard[compiled]_over_bound"]
    for suffix, which in (("", "new"), ("@dynamic", "old")):
        e = ds.get(f"spec[prompt-lookup]{suffix}", {}).get("T=0", {})
        if e.get("achieved_over_theoretical") is not None:
            out.setdefault("greedy_lookup_over_theory", {})[which] = e["achieved_over_theoretical"]
        if e.get("theoretical_speedup") and e.get("speedup") is not None:
            # the end-to-end speedup (each request's prefill on both sides) over the same theory:
            # the figure this goal read before it took the decode phase alone
            out.setdefault("greedy_lookup_end_to_end_over_theory", {})[which] = e["speedup"] / e["theoretical_speedup"]
        if e.get("theoretical_speedup_fixed_k") and e.get("decode_speedup") is not None:
            out.setdefault("greedy_lookup_over_formula_at_k", {})[which] = (e["decode_speedup"]
                                                                            / e["theoretical_speedup_fixed_k"])
    for label, e in ds.items():
        if e["decoder"] != "speculative":
            continue
        base, _, suffix = label.partition("@")
        peer_label = "hf-assisted" + base[len("spec"):]
        peer = ds.get(peer_label)
        if peer is None:
            continue
        for t in result["temperatures"]:
            tag = f"T={t:g}"
            mine, theirs = e.get(tag, {}).get("tokens_per_s"), peer.get(tag, {}).get("tokens_per_s")
            if mine and theirs:
                out.setdefault(f"{base} over {peer_label} {tag}", {})["old" if suffix else "new"] = mine / theirs
    return out


def profile_request(decoder, request) -> dict:
    """Where one speculative request spends its time, by function (cProfile adds overhead to
    Python-heavy parts, so 'python_other' is an upper bound)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    decoder.generate(request)
    prof.disable()
    st = pstats.Stats(prof).stats
    buckets = {"draft": ("drafters.py", "propose"), "target_verify": ("speculative.py", "score"),
               "verify_math": ("verify.py", None), "cache_rollback": (None, "rollback")}
    total = max((v[3] for (f, _, n), v in st.items() if n == "generate" and f.endswith("speculative.py")), default=0.0)
    out = {}
    for name, (file, func) in buckets.items():
        out[name] = sum(v[3] for (f, _, n), v in st.items()
                        if (file is None or f.endswith(file)) and (func is None or n == func)
                        and not (file == "verify.py" and n.startswith("_")))
    out["python_other"] = max(0.0, total - sum(out.values()))
    out["total"] = total
    return out


def table(result: dict) -> str:
    lines = [f"target {result['target']}, K={result['k']}, {result['max_new_tokens']} new tokens, "
             f"{result['rounds']} interleaved rounds over {len(result['prompts'])} prompts"]
    for t in result["temperatures"]:
        tag = f"T={t:g}"
        lines.append(f"\n{tag}")
        head = ("decoder", "tok/s", "p50 ms/tok", "p95 ms/tok", "vs standard [95% CI]", "identity", "α", "τ", "c",
                "theory", "ach/theory", "layers")
        rows = [head]
        for label, e in result["decoders"].items():
            d = e.get(tag, {})
            f = lambda k, spec=".2f": format(d[k], spec) if d.get(k) is not None else "–"  # noqa: E731
            sp = f"{d['speedup']:.2f}x [{d['ci'][0]:.2f}, {d['ci'][1]:.2f}]" if "speedup" in d else "1.00x"
            rows.append((label, f"{d['tokens_per_s']:.1f}", f"{d['p50_s_per_token'] * 1e3:.1f}",
                         f"{d['p95_s_per_token'] * 1e3:.1f}", sp, f("identity"), f("alpha"), f("tau"), f("c"),
                         f("theoretical_speedup"), f("achieved_over_theoretical"),
                         f"{d['avg_layers']:.1f}/{d['num_layers']}" if "avg_layers" in d else "–"))
        w = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines += ["  ".join(c.ljust(x) for c, x in zip(r, w)) for r in rows]
        cats = [(label, d) for label, e in result["decoders"].items() if (d := e.get(tag, {})).get("by_category")]
        if cats:
            lines.append("  by category (speedup vs standard; α):")
            for label, d in cats:
                lines.append("    " + label.ljust(32) + "  ".join(
                    f"{c}={v['speedup']:.2f}x" + (f" α={v['alpha']:.2f}" if "alpha" in v else "")
                    for c, v in d["by_category"].items()))
    r = result["roofline"]
    probes = r.get("memory_bandwidth_probes_gbs") or [r["memory_bandwidth_gbs"]]
    lines.append(f"\nroofline: {r['weight_bytes_per_token'] / 1e6:.0f} MB of weights per token / "
                 f"{r['memory_bandwidth_gbs']:.1f} GB/s copy bandwidth (median of {len(probes)} probes between the "
                 f"decoders, {min(probes):.1f}-{max(probes):.1f}) = {r['step_lower_bound_s'] * 1e3:.1f} ms lower bound "
                 f"per step; standard takes {r['standard_step_s'] * 1e3:.1f} ms ({r['standard_over_bound']:.2f}x the "
                 f"bound; {r.get('standard_over_best_probe_bound', r['standard_over_bound']):.2f}x the best probe's)")
    lines.append("verifying K+1 tokens costs " + ", ".join(f"{v:.2f} steps ({k} cache)"
                                                        for k, v in result["verify_cost"].items()))
    lines.append("\ngoals (issue 26): standard/roofline <= 1.5, verify K+1 <= 1.2 steps, greedy lookup "
                 "achieved/theory >= 0.8, in-process over transformers' own >= 1\n"
                 "  (theory: Leviathan's speedup over the rounds run, each at its own draft length, rounds without "
                 "a draft as plain steps; 'formula_at_k' assumes every round drafts K. Both are theories of the "
                 "decode phase, so 'achieved' there is too: wall - TTFT over the tokens after the first; "
                 "'end_to_end' divides the speedup column, prefill included)")
    for name, vals in result["goals"].items():
        lines.append(f"  {name:<56} " + "  ".join(f"{k} {v:.2f}" for k, v in vals.items() if v is not None))
    for label, prof in result.get("step_profile", {}).items():
        fr = prof["fractions"]
        lines.append(f"step profile {label}: {prof['ms_per_step']:.1f} ms/step, " + ", ".join(
            f"{k} {v:.0%}" for k, v in sorted(fr.items(), key=lambda kv: -kv[1]) if v >= 0.005))
    for label, prof in result.get("profile", {}).items():
        tot = prof["total"] or 1.0
        lines.append(f"profile {label}: " + ", ".join(f"{k} {v / tot:.0%}" for k, v in prof.items() if k != "total")
                     + f" of {tot:.2f} s")
    return "\n".join(lines)


def run(args) -> int:
    from decoders.base import DecoderError
    if args.k < 1:
        raise DecoderError(f"--k must be >= 1, got {args.k}")
    from harness.verdict.report import check_ci_paths
    check_ci_paths(args.out)  # a folder, a missing parent, no permission: now, not after the measurements
    try:
        temps = [float(x) for x in args.temperatures.split(",") if x]
        [float(x) for x in args.thresholds.split(",") if x.strip() and not x.strip().startswith("calibrated:")]
    except ValueError:
        raise DecoderError("--temperatures and --thresholds take comma-separated numbers "
                           "(--thresholds also calibrated:DIR)") from None
    # Said before the models load and the warm-up runs, not by the first request.
    from decoders.base import temperature_problem
    for t in temps:
        if temperature_problem(t):
            raise DecoderError(f"--temperatures: {temperature_problem(t)}")
    if args.max_new_tokens < 1:
        raise DecoderError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.draft is None:
        if args.target == "smollm2-135m":
            args.draft = DEFAULT_DRAFTS
        else:
            from harness.build import get_model
            n = get_model(args.target, args.device).model.config.num_hidden_layers
            args.draft = f"prompt-lookup,self:{max(1, n // 3)}"
    if args.rounds < 1 or args.prompts_per_category < 1:
        raise DecoderError("--rounds and --prompts-per-category must be >= 1")
    result = run_bench(args)
    text = json.dumps(result, indent=2, default=float)
    print(text if args.json else table(result))  # first: a failing --out must not cost the results
    rc = 0
    if args.out:
        try:
            with open(args.out, "w") as f:
                f.write(text)
        except OSError as e:  # checked before the run; a full disk or a folder removed since
            print(f"decodegate: error: --out {args.out} was not written ({e}); the results are printed above",
                  file=sys.stderr)
            rc = 2
    if args.tracking_uri:
        from harness.run import tracking
        try:
            tracking.log_bench(result, args.tracking_uri)
        except Exception as e:  # noqa: BLE001 - the numbers are printed already
            print(f"decodegate: warning: MLflow logging failed: {e}", file=sys.stderr)
    return rc
