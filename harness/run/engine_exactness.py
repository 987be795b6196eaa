"""Distribution checks for exact engine candidates on sampled traffic (temperature > 0).

At T > 0 an engine with speculation on cannot be token-identical to itself without it: its
verifier draws its randomness differently. What must hold is that every token it emits comes from
the target's shaped distribution at that context. So each token of its sampled records goes
through the sequential PIT test (`analysis/pit.py`), against a reference distribution per emitted
position, chosen by the profile's `exactness_reference`:

- "target": the harness's own copy of the weights, teacher-forced on the engine's output and
  shaped by transformers' warpers (`harness/run/reference.py`, nothing from `decoders/`);
- "engine:NAME": that engine's own top-k raw logprobs over the output (`prompt_logprobs` on the
  flavour: vLLM `prompt_logprobs`, SGLang `logprob_start_len`, llama.cpp one request per
  position), shaped the same way where the top-k decides the nucleus (`shaped_from_top_logprobs`);
  the other positions are left out, and counted.

A position is also left out where the nucleus boundary could move within the numerical noise
between the engine and the reference (`noise`: the largest gap, in logits, between the top-2
margins the baseline engine reported and the reference's at the same positions). That choice
depends on the reference alone, never on the token sampled there, so the test stays valid.

The control: the baseline engine's own samples (speculation off) through the same test against the
same reference. If they fail, the reference does not reproduce the engine's sampler (quantized
kernels against an fp32 copy, a sampler left on), and a candidate can only be judged by whether it
deviates more than its control (harness/verdict/engine_exactness.py).

Also measured here, from the same records: the seed check (the baseline's samples at two seeds
must differ where the reference says identical draws are unlikely; its A/A run at the same seed
should reproduce them; each candidate's samples at two seeds must differ too), and the baseline's
mean entropy per temperature (the yardstick for "does the candidate's acceptance move with
temperature").
"""
from __future__ import annotations

import math

import httpx
import numpy as np
import torch

import analysis
from analysis import pit
from decoders.base import DecoderError
from harness.run import reference
from harness.run.exactness import sampled_rows
from harness.run.reference import output_size, shaped_probs, teacher_forced_logits

TOP_K = 20            # logprobs asked of an engine reference per position, unless its flavour
                      # says how many it can give (`reference_top_k`: vLLM's prompt_logprobs)
MASS_TOL = 1e-4       # the nucleus boundary's own rounding, on top of the measured noise
SEED_LEVEL = 1e-3     # the seed check's false-alarm rate, split over its routes (`route_pvalues`):
# the share of each. One deaf prompt among many (min-p) and a fully deaf engine with predictable
# outputs (product: one uncertain token at 0.7 per sample over 18 pairs needs >= 3e-4 to be caught
# 0.95) are the shapes Fisher's sum cannot see, so they get the most (CALIBRATION.md).
SEED_ROUTES = {"fisher": 0.15, "min-p": 0.4, "product": 0.35, "control": 0.1}
KEEP_BYTES = 1 << 30  # in-process logits held from the noise pass for the control's (~130 samples
                      # of 40 tokens at a 49k vocabulary)


def needs_check(spec) -> bool:
    from harness.run.sweep import is_engine
    return is_engine(spec) and spec.kind == "exact" and spec.role != "aa-floor"


def _levels(config) -> list[tuple[str, str | None, list[str]]]:
    """(baseline name, its A/A run or None, exact engine candidates) per concurrency level."""
    from harness.run.sweep import level_config, levels
    out = []
    for level in levels(config):
        cfg = level_config(config, level)
        aa = next((c.name for c in cfg.candidates if c.role == "aa-floor"), None)
        out.append((cfg.baseline.name, aa, [c.name for c in cfg.candidates if needs_check(c)]))
    return out


# ------------------------------------------------------------------------------- the reference


class Reference:
    """Shaped distributions at every position of a sampled record, or None where left out."""

    def __init__(self, config, lineup, servers: dict | None):
        self.name = config.profile.exactness_reference
        self.target = lineup.baseline_target
        self.vocab = output_size(self.target.model)
        self.noise = 0.0
        self.engine = None
        if self.name.startswith("engine:"):
            self.engine = _engine_decoder(config, self.name[len("engine:"):], lineup, servers)
        self._cache: dict = {}
        self._kept = 0  # bytes of in-process logits in _cache

    @property
    def top_k(self) -> int:
        """Logprobs asked per position: the flavour's own where it says (a server that allows
        fewer lowers it on its first answer), else TOP_K."""
        return int(getattr(self.engine, "reference_top_k", TOP_K))

    def describe(self) -> str:
        if self.engine is None:
            return ("the target's own weights in-process, teacher-forced, shaped by transformers' "
                    "TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper (float64)")
        return (f"engine {self.engine.server.spec.name!r}'s own top-{self.top_k} raw logprobs over each output, shaped "
                f"where they decide the nucleus")

    def raw_many(self, context, outputs: list, keep: bool = False) -> list:
        """The reference's raw output over each of `outputs` continuing `context`: logits (T, V)
        from the target, or the engine's top-k logprobs per position. In-process, the outputs
        not at hand are teacher-forced in one call (the prompt's keys and values computed once
        for every seed of every decoder); `keep` holds them for a later pass, up to KEEP_BYTES
        (past that they are computed again: a large run must not hold every sample's logits)."""
        context, keys = tuple(context), [tuple(t) for t in outputs]
        todo = [t for t in dict.fromkeys(keys) if (context, t) not in self._cache]
        if self.engine is None:
            got = dict(zip(todo, teacher_forced_logits(self.target, context, [list(t) for t in todo]) if todo else []))
        else:
            got = {t: self.engine.prompt_logprobs(list(context), list(t), self.top_k) for t in todo}
        for t, raw in got.items():
            if self.engine is not None:  # top-k dicts: small, and each position cost a request
                self._cache[(context, t)] = raw
            elif keep and self._kept + raw.numel() * raw.element_size() <= KEEP_BYTES:
                self._cache[(context, t)] = raw
                self._kept += raw.numel() * raw.element_size()
        return [got[t] if t in got else self._cache[(context, t)] for t in keys]

    def margins(self, raw) -> np.ndarray:
        """The reference's top-2 margins (logits) at each position of one raw output."""
        if self.engine is not None:
            return np.asarray([_gap(top) for top in raw], dtype=float)
        top2 = torch.topk(raw.double(), 2, dim=-1).values
        return (top2[:, 0] - top2[:, 1]).numpy()

    def shape(self, raw, request) -> list[torch.Tensor | None]:
        """Per position of one raw output: the shaped distribution (V,), or None where left out."""
        if self.engine is not None:
            band = reference.boundary_band(self.noise, request.temperature)
            return [reference.shaped_from_top_logprobs(top, request, self.vocab, band) for top in raw]
        p = shaped_probs(raw, request)
        if request.top_p >= 1.0:
            return list(p)
        unsure = boundary_unsure(shaped_probs(raw, request, top_p=1.0), request, self.noise)
        return [None if u else row for row, u in zip(p, unsure.tolist())]

    def rows(self, context, tokens, request) -> list[torch.Tensor | None]:
        return self.shape(self.raw_many(context, [tokens])[0], request)


def _engine_decoder(config, name: str, lineup, servers: dict | None):
    """A decoder on engine `name`: one of the lineup's, else one of the baseline's flavour."""
    for spec in lineup.specs:
        if spec.options.get("engine") == name and spec.role != "aa-floor":
            return lineup.decoders[spec.name]
    if name not in (servers or {}):
        raise ValueError(f"exactness_reference engine:{name}: the engine is not running")
    from harness.build import build_decoder
    return build_decoder(config.baseline.decoder, lineup.baseline_target, {"engine": name}, servers)


def _gap(top: dict) -> float:
    v = sorted(top.values(), reverse=True)
    return v[0] - v[1] if len(v) >= 2 else float("nan")


def boundary_unsure(pre: torch.Tensor, request, noise: float, k: int = 256) -> torch.Tensor:
    """(T,) bool: whether the top-p nucleus of each row of `pre` (T, V) (the tempered distribution
    before the cut) could hold other tokens under the engine-vs-reference noise: some token's
    mass-before has odds within `reference.boundary_band` of top_p's (or within MASS_TOL of
    top_p)."""
    band = reference.boundary_band(noise, request.temperature)
    target = reference.odds(request.top_p)

    def near(q):  # q: rows sorted in descending order
        before = (torch.cumsum(q, -1) - q).clamp(0.0, 1.0 - 1e-15)
        o = before / (1.0 - before)
        hit = (o >= target / band) & (o < target * band) | ((before - request.top_p).abs() < MASS_TOL)
        return (hit & (q > 0)).any(-1)

    # Sorting 49k-token rows dominated the exactness checks. Past the k largest tokens every
    # mass-before is at least the top k's mass, so where that mass already lies above the band
    # (and above top_p + MASS_TOL) no later token can be near: the top k decide. Other rows sort.
    top = torch.topk(pre, min(k, pre.shape[-1]), dim=-1).values
    out = near(top)
    tb = target * band
    edge = max(tb / (1.0 + tb) if math.isfinite(tb) else 1.0, request.top_p + MASS_TOL)
    rest = (~out & (top.sum(-1) < edge + 1e-9)).nonzero().flatten()
    if rest.numel():
        out[rest] = near(torch.sort(pre[rest], dim=-1, descending=True).values)
    return out


# ---------------------------------------------------------------------------------- features


class Seqs:
    """The sampled records of one decoder as (record, request) pairs (`exactness.sampled_rows`)."""

    def __init__(self, config, target, rows, items):
        self.rows = [(r, req) for r, req, _, _ in sampled_rows(config, target, rows, items)]


def _by_prompt(named: dict[str, Seqs]) -> dict[tuple, list[tuple[str, int]]]:
    """{prompt: [(decoder, row index)]}: the samples that share a prompt, across decoders."""
    groups: dict[tuple, list[tuple[str, int]]] = {}
    for name, seqs in named.items():
        for i, (_, req) in enumerate(seqs.rows):
            groups.setdefault(tuple(req.prompt_ids), []).append((name, i))
    return groups


def _features_of(rows: list, tokens: list[int]) -> tuple:
    """(PIT features or None, positions, positions left out, entropies) of one shaped output."""
    keep = [t for t, row in enumerate(rows) if row is not None]
    feat, ent = None, []
    if keep:
        p = torch.stack([rows[t] for t in keep])
        feat = pit.features(p.numpy(), [tokens[t] for t in keep])
        ent = (-(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)).tolist()
    return feat, len(rows), len(rows) - len(keep), ent


def features(ref: Reference, named: dict[str, Seqs], progress: bool = False) -> dict[str, dict]:
    """{decoder: its PIT features pooled over its records (in record order), with counts and mean
    entropy per temperature}, one prompt at a time: that prompt's samples from every decoder are
    teacher-forced together, shaped, reduced to features and let go."""
    from tqdm import tqdm
    per = {name: [None] * len(seqs.rows) for name, seqs in named.items()}
    groups = _by_prompt(named)
    for context, members in tqdm(groups.items(), desc="exactness (engines)", disable=not progress, leave=False):
        raws = ref.raw_many(context, [named[n].rows[i][0]["tokens"] for n, i in members])
        done: dict = {}  # a correct candidate repeats the baseline's samples: shaped once
        for (n, i), raw in zip(members, raws):
            r, req = named[n].rows[i]
            key = (tuple(r["tokens"]), req.temperature, req.top_k, req.top_p)
            if key not in done:
                try:
                    done[key] = _features_of(ref.shape(raw, req), r["tokens"])
                except ValueError as e:  # a reference that gives no distribution here: name where
                    raise ValueError(f"{n} {r['suite']}/{r['item_id']} seed {r['seed']}: {e}") from e
            per[n][i] = done[key]
    out = {}
    for name, seqs in named.items():
        feats = [f for f, *_ in per[name] if f is not None]
        entropy: dict = {}
        for (r, _), (_, _, _, ent) in zip(seqs.rows, per[name]):
            entropy.setdefault(r["temperature"], []).extend(ent)
        out[name] = {"features": pit.PitFeatures.concat(feats) if feats else pit.empty_features(),
                     "left_out": sum(x[2] for x in per[name]), "tokens": sum(x[1] for x in per[name]),
                     "records": len(seqs.rows),
                     "entropy": {t: float(np.mean(v)) for t, v in entropy.items() if v}}
    return out


def measured_noise(ref: Reference, seqs: Seqs) -> dict:
    """The largest gap between the top-2 margins the engine reported and the reference's, over
    the control's positions (logits): how far the engine's numerics sit from the reference's."""
    gaps = []
    for context, members in _by_prompt({"": seqs}).items():
        raws = ref.raw_many(context, [seqs.rows[i][0]["tokens"] for _, i in members], keep=True)
        for (_, i), raw in zip(members, raws):
            r = seqs.rows[i][0]
            ref_margins = ref.margins(raw)
            mine = np.asarray([np.nan if m is None else m for m in r.get("margins") or []], dtype=float)
            n = min(mine.size, ref_margins.size)
            d = np.abs(mine[:n] - ref_margins[:n])
            gaps.extend(d[np.isfinite(d)].tolist())
    return {"max": float(max(gaps)) if gaps else None, "median": float(np.median(gaps)) if gaps else None,
            "positions": len(gaps)}


# ------------------------------------------------------------------------------------- seeds

def _against_control(pairs: int, identical: int, control: dict) -> dict:
    """The candidate's identical different-seed pairs against the baseline engine's own, on the same
    prompts and seeds: Fisher's exact one-sided p that an engine honouring the seed as the baseline
    does would repeat itself this often. The reference's chance alone cannot decide where most
    positions are left out (it counts only the positions the reference decides, an upper bound
    that reached 0.073 for 16 identical pairs of 40-token samples on a Zen 3 EPYC, where the
    baseline's own pairs differed in 24-40 tokens each): the baseline engine is the control that
    needs no reference."""
    from scipy.stats import fisher_exact
    c_pairs, c_same = int(control.get("pairs") or 0), int(control.get("identical") or 0)
    if not pairs or not c_pairs:
        return {"control_p": None}
    _, p = fisher_exact([[identical, pairs - identical], [c_same, c_pairs - c_same]], alternative="greater")
    return {"control_p": float(p), "control_pairs": c_pairs, "control_identical": c_same}


def raised(probs, noise: float) -> np.ndarray:
    """Each probability as high as an engine `noise` logits from the reference could make it: the
    token's logit raised by `noise` against all others (log p + noise - log(p e^noise + 1 - p))."""
    lp = np.log(np.maximum(np.asarray(probs, dtype=float), 1e-300))
    with np.errstate(divide="ignore"):  # p = 1: no other token, log(0)
        rest = np.log1p(-np.exp(lp))
    return np.minimum(lp + noise - np.logaddexp(lp + noise, rest), 0.0)


def combined_pvalue(prompt_log_p: list[float]) -> float | None:
    """Fisher's combination of one p-value per prompt (log): an identical pair's p-value is the
    chance an honoured seed reproduces that sample, P(identical, P(x) <= u) <= u under an honoured
    seed, so each is valid, and a prompt whose pairs differ gives 1. None without prompts. It sees
    many weak signals; one deaf prompt among many is diluted (see `min_pvalue`)."""
    if not prompt_log_p:
        return None
    from scipy.stats import chi2
    return float(chi2.sf(-2.0 * float(np.sum(prompt_log_p)), 2 * len(prompt_log_p)))


def min_pvalue(prompt_log_p: list[float]) -> float | None:
    """Tippett's combination, Bonferroni form: the smallest prompt p-value times the prompts. It
    sees one strongly repeated prompt among many honest ones, which Fisher's sum dilutes."""
    if not prompt_log_p:
        return None
    return float(min(1.0, len(prompt_log_p) * math.exp(min(prompt_log_p))))


def _chance(ref: Reference, req, tokens: list[int], noise: float) -> dict:
    """How likely an honoured seed reproduces one sample: log of the product of the reference's
    probabilities of its tokens, as given and raised by the engine-reference noise. A position the
    reference leaves out (None) and a token it gives probability 0 (the engine does not sample from
    it there, the PIT's finding) count as probability 1: the chance stays an upper bound."""
    rows = ref.rows(req.prompt_ids, tokens, req)
    probs = np.asarray([float(row[tok]) for row, tok in zip(rows, tokens) if row is not None], dtype=float)
    kept = probs[probs > 0.0]
    return {"log": float(np.log(kept).sum()), "raised": float(raised(kept, noise).sum()),
            "left_out": sum(row is None for row in rows), "off_reference": int(probs.size - kept.size)}


def _prompt_repeats(ref: Reference, group: list, noise: float) -> dict:
    """One prompt's different-seed pairs (consecutive records of the group): how many, how many
    identical, each repeat's chance, and its p-value (the likeliest repeat's raised chance times
    the pairs, Bonferroni; 1 where no pair repeats)."""
    pairs, repeats = 0, []
    for (a, req), (b, _) in zip(group, group[1:]):
        if a["seed"] == b["seed"]:
            continue
        pairs += 1
        if a["tokens"] == b["tokens"]:
            repeats.append(_chance(ref, req, a["tokens"], noise))
    log_p = min(0.0, math.log(pairs) + min(r["raised"] for r in repeats)) if repeats else 0.0
    return {"pairs": pairs, "repeats": repeats, "log_p": log_p}


def route_pvalues(prompts: list[dict], control_p: float | None = None) -> dict:
    """The seed check's routes, each a valid p-value under an honoured seed, each at its share of
    SEED_LEVEL (SEED_ROUTES; so the false-alarm rate of the union stays <= SEED_LEVEL): Fisher's combination of
    the prompts (many weak repeats), the smallest prompt's (one strong repeat), the product of
    every pair's raised chance where every pair repeated (predictable outputs: P(all identical,
    product <= u) <= u), and the baseline engine as control (a candidate's all-identical pairs
    against the baseline's own; `_against_control`)."""
    log_ps = [p["log_p"] for p in prompts if p["pairs"]]
    pairs = sum(p["pairs"] for p in prompts)
    repeats = [r for p in prompts for r in p["repeats"]]
    every = bool(pairs) and len(repeats) == pairs
    routes = {"fisher": combined_pvalue(log_ps), "min-p": min_pvalue(log_ps),
              "product": math.exp(sum(r["raised"] for r in repeats)) if every else None,
              "control": control_p if every else None}
    levels = {k: SEED_LEVEL * SEED_ROUTES[k] for k in routes}
    return {"routes": routes, "level": SEED_LEVEL, "route_levels": levels,
            "ignored": any(p is not None and p < levels[k] for k, p in routes.items())}


def seed_check(ref: Reference, base: Seqs, aa: Seqs | None, control: dict | None = None) -> dict:
    """Different seeds must give different samples where identical draws are unlikely; the same
    seed twice (the A/A run) should give the same ones. Judged prompt by prompt (`_prompt_repeats`:
    a repeat's chance under the reference, each token raised by the measured engine-reference noise
    `ref.noise`, since an engine more peaked than the reference repeats itself more often than the
    reference says), then over prompts by the routes of `route_pvalues`: `ignored` where one of them
    is below its share of SEED_LEVEL. `control`: the baseline engine's own seed_check, for a
    candidate (see `_against_control`)."""
    noise = float(getattr(ref, "noise", 0.0) or 0.0)
    by_key: dict = {}
    for r, req in base.rows:
        by_key.setdefault((r["suite"], r["item_id"], r["temperature"]), []).append((r, req))
    prompts = [p for p in (_prompt_repeats(ref, g, noise) for g in by_key.values()) if p["pairs"]]
    repeats = [r for p in prompts for r in p["repeats"]]
    pairs = sum(p["pairs"] for p in prompts)
    out = {"pairs": pairs, "identical": len(repeats),
           "chance": math.exp(sum(r["log"] for r in repeats)) if pairs else None,
           "left_out": sum(r["left_out"] for r in repeats),
           "off_reference": sum(bool(r["off_reference"]) for r in repeats),
           "off_reference_tokens": sum(r["off_reference"] for r in repeats),
           "prompts": len(prompts), "repeated_prompts": sum(bool(p["repeats"]) for p in prompts),
           "pvalue": combined_pvalue([p["log_p"] for p in prompts]), "noise": noise}
    if control is not None:
        out.update(_against_control(pairs, len(repeats), control))
    out.update(route_pvalues(prompts, out.get("control_p")))
    out["ignored"] = bool(pairs) and out["ignored"]
    if aa is not None:
        mine = {(r["suite"], r["item_id"], r["temperature"], r["seed"]): r["tokens"] for r, _ in base.rows}
        same = [mine[k] == r["tokens"] for r, _ in aa.rows
                if (k := (r["suite"], r["item_id"], r["temperature"], r["seed"])) in mine]
        out.update(same_seed_pairs=len(same), same_seed_identical=int(sum(same)))
    return out


# ---------------------------------------------------------------------------------- the checks


def run_checks(config, run_dir, lineup, suites, servers: dict | None = None, progress: bool = True) -> dict:
    """{candidate: result} for every exact engine candidate with sampled records; a level whose
    reference could not be computed gives its candidates {"error": why} (they fail closed)."""
    from harness.run.records import read_records
    prof = config.profile
    plan = [(b, aa, cands) for b, aa, cands in _levels(config) if cands]
    if not plan or not any(t > 0 for t in prof.temperatures):
        return {}
    records = [r for r in read_records(run_dir) if r.get("temperature", 0) > 0]
    items = {(s.name, it.id): (s, it) for s in suites if hasattr(s, "select")
             for it in s.select(prof.subset) if hasattr(it, "id")}
    ref = Reference(config, lineup, servers)
    rng = np.random.default_rng(20_261_201)
    out: dict = {}
    for base_name, aa_name, cands in plan:
        def rows_of(name):
            return Seqs(config, ref.target, [r for r in records if r["candidate"] == name], items)
        try:
            out.update(_level(config, ref, rows_of, base_name, aa_name, cands, rng, progress))
        except (DecoderError, httpx.HTTPError, ValueError, KeyError) as e:
            # An engine reference that went down or answered nonsense: no evidence, no pass.
            out.update({name: {"engine": True, "error": f"{type(e).__name__}: {e}"} for name in cands})
    return out


def _level(config, ref: Reference, rows_of, base_name: str, aa_name: str | None, cands: list[str], rng,
           progress: bool) -> dict:
    base = rows_of(base_name)
    aa = rows_of(aa_name) if aa_name else None
    mine_of = {name: rows_of(name) for name in cands}
    noise = measured_noise(ref, base)
    ref.noise = noise["max"] or 0.0  # shaping leaves positions out by it: known before any is shaped
    feats = features(ref, {base_name: base, **mine_of}, progress)
    control = feats[base_name]
    seeds = seed_check(ref, base, aa)
    level = config.gates.exactness_pvalue / 2  # the candidate's test and its control
    ctrl = analysis.pit_test(control["features"], level=level, rng=rng)
    out = {}
    for name in cands:
        mine, cand = mine_of[name], feats[name]
        res = analysis.pit_test(cand["features"], level=level, rng=rng)
        stats = [r.get("stats") or {} for r, _ in mine.rows]
        by_key = {(r["suite"], r["item_id"], r["temperature"], r["seed"]): r["tokens"] for r, _ in base.rows}
        same = [by_key.get((r["suite"], r["item_id"], r["temperature"], r["seed"])) == r["tokens"]
                for r, _ in mine.rows]
        proposed = sum(int(s.get("proposed") or 0) for s in stats)
        accepted = sum(int(s.get("accepted") or 0) for s in stats)
        out[name] = {
            "engine": True, "tests": [],
            "pit": {"subsets": {"all": {**_asdict(res), "proposed": proposed, "rejected": proposed - accepted,
                                        "drafting_counted": sum("proposed" in s for s in stats),
                                        "left_out": cand["left_out"], "tokens": cand["tokens"],
                                        "records": cand["records"]}},
                    "control": {**_asdict(ctrl), "left_out": control["left_out"], "tokens": control["tokens"],
                                "records": control["records"], "of": base_name},
                    "level": level, "reference": ref.describe(), "reference_kind": ref.name, "noise": noise,
                    "drafted": "not reported by the engine (no per-position draft marks): every sampled token "
                               "is tested"},
            "seeds": {**seeds, "of": base_name, "aa": aa_name},
            # The candidate's own seed: a sampler that repeats one draw per prompt whatever the seed
            # still gives each single token from the target's distribution, so the PIT, which pools
            # draws as independent, cannot see it; only its samples at different seeds can.
            "candidate_seeds": {**seed_check(ref, mine, None, control=seeds), "of": name, "control_of": base_name},
            # Same seed, same tokens as the baseline: an engine whose speculation consumes its random
            # stream as plain sampling would (not required; exact in distribution is what is tested).
            "identical_to_baseline": {"records": len(same), "identical": int(sum(same))},
            "entropy": {"baseline": {f"{t:g}": v for t, v in control["entropy"].items()}},
        }
    return out


def _asdict(res) -> dict:
    import dataclasses
    return dataclasses.asdict(res)
