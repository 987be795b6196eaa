"""Calibration of the engine seed gate, by simulation through the gate's own code.

Part of ``python -m harness.calibration.report`` (the section "Engine seed gate" in CALIBRATION.md).
Each simulated study samples two seeds' outputs per prompt from an engine and judges them with
``harness.run.engine_exactness.seed_check`` and ``harness.verdict.engine_exactness.seed_gates``,
the functions a run calls; an alarm is the gate's "ignores the request's seed" (fail).

The model: two tokens per position, the engine's likelier one at probability ``engine_top`` and the
reference's at ``ref_top`` (a quantized engine judged against an fp32 copy is more peaked). The
engine-reference noise is what ``measured_noise`` reads on it: the gap between the two top-2
margins, |logit(engine_top) - logit(ref_top)|. A seed-deaf prompt repeats its first sample at the
second seed; an honest one draws again. "before" is the rule the gate had: every pair identical and
the product of the reference's chances below SEED_LEVEL.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from harness.run.engine_exactness import SEED_LEVEL, seed_check
from harness.verdict.engine_exactness import seed_gates

from .common import Rate, pick

HEADING = "## Engine seed gate: false alarms on a more peaked engine, detection of a partly seed-deaf one"


class TwoTokenReference:
    """The reference's rows: [ref_top, 1 - ref_top] at every position; `noise` as measured."""

    def __init__(self, ref_top: float, noise: float):
        self.row, self.noise = np.array([ref_top, 1 - ref_top]), noise

    def rows(self, prompt_ids, tokens, request):
        return [self.row] * len(tokens)


def noise_between(engine_top: float, ref_top: float) -> float:
    def logit(p):
        return math.log(p / (1 - p))
    return abs(logit(engine_top) - logit(ref_top))


def shifted(p: float, noise: float) -> float:
    """The probability whose logit is `noise` above p's."""
    return 1.0 / (1.0 + (1.0 - p) / p * math.exp(-noise))


def alarms(engine_top: float, ref_top: float, prompts: int, tokens: int, deaf: int, studies: int, rng,
           noise: float | None = None) -> tuple[Rate, Rate]:
    """(P(the gate calls the seed ignored), P(the rule before did)) over ``studies`` studies with
    ``deaf`` of ``prompts`` prompts repeating their sample whatever the seed."""
    ref = TwoTokenReference(ref_top, noise_between(engine_top, ref_top) if noise is None else noise)
    req = SimpleNamespace(prompt_ids=[1], temperature=0.7)
    now = before = 0
    for _ in range(studies):
        first = (rng.random((prompts, tokens)) >= engine_top).astype(int)
        second = (rng.random((prompts, tokens)) >= engine_top).astype(int)
        second[:deaf] = first[:deaf]
        rows = [({"suite": "s", "item_id": f"p{i}", "temperature": 0.7, "seed": s, "tokens": x[i].tolist()}, req)
                for i in range(prompts) for s, x in ((0, first), (1, second))]
        seeds = seed_check(ref, SimpleNamespace(rows=rows), None)
        now += any(g.status == "fail" and "ignores" in g.detail for g in seed_gates(seeds))
        before += seeds["identical"] == seeds["pairs"] and seeds["chance"] < SEED_LEVEL
    return Rate(now / studies, studies, None), Rate(before / studies, studies, None)


def _ci(r: Rate) -> str:
    return f"{r.simulated:.4f} ± {1.96 * r.mc_se:.4f}"


def report_lines(*, rng, grid: str = "full") -> list[str]:
    honest = pick(((0.999, 0.98, 8), (0.999, 0.98, 16), (0.999, 0.99, 16), (0.99, 0.95, 8), (0.9, 0.9, 8)),
                  ((0.999, 0.98, 8),), grid)
    deafs = pick(((0.9, 0.9, 0.25), (0.9, 0.9, 0.5), (0.9, 0.9, 0.75), (0.9, 0.9, 0.9), (0.98, 0.98, 0.5),
                  (0.999, 0.98, 0.5), (0.999, 0.98, 0.9)), ((0.9, 0.9, 0.5),), grid)
    n_honest, n_deaf, tokens = pick(10_000, 300, grid), pick(2000, 100, grid), 48
    out = [HEADING, "",
           f"Through the gate's own code (`harness.run.engine_exactness.seed_check` -> "
           f"`harness.verdict.engine_exactness.seed_gates`; harness/calibration/seeds.py), two seeds per prompt, "
           f"{tokens} tokens per sample, two tokens per position (the engine's top probability against the "
           f"reference's; the noise is the gap between their top-2 margins, as `measured_noise` reads it). "
           f"'before': every pair identical and the product of the reference's chances below {SEED_LEVEL:g}. "
           f"Simulated rates ± 1.96 Monte Carlo SE.", "",
           f"### An honest engine: false alarms (target <= {SEED_LEVEL:g}), {n_honest:,} studies per row", "",
           "| engine top | reference top | noise (logits) | prompts | false alarm: now | before |",
           "|---|---|---|---|---|---|"]
    for pe, pr, prompts in honest:
        now, before = alarms(pe, pr, prompts, tokens, 0, n_honest, rng)
        out.append(f"| {pe:g} | {pr:g} | {noise_between(pe, pr):.2f} | {prompts} | {_ci(now)} | {_ci(before)} |")
    out += ["", f"### An engine deaf to the seed on a share of its prompts: detection (target >= 0.8 at half of "
            f"8 prompts), {n_deaf:,} studies per row", "",
            "| engine top | reference top | noise (logits) | prompts | deaf prompts | detected: now | before |",
            "|---|---|---|---|---|---|---|"]
    for pe, pr, share in deafs:
        deaf = round(share * 8)
        now, before = alarms(pe, pr, 8, tokens, deaf, n_deaf, rng)
        out.append(f"| {pe:g} | {pr:g} | {noise_between(pe, pr):.2f} | 8 | {deaf} | {_ci(now)} | {_ci(before)} |")
    return out + [""] + noise_lines(rng=rng, grid=grid)


def noise_lines(*, rng, grid: str) -> list[str]:
    """Both rates at the engine-reference noise real engines show (0.1-1 logits), each in its hard
    direction: an honest engine more peaked than its reference by the noise (it repeats itself
    more often than the reference says), and a deaf one whose reference is more peaked than it by
    the noise (the raise by the noise then makes its repeats look likelier than they are)."""
    noises, tops = pick((0.1, 0.25, 0.5, 1.0), (0.5,), grid), pick((0.9, 0.95), (0.9,), grid)
    n_honest, n_deaf = pick(10_000, 300, grid), pick(2000, 100, grid)
    out = ["### At real engines' noise (0.1-1 logits, e.g. 0.48 between llama.cpp's Q4_1 server and its own "
           "prompt logprobs): honest engine more peaked than the reference, deaf engine less peaked", "",
           f"False alarms at {n_honest:,} studies per row, detection (deaf on 4 of 8 prompts) at {n_deaf:,}; "
           f"8 prompts x 48 tokens.", "",
           "| top (reference, honest; engine, deaf) | noise (logits) | honest: false alarm | deaf on 4 of 8: detected |",
           "|---|---|---|---|"]
    for top in tops:
        for noise in noises:
            honest, _ = alarms(shifted(top, noise), top, 8, 48, 0, n_honest, rng)
            deaf, _ = alarms(top, shifted(top, noise), 8, 48, 4, n_deaf, rng)
            out.append(f"| {top:g} | {noise:g} | {_ci(honest)} | {_ci(deaf)} |")
    return out + [""]
