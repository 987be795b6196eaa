"""The data exit heads learn from and are calibrated on: the target's own continuations of the
prompts in `harness/exits/prompts.py`, and the hidden states it computes on them.

- `continuations`: for each prompt, one greedy continuation and one sampled one per extra
  temperature (transformers' `generate`, batched with left padding; sampling seeded per batch).
- `layer_states`: one pass of the frozen target over prompt + continuation (batched, right
  padding, causal: padding never reaches a real token), keeping at each asked layer `l` the hidden
  state after `l` decoder layers at every position that predicts a continuation token (the prompt's
  last position and every continuation token but the last), and the final-layer state before the
  norm. These are the positions where the early-exit decoder decides a token.

Continuations are cached in the user cache (token ids only, keyed by the target fingerprint, the
prompts and the settings), so a rerun or a resumed training does not generate again.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Continuation:
    prompt: str
    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]        # new tokens, up to and including a stop token
    temperature: float


@dataclass
class States:
    """Hidden states at the positions that predict continuation tokens, (N, H) each."""

    layers: dict[int, torch.Tensor]   # layer -> (N, H): after `layer` decoder layers
    final: torch.Tensor               # (N, H): after every layer, before the final norm
    sequence: torch.Tensor            # (N,): index of the continuation each row belongs to

    @property
    def n(self) -> int:
        return int(self.final.shape[0])

    def rows(self, index: torch.Tensor) -> States:
        return States({l: h[index] for l, h in self.layers.items()}, self.final[index], self.sequence[index])


def data_hash(conts: list[Continuation]) -> str:
    h = hashlib.sha256()
    for c in conts:
        h.update(json.dumps([c.prompt_ids, c.tokens, c.temperature]).encode())
    return h.hexdigest()[:16]


def _cache_file(fingerprint: str, prompts: list[str], settings: dict) -> Path:
    from harness.models import cache_dir
    key = hashlib.sha256(json.dumps([fingerprint, prompts, settings], sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / "exits" / f"continuations-{key}.json"


def continuations(target, prompts: list[str], *, temperatures=(0.0, 0.7), max_new_tokens: int = 64,
                  top_p: float = 0.95, seed: int = 0, batch_size: int = 16, progress: bool = True,
                  fingerprint: str | None = None, use_cache: bool = True) -> list[Continuation]:
    """The target's continuations of `prompts` (chat template applied), one per temperature
    (0 is greedy). Cached by (fingerprint, prompts, settings) when a fingerprint is given."""
    settings = {"temperatures": list(temperatures), "max_new_tokens": max_new_tokens, "top_p": top_p,
                "seed": seed, "batch_size": batch_size}
    path = _cache_file(fingerprint, prompts, settings) if fingerprint and use_cache else None
    if path is not None and path.is_file():
        return [Continuation(r["prompt"], tuple(r["prompt_ids"]), tuple(r["tokens"]), r["temperature"])
                for r in json.loads(path.read_text())]
    from tqdm import tqdm
    encoded = [(p, tuple(target.encode(p))) for p in prompts]
    stops = set(target.stop_token_ids())
    jobs = [(t, encoded[i:i + batch_size]) for t in temperatures for i in range(0, len(encoded), batch_size)]
    out: list[Continuation] = []
    bar = tqdm(total=len(prompts) * len(temperatures), desc="continuations", unit="seq", disable=not progress,
               dynamic_ncols=True)
    for b, (t, batch) in enumerate(jobs):
        out += _generate_batch(target, batch, t, max_new_tokens, top_p, seed * 100003 + b, stops)
        bar.update(len(batch))
    bar.close()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"prompt": c.prompt, "prompt_ids": list(c.prompt_ids), "tokens": list(c.tokens),
                 "temperature": c.temperature} for c in out]
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cont-")
        with os.fdopen(fd, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, path)
    return out


@torch.inference_mode()
def _generate_batch(target, batch, temperature, max_new_tokens, top_p, seed, stops) -> list[Continuation]:
    model, device = target.model, target.device
    pad = target.tokenizer.pad_token_id
    pad = pad if pad is not None else min(stops)
    width = max(len(ids) for _, ids in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (_, p) in enumerate(batch):  # left padding: every row ends at the same column
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    kw = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else \
        dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    cpu_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                             pad_token_id=pad, eos_token_id=sorted(stops), **kw)
    finally:
        torch.random.set_rng_state(cpu_state)
    out = []
    for i, (prompt, p) in enumerate(batch):
        new = gen[i, width:].tolist()
        cut = next((j + 1 for j, tok in enumerate(new) if tok in stops), len(new))
        out.append(Continuation(prompt, p, tuple(new[:cut]), float(temperature)))
    return out


@torch.no_grad()   # not inference mode: the states feed autograd (the heads' training) later
def layer_states(target, conts: list[Continuation], layers, *, batch_tokens: int = 2048,
                 progress: bool = True, desc: str = "hidden states") -> States:
    """Hidden states of the frozen target at the positions that predict each continuation's
    tokens (see the module docstring), after each of `layers` and at the end (before the norm)."""
    from tqdm import tqdm

    from decoders.adapter import LayerAdapter
    ad = LayerAdapter(target.model)
    layers = sorted(int(l) for l in layers)
    seqs = [(i, list(c.prompt_ids) + list(c.tokens[:-1]), len(c.prompt_ids)) for i, c in enumerate(conts) if c.tokens]
    seqs.sort(key=lambda s: len(s[1]))  # similar lengths together: little padding
    keep = {l: [] for l in layers}
    final, owner = [], []
    bar = tqdm(total=len(seqs), desc=desc, unit="seq", disable=not progress, dynamic_ncols=True)
    i = 0
    while i < len(seqs):
        width = len(seqs[i][1])
        j = i + 1
        while j < len(seqs) and (j - i + 1) * len(seqs[j][1]) <= batch_tokens:
            j += 1
        batch = seqs[i:j]
        width = max(len(s[1]) for s in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (_, toks, _) in enumerate(batch):  # right padding: causal attention never sees it
            ids[r, :len(toks)] = torch.tensor(toks)
        hidden = ad.embed(ids.to(target.device))                    # (B, T, H)
        cos_sin, pos = ad.rope(hidden, 0)
        mask = ad.mask(width, 0, hidden)
        states = {}
        for k, layer in enumerate(ad.layers):
            if k in keep:
                states[k] = hidden
            hidden = layer(hidden, attention_mask=mask, position_embeddings=cos_sin, position_ids=pos)
            if isinstance(hidden, tuple):  # pragma: no cover - older transformers return tuples
                hidden = hidden[0]
        for r, (index, toks, plen) in enumerate(batch):
            rows = slice(plen - 1, len(toks))                        # positions predicting the new tokens
            for l in layers:
                keep[l].append(states[l][r, rows].float().cpu())
            final.append(hidden[r, rows].float().cpu())
            owner.append(torch.full((len(toks) - plen + 1,), index, dtype=torch.long))
        bar.update(len(batch))
        i = j
    bar.close()
    H = int(target.model.config.hidden_size)
    cat = (lambda xs: torch.cat(xs) if xs else torch.empty(0, H))
    return States({l: cat(keep[l]) for l in layers}, cat(final),
                  torch.cat(owner) if owner else torch.empty(0, dtype=torch.long))
