"""Calibration of the engine seed gate, by simulation through the gate's own code.

Part of ``python -m harness.calibration.report`` (the section "Engine seed gate" in CALIBRATION.md).
Each simulated study samples two seeds' outputs per prompt from an engine and judges them with
``harness.run.engine_exactness.seed_check`` and ``harness.verdict.engine_exactness.seed_gates``,
the functions a run calls; an alarm is the gate's "ignores the request's seed" (fail).

The model: two tokens per position, the engine's likelier one at probability ``engine_top`` and the
reference's at ``ref_top`` (a quantized engine judged against an fp32 copy is more peaked). The
engine-reference noise is what ``measured_noise`` reads on it: the gap between the two top-2
margins, |logit(engine_top) - logit(ref_top)|. A seed-deaf prompt repeats its first sample at the
second seed; an honest one draws again. "before" is the rule the gate had: Fisher's combination of
the prompts alone below SEED_LEVEL, a repeat holding a token outside the nucleus dropped whole.
Designs beside the grid: a few deaf prompts among many (1 of 16, 2 of 40, 4 of 100), a fully deaf
engine with predictable outputs (18 prompts, one uncertain token at 0.7 and 47 certain ones per
sample), and an engine deaf on 4 of 8 prompts whose repeats each hold one out-of-nucleus token.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from harness.run.engine_exactness import SEED_LEVEL, SEED_ROUTES, seed_check
from harness.verdict.engine_exactness import seed_gates

from .common import Rate, pick

HEADING = "## Engine seed gate: false alarms on a more peaked engine, detection of a partly seed-deaf one"


class TwoTokenReference:
    """The reference's rows: [ref_top, 1 - ref_top, 0] at every position (or per position where
    ``ref_top`` is a sequence); token 2 lies outside the nucleus; `noise` as measured."""

    def __init__(self, ref_top, noise: float):
        top = np.atleast_1d(np.asarray(ref_top, dtype=float))
        self.table, self.noise = np.stack([top, 1 - top, np.zeros_like(top)], axis=1), noise

    def rows(self, prompt_ids, tokens, request):
        table = np.broadcast_to(self.table, (len(tokens), 3)) if len(self.table) == 1 else self.table
        return list(table[:len(tokens)])


def noise_between(engine_top: float, ref_top: float) -> float:
    def logit(p):
        return math.log(p / (1 - p))
    return abs(logit(engine_top) - logit(ref_top))


def shifted(p: float, noise: float) -> float:
    """The probability whose logit is `noise` above p's."""
    return 1.0 / (1.0 + (1.0 - p) / p * math.exp(-noise))


def _samples(rng, engine_top, prompts: int, tokens: int) -> np.ndarray:
    return (rng.random((prompts, tokens)) >= np.broadcast_to(engine_top, (tokens,))).astype(int)


def study(rng, engine_top, ref, prompts: int, tokens: int, deaf: int, off_reference: bool = False):
    """One simulated study: two seeds per prompt, the first ``deaf`` prompts repeating their first
    sample (with one token outside the reference's nucleus where ``off_reference``). Returns
    (the seed_check result, its gates)."""
    req = SimpleNamespace(prompt_ids=[1], temperature=0.7)
    first = _samples(rng, engine_top, prompts, tokens)
    second = _samples(rng, engine_top, prompts, tokens)
    if off_reference:
        first[:deaf, tokens // 2] = 2
    second[:deaf] = first[:deaf]
    rows = [({"suite": "s", "item_id": f"p{i}", "temperature": 0.7, "seed": s, "tokens": x[i].tolist()}, req)
            for i in range(prompts) for s, x in ((0, first), (1, second))]
    seeds = seed_check(ref, SimpleNamespace(rows=rows), None)
    return seeds, seed_gates(seeds)


def fisher_alone(seeds: dict) -> bool:
    """The rule before issue 58: Fisher's combination alone below SEED_LEVEL; a repeat holding a
    token outside the nucleus was dropped whole."""
    return not seeds["off_reference"] and seeds["pvalue"] is not None and seeds["pvalue"] < SEED_LEVEL


def all_identical(seeds: dict) -> bool:
    """The rule before issue 49: every pair identical and the product of the reference's chances
    (not raised by the noise) below SEED_LEVEL."""
    return seeds["identical"] == seeds["pairs"] and seeds["chance"] < SEED_LEVEL


def alarms(engine_top, ref_top, prompts: int, tokens: int, deaf: int, studies: int, rng,
           noise: float | None = None, off_reference: bool = False, before=fisher_alone) -> tuple[Rate, Rate]:
    """(P(the gate calls the seed ignored), P(the rule ``before`` did)) over ``studies`` studies
    with ``deaf`` of ``prompts`` prompts repeating their sample whatever the seed."""
    if noise is None:
        noise = noise_between(float(np.max(engine_top)), float(np.max(ref_top)))
    ref = TwoTokenReference(ref_top, noise)
    now = was = 0
    for _ in range(studies):
        seeds, gates = study(rng, engine_top, ref, prompts, tokens, deaf, off_reference)
        now += any(g.status == "fail" and "ignores" in g.detail for g in gates)
        was += before(seeds)
    return Rate(now / studies, studies, None), Rate(was / studies, studies, None)


def outcomes(engine_top, ref_top, prompts: int, tokens: int, deaf: int, studies: int, rng,
             off_reference: bool = False) -> dict:
    """The share of studies by the seed gate's status: "fail" (ignored or inconclusive under the
    shipped `inconclusive = "fail"`), "warn", "silent" (no seed gate result at all)."""
    ref = TwoTokenReference(ref_top, 0.0)
    counts = {"fail": 0, "warn": 0, "silent": 0}
    for _ in range(studies):
        _, gates = study(rng, engine_top, ref, prompts, tokens, deaf, off_reference)
        counts[gates[0].status if gates else "silent"] += 1
    return {k: v / studies for k, v in counts.items()}


PREDICTABLE = np.r_[0.7, np.ones(47)]  # one uncertain token per sample: 18 repeats' product ~1.9e-5 (typical)


def _ci(r: Rate) -> str:
    return f"{r.simulated:.4f} ± {1.96 * r.mc_se:.4f}"


def report_lines(*, rng, grid: str = "full") -> list[str]:
    honest = pick(((0.999, 0.98, 8), (0.999, 0.98, 16), (0.999, 0.99, 16), (0.99, 0.95, 8), (0.9, 0.9, 8),
                   (0.9, 0.9, 16), (0.9, 0.9, 40), (0.9, 0.9, 100), (0.999, 0.98, 100)), ((0.999, 0.98, 8),), grid)
    deafs = pick(((0.9, 0.9, 0.25), (0.9, 0.9, 0.5), (0.9, 0.9, 0.75), (0.9, 0.9, 0.9), (0.98, 0.98, 0.5),
                  (0.999, 0.98, 0.5), (0.999, 0.98, 0.9)), ((0.9, 0.9, 0.5),), grid)
    n_honest, n_deaf, tokens = pick(5000, 300, grid), pick(1000, 100, grid), 48
    out = [HEADING, "",
           f"Through the gate's own code (`harness.run.engine_exactness.seed_check` -> "
           f"`harness.verdict.engine_exactness.seed_gates`; harness/calibration/seeds.py), two seeds per prompt, "
           f"{tokens} tokens per sample, two tokens per position (the engine's top probability against the "
           f"reference's; the noise is the gap between their top-2 margins, as `measured_noise` reads it). "
           f"Routes and their shares of the level {SEED_LEVEL:g}: "
           f"{', '.join(f'{k} {v:g}' for k, v in SEED_ROUTES.items())}. 'before': Fisher's combination alone below "
           f"{SEED_LEVEL:g}, a repeat holding a token outside the nucleus dropped whole (issue 49's rule). "
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
    return out + [""] + sparse_lines(rng=rng, grid=grid) + noise_lines(rng=rng, grid=grid)


def sparse_lines(*, rng, grid: str) -> list[str]:
    """The shapes issue 58 found missed: a few deaf prompts among many, a fully deaf engine with
    predictable outputs (and an honest one with the same outputs), and a deaf engine whose repeats
    hold a token outside the reference's nucleus (fails or is inconclusive, never silent)."""
    n_deaf, n_honest, tokens = pick(1000, 100, grid), pick(5000, 300, grid), 48
    out = [f"### Sparse and predictable deafness (targets: detected >= 0.8, fully deaf predictable >= 0.95), "
           f"{n_deaf:,} studies per row, honest rows {n_honest:,}", "",
           "| design | prompts | deaf prompts | detected: now | before |", "|---|---|---|---|---|"]
    for prompts, deaf in pick(((16, 1), (40, 2), (100, 4)), ((16, 1),), grid):
        now, before = alarms(0.9, 0.9, prompts, tokens, deaf, n_deaf, rng)
        out.append(f"| top 0.9, noise 0 | {prompts} | {deaf} | {_ci(now)} | {_ci(before)} |")
    for deaf, studies, what in ((18, n_deaf, "fully deaf"), (0, n_honest, "honest: false alarm")):
        now, before = alarms(PREDICTABLE, PREDICTABLE, 18, tokens, deaf, studies, rng, noise=0.0)
        out.append(f"| one token at 0.7, 47 certain ({what}) | 18 | {deaf} | {_ci(now)} | {_ci(before)} |")
    off = outcomes(0.9, 0.9, 8, tokens, 4, n_deaf // 4, rng, off_reference=True)
    out += ["", f"Deaf on 4 of 8 prompts, each repeat holding one token outside the nucleus ({n_deaf // 4:,} "
            f"studies): fail {off['fail']:.3f}, warn {off['warn']:.3f}, no seed result {off['silent']:.3f} "
            f"(before: no seed result, combined p = 1).", ""]
    return out


def noise_lines(*, rng, grid: str) -> list[str]:
    """Both rates at the engine-reference noise real engines show (0.1-1 logits), each in its hard
    direction: an honest engine more peaked than its reference by the noise (it repeats itself
    more often than the reference says), and a deaf one whose reference is more peaked than it by
    the noise (the raise by the noise then makes its repeats look likelier than they are)."""
    noises, tops = pick((0.1, 0.25, 0.5, 1.0), (0.5,), grid), pick((0.9, 0.95), (0.9,), grid)
    n_honest, n_deaf = pick(5000, 300, grid), pick(1000, 100, grid)
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
