"""Distribution checks for rejection-sampling candidates: many short samples from the candidate
on a few prompts, against the target's exact sequence probabilities (teacher forcing).

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
SEQ_LEN = 2  # two-token sequences: enough to exercise accept, reject-and-resample, and bonus


@torch.inference_mode()
def sequence_probabilities(target, request: GenerationRequest, sequences: set[tuple[int, ...]]) -> dict:
    """Exact probability of each sequence under the target's shaped distribution."""
    model, device = target.model, target.device
    prompt = list(request.prompt_ids)
    first = model(torch.tensor([prompt], device=device)).logits[0, -1]
    p1 = probs(first, request).double().cpu()
    heads = sorted({s[0] for s in sequences})
    batch = torch.tensor([prompt + [h] for h in heads], device=device)
    p2 = probs(model(batch).logits[:, -1], request).double().cpu()  # (len(heads), V)
    row = {h: i for i, h in enumerate(heads)}
    return {s: float(p1[s[0]] * p2[row[s[0]], s[1]]) for s in sequences}


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
            for suite, item in mine[: prof.exactness_prompts]:
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
                        full = [s for s in samples if len(s) == SEQ_LEN]
                        p = sequence_probabilities(lineup.baseline_target, base, set(full))
                        row = {"candidate": spec.name, "suite": suite.name, "item_id": item.id, "temperature": t,
                               "n": len(full)}
                        try:
                            gof = analysis.goodness_of_fit(full, p)
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
