"""`speculative`: a drafter proposes K tokens, the target scores the K+1 positions in one forward,
a verifier keeps an accepted prefix plus one target token (Leviathan et al. 2023; Chen et al.
2023). Drafters live in `decoders/drafters.py`, verifiers in `decoders/verify.py`; this module is
the loop that joins them, and nothing else.

Invariants of the loop (context = prompt + emitted tokens):
- the target's cache holds context[:-1]: its last token is fed with the next block, never
  re-prefilled; after verification both caches roll back to the accepted length;
- the drafter's state is a prefix of the context; what it lacks (the correction token, and after
  a fully accepted block also the last draft token) it processes at the start of its next draft;
- tokens are emitted one at a time through the `Emitter`, so EOS, stop strings and max tokens
  inside a block cut it exactly where `standard` would stop;
- K is capped by the tokens still to emit and by the target's context, so no forward ever goes
  past the context limit.

Exactness: greedy and `coupled` are token-identical to `standard` (up to numerical near-ties of
batched vs one-token forwards); `rejection` samples exactly from the target's distribution.
"""
from __future__ import annotations

import math
import time
from collections import deque

import torch

from decoders.base import Decoder, DecoderError, GenerationRequest, GenerationResult
from decoders.common import (Emitter, check_prompt_fits, forward, pick_and_margin, reject_options, rollback, scope,
                             step_function, sync)
from decoders.context import context_length
from decoders.drafters import Draft, make_drafter, output_size
from decoders.kv import DEFAULT_CACHE, CachePool, check_cache_kind, request_capacity
from decoders.sampling import (ACCEPT, RESIDUAL, argmax_and_margin, check_finite, gumbel, prompt_key, shape_logits,
                               top2_margin, uniforms)
from decoders.verify import Verdict, keep_until_mismatch, verify_coupled, verify_rejection

VERIFIERS = ("rejection", "coupled")
# Sampling requests without `verify` use the classic rejection verifier: the highest acceptance
# any exact verifier can reach (1 - TV(p, q) per token), as production systems run it. Ask for
# `coupled` to get token identity with `standard` sampling.
DEFAULT_VERIFIER = "rejection"


class TargetScorer:
    """The target's side of the loop: one KV cache, one prefill, then blocks of tokens."""

    def __init__(self, target, cache: str = DEFAULT_CACHE, compile: bool = False):
        self.model, self.device = target.model, target.device
        self.pool = CachePool(self.model, cache)
        self.step = step_function(self.model, compile)
        self.cache = None

    def prefill(self, prompt_ids, capacity: int | None = None) -> torch.Tensor:
        capacity = capacity or len(prompt_ids) + 1
        kept = self.pool.prefilled(prompt_ids, capacity)
        if kept is not None:
            self.cache, logits = kept
            return logits
        self.cache = self.pool.new(capacity)
        logits = forward(self.model, torch.tensor([list(prompt_ids)], device=self.device), self.cache, 1)
        self.pool.remember(prompt_ids, logits)
        return logits

    def score(self, tokens: list[int], position: int) -> torch.Tensor:
        """Logits (T, V) after each of `tokens`, the first of which sits at absolute `position`."""
        have = self.cache.get_seq_length()
        if have != position:
            raise RuntimeError(f"target cache holds {have} tokens, expected {position}")
        ids = torch.tensor([tokens], device=self.device)
        if len(tokens) == 1:
            return self.step(ids, self.cache)
        return forward(self.model, ids, self.cache, len(tokens))

    def rollback(self, length: int) -> None:
        rollback(self.cache, length)


class Noise:
    """The keyed Gumbel noise of `standard`, memoised by absolute position: the draft proposes
    with it and the coupled verifier scores with it, without drawing it twice."""

    def __init__(self, key: int, vocab: int, device):
        self.key, self.vocab, self.device = key, vocab, device
        self.rows: dict[int, torch.Tensor] = {}

    def at(self, position: int) -> torch.Tensor:
        if position not in self.rows:
            self.rows[position] = gumbel(self.key, position, self.vocab, self.device)
        return self.rows[position]

    def forget_before(self, position: int) -> None:
        for p in [p for p in self.rows if p < position]:
            del self.rows[p]


class Picker:
    """How a model drafter turns its logits at an absolute position into a draft token.

    greedy: argmax. coupled: argmax(log q + g) with the position's Gumbel noise. rejection: the
    same Gumbel-max draw (an exact sample from q; its noise stream is independent of the
    verifier's accept and residual uniforms), and q itself is returned for the verifier.
    """

    def __init__(self, request: GenerationRequest, verifier: str, noise: Noise):
        self.request, self.verifier, self.noise = request, verifier, noise

    def __call__(self, logits: torch.Tensor, position: int) -> tuple[int, torch.Tensor | None]:
        check_finite(logits, f"draft position {position}")
        if self.verifier == "greedy":
            return int(logits.argmax()), None
        r = self.request
        logq = shape_logits(logits, r.temperature, r.top_k, r.top_p)  # (V,)
        token = int((logq + self.noise.at(position)).argmax())
        return token, (logq.exp() if self.verifier == "rejection" else None)


class _Stats:
    def __init__(self, k_max: int):
        self.rounds = 0
        self.proposed: list[int] = []
        self.accepted: list[int] = []
        self.offsets: list[int] = []    # index in the new tokens of each round's first emitted token
        self.rejected: list[int] = []   # per round: the draft token the verifier rejected, or -1
        self.by_position = [[0, 0] for _ in range(k_max)]  # [accepted, proposed] per draft index
        self.target_forwards = 0
        self.fallbacks = 0
        self.fallback_tokens = 0
        self.prefill_s = self.draft_s = self.verify_s = 0.0

    def record(self, proposed: int, accepted: int, offset: int, rejected: int) -> None:
        self.rounds += 1
        self.proposed.append(proposed)
        self.accepted.append(accepted)
        self.offsets.append(offset)
        self.rejected.append(rejected)
        for i in range(proposed):
            self.by_position[i][1] += 1
            self.by_position[i][0] += int(i < accepted)


class SpeculativeDecoder(Decoder):
    """Speculative decoding with exact verification.

    Options (keyword):
      draft: a loaded model sharing the target's tokenizer, "prompt-lookup", or "self:L" (the
          target's first L layers + final norm + LM head, sharing its KV cache). Required.
      k: draft length K (default 4), >= 1. Each round proposes min(K, tokens left - 1, context
          room) tokens; a drafter may propose fewer (prompt lookup without a match: a plain step).
      verify: "rejection" or "coupled" for sampling requests; None uses DEFAULT_VERIFIER
          ("rejection"). Greedy requests always verify by argmax (both verifiers reduce to it).
      adaptive_k: K grows by one after a fully accepted full-length round and shrinks by one after
          a rejection, within [1, k_max]. Off by default.
      k_max: the adaptive bound (default 2·k; with adaptive_k off, K stays k).
      min_acceptance: kill switch. When the acceptance rate over the last `window` drafting
          rounds (accepted / proposed, rounds that proposed nothing are not counted) falls below
          it, decoding continues as `standard`: for `cooldown` tokens, after which drafting
          resumes with a fresh window, or for the rest of the request when cooldown is None
          (the default). Each switch counts in stats["fallbacks"].
      window: rounds in the kill switch's rolling window (default 8).
      cooldown: standard tokens per fallback, or None for the rest of the request.
      ngram_max, ngram_min: n-gram sizes tried by prompt lookup (default 3 down to 1).
      exit_heads: for draft "self:L", exit heads (`decodegate train-exits`) through which the
          draft reads layer L; the verification is unchanged.

    Stats: rounds, proposed, accepted (the verifier's decisions, also past an EOS that ended the
    request), proposed_per_round, accepted_per_round, acceptance_by_position ([accepted,
    proposed] per draft index), round_offsets (index in `tokens` of each round's first emitted
    token), rejected_draft_tokens (per round, the draft token the verifier rejected, or -1),
    acceptance_rate, tau (new tokens per target forward), k, k_final,
    target_forwards (prefill = 1; a self-draft verification is one, though it starts mid-model),
    draft_forwards, prefill_time_s, draft_time_s, verify_time_s (target scoring and verification
    after prefill, fallback steps included), other_time_s, fallbacks, fallback_tokens, drafter,
    verifier.
    """

    name = "speculative"

    def __init__(self, target, draft=None, k: int = 4, verify: str | None = None, adaptive_k: bool = False,
                 k_max: int | None = None, min_acceptance: float | None = None, window: int = 8,
                 cooldown: int | None = None, ngram_max: int = 3, ngram_min: int = 1, exit_heads=None,
                 cache: str = DEFAULT_CACHE, compile: bool = False, **options):
        reject_options(self.name, options)
        self.target = target
        self.cache_kind, self.compile = check_cache_kind(cache), bool(compile)
        self.k = _positive_int("k", k)
        if verify is not None and verify not in VERIFIERS:
            raise DecoderError(f"verify must be one of {', '.join(VERIFIERS)} (or unset), got {verify!r}")
        self.verify = verify or DEFAULT_VERIFIER
        self.adaptive_k = bool(adaptive_k)
        self.k_max = _positive_int("k_max", k_max) if k_max is not None else (2 * self.k if self.adaptive_k else self.k)
        if self.k_max < self.k:
            raise DecoderError(f"k_max must be >= k ({self.k}), got {self.k_max}")
        if min_acceptance is not None and not 0 <= float(min_acceptance) <= 1:
            raise DecoderError(f"min_acceptance must be in [0, 1], got {min_acceptance}")
        self.min_acceptance = None if min_acceptance is None else float(min_acceptance)
        self.window = _positive_int("window", window)
        self.cooldown = None if cooldown is None else _positive_int("cooldown", cooldown)
        self.drafter = make_drafter(draft, target, ngram_max=int(ngram_max), ngram_min=int(ngram_min),
                                    exit_heads=exit_heads, cache=self.cache_kind, compile=self.compile)
        self.vocab = output_size(target.model)
        self.scorer = self.drafter.scorer() or TargetScorer(target, self.cache_kind, self.compile)

    def reuse_prefill(self, on: bool) -> None:
        # The target's prefill only: a draft model is fed the prompt with the first new token, and
        # a self-draft's scorer writes its own layers into the shared cache.
        if isinstance(self.scorer, TargetScorer):
            self.scorer.pool.reuse_prefill = bool(on)

    # ---------------------------------------------------------------------------------- loop
    @torch.inference_mode()
    def generate(self, request: GenerationRequest) -> GenerationResult:
        run = _Run(self, request)
        run.prefill()
        while not run.out.done:
            if run.fallback_left > 0:
                run.standard_step()
            else:
                run.speculate()
        sync(self.target.device)
        return run.out.result(self.name, run.stats())


class _Run:
    """One request's state: the context, both sides' caches, noise, K, the kill switch."""

    def __init__(self, dec: SpeculativeDecoder, request: GenerationRequest):
        target = dec.target
        self.dec, self.request, self.device = dec, request, target.device
        self.out = Emitter(request, target.tokenizer, check_prompt_fits(target.model, request))
        self.limit = context_length(target.model)
        self.key = prompt_key(request.seed, request.prompt_ids)
        self.verifier = "greedy" if request.greedy else dec.verify
        self.noise = Noise(self.key, dec.vocab, self.device)
        self.pick = Picker(request, self.verifier, self.noise)
        self.drafter = dec.drafter
        self.scorer = dec.scorer
        self.st = _Stats(dec.k_max)
        self.context = list(request.prompt_ids)
        self.k = dec.k
        self.recent: deque[tuple[int, int]] = deque(maxlen=dec.window)  # (accepted, proposed)
        self.fallback_left = 0  # standard steps still to take; math.inf: the rest of the request

    def prefill(self) -> None:
        t = _clock(self.device)
        prompt = self.request.prompt_ids
        # Room for the prompt, the new tokens and one round's draft beyond them.
        capacity = request_capacity(self.dec.target.model, len(prompt), self.out.max_new, self.dec.k_max)
        with scope("prefill"):
            logits = self.scorer.prefill(prompt, capacity)  # (1, V)
            self.drafter.start(prompt, capacity)
        self.st.target_forwards, self.st.prefill_s = 1, _clock(self.device) - t
        self._emit_one(logits)

    def standard_step(self) -> None:
        """A `standard` decoding step (kill switch engaged): no draft."""
        t = _clock(self.device)
        logits = self.scorer.score([self.context[-1]], len(self.context) - 1)  # (1, V)
        self.st.target_forwards += 1
        self.st.fallback_tokens += 1
        self.fallback_left -= 1
        self._emit_one(logits, t)

    def speculate(self) -> None:
        """One round: draft up to K tokens, score K+1 positions in one target forward, verify,
        emit, roll both sides back to the accepted length."""
        position = len(self.context)  # absolute position of the next new token
        room = self.out.remaining - 1  # the round emits at most room + 1 tokens
        if self.limit is not None:     # the block's last token is scored at position - 1 + K
            room = min(room, self.limit - position)
        t = _clock(self.device)
        draft = self.drafter.propose(self.context, min(self.k, room), self.pick) if room > 0 else Draft([], None)
        self.st.draft_s += _clock(self.device) - t

        t = _clock(self.device)
        n = len(draft.tokens)
        logits = self.scorer.score([self.context[-1]] + draft.tokens, position - 1)  # (n + 1, V)
        self.st.target_forwards += 1
        if n == 0:  # nothing to verify: a plain target step
            self.st.record(0, 0, len(self.out.tokens), -1)
            if self._emit_one(logits, t):
                return
        else:
            with scope("verify"):
                verdict, margin = self._verify(logits, draft, position)
                # One read from the device for the whole block: the verdict, every row's margin
                # and the finiteness check (the stopping rule needs the tokens on the host). A sum
                # is finite only when every term is; one that is not is checked value by value.
                row = torch.cat([verdict.accepted.double(), verdict.token.double(),
                                 torch.isfinite(logits.sum()).double()[None], margin.double()]).tolist()
            accepted, token, margins = int(row[0]), int(row[1]), row[3:]
            if not row[2]:
                # Only the rows the verdict used (each row's test reads its own row alone): rows
                # past the first rejection score a context that is thrown away, and a NaN there
                # never reaches a token.
                check_finite(logits[:accepted + 1], f"positions {position}..{position + accepted}")
            self.st.verify_s += _clock(self.device) - t
            # Where the round's tokens land and which draft token was turned down: the exactness
            # check needs both to test the tokens the verifier produced (analysis/pit.py).
            self.st.record(n, accepted, len(self.out.tokens), draft.tokens[accepted] if accepted < n else -1)
            if self._emit(draft.tokens[:accepted] + [token], margins):
                return
        self.scorer.rollback(len(self.context) - 1)  # the target's cache holds context[:-1]
        self.drafter.rollback(len(self.context) - 1)
        self.noise.forget_before(len(self.context))
        if n > 0:
            self._adapt(n, accepted)

    def _verify(self, logits: torch.Tensor, draft: Draft, position: int) -> tuple[Verdict, torch.Tensor]:
        """One block: logits (K+1, V) from the target, K draft tokens at positions position.. .
        Returns the verdict and every row's top-2 margin (K+1,)."""
        r, device = self.request, logits.device
        d = torch.tensor([draft.tokens], device=device)  # (1, K)
        if self.verifier == "greedy":  # verify_greedy's argmax, read with the margins in one pass
            choice, margin = argmax_and_margin(logits)
            return keep_until_mismatch(choice[None], d), margin
        margin = top2_margin(logits)
        logp = shape_logits(logits, r.temperature, r.top_k, r.top_p)  # (K+1, V)
        positions = range(position, position + len(draft.tokens) + 1)
        if self.verifier == "coupled":
            g = torch.stack([self.noise.at(p) for p in positions])  # (K+1, V)
            return verify_coupled(logp[None], d, g[None]), margin
        q = None if draft.q is None else draft.q.to(device)[None]  # None: a point mass (prompt lookup)
        u_accept = torch.cat([uniforms(self.key, p, 1, ACCEPT) for p in positions[:-1]]).to(device)[None]
        u_sample = torch.cat([uniforms(self.key, p, 1, RESIDUAL) for p in positions]).to(device)[None]
        return verify_rejection(logp.exp()[None], q, d, u_accept, u_sample), margin

    def _emit_one(self, logits: torch.Tensor, t: float | None = None) -> bool:
        """`standard`'s own step from logits (1, V): choose, emit; True when the request is done.
        `t`: when the step's target forward began (its time counts as verification)."""
        position = len(self.context)
        with scope("sampling"):
            token, margin = pick_and_margin(logits, self.request, self.key, position, f"position {position}")
        if t is not None:
            self.st.verify_s += _clock(self.device) - t
        return self._emit([token], [margin])

    def _emit(self, tokens: list[int], margins: list[float]) -> bool:
        """Emit tokens one at a time (margin i: the target's top-2 margin of the row that chose
        token i); True when the request is done. Only emitted tokens join the context."""
        for token, margin in zip(tokens, margins):
            self.context.append(token)
            if self.out.emit(token, margin):
                return True
        return False

    def _adapt(self, proposed: int, accepted: int) -> None:
        """Adaptive K, then the kill switch, after a round that proposed something."""
        dec = self.dec
        if dec.adaptive_k:
            if accepted == proposed == self.k:
                self.k = min(self.k + 1, dec.k_max)
            elif accepted < proposed:
                self.k = max(self.k - 1, 1)
        if dec.min_acceptance is not None:
            self.recent.append((accepted, proposed))
            rate = sum(a for a, _ in self.recent) / sum(p for _, p in self.recent)
            if len(self.recent) == self.recent.maxlen and rate < dec.min_acceptance:
                self.st.fallbacks += 1
                self.fallback_left = dec.cooldown or math.inf
                self.recent.clear()

    def stats(self) -> dict:
        st, out = self.st, self.out
        wall = (out.stamps[-1] if out.stamps else time.perf_counter()) - out.t0
        proposed, accepted = sum(st.proposed), sum(st.accepted)
        return {
            "target_forwards": st.target_forwards,
            "draft_forwards": self.drafter.forwards,
            "proposed": proposed,
            "accepted": accepted,
            "fallbacks": st.fallbacks,
            "fallback_tokens": st.fallback_tokens,
            "rounds": st.rounds,
            "proposed_per_round": st.proposed,
            "accepted_per_round": st.accepted,
            "acceptance_by_position": st.by_position,
            "round_offsets": st.offsets,
            "rejected_draft_tokens": st.rejected,
            "acceptance_rate": accepted / proposed if proposed else None,
            "tau": len(out.tokens) / st.target_forwards,
            "k": self.dec.k,
            "k_final": self.k,
            "prefill_time_s": st.prefill_s,
            "draft_time_s": st.draft_s,
            "verify_time_s": st.verify_s,
            "other_time_s": max(0.0, wall - st.prefill_s - st.draft_s - st.verify_s),
            "drafter": self.drafter.name,
            "verifier": self.verifier,
        }


def _clock(device) -> float:
    sync(device)
    return time.perf_counter()


def _positive_int(name: str, value) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise DecoderError(f"{name} must be an integer >= 1, got {value!r}") from None
    if n != value or n < 1 or isinstance(value, bool):
        raise DecoderError(f"{name} must be an integer >= 1, got {value!r}")
    return n
