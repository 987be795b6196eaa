"""`decodegate estimate-acceptance`: will this draft pay on my suite? No speculative generation.

One forward of the target and one of the draft over each item's baseline greedy output (teacher
forcing) give the expected acceptance α̂ per category (see analysis.acceptance_estimate for what
is computed, greedy and sampled), and with the measured draft cost c (one draft step over one
target step, timed here with a KV cache, median of repeated one-token steps) Leviathan's
theoretical speedup. Greedy, it is taken over the replayed rounds, each at its own draft length:
prompt lookup drafts nothing where the context has no match, and such a round is a plain step
(`analysis.acceptance.round_speedup`); the formula at K assumed that every round drafts K tokens,
and on the bench's prompts promised 2.56x where the rounds as run allow 1.61x. Sampling, it is the
formula at K. Both assume that verifying K+1 tokens costs one target step; on a CPU it costs more,
so the cost v of one K+1 forward over one step is measured here too
(`decoders.measure.block_cost`), and the speedup with it (a round of k drafts verifying at
1 + (v - 1) k / K steps) is reported beside. Greedy, the replayed rounds are the decoder's own, so
the figure to compare with what `regress` measures is `predicted`: those rounds at their measured
costs, plus each prompt's prefill (timed here), as wall time per token, with an interval over
prompts.

The baseline outputs are generated here with `standard` (greedy), or read from a regress run
folder (`--baseline-run DIR`: its baseline's greedy records of this suite), which makes the
estimate cost only the forwards. Drafts: a model (alias, folder, Hub id), `prompt-lookup`, or
`self:L` (the target's first L layers through its final norm and LM head). A draft whose numerics
depend on the tokens per forward (dynamic int8 quantization) is run as the decoder runs it: the
prompt in one forward, then one token at a time with its KV cache. Sampling at
`--temperature X` uses the tempered distributions, without top-p.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

from harness.config import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m", help="target model (default: %(default)s)")
    p.add_argument("--draft", required=True, help="a draft model, 'prompt-lookup', or 'self:L'")
    p.add_argument("--suite", required=True, help="a suite name or a suite .jsonl file")
    p.add_argument("--subset", choices=("smoke", "full"), default="smoke", help="items (default: %(default)s)")
    p.add_argument("--temperature", type=temperature, default=0.0,
                   help="0: greedy (argmax agreement); > 0: E[Σ min(p, q)]")
    p.add_argument("--k", type=int, default=4, help="draft length K for the replayed rounds and the speedup "
                                                    "(default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, help="cap on each item's budget")
    p.add_argument("--baseline-run", help="regress run folder whose baseline greedy records to use as the outputs")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON")


def temperature(text: str) -> float:
    """--temperature: a finite number >= 0 (float() takes 'nan' and 'inf', which would divide
    the logits into NaN and still exit 0)."""
    try:
        t = float(text)
    except ValueError:
        t = float("nan")
    if not (math.isfinite(t) and t >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return t


# ---------------------------------------------------------------------------------- outputs

def check_baseline_run(summary: dict, run_dir, target, suite_name: str, suite_hash: str | None) -> None:
    """Refuse a baseline run of another model or other prompts, naming the mismatch: its tokens
    teacher-forced through this target give confidently wrong α̂, or an IndexError where the
    token ids exceed this target's vocabulary."""
    base = summary["baseline"]
    theirs = ((summary.get("fingerprints") or {}).get(base) or {}).get("target_fingerprint")
    if theirs and not theirs.startswith("engine:"):  # by content: a name can be reused for other weights
        from harness.run.fingerprint import model_fingerprint
        mine = model_fingerprint(target)
        if theirs != mine:
            raise ConfigError(f"--baseline-run {run_dir}: its baseline ran on target {summary.get('target')!r} "
                              f"(fingerprint {theirs}), this estimate's target is {target.name!r} (fingerprint "
                              f"{mine}): another model's outputs say nothing about this one's acceptance")
    elif summary.get("target") != target.name:  # no fingerprint (an engine baseline): by name
        raise ConfigError(f"--baseline-run {run_dir}: its baseline ran on target {summary.get('target')!r}, "
                          f"this estimate's target is {target.name!r}")
    theirs = ((summary.get("suites") or {}).get(suite_name) or {}).get("hash")
    if suite_hash and theirs and theirs != suite_hash:
        raise ConfigError(f"--baseline-run {run_dir}: its suite {suite_name!r} has hash {theirs[:12]}, this "
                          f"estimate's has {suite_hash[:12]}: the outputs answer other prompts")


def baseline_outputs(target, items, *, run_dir: str | None, suite_name: str, cap: int | None,
                     suite_hash: str | None = None) -> dict:
    """item id -> (prompt ids, output tokens, budget)."""
    out = {}
    prompts = {it.id: target.encode(it.messages or it.prompt) for it in items}
    budgets = {it.id: min(it.max_new_tokens, cap) if cap else it.max_new_tokens for it in items}
    if run_dir:
        from pathlib import Path
        from harness.run.records import read_records, read_summary
        summary = read_summary(Path(run_dir))
        check_baseline_run(summary, run_dir, target, suite_name, suite_hash)
        base = summary["baseline"]
        for r in read_records(Path(run_dir)):
            if (r["candidate"] == base and r["suite"] == suite_name and r["temperature"] == 0
                    and r["item_id"] in prompts and r.get("tokens")):
                out[r["item_id"]] = (prompts[r["item_id"]], list(r["tokens"]), budgets[r["item_id"]])
        missing = [i for i in prompts if i not in out]
        if missing:
            raise ConfigError(f"{run_dir}: no baseline greedy record of suite {suite_name!r} for {len(missing)} "
                             f"item(s), first {missing[0]!r}")
        return out
    from decoders import GenerationRequest, make_decoder
    dec = make_decoder("standard", target)
    for it in items:
        res = dec.generate(GenerationRequest(tuple(prompts[it.id]), max_new_tokens=budgets[it.id],
                                             stop_token_ids=target.stop_token_ids(), stop_strings=tuple(it.stop)))
        out[it.id] = (prompts[it.id], list(res.tokens), budgets[it.id])
    return out


# ---------------------------------------------------------------------------- teacher forcing

class Draft:
    """Teacher-forced draft logits over a sequence, and one timed draft step."""

    def __init__(self, spec: str, target, device):
        import torch
        from decoders.drafters import PromptLookup, output_size
        self.spec, self.target = spec, target
        self.vocab = output_size(target.model)
        self.lookup = self.model = self.layers = None
        if spec == "prompt-lookup":
            self.lookup = PromptLookup(vocab=self.vocab)
        elif spec.startswith("self:"):
            from decoders.adapter import LayerAdapter
            self.adapter = LayerAdapter(target.model)
            self.layers = int(spec[len("self:"):])
            if not 1 <= self.layers <= self.adapter.num_layers:
                raise ConfigError(f"--draft self:L needs L in 1..{self.adapter.num_layers}, got {self.layers}")
        else:
            from decoders.drafters import check_tokenizers
            from harness.build import get_model
            self.model = target if spec == target.name else get_model(spec, device)
            check_tokenizers(target.tokenizer, self.model.tokenizer)
            self.incremental = batch_dependent(self.model.model)
        self.torch = torch

    def logits(self, seq: list[int], prompt_len: int):
        """(len(seq), V) logits after each token (rows before prompt_len - 1 may be garbage);
        None for prompt lookup."""
        torch = self.torch
        if self.lookup is not None:
            return None
        if self.layers is not None:
            from decoders.common import new_cache
            a = self.adapter
            ids = torch.tensor([seq], device=self.target.device)
            h = a.run_layers(a.embed(ids), 0, self.layers, new_cache(a.model), 0)
            return a.head(h)  # (T, V)
        from decoders.drafters import align_vocab
        model, dev = self.model.model, self.model.device
        if not self.incremental:
            logits = model(torch.tensor([seq], device=dev)).logits[0]
        else:  # as the decoder runs it: the prompt in one forward, then one token at a time
            from decoders.common import forward, new_cache
            cache = new_cache(model)
            rows = [forward(model, torch.tensor([seq[:prompt_len]], device=dev), cache, 1)]
            rows += [forward(model, torch.tensor([[tok]], device=dev), cache, 1) for tok in seq[prompt_len:]]
            last = torch.cat(rows).reshape(-1, rows[0].shape[-1])  # (n + 1, V): rows prompt_len - 1 ..
            logits = torch.cat([last.new_zeros(prompt_len - 1, last.shape[-1]), last])
        return align_vocab(logits.to(self.target.device), self.vocab)

    def step_seconds(self, context: list[int], k: int, reps: int = 12) -> float:
        """Median time of one draft step (one token, KV cache warm)."""
        torch = self.torch
        from decoders.common import forward, new_cache, sync
        times = []
        if self.lookup is not None:
            for _ in range(reps):
                t = time.perf_counter()
                self.lookup.propose(context, k, None)
                times.append((time.perf_counter() - t) / k)
            return statistics.median(times)
        if self.layers is not None:
            a = self.adapter
            cache = new_cache(a.model)
            a.run_layers(a.embed(torch.tensor([context], device=self.target.device)), 0, self.layers, cache, 0)
            pos = len(context)
            for _ in range(reps):
                t = time.perf_counter()
                h = a.run_layers(a.embed(torch.tensor([[context[-1]]], device=self.target.device)), 0, self.layers,
                                 cache, pos)
                a.head(h)
                sync(self.target.device)
                times.append(time.perf_counter() - t)
                a.rollback(cache, pos)
            return statistics.median(times[2:])
        return model_step_seconds(self.model, context, reps)


def batch_dependent(model) -> bool:
    """Whether a model's numerics depend on how many tokens one forward holds: dynamic
    quantization scales activations per tensor, over all tokens of the forward, so a
    teacher-forced forward over the whole output is not what incremental decoding computes
    (on smollm2-135m-int8 it agreed with the target on ~53% of tokens, incremental on ~79%)."""
    return any("quantized.dynamic" in type(m).__module__ for m in model.modules())


def model_step_seconds(loaded, context: list[int], reps: int = 12) -> float:
    import torch
    from decoders.common import forward, new_cache, rollback, sync
    cache = new_cache(loaded.model)
    forward(loaded.model, torch.tensor([context[:-1]], device=loaded.device), cache, 1)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        forward(loaded.model, torch.tensor([[context[-1]]], device=loaded.device), cache, 1)
        sync(loaded.device)
        times.append(time.perf_counter() - t)
        rollback(cache, len(context) - 1)
    return statistics.median(times[2:])


def prefill_seconds(loaded, prompt: list[int]) -> float:
    """One prefill of `prompt` as the decoders run it (their cache, their forward)."""
    import torch
    from decoders.common import forward, sync
    from decoders.kv import CachePool
    cache = CachePool(loaded.model).new(len(prompt) + 1, private=True)
    with torch.inference_mode():
        sync(loaded.device)
        t = time.perf_counter()
        forward(loaded.model, torch.tensor([prompt], device=loaded.device), cache, 1)
        sync(loaded.device)
    return time.perf_counter() - t


def estimate_item(target, draft: Draft, prompt: list[int], out: list[int], budget: int, *, k: int,
                  temperature: float):
    """(accepted, tested, rounds, agreement, proposals per round (greedy; () when sampling)) of one
    item, teacher forced."""
    import torch
    from analysis.acceptance_estimate import replay_greedy_rounds
    n = len(out)
    if n < 2:
        return 0.0, 0.0, 0, float("nan"), ()
    seq = prompt + out
    rows = slice(len(prompt) - 1, len(seq) - 1)  # row i predicts output index i
    with torch.inference_mode():
        p_logits = target.model(torch.tensor([seq], device=target.device)).logits[0, rows].float()  # (n, V)
        p_logits = p_logits[:, :draft.vocab]
        q_logits = draft.logits(seq, len(prompt))
        q_logits = None if q_logits is None else q_logits[rows].float()[:, :draft.vocab]
    argmax_p = p_logits.argmax(-1).tolist()
    if draft.lookup is not None:
        def propose(i, m):
            return draft.lookup.propose(prompt + out[:i], m, None).tokens
        single = [propose(i, 1) for i in range(1, n)]
        agree = [bool(s) and s[0] == argmax_p[i] for i, s in zip(range(1, n), single)]
    else:
        argmax_q = q_logits.argmax(-1).tolist()

        def propose(i, m):
            return argmax_q[i:i + m]
        agree = [argmax_q[i] == argmax_p[i] for i in range(1, n)]
    agreement = sum(agree) / len(agree)
    if temperature == 0:
        acc, tested, rounds, proposals = replay_greedy_rounds(n, budget, k, propose, argmax_p)
        return float(acc), float(tested), rounds, agreement, proposals
    p = torch.softmax(p_logits[1:] / temperature, -1)  # (n-1, V), drafted positions only
    if draft.lookup is not None:
        beta = [float(p[i - 1, s[0]]) for i, s in zip(range(1, n), single) if s]
    else:
        q = torch.softmax(q_logits[1:] / temperature, -1)
        beta = torch.minimum(p, q).sum(-1).tolist()
    return float(sum(beta)), float(len(beta)), len(beta), agreement, ()


def estimate(target, draft_spec: str, items, outputs: dict, *, k: int = 4, temperature: float = 0.0,
             device=None, seed: int = 0) -> dict:
    """α̂ per category with intervals, the measured draft cost and the implied speedup."""
    from analysis.acceptance_estimate import PromptEstimate, summarize_estimates
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"--temperature must be a finite number >= 0, got {temperature}")
    if k < 1:
        raise ConfigError(f"--k must be >= 1, got {k}")
    draft = Draft(draft_spec, target, device)
    t0 = time.perf_counter()
    prompts = []
    for it in items:
        prompt, out, budget = outputs[it.id]
        acc, tested, rounds, agreement, proposals = estimate_item(target, draft, prompt, out, budget, k=k,
                                                                  temperature=temperature)
        prompts.append(PromptEstimate(it.id, tuple(it.categories), acc, tested, rounds, agreement, proposals))
    forward_s = time.perf_counter() - t0
    first = max(outputs.values(), key=lambda v: len(v[0]) + len(v[1]))
    context = first[0] + first[1]
    target_step = model_step_seconds(target, context)
    draft_step = draft.step_seconds(context, k)
    c = draft_step / target_step
    from decoders.measure import block_cost
    cost = block_cost(target.model, target.device, context, k)
    if temperature == 0:  # the prefills, for the end-to-end prediction (regress times them too)
        from dataclasses import replace
        prefill_seconds(target, outputs[items[0].id][0])  # warm-up
        prompts = [replace(p, tokens=len(outputs[it.id][1]),
                           prefill_steps=prefill_seconds(target, outputs[it.id][0]) / target_step)
                   for p, it in zip(prompts, items)]
    groups = summarize_estimates(prompts, k=k, c=c, rng=seed)
    from dataclasses import asdict

    from analysis.acceptance import round_speedup, theoretical_speedup
    from analysis.acceptance_estimate import replayed_speedup
    rows = {}
    for g, v in groups.items():
        row = asdict(v)
        a = v.alpha
        mine = [p for p in prompts if g == "all" or g[len("category:"):] in p.categories]
        ks = [j for p in mine for j in p.proposals]
        row["theoretical_speedup_measured_verify"] = (
            None if a != a else round_speedup(a, ks, c, k=k, verify_cost=cost.ratio) if ks
            else float(theoretical_speedup(min(max(a, 0.0), 1.0), k, c, verify_cost=cost.ratio)))
        if ks:
            row["plain_steps"] = sum(1 for j in ks if j == 0)
            pred = replayed_speedup(mine, k=k, c=c, verify_cost=cost.ratio, rng=seed)
            row["predicted_speedup"], row["predicted_ci_low"], row["predicted_ci_high"] = pred
        rows[g] = row
    return {"target": target.name, "draft": draft_spec, "k": k, "temperature": temperature,
            "method": "replayed greedy rounds" if temperature == 0 else "E[sum min(p, q)] per position",
            "c": c, "target_step_s": target_step, "draft_step_s": draft_step, "forwards_s": forward_s,
            "verify_cost": cost.ratio, "verify_block_s": cost.block_s, "verify_step_s": cost.step_s,
            "groups": rows, "prompts": [asdict(p) for p in prompts]}


def table(result: dict) -> str:
    def f(x, spec=".3f"):
        return "–" if x is None or x != x else format(x, spec)
    lines = [f"{result['target']} ← draft {result['draft']}, K={result['k']}, T={result['temperature']:g} "
             f"({result['method']}); c = {f(result['c'])} (draft step {1e3 * result['draft_step_s']:.2f} ms / "
             f"target step {1e3 * result['target_step_s']:.2f} ms); verifying K+1 tokens costs "
             f"v = {f(result['verify_cost'], '.2f')} steps ({1e3 * result['verify_block_s']:.2f} ms)",
             f"{'group':<28} {'prompts':>7} {'rounds':>6} {'plain':>5} {'α̂':>6} {'95% CI':>15} {'agree':>6} "
             f"{'theory':>7} {'with v':>7} {'predicted [95% CI]':>20}"]
    for g, v in result["groups"].items():
        lines.append(f"{g:<28} {v['n_prompts']:>7} {v['rounds']:>6} {v.get('plain_steps', '–'):>5} {f(v['alpha']):>6} "
                     f"{'[' + f(v['ci_low']) + ', ' + f(v['ci_high']) + ']':>15} {f(v['agreement']):>6} "
                     f"{f(v['theoretical_speedup'], '.2f') + 'x':>7} "
                     f"{f(v['theoretical_speedup_measured_verify'], '.2f') + 'x':>7} "
                     + (f"{f(v['predicted_speedup'], '.2f')}x [{f(v['predicted_ci_low'], '.2f')}, "
                        f"{f(v['predicted_ci_high'], '.2f')}]" if "predicted_speedup" in v else "–").rjust(20))
    lines.append("rounds: rounds that drafted; plain: rounds without a draft (one target step each, greedy)")
    lines.append("theory: Leviathan's speedup over those rounds, each at its own draft length (at K when "
                 "sampling), a K+1 verification costing one step; with v: the same with the measured cost "
                 "of verifying K+1 tokens")
    lines.append("predicted (greedy): the replayed rounds at their measured costs, prefill included: the "
                 "speedup `regress` measures (wall time per token), with an interval over prompts")
    return "\n".join(lines)


def run(args) -> int:
    from harness.build import get_model
    from suites import load_suite
    suite = load_suite(args.suite)
    items = suite.select(args.subset)
    if args.max_new_tokens is not None and args.max_new_tokens < 2:
        raise ConfigError("--max-new-tokens must be >= 2 (the first token is never drafted)")
    # Said before the model loads and the baseline generates: estimate() meets them only after that.
    if args.k < 1:
        raise ConfigError(f"--k must be >= 1, got {args.k}")
    if args.seed < 0:  # the bootstrap's numpy SeedSequence takes none below 0
        raise ConfigError(f"--seed must be an integer >= 0, got {args.seed}")
    target = get_model(args.target, args.device)
    t = time.perf_counter()
    outputs = baseline_outputs(target, items, run_dir=args.baseline_run, suite_name=suite.name,
                               cap=args.max_new_tokens, suite_hash=suite.hash)
    gen_s = time.perf_counter() - t
    result = estimate(target, args.draft, items, outputs, k=args.k, temperature=args.temperature,
                      device=args.device, seed=args.seed)
    result.update(suite=suite.name, suite_hash=suite.hash, subset=args.subset, baseline_s=gen_s)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
        print(f"baseline outputs {gen_s:.1f} s, teacher-forced forwards {result['forwards_s']:.1f} s", file=sys.stderr)
    return 0
