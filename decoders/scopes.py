"""Profiling scopes: `bench --profile-round` turns them on to attribute kernel time to the parts
of a step (sampling, verification, drafting; the lean step's norms, attention, MLPs and LM head).
Off, a scope is a shared null context: no cost."""
from __future__ import annotations

import contextlib

import torch

_PROFILING = [False]
_NULL = contextlib.nullcontext()


def scope(name: str):
    if not _PROFILING[0]:
        return _NULL
    return torch.profiler.record_function(name)


@contextlib.contextmanager
def profiling_scopes():
    _PROFILING[0] = True
    try:
        yield
    finally:
        _PROFILING[0] = False
