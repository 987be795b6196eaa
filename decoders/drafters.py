"""Drafters for the speculative backend: who proposes the next K tokens. Verification is not here
(see `decoders/verify.py`); a drafter only proposes, and keeps its own state in step with the
accepted text.

The interface (`Drafter`), for one request at a time:
- `start(prompt_ids)`: forget the previous request.
- `propose(context, k, pick) -> Draft`: up to k tokens that continue `context` (prompt + emitted
  tokens). A drafter with a model scores each step and lets `pick(logits, position)` choose the
  token (argmax, or a draw with the keyed noise of that absolute position) and return the draft
  probabilities q when the verifier needs them. It may return fewer than k tokens (no n-gram
  match, its own context full), including none.
- `rollback(length)`: the accepted text now agrees with what the drafter saw only on its first
  `length` tokens; drop any state beyond. Tokens of `context` that the drafter has not processed
  yet (the correction token; after a fully accepted round also the last draft token) are fed
  at the start of the next `propose`, in one forward.
- `scorer()`: the object that scores the target, when the drafter shares the target's state
  (the self-draft); None for the plain target forward.

Drafters:
- `DraftModel`: any causal LM with the target's tokenizer (vocabulary and special tokens are
  compared; a difference is refused). May sit on another device.
- `PromptLookup`: n-gram match of the context's tail against the context itself; no model, no
  probabilities (a point mass: the rejection verifier treats it as q = one_hot(d)).
- `SelfDraft`: the target's first L layers, final norm and LM head (LayerSkip-style
  self-speculation), sharing the target's KV cache for those layers. Given exit heads
  (`decoders.exit_heads`, trained by `decodegate train-exits`), it reads layer L through its
  head: only the proposals change, the target still verifies, so exactness is untouched.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

from decoders.adapter import LayerAdapter
from decoders.base import DecoderError
from decoders.common import forward, rollback, scope, step_function
from decoders.context import context_length
from decoders.kv import DEFAULT_CACHE, CachePool

# pick(logits (V,) on the target's device, absolute position) -> (token, q row (V,) or None)
Pick = Callable[[torch.Tensor, int], "tuple[int, torch.Tensor | None]"]


class Draft(NamedTuple):
    tokens: list[int]
    q: torch.Tensor | None  # (len(tokens), V) draft probabilities, or None: a point mass / not needed


class Drafter:
    name = "?"

    def __init__(self):
        self.forwards = 0

    def start(self, prompt_ids, capacity: int | None = None) -> None:
        """`capacity`: the most tokens of context the request can reach (a KV cache's size)."""
        self.forwards = 0

    def propose(self, context: list[int], k: int, pick: Pick) -> Draft:  # pragma: no cover
        raise NotImplementedError

    def rollback(self, length: int) -> None:
        pass

    def scorer(self):
        return None


def _stack(rows: list) -> torch.Tensor | None:
    return None if not rows or rows[0] is None else torch.stack(rows)


# ------------------------------------------------------------------------------ draft model

def check_tokenizers(target_tok, draft_tok) -> None:
    """Refuse a draft whose tokenizer differs from the target's: token ids would mean different
    text, and every draft token would be a wasted (or worse, misleading) proposal."""
    if target_tok is draft_tok:
        return
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        only_t = sorted(set(tv) - set(dv))
        only_d = sorted(set(dv) - set(tv))
        moved = sorted(t for t in tv.keys() & dv.keys() if tv[t] != dv[t])
        parts = [f"target {len(tv)} tokens, draft {len(dv)}"]
        if only_t:
            parts.append(f"only in the target: {only_t[:3]!r}")
        if only_d:
            parts.append(f"only in the draft: {only_d[:3]!r}")
        if moved:
            parts.append(f"different ids for {moved[:3]!r}")
        raise DecoderError("the draft's tokenizer differs from the target's (vocabulary: "
                           + "; ".join(parts) + "); a draft model must share the target's tokenizer")
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        a, b = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if str(a) != str(b):
            raise DecoderError(f"the draft's tokenizer differs from the target's (special tokens: "
                               f"{attr} is {a!r} in the target, {b!r} in the draft)")
    a, b = sorted(map(str, target_tok.all_special_tokens)), sorted(map(str, draft_tok.all_special_tokens))
    if a != b:
        raise DecoderError(f"the draft's tokenizer differs from the target's (special tokens: "
                           f"target {a!r}, draft {b!r})")


def output_size(model) -> int:
    """How many logits the model emits per position (its LM head's rows; may exceed the
    tokenizer's vocabulary through padding)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or model.config.vocab_size)


def align_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft logits (..., V_d) onto the target's vocabulary size: ids the target cannot emit are
    cut, ids the draft lacks get -inf (both models share one tokenizer; only padding differs)."""
    v = logits.shape[-1]
    if v == vocab:
        return logits
    if v > vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - v), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


class DraftModel(Drafter):
    """A separate causal LM with its own KV cache, kept at the accepted length."""

    name = "model"

    def __init__(self, draft, target, cache: str = DEFAULT_CACHE, compile: bool = False):
        super().__init__()
        self.pool = CachePool(draft.model, cache)
        self.step = step_function(draft.model, compile)
        check_tokenizers(target.tokenizer, draft.tokenizer)
        self.loaded = draft
        self.name = f"model:{draft.name}"
        self.vocab = output_size(target.model)
        embeds = draft.model.get_input_embeddings().num_embeddings
        emittable = min(self.vocab, len(target.tokenizer))
        if embeds < emittable:
            raise DecoderError(f"the draft model embeds token ids below {embeds} only, but the target can "
                               f"emit ids up to {emittable - 1}: use a draft with the target's full vocabulary")
        self.target_device = target.device
        self.limit = context_length(draft.model)
        self.cache, self.length = None, 0  # length: tokens of the context in self.cache

    def start(self, prompt_ids, capacity: int | None = None) -> None:
        super().start(prompt_ids)
        self.cache, self.length = self.pool.new(capacity or len(prompt_ids) + 1), 0

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, pick: Pick) -> Draft:
        if self.limit is not None:  # its own context: the last fed token sits at len + k - 2
            k = min(k, self.limit - len(context) + 1)
        tokens, q = [], []
        pending = context[self.length:]  # >= 1 token: the correction (and a kept last draft)
        for i in range(max(k, 0)):
            ids = torch.tensor([pending], device=self.loaded.device)
            with scope("draft_forward"):
                logits = (self.step(ids, self.cache) if len(pending) == 1
                          else forward(self.loaded.model, ids, self.cache, 1))[0]  # (V_d,)
            self.forwards += 1
            self.length += len(pending)
            with scope("draft_pick"):
                token, q_row = pick(align_vocab(logits.to(self.target_device), self.vocab), len(context) + i)
            tokens.append(token)
            q.append(q_row)
            pending = [token]
        return Draft(tokens, _stack(q))

    def rollback(self, length: int) -> None:
        if self.length > length:
            rollback(self.cache, length)
            self.length = length


# ----------------------------------------------------------------------------- prompt lookup

class PromptLookup(Drafter):
    """Prompt lookup decoding (Saxena 2023): find the context's last n tokens earlier in the
    context (n from ngram_max down to ngram_min) and propose what followed them. Prefers the most
    recent match that has k tokens after it, else the match with the longest continuation."""

    name = "prompt-lookup"

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, vocab: int | None = None):
        super().__init__()
        if not 1 <= ngram_min <= ngram_max:
            raise DecoderError(f"prompt lookup needs 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_max, self.ngram_min, self.vocab = ngram_max, ngram_min, vocab

    def propose(self, context: list[int], k: int, pick: Pick) -> Draft:
        seq = np.asarray(context, dtype=np.int64)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if k < 1 or len(seq) <= n:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # starts 0 .. len-1-n
            hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
            if hits.size == 0:
                continue
            full = hits[hits + n + k <= len(seq)]
            start = (full[-1] if full.size else hits[0]) + n
            tokens = seq[start:start + k].tolist()
            if self.vocab is not None:  # ids the target cannot emit end the proposal
                tokens = tokens[:next((i for i, t in enumerate(tokens) if t >= self.vocab), len(tokens))]
            return Draft(tokens, None)
        return Draft([], None)


# --------------------------------------------------------------------------------- self-draft

class SelfDraft(Drafter):
    """Early-exit self-speculation: draft with layers [0, L) + final norm + LM head of the target.

    The draft and the target share one KV cache. Lower layers [0, L) run ahead while drafting;
    their keys/values and the layer-L hidden states of the drafted tokens are kept, so the
    target's verification (`score`) only runs the lower layers for tokens the draft has not
    processed (the last draft token) and the upper layers [L, N) for all K+1 tokens. This equals
    a full forward of those tokens: every token's lower-layer computation attends to the same
    cached keys either way (LayerSkip's cache reuse, Elhoushi et al. 2024).

    State: upper layers hold `up` tokens, lower layers `low >= up`; `hidden` holds the layer-L
    states of positions [up, low). Also the target's scorer: `prefill`, `score`, `rollback`.
    L = N (every layer) is allowed: a draft identical to the target, useful in tests.
    """

    def __init__(self, target, layers: int, exit_heads=None, cache: str = DEFAULT_CACHE):
        super().__init__()
        self.adapter = LayerAdapter(target.model)
        self.pool = CachePool(target.model, cache)
        n = self.adapter.num_layers
        if not 1 <= layers <= n:
            raise DecoderError(f"self-draft layers must be in 1..{n} for this model, got {layers}")
        self.layers, self.name = layers, f"self:{layers}"
        self.device = target.device
        self.cache, self.up, self.low, self.hidden = None, 0, 0, None
        self.heads = None
        if exit_heads is not None:
            self.heads = _fitted_head(exit_heads, target, layers)
            self.name = f"self:{layers}+head"

    def scorer(self):
        return self

    # target side ------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompt_ids, capacity: int | None = None) -> torch.Tensor:
        a = self.adapter
        capacity = capacity or len(prompt_ids) + 1
        a.check_capacity(capacity)
        self.cache = self.pool.new(capacity)
        h = a.run_layers(a.embed(torch.tensor([list(prompt_ids)], device=self.device)), 0, a.num_layers,
                         self.cache, 0)
        self.up = self.low = len(prompt_ids)
        self.hidden = h[:, :0]
        return a.head(h[:, -1:])  # (1, V)

    @torch.inference_mode()
    def score(self, tokens: list[int], position: int) -> torch.Tensor:
        """Target logits (T, V) for `tokens` at absolute positions position.. ."""
        a = self.adapter
        if self.up != position or self.low > position + len(tokens):
            raise RuntimeError(f"self-draft state up={self.up} low={self.low} cannot score "
                               f"{len(tokens)} tokens at {position}")
        rest = tokens[self.low - position:]  # tokens the lower layers have not seen
        hidden = self.hidden
        if rest:
            h = a.run_layers(a.embed(torch.tensor([rest], device=self.device)), 0, self.layers,
                             self.cache, self.low)
            hidden = torch.cat([hidden, h], dim=1)
        out = a.run_layers(hidden, self.layers, a.num_layers, self.cache, position)  # (1, T, H)
        self.up = self.low = position + len(tokens)
        self.hidden = out[:, :0]
        return a.head(out)

    def rollback(self, length: int) -> None:
        self.adapter.rollback(self.cache, length)
        self.low = min(self.low, length)
        self.up = min(self.up, length)
        self.hidden = self.hidden[:, :self.low - self.up]

    # draft side -------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, context: list[int], k: int, pick: Pick) -> Draft:
        a = self.adapter
        limit = context_length(a.model)
        if limit is not None:  # scoring will put the last draft token at len(context) + k - 1
            k = min(k, limit - len(context))
        tokens, q = [], []
        pending = context[self.low:]
        for i in range(max(k, 0)):
            h = a.run_layers(a.embed(torch.tensor([pending], device=self.device)), 0, self.layers,
                             self.cache, self.low)
            self.forwards += 1
            self.low += len(pending)
            self.hidden = torch.cat([self.hidden, h], dim=1)
            token, q_row = pick(self.draft_logits(h[:, -1:])[0], len(context) + i)
            tokens.append(token)
            q.append(q_row)
            pending = [token]
        return Draft(tokens, _stack(q))

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits (T, V) from layer-L hidden states (1, T, H): through the exit head when
        there is one (the logit lens otherwise; at L = N the model's own output)."""
        if self.heads is not None and self.layers < self.adapter.num_layers:
            hidden = self.heads.apply(self.layers, hidden)
        return self.adapter.head(hidden)


def _fitted_head(exit_heads, target, layers: int):
    """Exit heads checked against the target (shape, fingerprint) and holding layer `layers`,
    on the target's device and dtype."""
    from decoders.exit_heads import ExitHeads, load_exit_heads, model_fingerprint
    heads = exit_heads if isinstance(exit_heads, ExitHeads) else load_exit_heads(exit_heads)
    cfg = target.model.config
    heads.check_fits(int(cfg.num_hidden_layers), int(cfg.hidden_size), fingerprint=model_fingerprint(target.model),
                     model_name=getattr(target, "name", "this model"))
    if layers < cfg.num_hidden_layers and layers not in heads.layers:
        raise DecoderError(f"self:{layers} with exit heads: {heads.source or 'the heads'} have no head for layer "
                           f"{layers} (they cover {list(heads.layers)})")
    param = next(target.model.parameters())
    return heads.to(device=param.device, dtype=param.dtype)


# ----------------------------------------------------------------------------------- factory

def make_drafter(draft, target, *, ngram_max: int = 3, ngram_min: int = 1, exit_heads=None,
                 cache: str = DEFAULT_CACHE, compile: bool = False) -> Drafter:
    """`draft`: a loaded model (with .model and .tokenizer), 'prompt-lookup', or 'self:L'.
    `exit_heads` (a folder or `ExitHeads`) applies to 'self:L' only. `cache`: the KV cache kind
    of a model drafter; `compile`: torch.compile a draft model's one-token steps."""
    if exit_heads is not None and not (isinstance(draft, str) and draft.startswith("self:")):
        raise DecoderError(f"exit_heads apply to a self-draft ('self:L') only, not to draft {draft!r}")
    if draft is None:
        raise DecoderError("speculative needs a draft: a model, 'prompt-lookup', or 'self:L' "
                           "(the target's first L layers)")
    if isinstance(draft, str):
        if draft == "prompt-lookup":
            return PromptLookup(ngram_max, ngram_min, vocab=output_size(target.model))
        if draft.startswith("self:"):
            try:
                layers = int(draft[len("self:"):])
            except ValueError:
                raise DecoderError(f"self-draft must be 'self:L' with an integer L, got {draft!r}") from None
            return SelfDraft(target, layers, exit_heads=exit_heads, cache=cache)
        raise DecoderError(f"unknown draft {draft!r}: give a model, 'prompt-lookup', or 'self:L'")
    if not (hasattr(draft, "model") and hasattr(draft, "tokenizer")):
        raise DecoderError(f"draft must be a loaded model, 'prompt-lookup' or 'self:L', got {type(draft).__name__}")
    return DraftModel(draft, target, cache=cache, compile=compile)
