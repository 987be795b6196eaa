"""Distribution checks for rejection-sampling candidates (speculative decoding, verify = "rejection"),
against the target's exact shaped probabilities from an independent reference
(`harness/run/reference.py`: transformers' logits warpers on teacher-forced logits; nothing here
uses `decoders.sampling`, the shaping the baseline and every candidate sample with).

1. The sequential PIT test (`analysis/pit.py`) over every token the candidate sampled (its sampled
   records and the window samples below); restricted to the positions where the verifier tested a
   draft token (still under p); and at the positions where it rejected one, under the residual
   normalize(max(p - q, 0)) (q: a point mass at the rejected token for prompt lookup; for a model
   draft, the draft's shaped distribution replayed the way it computed it while decoding; a
   self-draft's q is not rebuilt, so that subset is not tested for it). Two controls:
   - the baseline's own sampled records through the same test: if they fail, the harness's
     sampler (or the reference's numerics) is wrong, which no candidate verdict can rest on;
   - for a model draft, the draft's proposals (each round's accepted drafts and its rejected one)
     under the rebuilt q: every one must have q > 0 and their PIT must pass, or the rebuilt q is
     not the q the draft sampled from, and the residual test cannot be read.
2. Goodness of fit of SEQ_LEN-token sequences in windows chosen where the verifier works: positions
   in the baseline's sampled continuations where the target is uncertain, ranked by the drafts the
   candidate rejects in a few trial runs (seeds apart from the test's), then `exactness_samples`
   samples against an a-priori partition with exact probabilities. Each window counts the draft
   tokens proposed and rejected inside it (without a rejection it cannot show a wrong correction)
   and states the smallest top-two distortion it could detect at its n.

`margin_noise` measures the baseline's own top-2 margin noise between its one-token decode steps
and a batched forward (what a numerical near-tie is).

Windows and their samples go to `exactness.jsonl` (one row per window), so a resumed run does not
redraw them (it draws only the windows still missing); the tests are recomputed from them. A sample
whose generation failed (a DecoderError, e.g. NaN logits) is kept as an error: its window's test is
inconclusive and names it. Fewer windows than `exactness_prompts` (too few positions to choose
from) add a test without a p-value that names the shortfall.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

import analysis
from analysis import pit
from decoders.base import DecoderError
from analysis.exactness import detectable_tv as gof_detectable_tv, samples_needed as gof_samples_needed
from harness.run import reference
from harness.run.reference import output_size, shaped_probs, teacher_forced_logits, to_vocab
from harness.run.remote import Broke
from harness.run.runner import WorkItem, broken, make_request, stage_broke

FILE = "exactness.jsonl"
# Three-token sequences: the first new token always comes from the prompt's prefill, so it takes
# two more to exercise a draft's accept test, the resample after a rejection, and the bonus token.
SEQ_LEN = 3
TRIALS = 8            # trial samples per candidate window, to find where the verifier rejects drafts
WINDOWS_PER_ITEM = 2
TEST_SEED, TRIAL_SEED = 10_000, 20_000
BOUNDARY_TOL = 1e-4   # a token this close to the top-p boundary may fall either side numerically
RESIDUAL_TOL = 1e-5   # p(x) this close to q(x): the residual's support is numerically ambiguous
STATS_KEPT = ("round_offsets", "proposed_per_round", "accepted_per_round", "rejected_draft_tokens")
REFERENCE = ("transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper (float64) on "
             "teacher-forced logits")


def _request_at(base, context, temperature=None):
    """The request `base` continued after `context` (a window's prompt)."""
    return dataclasses.replace(base, prompt_ids=tuple(context),
                               temperature=base.temperature if temperature is None else temperature)


def _ambiguous_at_boundary(logits_row: torch.Tensor, token: int, request) -> bool:
    return reference.at_top_p_boundary(logits_row, token, request, BOUNDARY_TOL)


class Sequence:
    """One sampled continuation with what the PIT subsets need."""

    def __init__(self, context, tokens, request, stats: dict | None):
        self.context, self.tokens, self.request, self.stats = list(context), list(tokens), request, stats or {}


def _draft_model(spec, target):
    """The draft model a candidate decodes with (as `harness.build.build_decoder` resolves it)."""
    draft = spec.options.get("draft")
    if not isinstance(draft, str) or draft == "prompt-lookup" or draft.startswith("self:"):
        return None
    device = spec.options.get("draft_device")
    if draft == target.name and device in (None, str(target.device)):
        return target
    from harness.build import get_model
    return get_model(draft, device or str(target.device))


def _keep_possible(p: torch.Tensor, logits: torch.Tensor, x: torch.Tensor, req) -> torch.Tensor:
    """Mask (T,) of the tokens to test: all but those of probability 0 that sit at the top-p
    boundary within BOUNDARY_TOL (rounding may put them on either side)."""
    keep = torch.ones(len(x), dtype=torch.bool)
    for t in torch.nonzero(p[torch.arange(len(x)), x] <= 0).flatten().tolist():
        if _ambiguous_at_boundary(logits[t], int(x[t]), req):
            keep[t] = False
    return keep


def _draft_side(draft, s: Sequence, tested: np.ndarray, rejected: np.ndarray, drafted_tok: np.ndarray,
                vocab: int) -> tuple[dict[int, torch.Tensor], pit.PitFeatures, int]:
    """The rebuilt q (shaped) at each tested position, the features of the draft's proposals
    under it (the draft-side control) and how many proposals sat at the top-p boundary."""
    rows = reference.replayed_draft_logits(draft, s.context, s.tokens, s.stats)
    q, props, logits = {}, [], []
    for t in np.flatnonzero(tested).tolist():
        if t not in rows:
            continue
        row = to_vocab(rows[t], vocab)
        q[t] = shaped_probs(row, s.request)
        d = int(drafted_tok[t]) if rejected[t] else int(s.tokens[t])
        if d >= 0:  # -1: the rejected draft token was not recorded (older records)
            props.append((t, d))
            logits.append(row)
    if not props:
        return q, pit.empty_features(), 0
    qm = torch.stack([q[t] for t, _ in props])                                  # (M, V)
    d = torch.tensor([d for _, d in props])
    keep = _keep_possible(qm, torch.stack(logits), d, s.request)
    feat = pit.features(qm.numpy(), d.numpy()).select(keep.numpy())
    return q, feat, int((~keep).sum())


def sequence_features(target, seqs: list[Sequence], draft=None, kind: str | None = None) -> dict:
    """Per subset ("all", "drafted", "rejected"): PitFeatures pooled over seqs, with counts; and
    "proposals": the draft's proposals under the rebuilt q (a model draft only).
    `kind`: how q at a rejection is rebuilt: "point" (prompt lookup), "model" (`draft`, replayed),
    None (not rebuilt)."""
    parts: dict[str, list] = {"all": [], "drafted": [], "rejected": [], "proposals": []}
    counts = {"proposed": 0, "rejected": 0, "ambiguous": 0, "no_rounds": 0, "ambiguous_proposals": 0}
    vocab = output_size(target.model)
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(seqs):
        groups.setdefault((tuple(s.context), s.request.temperature, s.request.top_p, s.request.top_k), []).append(i)
    for key, idx in groups.items():
        req = seqs[idx[0]].request
        logits = teacher_forced_logits(target, key[0], [seqs[i].tokens for i in idx])
        for j, i in enumerate(idx):
            s, lg = seqs[i], logits[j]
            if not s.tokens:
                continue
            p = shaped_probs(lg, req)                                        # (T, V) float64
            x = torch.tensor(s.tokens)
            keep = _keep_possible(p, lg, x, req)
            counts["ambiguous"] += int((~keep).sum())
            feat = pit.features(p.numpy(), s.tokens)
            parts["all"].append(feat.select(keep.numpy()))
            n_prop, n_rej = pit.verifier_counts(s.stats)
            counts["proposed"] += n_prop
            counts["rejected"] += n_rej
            try:
                tested, rejected, drafted_tok = pit.verifier_positions(s.stats, len(s.tokens))
            except KeyError:
                counts["no_rounds"] += 1
                continue
            parts["drafted"].append(feat.select(tested & keep.numpy()))
            if kind == "model":
                q_at, props, n_amb = _draft_side(draft, s, tested, rejected, drafted_tok, vocab)
                parts["proposals"].append(props)
                counts["ambiguous_proposals"] += n_amb
            at = np.flatnonzero(rejected & keep.numpy())
            if kind == "model":
                at = np.asarray([t for t in at.tolist() if t in q_at], dtype=np.int64)
            if not at.size or kind is None:
                continue
            if kind == "point":
                q = torch.zeros(len(at), p.shape[1], dtype=torch.float64)
                q[torch.arange(len(at)), torch.as_tensor(drafted_tok[at])] = 1.0
            else:
                q = torch.stack([q_at[t] for t in at.tolist()])
            residual = (p[at] - q).clamp_min(0)                              # (R, V)
            rx = residual[torch.arange(len(at)), x[at]]
            # p(x) and q(x) equal within rounding: the residual's support there is a coin toss.
            unsure = (rx <= 0) & ((q[torch.arange(len(at)), x[at]] - p[at][torch.arange(len(at)), x[at]]) < RESIDUAL_TOL)
            counts["ambiguous"] += int(unsure.sum())
            ok = ~unsure.numpy()
            if residual.sum(dim=-1).min() <= 0:  # p == q on a row: a rejection is impossible there
                residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p[at])
            parts["rejected"].append(pit.features(residual[ok].numpy(), x[at][ok].numpy()) if ok.any()
                                     else pit.empty_features())
    return {"features": {k: pit.PitFeatures.concat(v) for k, v in parts.items()}, **counts}


def _q_kind(spec) -> str | None:
    draft = spec.options.get("draft")
    if draft == "prompt-lookup":
        return "point"
    if isinstance(draft, str) and draft.startswith("self:"):
        return None
    return "model"


# ----------------------------------------------------------------------------- window choice


@torch.inference_mode()
def categories(target, request, n: int, depth: int = 3, min_expected: float = 5.0):
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
        rows = shaped_probs(model(batch).logits[:, -1].float().cpu(), request)  # (len(frontier), V)
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


def _uncertain_windows(base_seqs: list[tuple], n: int) -> list[tuple]:
    """(score, suite, item, offset, temperature) of the windows where the target is least sure of
    the tokens a draft would be tested on (the window's 2nd and 3rd), at most WINDOWS_PER_ITEM an item."""
    scored = []
    for suite, item, tokens, top1, t in base_seqs:
        per_item = []
        for o in range(0, len(tokens) - SEQ_LEN + 1):
            per_item.append((float(2.0 - top1[o + 1] - top1[o + 2]), suite, item, o, t))
        per_item.sort(key=lambda w: -w[0])
        chosen = []
        for w in per_item:  # windows of one item that do not overlap
            if all(abs(w[3] - c[3]) >= SEQ_LEN for c in chosen):
                chosen.append(w)
            if len(chosen) == WINDOWS_PER_ITEM:
                break
        scored += chosen
    scored.sort(key=lambda w: -w[0])
    return scored[:n]


def _generate(decoder, request, seeds) -> list[dict]:
    """One sample of `request` per seed. The samples share their prompt, so the decoder prefills
    it once (nothing here is timed). A sample whose generation fails is kept as its error: it is
    this window's missing evidence, not the end of the run."""
    reuse = getattr(decoder, "reuse_prefill", None)
    if reuse is not None:
        reuse(True)
    out = []
    try:
        for seed in seeds:
            try:
                res = decoder.generate(dataclasses.replace(request, seed=seed))
            except DecoderError as e:
                out.append({"tokens": [], "stats": {}, "seed": seed, "error": str(e)})
                continue
            out.append({"tokens": list(res.tokens), "stats": {k: res.stats[k] for k in STATS_KEPT if k in res.stats}})
    finally:
        if reuse is not None:
            reuse(False)
    return out


def choose_windows(config, lineup, spec, base_seqs: list[tuple], n: int, progress: bool) -> list[dict]:
    """The n windows (context, temperature) where the candidate's verifier rejects most drafts."""
    from tqdm import tqdm
    target, decoder = lineup.targets[spec.name], lineup.decoders[spec.name]
    pool = _uncertain_windows(base_seqs, 4 * n)
    trials = []
    for score, suite, item, offset, t in tqdm(pool, desc=f"exactness {spec.name}: choosing windows",
                                              disable=not progress, leave=False):
        base = make_request(config, target, WorkItem(suite, item, t, 0))
        prefix = next(tok for s, i, tok, _, tt in base_seqs if s is suite and i is item and tt == t)[:offset]
        req = dataclasses.replace(_request_at(base, list(base.prompt_ids) + prefix), max_new_tokens=SEQ_LEN)
        runs = _generate(decoder, req, range(TRIAL_SEED, TRIAL_SEED + TRIALS))
        rejected = sum(pit.verifier_counts(r["stats"])[1] for r in runs)
        proposed = sum(pit.verifier_counts(r["stats"])[0] for r in runs)
        trials.append(((rejected, proposed, score), suite, item, offset, t, prefix))
    trials.sort(key=lambda w: w[0], reverse=True)
    return [{"suite": s.name, "item_id": i.id, "offset": o, "temperature": t, "prefix": prefix,
             "trial_rejected": key[0], "trial_proposed": key[1]} for key, s, i, o, t, prefix in trials[:n]]


# --------------------------------------------------------------------------------- the checks


def needs_check(spec) -> bool:
    return spec.decoder == "speculative" and spec.kind == "exact" and spec.options.get("verify") == "rejection"


def sampled_rows(config, target, rows, items) -> list[tuple[dict, object, object, object]]:
    """(record, request, suite, item) of each record whose sampled tokens can be replayed: its
    item is in the run's suites, it has tokens and no error, and it is compared by tokens. The
    request is rebuilt as the run made it, so a reference sees the same context and shaping."""
    out = []
    for r in rows:
        found = items.get((r["suite"], r["item_id"]))
        if found is None or not r.get("tokens") or r.get("error") or r.get("compare_on") == "text":
            continue
        suite, item = found
        out.append((r, make_request(config, target, WorkItem(suite, item, r["temperature"], r["seed"])), suite, item))
    return out


def _record_sequences(config, lineup, name: str, rows, items) -> tuple[list[Sequence], list[tuple]]:
    seqs, meta = [], []
    for r, req, suite, item in sampled_rows(config, lineup.targets[name], rows, items):
        seqs.append(Sequence(req.prompt_ids, r["tokens"], req, r.get("stats")))
        meta.append((suite, item, r["tokens"], r["temperature"], r["seed"]))
    return seqs, meta


def _top1(target, seqs: list[Sequence]) -> list[np.ndarray]:
    out = []
    for s in seqs:
        lg = teacher_forced_logits(target, s.context, [s.tokens])[0]
        out.append(shaped_probs(lg, s.request).max(dim=-1).values.numpy())
    return out


def _window_key(w: dict) -> tuple:
    return w["suite"], w["item_id"], w["offset"], w["temperature"]


def _window_rows(config, run_dir: Path, lineup, spec, base_seqs, done: list[dict], progress: bool) -> list[dict]:
    """The candidate's windows with their samples: from exactness.jsonl, and the ones still
    missing (a run interrupted while drawing them) drawn now. Fewer than `exactness_prompts` only
    where the pool of windows holds fewer (the caller names the shortfall)."""
    from tqdm import tqdm
    from harness.run.records import RecordWriter
    prof = config.profile
    if len(done) >= prof.exactness_prompts:
        return done
    rows = list(done)
    stored = {_window_key(w) for w in done}
    target, decoder = lineup.targets[spec.name], lineup.decoders[spec.name]
    items = {(s.name, it.id): (s, it) for s, it, *_ in base_seqs}
    # The same ranking as the first attempt (same pool, same trial seeds): its top windows, less
    # those already stored, hold at least the number still missing.
    todo = [w for w in choose_windows(config, lineup, spec, base_seqs, prof.exactness_prompts, progress)
            if _window_key(w) not in stored][:prof.exactness_prompts - len(done)]
    writer = RecordWriter(run_dir, FILE)
    try:
        for w in todo:
            suite, item = items[(w["suite"], w["item_id"])]
            base = make_request(config, target, WorkItem(suite, item, w["temperature"], 0))
            req = dataclasses.replace(_request_at(base, list(base.prompt_ids) + w["prefix"]), max_new_tokens=SEQ_LEN)
            seeds = range(TEST_SEED, TEST_SEED + prof.exactness_samples)
            samples = _generate(decoder, req, tqdm(seeds, desc=f"exactness {spec.name} {item.id}@{w['offset']} "
                                                   f"T={w['temperature']:g}", disable=not progress, leave=False))
            row = {"kind": "window", "candidate": spec.name, **w, "samples": samples}
            writer.write(row)
            rows.append(row)
    finally:
        writer.close()
    return rows


def _gof(target, window: dict, request) -> dict:
    errors = [s for s in window["samples"] if s.get("error")]
    samples = [tuple(s["tokens"]) for s in window["samples"] if not s.get("error")]
    full = [s for s in samples if len(s) == SEQ_LEN]
    prop = sum(pit.verifier_counts(s["stats"])[0] for s in window["samples"])
    rej = sum(pit.verifier_counts(s["stats"])[1] for s in window["samples"])
    row = {"suite": window["suite"], "item_id": window["item_id"], "offset": window["offset"],
           "temperature": window["temperature"], "n": len(full), "proposed": prop, "rejected": rej}
    if errors:
        # The samples that failed are not a random subset: a test of the rest could pass or fail
        # for that alone. No p-value: inconclusive, with the error named.
        return {**row, "pvalue": None, "errors": len(errors),
                "note": f"{len(errors)} of {len(window['samples'])} samples failed (first, seed "
                        f"{errors[0].get('seed')}: {errors[0]['error']}); the window's sample is incomplete"}
    if not full:
        return {**row, "pvalue": None, "note": "no sample reached the window's length"}
    p, assign = categories(target, request, len(full), depth=SEQ_LEN)
    total = sum(p.values())
    p = {k: v / total for k, v in p.items()} if total > 1 else p
    try:
        gof = analysis.goodness_of_fit([assign(x) for x in full], p)
        row.update(pvalue=gof.pvalue, statistic=gof.statistic, categories=gof.categories,
                   bin_probabilities=list(gof.bin_probabilities))
        if not prop:
            row["note"] = "no draft token was proposed inside the window"
    except analysis.InsufficientDataError as e:
        row.update(pvalue=None, note=str(e))
    return row


def _shortfall(windows: list[dict], prof, chosen: list) -> dict:
    """A test without a p-value standing for the windows that could not be drawn."""
    t = min((c[4] for c in chosen), default=min(t for t in prof.temperatures if t > 0))
    return {"suite": "", "item_id": "windows", "offset": 0, "temperature": t, "n": 0, "proposed": 0,
            "rejected": 0, "pvalue": None, "shortfall": prof.exactness_prompts - len(windows),
            "note": f"only {len(windows)} of the {prof.exactness_prompts} exactness windows configured "
                    f"(exactness_prompts) could be drawn: the baseline's sampled continuations at "
                    f"T={t:g} hold too few non-overlapping {SEQ_LEN}-token windows (more prompts or "
                    f"longer continuations, or fewer exactness_prompts)"}


def run_checks(config, run_dir: Path, lineup, suites, progress: bool = True) -> dict:
    from harness.run.records import read_records
    prof = config.profile
    gone = broken(run_dir)  # a candidate that broke is FAIL already; its worker may be gone
    specs = [s for s in lineup.specs if needs_check(s) and s.name not in gone]
    if not specs or not any(t > 0 for t in prof.temperatures):
        return {}
    records = read_records(run_dir)
    items = {}
    for s in suites:
        for it in s.select(prof.subset) if hasattr(s, "select") else []:
            if hasattr(it, "id"):
                items[(s.name, it.id)] = (s, it)
    stored = [r for r in read_records(run_dir, FILE) if r.get("kind") == "window"]
    out = {}
    for spec in specs:
        try:
            out[spec.name] = _check_candidate(config, run_dir, lineup, spec, records, items,
                                              [r for r in stored if r["candidate"] == spec.name], progress)
        except Broke as e:  # it broke in its worker drawing a window: its stop row is its verdict
            stage_broke(run_dir, lineup, spec.name, e, ("exactness", f"window {lineup.decoders[spec.name].requests}",
                                                        TRIAL_SEED, 0.0))
    return out


def _check_candidate(config, run_dir: Path, lineup, spec, records, items: dict, stored, progress: bool) -> dict:
    """One candidate's exactness checks: the window goodness-of-fit tests and the PIT tests of its
    sampled tokens (by subset), with the baseline's own tokens as the control."""
    target = lineup.baseline_target
    cand_seqs, base_seqs, chosen = _sequences(config, lineup, spec, records, items)
    windows = _window_rows(config, run_dir, lineup, spec, chosen, stored, progress)
    tests, win_seqs = _window_tests(config, target, windows, items)
    if len(windows) < config.profile.exactness_prompts:
        tests.append(_shortfall(windows, config.profile, chosen))
    kind = _q_kind(spec)
    draft = _draft_model(spec, lineup.targets[spec.name]) if kind == "model" else None
    cand = sequence_features(target, cand_seqs + win_seqs, draft=draft, kind=kind)
    control = sequence_features(target, base_seqs, kind=None)
    feats = cand["features"]
    # The family: the candidate's checks and the controls, Bonferroni at exactness_pvalue.
    runnable = [k for k in ("all", "drafted", "rejected", "proposals") if len(feats[k]) >= pit.MIN_TOKENS]
    n_checks = (len(runnable) + sum(t.get("pvalue") is not None for t in tests)
                + int(len(control["features"]["all"]) >= pit.MIN_TOKENS))
    level = config.gates.exactness_pvalue / max(n_checks, 1)
    rng = np.random.default_rng(20_250_916)
    subsets = _pit_subsets(cand, kind, level, rng)
    for t in tests:
        if t.get("pvalue") is not None:
            bins = t.pop("bin_probabilities")
            t["detectable_tv"] = gof_detectable_tv(bins, t["n"], level=level)
            if t["detectable_tv"] is None:
                t["samples_needed"] = gof_samples_needed(bins, level=level)
    ctrl = analysis.pit_test(control["features"]["all"], level=level, rng=rng)
    result = {
        "tests": tests,
        "pit": {"subsets": subsets, "control": {**dataclasses.asdict(ctrl), "ambiguous": control["ambiguous"]},
                "level": level, "reference": REFERENCE,
                "sources": f"{len(cand_seqs)} sampled records and {len(win_seqs)} window samples "
                           f"({len(feats['all'])} tokens); control: the baseline's {len(base_seqs)} records",
                "ambiguous": cand["ambiguous"], "records_without_rounds": cand["no_rounds"],
                "residual_q": {"point": "point mass at the rejected draft token", "model":
                               f"draft model {spec.options.get('draft')!r}, replayed on its KV cache in the "
                               f"chunks it was fed while decoding",
                               None: "not rebuilt (self-draft): the rejected subset is not tested"}[kind]},
    }
    if kind == "model":
        dc = analysis.pit_test(feats["proposals"], level=level, rng=rng)
        result["pit"]["draft_control"] = {
            **dataclasses.asdict(dc), "ambiguous": cand["ambiguous_proposals"],
            "what": f"the draft's {len(feats['proposals'])} tested proposals under the rebuilt q"}
    return result


def _sequences(config, lineup, spec, records, items: dict):
    """(the candidate's sampled sequences, the baseline's on the same keys, the window candidates:
    the baseline's continuations at its first seed and lowest temperature, with their top-1)."""
    base_name = config.baseline.name
    mine = [r for r in records if r["candidate"] == spec.name and r["temperature"] > 0]
    keys = {(r["suite"], r["item_id"], r["seed"], r["temperature"]) for r in mine}
    base_rows = [r for r in records if r["candidate"] == base_name and r["temperature"] > 0
                 and (r["suite"], r["item_id"], r["seed"], r["temperature"]) in keys]
    cand_seqs, _ = _record_sequences(config, lineup, spec.name, mine, items)
    base_seqs, base_meta = _record_sequences(config, lineup, base_name, base_rows, items)
    # Window candidates: the baseline's continuations at its first seed and lowest temperature.
    first = [i for i, m in enumerate(base_meta) if m[4] == min(x[4] for x in base_meta)
             and m[3] == min(x[3] for x in base_meta)]
    top1 = _top1(lineup.baseline_target, [base_seqs[i] for i in first])
    chosen = [(base_meta[i][0], base_meta[i][1], base_meta[i][2], p1, base_meta[i][3])
              for i, p1 in zip(first, top1)]
    return cand_seqs, base_seqs, chosen


def _window_tests(config, target, windows: list[dict], items: dict):
    """(a goodness-of-fit test per window, the windows' samples as sequences for the PIT)."""
    tests, win_seqs = [], []
    for w in windows:
        suite, item = items[(w["suite"], w["item_id"])]
        base = make_request(config, target, WorkItem(suite, item, w["temperature"], 0))
        req = dataclasses.replace(_request_at(base, list(base.prompt_ids) + w["prefix"]), max_new_tokens=SEQ_LEN)
        tests.append(_gof(target, w, req))
        win_seqs += [Sequence(req.prompt_ids, s["tokens"], req, s["stats"]) for s in w["samples"]
                     if not s.get("error")]
    return tests, win_seqs


def _pit_subsets(cand: dict, kind, level: float, rng) -> dict:
    """The PIT test of all sampled tokens, the drafted ones and (with a rebuilt residual q) the
    rejected ones, at the family's level."""
    feats = cand["features"]
    subsets = {}
    for k in ("all", "drafted", "rejected"):
        if k == "rejected" and kind is None:
            continue
        res = analysis.pit_test(feats[k], level=level, rng=rng)
        prop, rej = (cand["proposed"], cand["rejected"]) if k != "rejected" else (cand["rejected"], cand["rejected"])
        subsets[k] = {**dataclasses.asdict(res), "proposed": prop, "rejected": rej}
        if res.pvalue is None:
            subsets[k]["note"] = res.note or "too few tokens"
    return subsets


# ------------------------------------------------------------------------------ numerics


@torch.inference_mode()
def margin_noise(config, lineup, suites, records, limit: int = 16) -> dict:
    """The baseline's top-2 margin noise: its recorded one-token decode margins against a
    teacher-forced batched forward over the same tokens (greedy records, up to `limit`)."""
    target = lineup.baseline_target
    dtype = str(getattr(target, "dtype", None) or next(target.model.parameters()).dtype).replace("torch.", "")
    if config.baseline.decoder not in ("standard", "hf"):  # an engine's margins are not this model's decode steps
        return {"dtype": dtype, "margin_noise_max": None, "margin_noise_median": None, "steps": 0, "records": 0}
    items = {(s.name, it.id): (s, it) for s in suites if hasattr(s, "select")
             for it in s.select(config.profile.subset) if hasattr(it, "id")}
    diffs = []
    used = 0
    for r in records:
        if used >= limit:
            break
        if r["candidate"] != config.baseline.name or r["temperature"] != 0 or not r.get("tokens") \
                or not r.get("margins") or (r["suite"], r["item_id"]) not in items:
            continue
        suite, item = items[(r["suite"], r["item_id"])]
        req = make_request(config, target, WorkItem(suite, item, 0.0, r["seed"]))
        lg = teacher_forced_logits(target, req.prompt_ids, [r["tokens"]])[0]
        m = torch.diff(torch.topk(lg.double(), 2, dim=-1).values, dim=-1)[..., 0].neg().numpy()  # top-1 - top-2
        rec = np.asarray([np.nan if v is None else v for v in r["margins"]], dtype=float)[: m.size]
        ok = np.isfinite(rec)
        diffs.append(np.abs(m[: rec.size][ok] - rec[ok]))
        used += 1
    d = np.concatenate(diffs) if diffs else np.empty(0)
    return {"dtype": dtype, "margin_noise_max": float(d.max()) if d.size else None,
            "margin_noise_median": float(np.median(d)) if d.size else None, "steps": int(d.size),
            "records": used}
