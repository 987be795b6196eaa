"""Sampling primitives shared by every backend: logit shaping, greedy, seeded Gumbel-max.

Noise is keyed by (seed, prompt, absolute position), not drawn from a running generator, so two
decoders that reach the same position of the same request draw the same noise there however many
forwards they took to get there. That is what lets the coupled speculative verifier and early
exit (at a threshold that never fires) reproduce `standard` sampling token for token.

Gumbel-max: argmax(log p + g), g = -log(-log U), U ~ Uniform(0, 1), is an exact sample from p.
"""
from __future__ import annotations

import hashlib

import torch

from decoders.base import DecoderError, GenerationRequest

# Streams derived from one key, so that the rejection verifier's uniforms are independent of
# the Gumbel noise used for token choice at the same position.
GUMBEL, ACCEPT, RESIDUAL = 0, 1, 2


def prompt_key(seed: int, prompt_ids) -> int:
    """A 64-bit key for (seed, prompt). Computed once per request."""
    h = hashlib.blake2b(digest_size=8)
    h.update(int(seed).to_bytes(8, "little", signed=True))
    h.update(torch.as_tensor(list(prompt_ids), dtype=torch.int64).numpy().tobytes())
    return int.from_bytes(h.digest(), "little")


def _generator(key: int, position: int, stream: int) -> torch.Generator:
    h = hashlib.blake2b(digest_size=8)
    h.update(key.to_bytes(8, "little"))
    h.update(int(position).to_bytes(8, "little"))
    h.update(int(stream).to_bytes(1, "little"))
    g = torch.Generator(device="cpu")  # CPU always: the same noise on every device
    g.manual_seed(int.from_bytes(h.digest(), "little") & ((1 << 63) - 1))
    return g


def uniforms(key: int, position: int, n: int, stream: int) -> torch.Tensor:
    """n uniforms in (0, 1), a pure function of (key, position, stream)."""
    u = torch.rand(n, generator=_generator(key, position, stream), dtype=torch.float64)
    return u.clamp_(min=1e-300, max=1.0 - 1e-16)


def gumbel(key: int, position: int, vocab_size: int, device=None) -> torch.Tensor:
    """Gumbel(0, 1) noise of shape (V,) for one absolute position, float32."""
    g = -torch.log(-torch.log(uniforms(key, position, vocab_size, GUMBEL)))
    return g.to(dtype=torch.float32, device=device)


def gumbel_rows(key: int, positions, vocab_size: int, device=None) -> torch.Tensor:
    """Stacked noise for several absolute positions: (len(positions), V)."""
    return torch.stack([gumbel(key, p, vocab_size) for p in positions]).to(device)


def shape_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities after temperature, top-k, top-p (in that order, as transformers does).

    Works on (..., V). Filtered tokens get -inf. temperature must be > 0 here; greedy callers
    use the raw logits.
    """
    x = logits.float() / temperature
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]  # (..., 1)
        x = x.masked_fill(x < kth, float("-inf"))
    logp = torch.log_softmax(x, dim=-1)
    if top_p < 1.0:
        logp = torch.log_softmax(_top_p_only(x, logp, top_p), dim=-1)
    return logp


def _top_p_only(x: torch.Tensor, logp: torch.Tensor, top_p: float, probe: int = 256) -> torch.Tensor:
    """x with -inf outside the smallest set of tokens whose mass (under logp) reaches top_p; the top
    token is always kept. A full sort of a 49k vocabulary costs ~6 ms on a CPU, more than the rest
    of a sampling step; the nucleus almost always lies inside the top few hundred tokens, so sort
    only those and fall back to the full sort for the rows where it does not. The result is the
    same either way. The kept values are scattered into a row of -inf, not masked in place: the
    same values, without a mask over the whole vocabulary (all of `shape_logits` on smollm2's
    logits: one row 0.19 -> 0.16 ms, five 0.92 -> 0.76 ms, side by side in one process;
    tests/test_foundation.py holds it to the mask bit for bit)."""
    k = min(probe, logp.shape[-1])
    top_logp, top_idx = torch.topk(logp, k, dim=-1)  # sorted, descending
    if bool((top_logp.exp().sum(dim=-1) >= top_p).all()):
        sorted_logp, idx = top_logp, top_idx
    else:
        sorted_logp, idx = torch.sort(logp, dim=-1, descending=True)
    p_sorted = sorted_logp.exp()
    # Drop a token when the mass before it already reaches top_p.
    drop_sorted = (p_sorted.cumsum(dim=-1) - p_sorted) >= top_p
    drop_sorted[..., 0] = False
    kept = x.gather(-1, idx).masked_fill_(drop_sorted, float("-inf"))
    return torch.full_like(x, float("-inf")).scatter_(-1, idx, kept)


def probs(logits: torch.Tensor, request: GenerationRequest) -> torch.Tensor:
    """The distribution a request samples from, (..., V) float32."""
    return shape_logits(logits, request.temperature, request.top_k, request.top_p).exp()


def check_finite(logits: torch.Tensor, where: str) -> None:
    # A sum is finite only when every term is (a NaN or an infinity carries through it), and it
    # costs ~6 us where isfinite().all() costs ~77 over a 49k vocabulary on a CPU. A sum that is
    # not finite (a bad value, or an overflow of finite ones) is then looked at element by element.
    if torch.isfinite(logits.sum()) or torch.isfinite(logits).all():
        return
    bad = "NaN" if torch.isnan(logits).any() else "inf"
    raise DecoderError(f"{bad} in logits at {where}: the model produced non-finite values "
                       f"(check dtype and weights)")


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """top-1 minus top-2 raw logit along the last dim."""
    top = torch.topk(logits.float(), 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def argmax_and_margin(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`argmax` and `top2_margin` of rows (..., V) from one top-2 pass (a K+1 block's two reads of
    5 x 49k logits took ~0.36 ms on a CPU, about 2% of a step). Where the top two tie (margin 0,
    or NaN) the top-2's index need not be the first maximum, which argmax returns: those rows
    take argmax's, so the token is argmax's on every row."""
    top = torch.topk(logits.float(), 2, dim=-1)
    margin = top.values[..., 0] - top.values[..., 1]
    token = top.indices[..., 0]
    unsure = ~(margin > 0)
    # On a CPU a read costs nothing and ties are rare; elsewhere, no read inside the step.
    if logits.device.type != "cpu" or bool(unsure.any()):
        token = torch.where(unsure, logits.argmax(dim=-1), token)
    return token, margin


def choose(logits: torch.Tensor, request: GenerationRequest, key: int, positions) -> torch.Tensor:
    """Token ids for rows of logits (N, V) at the given absolute positions.

    Greedy: argmax of the raw logits. Sampling: argmax(shaped log p + Gumbel noise of that position).
    """
    if request.greedy:
        return logits.argmax(dim=-1)
    logp = shape_logits(logits, request.temperature, request.top_k, request.top_p)
    noise = gumbel_rows(key, positions, logits.shape[-1], logits.device)
    return (logp + noise).argmax(dim=-1)
