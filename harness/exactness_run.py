"""Distribution checks for rejection-sampling candidates: many short samples from the candidate
on a few prompts (those where the target is least certain, so the test has power), against the
target's exact sequence probabilities (teacher forcing).

Results go to `exactness.jsonl` in the run folder (one row per prompt and temperature), so a
resumed run does not redo them.
"""
from __future__ import annotations

from pathlib import Path

import torch

import analysis
from decoders import GenerationRequest
from decoders.sampling import probs
from harness.runner import WorkItem, make_request

FILE = "exactness.jsonl"
# Three-token sequences: the first new token always comes from the prompt's prefill, so it takes
# two more to exercise a draft's accept test, the resample after a rejection, and the bonus token.
SEQ_LEN = 3


@torch.inference_mode()
def categories(target, request: GenerationRequest, n: int, depth: int = 3, min_expected: float = 5.0):
    """An a-priori partition of `depth`-token sequences with exact probabilities under the target's
    shaped distribution (teacher forcing), fixed before looking at any sample. A prefix is split
    further while it is expected at least `min_expected` times in n samples; "a,b,*" holds the rest
    of a split prefix "a,b"; "*" everything whose first token is unlikely. Returns
    (probabilities by category name, a function from a sequence to its category)."""
    model, device = target.model, target.device
    prompt = list(request.prompt_ids)
    table: dict = {}
    split: set = set()          # prefixes that were split into their next tokens
    frontier = [((), 1.0)]      # (prefix, its probability)
    for level in range(depth):
        if not frontier:
            break
        batch = torch.tensor([prompt + list(pre) for pre, _ in frontier], device=device)
        rows = probs(model(batch).logits[:, -1], request).double().cpu()  # (len(frontier), V)
        nxt = []
        for (pre, mass), row in zip(frontier, rows):
            split.add(pre)
            joint = mass * row
            kept = [int(t) for t in torch.nonzero(joint * n >= min_expected).flatten()]
            for t in kept:
                if level == depth - 1:
                    table[",".join(map(str, pre + (t,)))] = float(joint[t])
                else:
                    nxt.append((pre + (t,), float(joint[t])))
            rest = float(mass - sum(joint[t] for t in kept))
            table[",".join(map(str, pre)) + ",*" if pre else "*"] = max(rest, 0.0)
        frontier = nxt

    def rest(pre: tuple) -> str:
        return ",".join(map(str, pre)) + ",*" if pre else "*"

    def assign(seq) -> str:
        pre: tuple = ()
        for i, token in enumerate(seq):
            child = pre + (int(token),)
            if i == depth - 1:
                name = ",".join(map(str, child))
                return name if name in table else rest(pre)
            if child not in split:
                return rest(pre)
            pre = child
        return rest(pre)
    return table, assign


@torch.inference_mode()
def most_uncertain(config, lineup, items, temps, n: int) -> list:
    """The n items whose first new token the target is least sure of (at the lowest sampled
    temperature). A goodness-of-fit test has power only where the distribution is spread: on a
    prompt whose next two tokens are near-certain every sample lands in one category."""
    if not temps or len(items) <= n:
        return items[:n]
    target = lineup.baseline_target
    scored = []
    for suite, item in items:
        req = make_request(config, target, WorkItem(suite, item, min(temps), 0))
        logits = target.model(torch.tensor([list(req.prompt_ids)], device=target.device)).logits[0, -1]
        scored.append((float(probs(logits, req).max()), suite, item))
    scored.sort(key=lambda x: x[0])
    return [(suite, item) for _, suite, item in scored[:n]]


def _normalised(p: dict) -> dict:
    total = sum(p.values())
    return {k: v / total for k, v in p.items()} if total > 1 else p


def needs_check(spec) -> bool:
    return spec.decoder == "speculative" and spec.kind == "exact" and spec.options.get("verify") == "rejection"


def run_checks(config, run_dir: Path, lineup, suites, progress: bool = True) -> dict:
    from tqdm import tqdm
    from harness.runner import RecordWriter, read_records
    done = {(r["candidate"], r["suite"], r["item_id"], r["temperature"]): r for r in read_records(run_dir, FILE)}
    prof = config.profile
    temps = [t for t in prof.temperatures if t > 0]
    items = [(s, it) for s in suites if s.name in prof.sample_suites for it in s.select(prof.subset)]
    out: dict = {}
    f = RecordWriter(run_dir, FILE)
    try:
        for spec in (s for s in lineup.specs if needs_check(s)):
            tests = []
            mine = [(su, it) for su, it in items if spec.suites is None or su.name in spec.suites]
            for suite, item in most_uncertain(config, lineup, mine, temps, prof.exactness_prompts):
                for t in temps:
                    key = (spec.name, suite.name, item.id, t)
                    if key not in done:
                        target = lineup.targets[spec.name]
                        base = make_request(config, target, WorkItem(suite, item, t, 0))
                        samples = []
                        for seed in tqdm(range(prof.exactness_samples), desc=f"exactness {spec.name} {item.id} T={t:g}",
                                         disable=not progress, leave=False):
                            req = GenerationRequest(base.prompt_ids, max_new_tokens=SEQ_LEN, temperature=t,
                                                    top_p=base.top_p, seed=10_000 + seed)
                            samples.append(tuple(lineup.decoders[spec.name].generate(req).tokens))
                        full = [s for s in samples if len(s) == SEQ_LEN]  # no stop tokens: always SEQ_LEN
                        p, assign = categories(lineup.baseline_target, base, len(full), depth=SEQ_LEN)
                        row = {"candidate": spec.name, "suite": suite.name, "item_id": item.id, "temperature": t,
                               "n": len(full)}
                        try:
                            gof = analysis.goodness_of_fit([assign(x) for x in full], _normalised(p))
                            row.update(pvalue=gof.pvalue, statistic=gof.statistic, categories=gof.categories)
                        except analysis.InsufficientDataError as e:
                            # Not a pass: the gate reports it as inconclusive.
                            row.update(pvalue=None, statistic=None, categories=None, note=str(e))
                        f.write(row)
                        done[key] = row
                    tests.append(done[key])
            out[spec.name] = {"tests": tests}
    finally:
        f.close()
    return out
