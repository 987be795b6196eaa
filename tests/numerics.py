"""Tolerances for floating-point comparisons that hold on any processor.

A result computed in a floating dtype differs from a more precise reference (or from the same
formula evaluated in another order) by rounding, and rounding is relative: its size is a few
machine epsilons of the dtype times the magnitude of the numbers involved, growing with the number
of dependent rounded steps. Which processor runs it (reduction order, FMA, SIMD width, the BLAS
kernel chosen) changes the rounding, not its size. So a bound here is stated as epsilons of the
dtype that was computed in, per layer of computation, times the largest magnitude compared; never
as one absolute number that was measured on one machine.
"""
from __future__ import annotations

import torch

# Measured on the tiny test models (hidden size 64): fp32 keys, values and logits stay within
# ~9 eps of their largest magnitude per layer; 16 leaves a factor of about two on any machine.
EPS_PER_LAYER = 16


def tolerance(dtype: torch.dtype, scale: float, *, layers: int = 1, eps_per_layer: int = EPS_PER_LAYER) -> float:
    """Absolute tolerance for values of magnitude up to `scale` after `layers` rounded stages in `dtype`."""
    return eps_per_layer * layers * torch.finfo(dtype).eps * max(float(scale), torch.finfo(dtype).tiny)


def assert_close_scaled(got, want, *, dtype: torch.dtype = torch.float32, layers: int = 1, scale: float | None = None,
                        eps_per_layer: int = EPS_PER_LAYER) -> None:
    """`got` equals `want` up to rounding in `dtype`; compared in float64 so the check adds none.
    `scale` is the magnitude the rounding is relative to (default: the largest |want|), given
    explicitly where the compared values are derived from larger ones (a margin of two logits)."""
    got, want = (torch.as_tensor(x).detach().to(torch.float64) for x in (got, want))
    scale = float(want.abs().max()) if scale is None else scale
    atol = tolerance(dtype, scale, layers=layers, eps_per_layer=eps_per_layer)
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
