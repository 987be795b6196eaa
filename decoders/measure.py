"""What a speculative round costs the target, measured: one forward of K+1 tokens against one
one-token step, on the same KV cache, interleaved and repeated, after a warm-up.

Leviathan's speedup assumes the K+1 block costs one step; on a CPU it does not (small matrix
products are not free), and the ratio measured here is what `estimate-acceptance` and `bench`
put into the theory beside the formula's.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from decoders.common import forward, sync
from decoders.kv import DEFAULT_CACHE, CachePool


@dataclass(frozen=True)
class BlockCost:
    step_s: float        # median one-token step
    block_s: float       # median forward of k + 1 tokens
    k: int

    @property
    def ratio(self) -> float:
        """The K+1 block in one-token steps (1.0: as the formula assumes)."""
        return self.block_s / self.step_s


@torch.inference_mode()
def block_cost(model, device, context: list[int], k: int, *, reps: int = 9, cache: str = DEFAULT_CACHE) -> BlockCost:
    """Time one-token steps and (k+1)-token forwards after `context` (the prompt and a little
    output), alternating, rolling the cache back after each, so that load hits both alike."""
    if len(context) < 2:
        raise ValueError("block_cost needs a context of at least 2 tokens")
    pool = CachePool(model, cache)
    kv = pool.new(len(context) + k + 2)
    base = len(context) - 1
    forward(model, torch.tensor([context[:-1]], device=device), kv)
    one = torch.tensor([context[-1:]], device=device)
    block = torch.tensor([(context[-1:] + context[-k:] * ((k // max(1, len(context[-k:]))) + 1))[:k + 1]],
                         device=device)
    steps, blocks = [], []
    for i in range(reps + 1):
        for ids, out in ((one, steps), (block, blocks)) if i % 2 == 0 else ((block, blocks), (one, steps)):
            sync(device)
            t = time.perf_counter()
            forward(model, ids, kv, ids.shape[1])
            sync(device)
            if i > 0:  # the first pair warms up
                out.append(time.perf_counter() - t)
            kv.crop(-(kv.get_seq_length() - base))
    return BlockCost(statistics.median(steps), statistics.median(blocks), k)
