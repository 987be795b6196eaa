"""The work of a run: which generations a config asks for, their requests and their records.

Pure pieces the runner, the exactness checks and the load runs share: work items (suite item,
temperature, seed), the work in stages (one per sequential look), a work item's request to a
decoder, and the record a result (or a DecoderError) becomes. Nothing here generates.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from decoders import GenerationRequest
from decoders.base import DecoderError
from harness.config import DecoderSpec, RegressConfig


@dataclass(frozen=True)
class WorkItem:
    suite: object
    item: object
    temperature: float
    seed: int

    def key(self, candidate: str) -> tuple:
        return (candidate, self.suite.name, self.item.id, self.seed, self.temperature)


def expand(config: RegressConfig, suite, item) -> list[WorkItem]:
    """One item's generations: each temperature the profile runs on its suite, each seed."""
    prof = config.profile
    out = []
    for t in (logged(item, "temperature") if prof.as_logged else prof.temperatures):
        if t > 0 and suite.name not in prof.sample_suites:
            continue
        # Greedy does not depend on the seed: one seed is enough.
        for seed in (prof.seeds[:1] if t == 0 else prof.seeds):
            out.append(WorkItem(suite, item, t, seed))
    return out


def work_items(config: RegressConfig, suites: list) -> list[WorkItem]:
    return [w for suite in suites for item in suite.select(config.profile.subset) for w in expand(config, suite, item)]


def runs_on(spec: DecoderSpec, suite: str) -> bool:
    return spec.suites is None or suite in spec.suites


# What an item's logged request used (`suites import`) where it logged nothing: the OpenAI API's defaults.
AS_LOGGED_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}


def logged(item, key: str) -> tuple[float]:
    """`temperatures = "as-logged"`: the item's own sampling setting `key`, as a 1-tuple (-0.0 as
    0.0: a logged -0.0 is greedy, and would be keyed "T=-0", out of the greedy identity gate)."""
    return (float((item.sampling or {}).get(key, AS_LOGGED_DEFAULTS[key])) + 0.0,)


def make_request(config: RegressConfig, target, work: WorkItem) -> GenerationRequest:
    item = work.item
    prompt = item.messages or item.prompt
    ids = target.encode(prompt, chat=config.chat)
    budget = item.max_new_tokens
    if config.profile.max_new_tokens:
        budget = min(budget, config.profile.max_new_tokens)
    messages = tuple(prompt) if isinstance(prompt, list) else ({"role": "user", "content": prompt},)
    return GenerationRequest(tuple(ids), max_new_tokens=budget, temperature=work.temperature,
                             top_p=(logged(item, "top_p")[0] if config.profile.as_logged else config.top_p)
                             if work.temperature > 0 else 1.0,
                             top_k=config.profile.top_k if work.temperature > 0 else 0,
                             stop_token_ids=target.stop_token_ids(), stop_strings=tuple(item.stop),
                             seed=work.seed, messages=messages)


def make_row(spec: DecoderSpec, work: WorkItem, result, block: int | None = None) -> dict:
    """One record: the generation (or the error that stopped it) and its grade."""
    from suites.graders import grade
    row = {"candidate": spec.name, "decoder": spec.decoder, "kind": spec.kind,
           "suite": work.suite.name, "suite_version": work.suite.version, "suite_hash": work.suite.hash,
           "item_id": work.item.id, "categories": list(work.item.categories),
           "seed": work.seed, "temperature": work.temperature}
    if block is not None:  # which requests were in flight together, and when this one ended
        row.update(block=block, finished_at=time.time())
    if isinstance(result, DecoderError):
        # One bad item (e.g. a prompt longer than this model's context) is recorded, not fatal.
        return {**row, "error": str(result), "tokens": [], "text": "", "score": 0.0, "passed": False,
                "margins": [], "stats": {}, "timing": {}}
    g = grade(work.item, result.text)
    row.update(tokens=list(result.tokens), text=result.text, finish_reason=result.finish_reason,
               score=g.score, passed=g.passed, grade_detail=g.detail,
               margins=list(result.margins), stats=result.stats, timing=result.timing.as_dict())
    if g.error:  # the grading machinery failed: this fail is no evidence (the quality gate says so)
        row["grade_error"] = g.error
    if result.stats.get("compare_on") == "text":
        row["compare_on"] = "text"  # the engine gave text only: tokens are our re-tokenization
    return row



def staged_work(config: RegressConfig, suites: list, looks=None) -> list[list[WorkItem]]:
    """The work in stages: one stage (config order) for the fixed design; with a look plan
    (`looks.count` > 1), the items of each suite's k-th look in the plan's order, suites
    interleaved so that every stage spans all of them."""
    if looks is None or looks.count <= 1:
        return [work_items(config, suites)]
    from analysis.sequential import fractions, look_sizes
    fracs = fractions(looks.count)
    per_suite = []
    for suite in suites:
        order = looks.order(suite)
        n, k = len(order), looks.count
        # A suite smaller than the looks goes whole into the first stage (judged by the fixed design).
        cuts = (0, *look_sizes(fracs, n)) if n >= k else (0, *([n] * k))
        per_suite.append([[w for it in order[lo:hi] for w in expand(config, suite, it)]
                          for lo, hi in zip(cuts, cuts[1:])])
    stages = []
    for k in range(looks.count):
        lists = [p[k] for p in per_suite]
        stages.append([w for group in _round_robin(lists) for w in group])
    return stages


def _round_robin(lists: list[list]) -> list[list]:
    out, i = [], 0
    while any(i < len(x) for x in lists):
        out.append([x[i] for x in lists if i < len(x)])
        i += 1
    return out


def label(w: WorkItem) -> str:
    return f"{w.suite.name}/{w.item.id} seed={w.seed} T={w.temperature:g}"
