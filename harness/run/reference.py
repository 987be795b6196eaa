"""The exactness reference: the distributions sampled tokens must follow, computed without any
code from `decoders/` (the checks in `harness/run/exactness.py` judge the decoders against it,
so a bug in the shaping the decoders share would otherwise be invisible to every check).

- `shaped_probs`: transformers' own logits warpers (`TemperatureLogitsWarper`,
  `TopKLogitsWarper`, `TopPLogitsWarper`, in the order `generate` applies them) on float64 logits.
  The decoders' documented contract (`decoders.sampling.shape_logits`) is the same: temperature,
  then top-k (ties with the k-th logit kept), then top-p on the softmax of what is left (a token
  is dropped when the mass ordered before it already reaches top_p; at least one token is kept,
  transformers' min_tokens_to_keep = 1). Deliberate differences: float64 here against float32
  there, and the order among tied logits; both move a token only when it sits at the top-p
  boundary within rounding, which `at_top_p_boundary` reports so a check can set it aside.
- `teacher_forced_logits`: a model's logits after each token of sequences continuing a context:
  the context once, then one batched forward per chunk of equal-length sequences on its keys and
  values (fp32 targets: batched and one-token forwards agree far below any sampling boundary).
- `replayed_draft_logits`: a draft model's logits where it proposed, recomputed the way it
  computed them while decoding: on its own KV cache, fed in the chunks the drafter fed (the whole
  context on its first proposal, then one token per step, two after a round it saw fully
  accepted), each forward keeping only its last position's logits. Dynamically quantized models
  (the `-int8` aliases) need exactly that: their activation scales depend on the tokens in each
  forward, so one batched forward gives another q (measured on smollm2-135m-int8, 33 proposals:
  batched q at total variation 0.56 on average from the q the draft sampled from, one token at a
  time after a prompt prefill 0.15, this replay 0, bitwise). The chunks come from the record's
  round structure (offsets, proposed and accepted per round), never its q: a wrong q is one of the
  bugs to catch. If a decoder changes how it feeds its draft, the draft-side control in the
  exactness check (the rebuilt q must explain the proposals) fails and says so.
"""
from __future__ import annotations

import functools
import inspect
import math

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

CHUNK = 16  # sequences per teacher-forced forward


def output_size(model) -> int:
    """Logits per position: the LM head's rows (may exceed the tokenizer's vocabulary)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or model.config.vocab_size)


def to_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft logits (..., V_d) on the target's V: ids the target cannot emit cut, ids the draft
    lacks at -inf (the models share one tokenizer; only padding differs)."""
    v = logits.shape[-1]
    if v >= vocab:
        return logits[..., :vocab]
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], vocab - v), float("-inf"))], dim=-1)


def _warpers(temperature: float, top_k: int, top_p: float) -> list:
    if not temperature > 0:
        raise ValueError(f"a sampled distribution needs temperature > 0, got {temperature}")
    out = [TemperatureLogitsWarper(float(temperature))]
    if top_k and top_k > 0:
        out.append(TopKLogitsWarper(int(top_k)))
    if top_p < 1.0:
        out.append(TopPLogitsWarper(float(top_p)))
    return out


def shaped_probs(logits: torch.Tensor, request, *, top_p: float | None = None) -> torch.Tensor:
    """The distribution `request` (temperature, top_k, top_p) samples from, (..., V) float64,
    by transformers' warpers. `top_p` overrides the request's (1.0: before the top-p cut)."""
    shape = logits.shape
    scores = logits.detach().double().reshape(-1, shape[-1])  # the warpers work on (B, V)
    tp = request.top_p if top_p is None else top_p
    for warp in _warpers(request.temperature, request.top_k, tp):
        scores = warp(None, scores)  # these warpers do not read input_ids
    return torch.softmax(scores, dim=-1).reshape(shape)


def at_top_p_boundary(logits_row: torch.Tensor, token: int, request, tol: float) -> bool:
    """A token of shaped probability 0 whose mass-before (before the top-p cut) lies within `tol`
    of top_p: the two sides' rounding may put it on either side of the nucleus."""
    if request.top_p >= 1.0:
        return False
    pt = shaped_probs(logits_row[None], request, top_p=1.0)[0]
    return float(pt[pt > pt[token]].sum()) < request.top_p + tol


# ------------------------------------------------------------------------------ forwards


@functools.lru_cache(maxsize=None)
def _cache_kwarg(cls) -> str:
    # transformers >= 5.2x renamed `past_key_values` to `cache`
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


@torch.inference_mode()
def teacher_forced_logits(loaded, context, seqs: list[list[int]]) -> list[torch.Tensor]:
    """For each sequence s continuing `context`, the logits (len(s), V) at the positions of s's
    tokens (float32, on the CPU). The context is computed once: its keys and values are repeated
    for each chunk of equal-length sequences (many samples of one window share a long context)."""
    import copy
    from transformers import DynamicCache
    model = loaded.model
    out: list[torch.Tensor | None] = [None] * len(seqs)
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(len(s), []).append(i)
    if set(by_len) <= {0}:
        return [torch.empty(0, output_size(model)) for _ in seqs]
    kw = _cache_kwarg(type(model))
    prefix = DynamicCache(config=model.config)
    ids = torch.tensor([list(context)], device=loaded.device)
    first = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: prefix}).logits[0].float().cpu()  # (1, V)
    for length, idx in by_len.items():
        if length <= 1:
            for i in idx:
                out[i] = first[:length]
            continue
        for start in range(0, len(idx), CHUNK):
            part = idx[start:start + CHUNK]
            cache = copy.deepcopy(prefix)
            if len(part) > 1:
                cache.batch_repeat_interleave(len(part))
            ids = torch.tensor([list(seqs[i][:-1]) for i in part], device=loaded.device)
            logits = model(input_ids=ids, use_cache=True, **{kw: cache}).logits.float().cpu()  # (B, T - 1, V)
            for j, i in enumerate(part):
                out[i] = torch.cat([first, logits[j]])
    return out


@torch.inference_mode()
def replayed_draft_logits(draft, context, tokens, stats: dict) -> dict[int, torch.Tensor]:
    """{t: the draft's logits (V_d,) for new token t} at every position where the verifier tested
    a draft token (each round's accepted drafts and its first rejected one), replayed on the
    draft's own KV cache in the chunks it was fed (see the module docstring). Needs the record's
    `round_offsets`, `proposed_per_round`, `accepted_per_round` (KeyError without them)."""
    from transformers import DynamicCache
    model = draft.model
    kw = _cache_kwarg(type(model))
    cache = DynamicCache(config=model.config)
    ctx = list(context) + list(tokens)
    start, fed, rows = len(context), 0, {}

    def step(ids: list[int]) -> torch.Tensor:
        ids_t = torch.tensor([ids], device=draft.device)
        return model(input_ids=ids_t, use_cache=True, logits_to_keep=1, **{kw: cache}).logits[0, -1].float().cpu()

    for off, n, a in zip(stats["round_offsets"], stats["proposed_per_round"], stats["accepted_per_round"]):
        if n <= 0 or off >= len(tokens):
            continue  # no proposal: the drafter fed nothing this round
        at = start + off
        rows[off] = step(ctx[fed:at])  # what it had not seen: the context's tail, in one forward
        fed = at
        for j in range(1, min(a, n - 1) + 1):  # then each accepted draft token, one forward each
            if off + j >= len(tokens):
                break
            rows[off + j] = step([ctx[at + j - 1]])
            fed = at + j
        # A rejection rolls the draft back to the accepted length (what it fed is already that);
        # a round accepted in full leaves its last draft token unfed, for the next chunk.
    return rows


# ------------------------------------------------------------------ from an engine's top-k


def odds(c: float) -> float:
    return c / (1.0 - c) if c < 1.0 else float("inf")


def boundary_band(noise: float, temperature: float) -> float:
    """How far the odds of a token's mass-before can move when every logit moves by up to
    `noise` / 2 (so a logit difference by up to `noise`): the mass before it, c, and the mass
    from it on, 1 - c, move by e^(+-noise / 2T) each at worst, so c / (1 - c) by e^(+-noise / T).
    A token whose odds lie within that factor of top_p / (1 - top_p) may fall either side."""
    return math.exp(noise / temperature)


LOGPROB_SLACK = 1e-3  # an engine's float32 softmax: its top-k probabilities may sum past 1 by rounding


def check_top_logprobs(top: dict[int, float]) -> None:
    """Raise ValueError where an engine's top-k logprobs are no log-probabilities: NaN, above 0,
    or summing past probability 1. Read as they are, a NaN token drops out of the nucleus (and a
    draw of it reads as a token of probability 0) and a sum past 1 hides the unseen mass, so the
    reference would decide positions it cannot; -inf (probability 0) is a log-probability."""
    bad = [(t, x) for t, x in top.items() if math.isnan(x) or x > LOGPROB_SLACK]
    if bad:
        t, x = bad[0]
        raise ValueError(f"the engine's top logprobs are not log-probabilities: token {t} has {x!r} "
                         f"({len(bad)} of {len(top)} such)")
    total = sum(math.exp(x) for x in top.values())
    if total <= 0.0:
        raise ValueError(f"the engine's top-{len(top)} logprobs are all -inf: no token has probability")
    if total > 1.0 + LOGPROB_SLACK:
        raise ValueError(f"the engine's top-{len(top)} logprobs sum to probability {total:.4g} > 1: not the "
                         f"log-softmax of its logits")


def shaped_from_top_logprobs(top: dict[int, float], request, vocab: int, band: float = 1.0) -> torch.Tensor | None:
    """The distribution `request` samples from, (vocab,) float64, from only the top-k raw logprobs
    {token: log-softmax of its logit} an engine returns; None when they cannot decide it.

    The tokens not returned hold mass m = 1 - sum(p_seen), each at most p_k (the k-th's). Shaped by
    the same contract as `shaped_probs` (temperature, top-k, then top-p on the tempered softmax),
    the nucleus is known when every returned token is surely in or surely out of it for any way
    the unseen mass could lie, and some returned token is surely out (so every unseen one is
    too); `band` >= 1 widens "surely" by that factor on the odds of the mass before a token
    (`boundary_band`: numerical noise between the engine that sampled and the one that scored).
    Inside a known nucleus the probabilities are exact: renormalizing over the nucleus
    cancels the unknown normalizer. Which positions are decided depends on the reference alone,
    never on the token sampled there, so leaving the others out keeps the test valid."""
    if not top or not request.temperature > 0:
        return None
    check_top_logprobs(top)
    ids = sorted(top, key=lambda t: (-top[t], t))
    lp = [top[t] for t in ids]
    inv_t = 1.0 / float(request.temperature)
    if request.top_k and 0 < request.top_k <= len(ids):
        ids, lp = ids[:request.top_k], lp[:request.top_k]
        unseen_lo = unseen_hi = 0.0          # the top-k cut is known: nothing else can be drawn
    elif request.top_k and request.top_k > len(ids) or request.top_p >= 1.0:
        return None                          # the kept set reaches past what was returned
    else:
        m = max(1.0 - sum(math.exp(x) for x in lp), 0.0)
        pk = math.exp(lp[-1])
        rest = max(vocab - len(ids), 1)
        # max of sum x_j^(1/T) over unseen x_j <= pk summing to m: packed at pk for T <= 1
        # (convex), spread evenly for T > 1 (concave).
        unseen_hi = m * pk ** (inv_t - 1.0) if inv_t >= 1.0 else rest * (m / rest) ** inv_t
        unseen_lo = 0.0
    base = lp[0]
    w = [math.exp((x - base) * inv_t) for x in lp]   # tempered weights relative to the top token
    scale = math.exp(base * inv_t)
    z_lo, z_hi = sum(w), sum(w) + unseen_hi / scale if scale > 0 else float("inf")
    if unseen_lo == unseen_hi == 0.0:
        z_lo = z_hi = sum(w)
    p = float(request.top_p)
    band = band if p < 1.0 else 1.0          # no top-p cut: no boundary for noise to move
    kept, before = 0, 0.0
    for i, wi in enumerate(w):
        sure_in = odds(before / z_lo) < odds(p) / band
        sure_out = odds(before / z_hi) >= odds(p) * band
        if i == 0 or sure_in and not sure_out:   # at least one token is always kept
            kept, before = i + 1, before + wi
            continue
        if sure_out:
            break
        return None                              # this token may fall either side
    else:
        if not z_lo == z_hi:                     # every returned token kept: the nucleus may go on
            return None
    out = torch.zeros(vocab, dtype=torch.float64)
    total = sum(w[:kept])
    for t, wi in zip(ids[:kept], w[:kept]):
        if t < vocab:
            out[t] = wi / total
    return out
